"""scripts/method_lines.py: each method file's framework share (docs/adding_a_method.md, "What a method file holds")
is classified by the call graph, stays within 25 %, and the docs' table is near the script's output."""
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


def test_every_method_file_is_within_the_framework_share_and_the_docs_table_is_near_it(capsys):
    """--check passes, and the docs' table lists every registered method with its framework share within 2 points of
    today's (the line counts move with every edit; the script prints the current table)."""
    assert method_lines.main(["--check"]) == 0
    capsys.readouterr()
    docs = (ROOT / "docs" / "adding_a_method.md").read_text()
    documented = {cells[1].strip(): float(cells[6].strip().rstrip("%"))
                  for line in docs.splitlines() if line.startswith("| ") and line.endswith("% |")
                  for cells in [line.split("|")]}
    files = method_lines.selector_files()
    assert set(documented) == set(files)
    for name, path in files.items():
        assert abs(100 * method_lines.split(path)["share"] - documented[name]) <= 2, name
