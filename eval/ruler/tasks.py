"""RULER needle-in-a-haystack benchmark data: templates, answer prefixes, task configs.

Everything here is benchmark *data* (specification: shared/specs/ruler.md §2, §3.1, §4, §5.1),
copied byte for byte from NVIDIA/RULER at commit c3f5e3b (``scripts/data/synthetic/constants.py``,
``scripts/synthetic.yaml``, ``scripts/data/synthetic/niah.py``).  Do not edit the strings: every
byte changes the generated prompts.  Bump ``GENERATOR_VERSION`` whenever anything in this file or in
``niah.py`` changes the generated samples.
"""

from __future__ import annotations

# Version of the NIAH generator output (part of the cache key of generated files).  Bump it whenever
# a change in this package changes any generated sample (text, answers, lengths).
GENERATOR_VERSION = "ruler-niah-1"

# ---------------------------------------------------------------------------------------------
# §3.1 — verbatim task template, answer prefix and generation budget of the "niah" family.
# Note the leading space of the answer prefix.
NIAH_FAMILY = {
    "tokens_to_generate": 128,
    "template": (
        "Some special magic {type_needle_v} are hidden within the following text. Make sure to "
        "memorize it. I will quiz you about the {type_needle_v} afterwards.\n{context}\nWhat are all "
        "the special magic {type_needle_v} for {query} mentioned in the provided text?"
    ),
    "answer_prefix": " The special magic {type_needle_v} for {query} mentioned in the provided text are",
}
NIAH_TEMPLATE: str = NIAH_FAMILY["template"]
NIAH_ANSWER_PREFIX: str = NIAH_FAMILY["answer_prefix"]
NIAH_TOKENS_TO_GENERATE: int = NIAH_FAMILY["tokens_to_generate"]

# §5.1 — needle sentence (the type name is always the plural one, e.g. "numbers").
NIAH_NEEDLE = "One of the special magic {type_needle_v} for {key} is: {value}."

# §5.1 — the "noise" haystack line (called "repeat" in pre-May-2025 configs).
NOISE_SENTENCE = "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again."

# §5.1 — single-needle rewrite (q * v == 1): plain substring replacements applied in this order;
# the needle type name additionally loses its trailing "s".
SINGLE_NEEDLE_REWRITES: tuple[tuple[str, str], ...] = (
    ("Some", "A"),
    ("are all", "is"),
    ("are", "is"),
    ("answers", "answer"),
)

# §5.1 — essay needle depths (percent) = round(linspace(0, 100, 40)) (numpy's round-half-to-even).
DEPTHS: tuple[int, ...] = (
    0, 3, 5, 8, 10, 13, 15, 18, 21, 23, 26, 28, 31, 33, 36, 38, 41, 44, 46, 49,
    51, 54, 56, 59, 62, 64, 67, 69, 72, 74, 77, 79, 82, 85, 87, 90, 92, 95, 97, 100,
)

# §4 — haystack units ("incremental" upstream): essay = words, noise/needle = lines.  Non-essay
# haystacks use the small unit when the target length is below SMALL_CONTEXT_THRESHOLD.
ESSAY_UNIT_WORDS = 500
LINE_UNIT = 25
SMALL_LINE_UNIT = 5
SMALL_CONTEXT_THRESHOLD = 4096
# §4 step 2 — upper bound of the binary search = SEARCH_SLACK x (budget / tokens per unit).
SEARCH_SLACK = 3

# ---------------------------------------------------------------------------------------------
# §2 — the eight NIAH task configs (scripts/synthetic.yaml).  `num_needle_k` is raised to
# max(num_needle_k, num_needle_q) by the generator, as upstream does.
_NIAH_COMMON = {
    "family": "niah",
    "tokens_to_generate": NIAH_TOKENS_TO_GENERATE,
    "metric": "string_match_all",
}


def _niah(type_haystack: str, type_needle_k: str, type_needle_v: str, k: int, v: int, q: int) -> dict:
    return {
        **_NIAH_COMMON,
        "type_haystack": type_haystack,
        "type_needle_k": type_needle_k,
        "type_needle_v": type_needle_v,
        "num_needle_k": k,
        "num_needle_v": v,
        "num_needle_q": q,
        "needs_essay": type_haystack == "essay",
    }


NIAH_TASKS: dict[str, dict] = {
    "niah_single_1": _niah("noise", "words", "numbers", 1, 1, 1),
    "niah_single_2": _niah("essay", "words", "numbers", 1, 1, 1),
    "niah_single_3": _niah("essay", "words", "uuids", 1, 1, 1),
    "niah_multikey_1": _niah("essay", "words", "numbers", 4, 1, 1),
    "niah_multikey_2": _niah("needle", "words", "numbers", 1, 1, 1),
    "niah_multikey_3": _niah("needle", "uuids", "uuids", 1, 1, 1),
    "niah_multivalue": _niah("essay", "words", "numbers", 1, 4, 1),
    "niah_multiquery": _niah("essay", "words", "numbers", 4, 1, 4),
}

# Tasks that need no external file (the noise sentence, random keys/values and the wonderwords lists
# shipped inside the `wonderwords` package are enough).
SELF_CONTAINED_TASKS = ("niah_single_1", "niah_multikey_2", "niah_multikey_3")
# Tasks that need the Paul Graham essay corpus (and NLTK punkt for sentence splitting).
ESSAY_TASKS = tuple(name for name, cfg in NIAH_TASKS.items() if cfg["needs_essay"])
