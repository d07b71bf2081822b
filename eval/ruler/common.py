"""Helpers shared by the non-NIAH RULER generators (vt, cwe, fwe, qa): token counting, prompt
wrapping, the haystack-size binary search of shared/specs/ruler.md §4 and data-file lookup.

The NIAH generator (niah.py) keeps its own copy of the same logic; it is left untouched so that its
output stays byte-identical.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from .hub import HUB_SOURCES, fetch_from_hub

# Retries of one sample at the smallest haystack size before giving up (upstream: infinite, pitfall 6).
MAX_RETRIES_AT_MIN = 50

# RULER's file names for the external sources (scripts/data/synthetic/json/ upstream).
DATA_FILES = {
    "essay": "PaulGrahamEssays.json",
    "squad": "squad.json",
    "hotpotqa": "hotpotqa.json",
    "english_words": "english_words.json",
}
_DATA_HOWTO = {
    "essay": "the Paul Graham essay corpus ({\"text\": ...}, built by RULER's "
             "scripts/data/synthetic/json/download_paulgraham_essay.py)",
    "squad": "the SQuAD v2.0 dev set (dev-v2.0.json from https://rajpurkar.github.io/SQuAD-explorer/, renamed)",
    "hotpotqa": "the HotpotQA dev distractor set (hotpot_dev_distractor_v1.json, renamed)",
    "english_words": "RULER's scripts/data/synthetic/json/english_words.json (a Git-LFS file: `git lfs pull`)",
}


def count_tokens(tokenizer, text: str) -> int:
    """spec §3.4: HF ``tokenize`` = no special tokens (chat-template special tokens count as one each)."""
    return len(tokenizer.tokenize(text))


def wrap(tokenizer, task_text: str, chat_template: bool, task: str) -> str:
    """Chat template of the user turn with the generation prompt added (or the bare task text)."""
    if not chat_template:
        return task_text
    try:
        return tokenizer.apply_chat_template(
            [{"role": "user", "content": task_text}], add_generation_prompt=True, tokenize=False
        )
    except ValueError as e:  # transformers raises ValueError when no chat template is set
        raise ValueError(f"{e}\n(RULER {task}: this tokenizer has no chat template; use chat_template=False)") from e


def resolve_data_file(kind: str, task: str, data_dir=None, explicit=None, hub_cache=None) -> Path:
    """The local file for one external source: ``explicit`` if given, else ``data_dir/<RULER name>``, else (SQuAD,
    HotpotQA, when ``hub_cache`` is given and the Hub is reachable) the file rebuilt from its ``datasets`` mirror.

    Raises one FileNotFoundError naming the missing file and the ``benchmark.data_dir=...`` fix.
    """
    name = DATA_FILES[kind]
    candidates = []
    if explicit is not None:
        candidates.append(Path(explicit))
    if data_dir is not None:
        candidates.append(Path(data_dir) / name)
    for c in candidates:
        if c.is_file():
            return c
    where = (f"looked for {', '.join(repr(str(c)) for c in candidates)}" if candidates
             else "no data directory was given")
    if hub_cache is not None and kind in HUB_SOURCES:
        try:
            return fetch_from_hub(kind, name, hub_cache)
        except FileNotFoundError as e:
            where += f"; {e}"
    raise FileNotFoundError(
        f"RULER task {task} needs {name} ({_DATA_HOWTO[kind]}), but it was not found ({where}). "
        f"Put {name} into a directory and pass benchmark.data_dir=/path/to/that/directory."
    )


def search_and_generate(task: str, build: Callable[[int], tuple], n_tokens: Callable[[tuple], int],
                        budget: int, unit: int, per_unit_probe: int, slack: float, num_samples: int,
                        sample_build: Callable[[int, int], tuple] | None = None, kind: str = "units",
                        cap: int | None = None):
    """§4: probe, binary search of the largest haystack count that fits, then ``num_samples`` samples.

    ``build(n)`` builds one random sample with haystack count ``n`` (consuming the random stream);
    ``n_tokens(built)`` = prompt tokens + tokens_to_generate.  ``per_unit_probe`` is the haystack
    count of the probe (the unit; CWE probes with 4096 words).  ``sample_build(i, n)`` builds sample
    ``i`` (defaults to ``build(n)``).  ``cap`` bounds the search from above (e.g. a word pool size).
    Returns (list of (built, tokens, count_used), best count).
    """
    probe = build(per_unit_probe)
    per_unit = max(n_tokens(probe), 1) / per_unit_probe
    lo, hi = unit, max(int((budget / per_unit) * slack), unit * 2)
    if cap is not None:
        hi = min(hi, cap)
    best, smallest_fail = None, None
    while True:
        top = hi
        while lo <= hi:
            mid = (lo + hi) // 2
            tokens = n_tokens(build(mid))
            if tokens <= budget:
                best, lo = mid, mid + 1
            else:
                hi = mid - 1
                smallest_fail = (mid, tokens)
        # Deviation: upstream stops at its upper bound even when that bound still fits, which
        # under-fills prompts whose probe overestimates the per-unit cost (e.g. VT, whose probe
        # includes the ~500-token ICL example).  We keep searching above it (doubling); the random
        # stream is upstream's whenever its bound was not binding.
        if best != top or (cap is not None and top >= cap):
            break
        lo, hi = top + 1, top * 2 if cap is None else min(top * 2, cap)
    if best is None:
        n, tokens = smallest_fail if smallest_fail else (unit, None)
        raise ValueError(
            f"RULER {task}: context_length={budget} is too small: even the smallest haystack "
            f"({n} {kind}) gives {tokens} tokens including the tokens to generate. Use a larger context_length."
        )
    sample_build = sample_build or (lambda i, n: build(n))
    out = []
    for i in range(num_samples):
        used, fails_at_min = best, 0
        while True:
            built = sample_build(i, used)
            tokens = n_tokens(built)
            if tokens <= budget:
                break
            # §4 step 4 / upstream: a too-long sample (randomness) is redrawn one unit smaller
            if used > unit:
                used -= unit
            else:  # upstream loops forever here (pitfall 6)
                fails_at_min += 1
                if fails_at_min >= MAX_RETRIES_AT_MIN:
                    raise ValueError(
                        f"RULER {task}: sample {i} does not fit context_length={budget} even with {used} "
                        f"{kind} after {fails_at_min} draws (last: {tokens} tokens). Use a larger context_length."
                    )
        out.append((built, tokens, used))
    return out, best


def sample_records(task: str, cfg: dict, results: list, chat_template: bool) -> list[dict]:
    """The generated-record dicts (same fields as the NIAH generator) from search_and_generate's results, whose
    built samples are (full prompt, answer prefix, answers)."""
    return [{
        "index": i,
        "task": task,
        "input": full,
        "outputs": list(answer),
        "answer_prefix": prefix,
        "length": tokens,
        "max_new_tokens": cfg["tokens_to_generate"],
        "metric": cfg["metric"],
        "chat_template": bool(chat_template),
        "num_haystack": used,
    } for i, ((full, prefix, answer), tokens, used) in enumerate(results)]
