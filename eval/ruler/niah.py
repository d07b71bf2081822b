"""RULER needle-in-a-haystack generator (the 8 niah_* tasks), docs/benchmarks/ruler.md

Written from the specification; where it is silent the behaviour of NVIDIA/RULER c3f5e3b
``scripts/data/synthetic/niah.py`` is reproduced (each such place says "upstream"; checked against
upstream's own output by tests/eval/test_conformance_ruler.py).  In particular
the random stream is consumed in upstream's order (probe, binary search, then the samples, all from
one ``random.Random(seed)``), so with the same tokenizer and prompt wrapper the same haystack sizes,
keys, values and positions come out.

Deliberate differences from upstream (each documented where it happens):
  * exit with ValueError when even one haystack unit does not fit (upstream loops forever);
  * a key that collides with an earlier key of the same sample (distractor or real) is re-drawn;
  * the single-needle rewrite is applied to the RULER task text and answer prefix only, not to the
    tokenizer's chat template (upstream rewrites its model template too, which turns e.g. SmolLM2's
    "You are a helpful AI assistant" into "You is ..."); with SmolLM2's chat template this is the only
    difference from upstream's samples (same draws, same token counts), and
    tests/eval/test_conformance_ruler.py allows exactly that difference and nothing else;
  * ``index`` is our own 0..n-1 sample id (upstream overwrites it with a character offset);
  * ``input`` is the full prompt given to the model (chat template + answer prefix applied).
"""

from __future__ import annotations

import bisect
import functools
import importlib.resources
import json
import os
import random
import re
import uuid
from collections.abc import Sequence
from pathlib import Path

from .common import wrap
from .tasks import (
    DEPTHS,
    ESSAY_UNIT_WORDS,
    LINE_UNIT,
    NIAH_ANSWER_PREFIX,
    NIAH_NEEDLE,
    NIAH_TASKS,
    NIAH_TEMPLATE,
    NOISE_SENTENCE,
    SEARCH_SLACK,
    SINGLE_NEEDLE_REWRITES,
    SMALL_CONTEXT_THRESHOLD,
    SMALL_LINE_UNIT,
)

# Retries of one sample at the smallest haystack size before giving up (upstream: infinite).
MAX_RETRIES_AT_MIN = 50

ESSAY_HOWTO = (
    "Provide the Paul Graham essay corpus as RULER's PaulGrahamEssays.json ({\"text\": \"...\"}, built "
    "by RULER's scripts/data/synthetic/json/download_paulgraham_essay.py) or as a plain .txt file, and "
    "pass it with benchmark.essay_path=/path/to/PaulGrahamEssays.json"
)
PUNKT_HOWTO = (
    "install the NLTK punkt_tab data, e.g. `python -m nltk.downloader punkt_tab` (needs the internet; "
    "or point NLTK_DATA at a copy), or offline `pip install --no-deps llama-index-core==0.14.25`, whose "
    "wheel vendors the same punkt_tab data (found automatically)"
)


# ------------------------------------------------------------------------------------ word keys
def _read_wordlist(name: str) -> list[str]:
    """A wonderwords list, read from the package files the way wonderwords itself reads them
    (text-mode readlines + rstrip), as upstream's ``_get_words_from_text_file`` does."""
    with importlib.resources.files("wonderwords.assets").joinpath(name).open("r", encoding="utf-8") as f:
        return [line.rstrip() for line in f.readlines()]


class AdjNounKeys(Sequence):
    """``sorted(set(f"{adj}-{noun}" for adj in adjs for noun in nouns))`` without building it.

    Upstream materializes this list (~6.2 M strings with wonderwords 3.0.1) and draws keys with
    ``random.choice``; ``random.choice`` only needs ``len`` and indexing, so this lazy equivalent
    yields the same keys from the same random stream.

    Ordering argument: call an adjective a *root* if no other adjective ``a`` has it starting with
    ``a + "-"``; a family is a root plus every adjective that starts with ``root + "-"``.  Strings of
    two different families never interleave and compare like ``root + "-"``; two equal strings
    always come from the same family.  So single-adjective families are contiguous blocks ordered
    by the sorted nouns, and the few multi-adjective families are materialized and de-duplicated.
    """

    def __init__(self, adjs: Sequence[str], nouns: Sequence[str]):
        adj_set = set(adjs)
        self._nouns = sorted(set(nouns))
        families: dict[str, list[str]] = {}
        for adj in adj_set:
            root = adj
            for m in re.finditer("-", adj):
                if adj[: m.start()] in adj_set:
                    root = adj[: m.start()]
                    break  # shortest prefix first
            families.setdefault(root, []).append(adj)
        self._blocks: list[str | list[str]] = []  # str = single adjective; list = materialized family
        starts: list[int] = []
        total = 0
        for root in sorted(families, key=lambda r: r + "-"):
            members = families[root]
            if len(members) == 1:
                block: str | list[str] = members[0]
                size = len(self._nouns)
            else:
                block = sorted({f"{a}-{n}" for a in members for n in self._nouns})
                size = len(block)
            if size:
                self._blocks.append(block)
                starts.append(total)
                total += size
        self._starts = starts
        self._len = total

    def __len__(self) -> int:
        return self._len

    def __getitem__(self, i):
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(self._len))]
        if i < 0:
            i += self._len
        if not 0 <= i < self._len:
            raise IndexError(i)
        b = bisect.bisect_right(self._starts, i) - 1
        block, off = self._blocks[b], i - self._starts[b]
        if isinstance(block, str):
            return f"{block}-{self._nouns[off]}"
        return block[off]


@functools.lru_cache(maxsize=1)
def word_keys() -> AdjNounKeys:
    """The NIAH word-key pool: adjective-noun from wonderwords' adjectivelist.txt x nounlist.txt."""
    return AdjNounKeys(_read_wordlist("adjectivelist.txt"), _read_wordlist("nounlist.txt"))


# ------------------------------------------------------------------------------------ essay
@functools.lru_cache(maxsize=4)
def _essay_words_cached(path: str, mtime_ns: int, size: int) -> tuple[str, ...]:
    with open(path, encoding="utf-8") as f:
        raw = f.read()
    if path.lower().endswith(".json"):
        try:
            text = json.loads(raw)["text"]
        except (ValueError, KeyError, TypeError) as e:
            raise ValueError(f"{path}: expected a JSON object {{\"text\": \"...\"}} (RULER's "
                             f"PaulGrahamEssays.json) or a plain .txt file: {e}") from e
    else:
        text = raw
    if not isinstance(text, str) or not text.strip():
        raise ValueError(f"{path}: the essay text is empty")
    # upstream: re.sub(r'\s+', " ", essay).split(" ")  (kept as is, including a possible leading "")
    return tuple(re.sub(r"\s+", " ", text).split(" "))


def load_essay_words(essay_path: str | os.PathLike, task: str = "essay task") -> tuple[str, ...]:
    """Whitespace-normalized essay words; FileNotFoundError with instructions when missing."""
    if essay_path is None or not Path(essay_path).is_file():
        what = "no essay file was given" if essay_path is None else f"essay file {str(essay_path)!r} not found"
        raise FileNotFoundError(f"RULER task {task} needs the Paul Graham essay haystack, but {what}. {ESSAY_HOWTO}.")
    p = str(Path(essay_path).resolve())
    st = os.stat(p)
    return _essay_words_cached(p, st.st_mtime_ns, st.st_size)


_VENDORED_PUNKT = ("llama-index-core", "llama_index/core/_static/nltk_cache")


def _vendored_nltk_dir() -> str | None:
    import importlib.metadata

    try:
        d = Path(str(importlib.metadata.distribution(_VENDORED_PUNKT[0]).locate_file(_VENDORED_PUNKT[1])))
    except importlib.metadata.PackageNotFoundError:
        return None
    return str(d) if (d / "tokenizers" / "punkt_tab" / "english").is_dir() else None


def ensure_punkt() -> str:
    """Make sure ``nltk.sent_tokenize`` can run; returns the punkt_tab/english directory used
    (for the run record).  Raises FileNotFoundError (a missing data file) with install instructions."""
    try:
        import nltk
    except ImportError as e:
        raise ImportError(f"RULER essay tasks split sentences with NLTK: `pip install nltk`, then {PUNKT_HOWTO}") from e
    try:
        return str(nltk.data.find("tokenizers/punkt_tab/english/"))
    except LookupError:
        pass
    vendored = _vendored_nltk_dir()
    if vendored is not None:
        if vendored not in nltk.data.path:
            nltk.data.path.append(vendored)
        try:
            return str(nltk.data.find("tokenizers/punkt_tab/english/"))
        except LookupError:
            pass
    raise FileNotFoundError(f"NLTK punkt_tab data (tokenizers/punkt_tab/english) not found; {PUNKT_HOWTO}")


_PUNKT_READY = False


def _sent_tokenize(text: str) -> list[str]:
    global _PUNKT_READY
    if not _PUNKT_READY:
        ensure_punkt()
        _PUNKT_READY = True
    import nltk

    return nltk.sent_tokenize(text)


# ------------------------------------------------------------------------------------ generator
def _validate(task: str) -> dict:
    if task not in NIAH_TASKS:
        raise ValueError(f"unknown RULER NIAH task {task!r}; valid tasks: {', '.join(NIAH_TASKS)}")
    return NIAH_TASKS[task]


def _count_tokens(tokenizer, text: str) -> int:
    # spec §3.4: HF `tokenize` = no special tokens (chat-template special tokens count as one each)
    return len(tokenizer.tokenize(text))


class _NiahSampler:
    """Builds one full prompt for a given haystack size, consuming the shared random stream."""

    def __init__(self, task: str, cfg: dict, tokenizer, rng: random.Random, seed: int,
                 chat_template: bool, essay_words: tuple[str, ...] | None):
        self.task = task
        self.cfg = cfg
        self.tokenizer = tokenizer
        self.rng = rng
        self.seed = seed
        self.chat_template = chat_template
        self.essay_words = essay_words
        self.k = max(cfg["num_needle_k"], cfg["num_needle_q"])  # upstream: k raised to max(k, q)
        self.v = cfg["num_needle_v"]
        self.q = cfg["num_needle_q"]
        self.type_k = cfg["type_needle_k"]
        self.type_v = cfg["type_needle_v"]
        self.keys_pool = word_keys() if "words" in (self.type_k, self.type_v) else None
        template, prefix, type_name = NIAH_TEMPLATE, NIAH_ANSWER_PREFIX, self.type_v
        if self.q * self.v == 1:  # §5.1 single-needle rewrite (task text and answer prefix only)
            for old, new in SINGLE_NEEDLE_REWRITES:
                template = template.replace(old, new)
                prefix = prefix.replace(old, new)
            type_name = type_name[:-1]
        self.template, self.prefix_template, self.type_name = template, prefix, type_name

    def _draw(self, kind: str) -> str:
        r = self.rng
        if kind == "numbers":
            return str(r.randint(10**6, 10**7 - 1))
        if kind == "words":
            return r.choice(self.keys_pool)
        if kind == "uuids":
            return str(uuid.UUID(int=r.getrandbits(128), version=4))
        raise ValueError(f"unknown needle type {kind!r}")

    def _draw_key(self, taken) -> str:
        # Deviation: upstream does not guard against a key equal to an earlier one (a real key or, in
        # the needle haystack, a distractor equal to a real key), which makes the query ambiguous.  We
        # re-draw; the random stream is upstream's whenever no collision happens.
        key = self._draw(self.type_k)
        while key in taken:
            key = self._draw(self.type_k)
        return key

    def build(self, num_haystack: int):
        """Returns (full prompt, task text, answer prefix, answers)."""
        keys: list[str] = []
        values: list[list[str]] = []
        needles: list[str] = []
        for _ in range(self.k):
            key = self._draw_key(keys)
            keys.append(key)
            vals = []
            for _ in range(self.v):
                val = self._draw(self.type_v)
                vals.append(val)
                needles.append(NIAH_NEEDLE.format(type_needle_v=self.type_v, key=key, value=val))
            values.append(vals)
        # upstream: a fresh Random(seed) each time -> the same permutation pattern for every sample
        random.Random(self.seed).shuffle(needles)

        haystack = self.cfg["type_haystack"]
        if haystack == "essay":
            words = self.essay_words
            if num_haystack <= len(words):
                text = " ".join(words[:num_haystack])
            else:  # upstream: repeat the essay as often as needed and cut
                repeats = -(-num_haystack // len(words))
                text = " ".join((words * repeats)[:num_haystack])
            sents = _sent_tokenize(text.strip())
            depths = self.rng.sample(DEPTHS, len(needles))
            cuts = [0] + sorted(int(len(sents) * (d / 100)) for d in depths) + [len(sents)]
            parts = []
            for i in range(1, len(cuts)):
                parts.append(" ".join(sents[cuts[i - 1]:cuts[i]]))
                if i - 1 < len(needles):
                    parts.append(needles[i - 1])
            context = " ".join(parts)
        else:
            if haystack == "noise":
                lines = [NOISE_SENTENCE] * num_haystack
            elif haystack == "needle":
                taken = set(keys)
                lines = []
                for _ in range(num_haystack):
                    key = self._draw_key(taken)
                    lines.append(NIAH_NEEDLE.format(type_needle_v=self.type_v, key=key, value=self._draw(self.type_v)))
            else:
                raise ValueError(f"unknown haystack type {haystack!r}")
            positions = sorted(self.rng.sample(range(num_haystack), len(needles)), reverse=True)
            for pos, needle in zip(positions, needles):
                lines.insert(pos, needle)
            context = "\n".join(lines)

        picked = self.rng.sample(range(self.k), self.q)
        queries = [keys[i] for i in picked]
        answers = [a for i in picked for a in values[i]]
        query = ", ".join(queries[:-1]) + ", and " + queries[-1] if len(queries) > 1 else queries[0]

        task_text = self.template.format(type_needle_v=self.type_name, context=context, query=query)
        answer_prefix = self.prefix_template.format(type_needle_v=self.type_name, query=query)
        return self.wrap(task_text) + answer_prefix, task_text, answer_prefix, answers

    def wrap(self, task_text: str) -> str:
        return wrap(self.tokenizer, task_text, self.chat_template, self.task)


def haystack_unit(cfg: dict, context_length: int) -> int:
    """§4 step 1: essay 500 words; noise/needle 25 lines (5 below 4096 tokens)."""
    if cfg["type_haystack"] == "essay":
        return ESSAY_UNIT_WORDS
    return SMALL_LINE_UNIT if context_length < SMALL_CONTEXT_THRESHOLD else LINE_UNIT


def generate_niah_samples(task: str, tokenizer, context_length: int, num_samples: int, seed: int = 42,
                          chat_template: bool = True, essay_path: str | None = None) -> list[dict]:
    """Generate ``num_samples`` RULER samples of one NIAH task sized to ``context_length`` tokens.

    Each sample: {"index" (0..n-1), "task", "input" (the full prompt: chat template of the user turn
    with the generation prompt, then the answer prefix; or task text + answer prefix when
    chat_template=False), "outputs" (references), "answer_prefix", "length" (tokens of input without
    special tokens + max_new_tokens, <= context_length), "max_new_tokens" (128), "metric"
    ("string_match_all"), plus the record fields "chat_template" (bool), "num_haystack" (haystack
    units used: lines or essay words) and "token_position_answer" (tokens before the first answer)}.
    """
    cfg = _validate(task)
    if context_length <= 0 or num_samples < 0:
        raise ValueError(f"context_length must be > 0 and num_samples >= 0, got {context_length}, {num_samples}")
    essay_words = None
    if cfg["needs_essay"]:
        essay_words = load_essay_words(essay_path, task)
        ensure_punkt()
    ttg = cfg["tokens_to_generate"]
    rng = random.Random(seed)
    sampler = _NiahSampler(task, cfg, tokenizer, rng, seed, chat_template, essay_words)
    unit = haystack_unit(cfg, context_length)
    budget = context_length  # model_template_token is 0: the chat template counts inside the prompt

    def total_tokens(n: int):
        built = sampler.build(n)
        return _count_tokens(tokenizer, built[0]) + ttg, built

    # §4 step 2: probe one unit-sized sample for tokens per unit (consumes the random stream)
    probe_tokens = _count_tokens(tokenizer, sampler.build(unit)[0])
    per_unit = probe_tokens / unit
    lo, hi = unit, max(int((budget / per_unit) * SEARCH_SLACK), unit * 2)
    # §4 step 3: largest haystack size whose prompt + generation budget fits
    best = None
    smallest_fail = None
    while lo <= hi:
        mid = (lo + hi) // 2
        tokens, _ = total_tokens(mid)
        if tokens <= budget:
            best, lo = mid, mid + 1
        else:
            hi = mid - 1
            smallest_fail = (mid, tokens)
    if best is None:
        n, tokens = smallest_fail
        kind = "essay words" if cfg["type_haystack"] == "essay" else "haystack lines"
        raise ValueError(
            f"RULER {task}: context_length={context_length} is too small: even the smallest haystack "
            f"({n} {kind}, one unit) gives {tokens} tokens including the {ttg} tokens to generate. "
            f"Use a larger context_length."
        )

    samples = []
    for i in range(num_samples):
        used = best
        fails_at_min = 0
        while True:
            length, (full, task_text, answer_prefix, answers) = total_tokens(used)
            if length <= budget:
                break
            # §4 step 4 / upstream: a too-long sample (randomness) is redrawn one unit smaller
            if used > unit:
                used -= unit
            else:  # upstream loops forever here (pitfall 6)
                fails_at_min += 1
                if fails_at_min >= MAX_RETRIES_AT_MIN:
                    raise ValueError(
                        f"RULER {task}: sample {i} does not fit context_length={context_length} even with "
                        f"{used} haystack units after {fails_at_min} draws (last: {length} tokens). "
                        f"Use a larger context_length."
                    )
        pos = full.find(answers[0])
        samples.append({
            "index": i,
            "task": task,
            "input": full,
            "outputs": list(answers),
            "answer_prefix": answer_prefix,
            "length": length,
            "max_new_tokens": ttg,
            "metric": cfg["metric"],
            "chat_template": bool(chat_template),
            "num_haystack": used,
            "token_position_answer": _count_tokens(tokenizer, full[:pos]) if pos >= 0 else -1,
        })
    return samples


def punkt_info() -> str | None:
    """Location of the punkt_tab data that would be used (None if unavailable), for the run record."""
    try:
        return ensure_punkt()
    except (ImportError, FileNotFoundError):
        return None


__all__ = [
    "AdjNounKeys",
    "ensure_punkt",
    "generate_niah_samples",
    "haystack_unit",
    "load_essay_words",
    "punkt_info",
    "word_keys",
]
