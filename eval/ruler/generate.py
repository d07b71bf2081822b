"""One entry point for all 13 RULER tasks, with an optional on-disk cache (docs/benchmarks/ruler.md).

    generate_samples(task, tokenizer, context_length, num_samples, seed=42, chat_template=True,
                     data_dir=None, essay_path=None, cache_dir=None) -> list[dict]

External sources are read from ``data_dir`` under RULER's file names (``PaulGrahamEssays.json``,
``squad.json``, ``hotpotqa.json``, ``english_words.json``); ``essay_path`` (kept from the NIAH API)
overrides the essay file.  SQuAD and HotpotQA, when missing there and the Hub is reachable, are rebuilt
once from their ``datasets`` mirrors under ``cache_dir/hub`` (hub.py); the essay corpus and the CWE word
list have no Hub source.  A missing source raises one FileNotFoundError naming the file and the
``benchmark.data_dir=...`` fix.

Cache: ``cache_dir/<task>/<key>.jsonl`` (+ ``<key>.key.json`` with the readable key), key = sha256 of
(tokenizer name + vocabulary size + chat-template hash, context length, task, seed, num_samples,
chat_template, family generator version, fingerprint of the external source files used).  Written
atomically (temporary file in the same directory + ``os.replace``).
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import tempfile
from pathlib import Path

from .common import resolve_data_file
from .tasks import ALL_TASKS, GENERATOR_VERSIONS, NIAH_TASKS


def _niah(task, tokenizer, context_length, num_samples, seed, chat_template, data_dir, essay_path, hub_cache=None):
    from .niah import generate_niah_samples

    essay = None
    if NIAH_TASKS[task]["needs_essay"]:
        essay = str(resolve_data_file("essay", task, data_dir, essay_path, hub_cache))
    return generate_niah_samples(task, tokenizer, context_length, num_samples, seed=seed,
                                 chat_template=chat_template, essay_path=essay)


def _vt(task, tokenizer, context_length, num_samples, seed, chat_template, data_dir, essay_path, hub_cache=None):
    from .variable_tracking import generate_vt_samples

    return generate_vt_samples(task, tokenizer, context_length, num_samples, seed, chat_template)


def _cwe(task, tokenizer, context_length, num_samples, seed, chat_template, data_dir, essay_path, hub_cache=None):
    from .common_words import generate_cwe_samples

    return generate_cwe_samples(task, tokenizer, context_length, num_samples, seed, chat_template, data_dir)


def _fwe(task, tokenizer, context_length, num_samples, seed, chat_template, data_dir, essay_path, hub_cache=None):
    from .freq_words import generate_fwe_samples

    return generate_fwe_samples(task, tokenizer, context_length, num_samples, seed, chat_template)


def _qa(task, tokenizer, context_length, num_samples, seed, chat_template, data_dir, essay_path, hub_cache=None):
    from .qa import generate_qa_samples

    return generate_qa_samples(task, tokenizer, context_length, num_samples, seed, chat_template, data_dir,
                               hub_cache=hub_cache)


# family -> generator; tests monkeypatch this table to prove a cache hit does not regenerate.
GENERATORS = {
    "niah": _niah,
    "variable_tracking": _vt,
    "common_words_extraction": _cwe,
    "freq_words_extraction": _fwe,
    "qa": _qa,
}


@functools.lru_cache(maxsize=16)
def _sha256_file(path: str, mtime_ns: int, size: int) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _source_fingerprints(task: str, data_dir, essay_path, hub_cache=None) -> dict:
    """Content hashes of the external files a task reads (so a changed file never hits an old cache)."""
    cfg = ALL_TASKS[task]
    kinds = list(cfg["needs"])
    if cfg["family"] == "common_words_extraction":
        kinds.append("english_words")  # optional: only when present
    out = {}
    for kind in kinds:
        try:
            p = resolve_data_file(kind, task, data_dir, essay_path if kind == "essay" else None, hub_cache)
        except FileNotFoundError:
            if kind == "english_words":
                continue
            raise
        st = os.stat(p)
        out[kind] = _sha256_file(str(Path(p).resolve()), st.st_mtime_ns, st.st_size)
    return out


def tokenizer_identity(tokenizer) -> dict:
    name = getattr(tokenizer, "name_or_path", None) or type(tokenizer).__name__
    try:
        vocab = len(tokenizer)
    except TypeError:
        vocab = getattr(tokenizer, "vocab_size", None)
    tmpl = getattr(tokenizer, "chat_template", None)
    return {
        "name": str(name),
        "vocab_size": vocab,
        "chat_template_sha256": hashlib.sha256(tmpl.encode()).hexdigest() if isinstance(tmpl, str) else None,
    }


def cache_key(task, tokenizer, context_length, num_samples, seed, chat_template, data_dir=None,
              essay_path=None, hub_cache=None) -> tuple[str, dict]:
    """(hex key, the readable key dict)."""
    cfg = ALL_TASKS[task]
    key = {
        "tokenizer": tokenizer_identity(tokenizer),
        "context_length": int(context_length),
        "task": task,
        "seed": int(seed),
        "num_samples": int(num_samples),
        "chat_template": bool(chat_template),
        "generator_version": GENERATOR_VERSIONS[cfg["family"]],
        "sources": _source_fingerprints(task, data_dir, essay_path, hub_cache),
    }
    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:32]
    return digest, key


def _atomic_write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=path.name + ".", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise


def cache_path(cache_dir, task: str, digest: str) -> Path:
    return Path(cache_dir) / task / f"{digest}.jsonl"


def generate_samples(task: str, tokenizer, context_length: int, num_samples: int, seed: int = 42,
                     chat_template: bool = True, data_dir=None, essay_path=None, cache_dir=None) -> list[dict]:
    """Samples of any of the 13 RULER tasks sized to ``context_length`` tokens.

    Each sample: "index" (0..n-1), "task", "input" (full prompt incl. chat template and answer prefix),
    "outputs" (references), "answer_prefix", "length" (prompt tokens without special tokens +
    max_new_tokens), "max_new_tokens", "metric" ("string_match_all" / "string_match_part"),
    "chat_template", "num_haystack" (lines / essay words / words / documents), and for NIAH
    "token_position_answer".
    """
    if task not in ALL_TASKS:
        raise ValueError(f"unknown RULER task {task!r}; valid tasks: {', '.join(ALL_TASKS)}")
    if context_length <= 0 or num_samples < 0:
        raise ValueError(f"context_length must be > 0 and num_samples >= 0, got {context_length}, {num_samples}")
    family = ALL_TASKS[task]["family"]
    path = None
    hub_cache = Path(cache_dir) / "hub" if cache_dir is not None else None  # SQuAD/HotpotQA rebuilt from the Hub
    if cache_dir is not None:
        digest, key = cache_key(task, tokenizer, context_length, num_samples, seed, chat_template, data_dir,
                                essay_path, hub_cache)
        path = cache_path(cache_dir, task, digest)
        if path.is_file():
            with open(path, encoding="utf-8") as f:
                samples = [json.loads(line) for line in f if line.strip()]
            if len(samples) == num_samples:
                return samples
    samples = GENERATORS[family](task, tokenizer, int(context_length), int(num_samples), int(seed),
                                 bool(chat_template), data_dir, essay_path, hub_cache=hub_cache)
    if path is not None:
        _atomic_write(path.with_suffix(".key.json"), json.dumps(key, indent=1, sort_keys=True) + "\n")
        _atomic_write(path, "".join(json.dumps(s, ensure_ascii=True) + "\n" for s in samples))
    return samples
