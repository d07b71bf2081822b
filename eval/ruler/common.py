"""Helpers shared by the non-NIAH RULER generators (vt, cwe, fwe, qa): token counting, prompt
wrapping, the haystack-size binary search of docs/benchmarks/ruler.md and data-file lookup.

The search reproduces NVIDIA/RULER c3f5e3b exactly (bound from a prompt-only probe, no search above the
bound, the same random draws in the same order), so that every sample is upstream's byte for byte; this
is checked against upstream's own output by tests/eval/test_conformance_ruler.py.  The NIAH generator
(niah.py) keeps its own copy of the same logic.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from locks.errors import ConfigError

from .hub import HUB_SOURCES, fetch_from_hub, hub_offline

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


NO_CHAT_TEMPLATE = ("benchmark.chat_template=true, but the model's tokenizer has no chat template (a base model?); pass "
                    "benchmark.chat_template=false for RULER's plain prompt")


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
    except ValueError:  # transformers raises ValueError when no chat template is set
        raise ConfigError(NO_CHAT_TEMPLATE) from None


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
    if kind == "essay" and hub_cache is not None and explicit is None:  # the offline natural-text haystack
        from .offline_text import offline_essay_file

        try:
            return offline_essay_file(Path(hub_cache).parent)
        except (FileNotFoundError, ValueError) as e:
            where += f"; {e}"
    fix = ("Pass an existing file as benchmark.essay_path" if explicit is not None and kind == "essay"
           else f"Put {name} into a directory and pass benchmark.data_dir=/path/to/that/directory")
    raise FileNotFoundError(f"RULER task {task} needs {name} ({_DATA_HOWTO[kind]}), but it was not found ({where}). {fix}.")


def check_sources(tasks, data_dir=None, essay_path=None, cache_dir=None) -> None:
    """Every external file the tasks will read, checked before any work (no model, no generation): one ConfigError
    naming the key the user set (benchmark.essay_path, benchmark.data_dir) and what to do. It mirrors
    resolve_data_file: an essay task reads essay_path, else data_dir's PaulGrahamEssays.json, else (with a cache_dir)
    the offline World English Bible; qa_1 / qa_2 read data_dir's squad.json / hotpotqa.json, else a copy rebuilt from
    the Hub under cache_dir/hub, which needs the Hub. cwe's english_words.json is optional up to the wonderwords pool
    (common_words.py says when it is needed) and is not checked here."""
    from locks.offline_text import HOWTO as WEB_HOWTO
    from locks.offline_text import web_text_path
    from .tasks import ALL_TASKS

    if essay_path is not None and not Path(essay_path).expanduser().is_file():
        instead = "benchmark.data_dir's PaulGrahamEssays.json" if data_dir else "the offline World English Bible"
        raise ConfigError(f"benchmark.essay_path={essay_path}: no such file. Give the essay corpus (RULER's "
                          f"PaulGrahamEssays.json or a plain .txt file), or drop benchmark.essay_path to use {instead}")
    if data_dir is not None and not Path(data_dir).expanduser().is_dir():
        raise ConfigError(f"benchmark.data_dir={data_dir}: no such directory. Pass the folder that holds RULER's "
                          f"data files ({', '.join(DATA_FILES.values())}), or drop benchmark.data_dir")
    here = Path(data_dir).expanduser() if data_dir is not None else None
    for task in tasks:
        for kind in ALL_TASKS[task]["needs"]:
            name = DATA_FILES[kind]
            if here is not None and (here / name).is_file():
                continue
            if kind == "essay":
                if essay_path is not None:
                    continue
                if cache_dir is None:
                    raise ConfigError(f"RULER task {task} needs an essay haystack: pass benchmark.essay_path=<{name} or "
                                      f"a .txt file> or put {name} into benchmark.data_dir; the offline World English "
                                      f"Bible needs benchmark.cache_dir, which is null")
                if web_text_path() is None:
                    raise ConfigError(f"RULER task {task} needs an essay haystack and none was given "
                                      f"(benchmark.essay_path, or {name} in benchmark.data_dir); the offline one "
                                      f"needs a package: {WEB_HOWTO}")
                continue
            if cache_dir is not None and (Path(cache_dir) / "hub" / name).is_file():
                continue  # rebuilt from the Hub by an earlier run
            if cache_dir is not None and not hub_offline():
                continue  # rebuilt from the Hub at generation
            where = (f"benchmark.data_dir={data_dir} has no {name}" if data_dir is not None
                     else "benchmark.data_dir is not set")
            why = ("the HF Hub is switched off (HF_HUB_OFFLINE / HF_DATASETS_OFFLINE / TRANSFORMERS_OFFLINE)"
                   if hub_offline() else "benchmark.cache_dir is null, so no Hub copy can be kept")
            raise ConfigError(f"RULER task {task} needs {name}, {_DATA_HOWTO[kind]}: {where}, and {why}. Put {name} "
                              f"into a folder and pass benchmark.data_dir=/path/to/that/folder")


def probe_upper_bound(task: str, budget: int, probe_tokens: int, probe_units: int, slack: float, unit: int,
                      floor_first: bool = False) -> int:
    """§4 step 2: upper bound of the haystack search from a probe of ``probe_units`` units that has
    ``probe_tokens`` prompt tokens (the tokens to generate are not part of the probe, as upstream).

    Upstream computes ``int((budget / per_unit) * slack)`` (niah, vt, qa) and, for cwe,
    ``int(budget // per_unit) * slack`` (``floor_first``); the float operations are done in the same
    order so that the bound is bit-identical.  Never below two units.
    """
    if probe_tokens <= 0:
        raise ValueError(f"RULER {task}: the probe prompt has no tokens; the tokenizer returned nothing")
    per_unit = probe_tokens / probe_units
    est = int(budget // per_unit) * slack if floor_first else int((budget / per_unit) * slack)
    return max(int(est), unit * 2)


def search_and_generate(task: str, search_tokens: Callable[[int], int], sample: Callable[[int, int], tuple],
                        budget: int, unit: int, upper: int, num_samples: int, kind: str = "units"):
    """§4 steps 3-4: binary search, then ``num_samples`` samples, consuming the random stream as upstream.

    ``search_tokens(n)`` builds one candidate with haystack count ``n`` and returns the tokens it counts
    against ``budget`` (prompt + tokens to generate, plus whatever else the family adds); the search keeps
    the largest ``n`` in [``unit``, ``upper``] that fits and stops at ``upper`` (upstream does not look above
    its bound).  ``sample(i, n)`` builds sample ``i`` and returns (built, tokens); a sample that is too long
    is redrawn one unit smaller.  When nothing fits, upstream falls back to one unit and keeps drawing; we
    do the same but give up after MAX_RETRIES_AT_MIN draws at one unit (upstream loops forever, pitfall 6).
    Returns (list of (built, tokens, count_used), best count or None).
    """
    lo, hi = unit, upper
    best = None
    while lo <= hi:
        mid = (lo + hi) // 2
        if search_tokens(mid) <= budget:
            best, lo = mid, mid + 1
        else:
            hi = mid - 1
    out = []
    for i in range(num_samples):
        used, fails_at_min = (best if best is not None else unit), 0
        while True:
            built, tokens = sample(i, used)
            if tokens <= budget:
                break
            if used > unit:
                used -= unit
            else:
                fails_at_min += 1
                if fails_at_min >= MAX_RETRIES_AT_MIN:
                    raise ValueError(
                        f"RULER {task}: context_length={budget} is too small: sample {i} does not fit even with "
                        f"{used} {kind} after {fails_at_min} draws (last: {tokens} tokens including the tokens to "
                        f"generate). Use a larger context_length."
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
