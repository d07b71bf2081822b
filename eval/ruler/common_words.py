"""RULER common words extraction ("cwe"), docs/benchmarks/ruler.md (haystack sizing §4).

Reproduces NVIDIA/RULER c3f5e3b ``scripts/data/synthetic/common_words_extraction.py`` ("upstream") byte
for byte (checked by tests/eval/test_conformance_ruler.py): one ``random.Random(seed)`` stream draws the words
(4096-word probe, binary search, then the samples), every list is shuffled with a fresh ``Random(seed)``,
the search bound is ``int(B // tokens_per_word) * 2`` from the prompt-only probe, and a call that needs
more distinct words than the wonderwords pool holds draws from ``english_words.json`` (its ``.values()``
in file order; upstream does not sort, de-duplicate or shuffle that list either).  The few-shot example
is the full prompt (model template and answer prefix included) plus its answer, as upstream builds it.
Deliberate differences (none is reached with RULER's real word lists, whose english_words.json has far
more words than any search bound):
  * the search is capped at the larger word pool, and without ``english_words.json`` at the wonderwords
    pool; a FileNotFoundError is raised only when the prompt could have used more words (upstream always
    loads the file, and its ``random.sample`` fails for a count above the pool);
  * the 4096-word probe is shrunk to the pool size when the pool is smaller (never with the real lists:
    wonderwords alone has 8,166 words);
  * ValueError instead of an endless loop when even one unit does not fit (pitfall 6).
"""

from __future__ import annotations

import functools
import json
import os
import random
from pathlib import Path

from .common import count_tokens, probe_upper_bound, resolve_data_file, sample_records, search_and_generate, wrap
from .niah import _read_wordlist
from .tasks import (
    CWE_FAMILY,
    CWE_PROBE_WORDS,
    CWE_SEARCH_SLACK,
    CWE_WORD_UNIT,
    OTHER_TASKS,
    SMALL_CONTEXT_THRESHOLD,
)


@functools.lru_cache(maxsize=1)
def wonderwords_pool() -> tuple[str, ...]:
    """nouns + adjectives + verbs of wonderwords, de-duplicated and sorted (8,166 words with 3.0.1);
    the seed-dependent shuffle is applied by the caller."""
    words = _read_wordlist("nounlist.txt") + _read_wordlist("adjectivelist.txt") + _read_wordlist("verblist.txt")
    return tuple(sorted(set(words)))


@functools.lru_cache(maxsize=2)
def _english_words_cached(path: str, mtime_ns: int, size: int) -> tuple[str, ...]:
    with open(path, encoding="utf-8") as f:
        data = json.load(f)
    if not isinstance(data, dict) or not data:
        raise ValueError(f"{path}: expected a non-empty JSON object whose values are words (RULER's english_words.json)")
    return tuple(data.values())  # file order, a repeated word kept (upstream: list(json.load(f).values()))


def load_english_words(path) -> tuple[str, ...]:
    p = str(Path(path).resolve())
    st = os.stat(p)
    return _english_words_cached(p, st.st_mtime_ns, st.st_size)


def generate_cwe_samples(task: str, tokenizer, context_length: int, num_samples: int, seed: int = 42,
                         chat_template: bool = True, data_dir=None) -> list[dict]:
    """``num_samples`` CWE samples sized to ``context_length`` tokens (same record fields as NIAH;
    ``num_haystack`` = distinct words of the target list)."""
    cfg = OTHER_TASKS[task]
    if cfg["family"] != "common_words_extraction":
        raise ValueError(f"{task!r} is not a common_words_extraction task")
    ttg = cfg["tokens_to_generate"]
    num_cw = cfg["num_cw"]
    words = list(wonderwords_pool())
    random.Random(seed).shuffle(words)
    english_path = None
    try:
        english_path = resolve_data_file("english_words", task, data_dir)
    except FileNotFoundError:
        pass
    english = load_english_words(english_path) if english_path is not None else None
    rng = random.Random(seed)
    template, prefix = CWE_FAMILY["template"], CWE_FAMILY["answer_prefix"]

    def example(num_words: int, common_repeats: int, uncommon_repeats: int):
        pool = words if num_words <= len(words) else english
        if pool is None:  # only reachable through the cap below
            resolve_data_file("english_words", task, data_dir)
        full = rng.sample(pool, num_words)
        common, uncommon = full[:num_cw], full[num_cw:]
        word_list = common * common_repeats + uncommon * uncommon_repeats
        random.Random(seed).shuffle(word_list)
        return " ".join(f"{i + 1}. {w}" for i, w in enumerate(word_list)), common

    def full_prompt(context: str) -> str:
        return wrap(tokenizer, template.format(context=context), chat_template, task) + prefix

    def build(num_words: int):
        if context_length < SMALL_CONTEXT_THRESHOLD:
            ex_ctx, ex_ans = example(20, 3, 1)
            ctx, ans = example(num_words, 6, 1)
        else:
            ex_ctx, ex_ans = example(40, 10, 3)
            ctx, ans = example(num_words, cfg["freq_cw"], cfg["freq_ucw"])
        # §5.3: the few-shot part is the full template (wrapper and answer prefix included) + its answer
        few_shot = full_prompt(ex_ctx) + " " + " ".join(f"{i + 1}. {w}" for i, w in enumerate(ex_ans))
        return few_shot + "\n" + full_prompt(ctx), ans

    def tokens(built) -> int:
        return count_tokens(tokenizer, built[0]) + ttg

    def sample(i: int, n: int):
        built = build(n)
        return built, tokens(built)

    cap = max(len(words), len(english)) if english is not None else len(words)
    # upstream: a 4096-word probe, prompt tokens only, bound int(B // tokens_per_word) * 2
    probe_words = min(CWE_PROBE_WORDS, cap)
    probe = count_tokens(tokenizer, build(probe_words)[0])
    upper = min(probe_upper_bound(task, context_length, probe, probe_words, CWE_SEARCH_SLACK, CWE_WORD_UNIT,
                                  floor_first=True), cap)
    results, best = search_and_generate(task, lambda n: tokens(build(n)), sample, context_length, CWE_WORD_UNIT,
                                        upper, num_samples, kind="words")
    if english is None and best == cap:
        # more distinct words would fit than wonderwords has: upstream switches to english_words.json
        resolve_data_file("english_words", task, data_dir)
    results = [((full, prefix, answer), n_tok, used) for (full, answer), n_tok, used in results]
    return sample_records(task, cfg, results, chat_template)
