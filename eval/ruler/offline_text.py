"""An offline natural-text haystack for RULER's essay tasks: the World English Bible (locks/offline_text.py).

RULER's essay tasks hide their needles in the Paul Graham essays, which cannot be redistributed. Without that file
(`benchmark.essay_path` or `<benchmark.data_dir>/PaulGrahamEssays.json`) the harness uses the WEB text, written once
as a plain-text essay file into the RULER cache, where RULER's loader reads it like any `benchmark.essay_path` .txt
file. The file's content hash is part of the sample cache key (docs/benchmarks/ruler.md).
"""
from __future__ import annotations

import os
import tempfile
from pathlib import Path

from locks.offline_text import web_text

FILE_NAME = "world_english_bible.txt"


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
