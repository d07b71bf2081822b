"""scripts/method_lines.py: each method file's framework share (docs/adding_a_method.md, "What a method file holds")
is classified by the call graph, stays within 25 %, and the docs' table is the script's output."""
import textwrap
from pathlib import Path

from scripts import method_lines

ROOT = Path(__file__).resolve().parents[2]

SOURCE = textwrap.dedent('''\
    """doc"""
    class S:
        def __init__(self):
            self.x = 1

        def static_step_cost(self, length):
            return self._bytes(length)

        def _bytes(self, length):
            return length

        def _shared(self, length):
            return length

        def memory_bytes(self, length):
            return self._shared(length)

        def select(self, query):
            return self._score(query) + self._shared(1)

        def _score(self, query):
            return query
''')


def test_helpers_only_the_framework_calls_are_framework_and_shared_ones_are_the_method(tmp_path):
    path = tmp_path / "selector.py"
    path.write_text(SOURCE)
    row = method_lines.split(path)
    # framework: __init__ (2 lines), static_step_cost (2), _bytes (2, called by it alone), memory_bytes (2);
    # method: select (2), _score (2) and _shared (2, called by select as well)
    assert (row["lines"], row["framework"], row["method"]) == (len(SOURCE.splitlines()), 8, 6)


def test_every_method_file_is_within_the_framework_share_and_the_docs_table_is_current(capsys):
    assert method_lines.main(["--check"]) == 0
    printed = capsys.readouterr().out.strip()
    assert printed in (ROOT / "docs" / "adding_a_method.md").read_text()
