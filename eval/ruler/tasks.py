"""RULER benchmark data: templates, answer prefixes, task configs of all 13 tasks.

Everything here is benchmark *data* (specification: docs/benchmarks/ruler.md),
copied byte for byte from NVIDIA/RULER at commit c3f5e3b (``scripts/data/synthetic/constants.py``,
``scripts/synthetic.yaml``, ``scripts/data/synthetic/{niah,variable_tracking,common_words_extraction,
freq_words_extraction,qa}.py``).  Do not edit the strings: every
byte changes the generated prompts.  Bump ``GENERATOR_VERSION`` whenever anything in this file or in
``niah.py`` changes the NIAH samples, and the family's entry of ``GENERATOR_VERSIONS`` for the others.
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

# NIAH tasks that need no external file (the noise sentence, random keys/values and the wonderwords
# lists shipped inside the `wonderwords` package are enough).
NIAH_SELF_CONTAINED_TASKS = ("niah_single_1", "niah_multikey_2", "niah_multikey_3")
# Tasks that need the Paul Graham essay corpus (and NLTK punkt for sentence splitting).
ESSAY_TASKS = tuple(name for name, cfg in NIAH_TASKS.items() if cfg["needs_essay"])

# =============================================================================================
# The other four families (spec §2, §3.1, §5.2-5.5), verbatim from constants.py / synthetic.yaml.
# Note the leading space of every answer prefix and the trailing space of the VT answer prefix.
VT_FAMILY = {
    "tokens_to_generate": 30,
    "template": (
        "Memorize and track the chain(s) of variable assignment hidden in the following text.\n\n{context}\n"
        "Question: Find all variables that are assigned the value {query} in the text above."
    ),
    "answer_prefix": (
        " Answer: According to the chain(s) of variable assignment in the text above, {num_v} variables "
        "are assigned the value {query}, they are: "
    ),
}
CWE_FAMILY = {
    "tokens_to_generate": 120,
    "template": (
        "Below is a numbered list of words. In these words, some appear more often than others. Memorize "
        "the ones that appear most often.\n{context}\nQuestion: What are the 10 most common words in the "
        "above list?"
    ),
    "answer_prefix": " Answer: The top 10 words that appear most often in the list are:",
}
FWE_FAMILY = {
    "tokens_to_generate": 50,
    "template": (
        "Read the following coded text and track the frequency of each coded word. Find the three most "
        "frequently appeared coded words. {context}\nQuestion: Do not provide any explanation. Please "
        "ignore the dots '....'. What are the three most frequently appeared words in the above coded text?"
    ),
    "answer_prefix": (
        " Answer: According to the coded text above, the three most frequently appeared words are:"
    ),
}
QA_FAMILY = {
    "tokens_to_generate": 32,
    "template": (
        "Answer the question based on the given documents. Only give me the answer and do not output any "
        "other words.\n\nThe following are given documents.\n\n{context}\n\nAnswer the question based on "
        "the given documents. Only give me the answer and do not output any other words.\n\nQuestion: {query}"
    ),
    "answer_prefix": " Answer:",
}
FAMILIES: dict[str, dict] = {
    "niah": NIAH_FAMILY,
    "variable_tracking": VT_FAMILY,
    "common_words_extraction": CWE_FAMILY,
    "freq_words_extraction": FWE_FAMILY,
    "qa": QA_FAMILY,
}

# §5.2 VT: unit = noise lines (10; 5 below 4096 tokens); the ICL example uses a 500-token budget and
# 5-line units with 3-letter names and the value 12345.
VT_LINE_UNIT = 10
VT_SMALL_LINE_UNIT = 5
VT_ICL_BUDGET = 500
VT_ICL_UNIT = 5
VT_ICL_NAME_LEN = 3
VT_ICL_VALUE = "12345"
VT_NAME_LEN = 5
# §5.3 CWE: unit 10 words, probe with 4096 words, upper bound 2 x.
CWE_WORD_UNIT = 10
CWE_PROBE_WORDS = 4096
CWE_SEARCH_SLACK = 2
# §5.4 FWE: coded word length 6 (start with budget // 6 words), vocabulary budget // 50, step budget // 32.
FWE_CODED_WORDLEN = 6
FWE_VOCAB_DIVISOR = 50
FWE_STEP_DIVISOR = 32
# §5.5 QA: unit 10 documents; document rendering.
QA_DOC_UNIT = 10
QA_DOCUMENT = "Document {i}:\n{document}"

# Per-family generator versions (part of the cache key).  The NIAH family keeps GENERATOR_VERSION.
GENERATOR_VERSIONS: dict[str, str] = {
    "niah": GENERATOR_VERSION,
    "variable_tracking": "ruler-vt-2",  # 2: upstream's search and random stream (conformance with c3f5e3b)
    "common_words_extraction": "ruler-cwe-2",  # 2: upstream's probe and bound
    "freq_words_extraction": "ruler-fwe-1",
    "qa": "ruler-qa-2",  # 2: upstream's probe; repeated documents kept
}

# §2: the 13 task configs (scripts/synthetic.yaml).
OTHER_TASKS: dict[str, dict] = {
    "vt": {"family": "variable_tracking", "tokens_to_generate": 30, "metric": "string_match_all",
           "type_haystack": "noise", "num_chains": 1, "num_hops": 4, "needs": ()},
    "cwe": {"family": "common_words_extraction", "tokens_to_generate": 120, "metric": "string_match_all",
            "freq_cw": 30, "freq_ucw": 3, "num_cw": 10, "needs": ()},  # english_words.json only if needed
    "fwe": {"family": "freq_words_extraction", "tokens_to_generate": 50, "metric": "string_match_all",
            "alpha": 2.0, "needs": ()},
    "qa_1": {"family": "qa", "tokens_to_generate": 32, "metric": "string_match_part", "dataset": "squad",
             "needs": ("squad",)},
    "qa_2": {"family": "qa", "tokens_to_generate": 32, "metric": "string_match_part", "dataset": "hotpotqa",
             "needs": ("hotpotqa",)},
}
ALL_TASKS: dict[str, dict] = {
    **{name: {**cfg, "needs": ("essay",) if cfg["needs_essay"] else ()} for name, cfg in NIAH_TASKS.items()},
    **OTHER_TASKS,
}
# Tasks that need no external file at all (pure RNG + constant noise sentence).
SELF_CONTAINED_TASKS = ("niah_single_1", "niah_multikey_2", "niah_multikey_3", "vt", "fwe")

# §9 per-category view (paper).
CATEGORIES: dict[str, tuple[str, ...]] = {
    "NIAH": tuple(NIAH_TASKS),
    "VT": ("vt",),
    "Aggregation": ("cwe", "fwe"),
    "QA": ("qa_1", "qa_2"),
}
