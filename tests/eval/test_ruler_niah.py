"""RULER NIAH generator and scorer tests (docs/benchmarks/ruler.md, docs/benchmarks/README.md).

Self-contained tasks run on the embedded SmolLM2 tokenizer and on a whitespace tokenizer stub.
Essay tasks use a small invented essay written to a temporary file; their sentence splitting uses
NLTK's punkt_tab data, which `make install` provides offline.
"""

from __future__ import annotations

import json
import random
import re
import time

import pytest

from eval.ruler import metrics as M
from eval.ruler import niah as N
from eval.ruler.tasks import (
    DEPTHS,
    ESSAY_TASKS,
    GENERATOR_VERSION,
    NIAH_ANSWER_PREFIX,
    NIAH_TASKS,
    NIAH_TEMPLATE,
    NIAH_TOKENS_TO_GENERATE,
)
from eval.ruler.tasks import (
    NIAH_SELF_CONTAINED_TASKS as SELF_CONTAINED_TASKS,  # the NIAH subset of tasks.SELF_CONTAINED_TASKS
)
from tests.helpers import WhitespaceTokenizer

# ---------------------------------------------------------------------------------- fixtures




def make_essay(n_words: int = 3000, seed: int = 7) -> str:
    """~3,000 words of invented prose with many sentence ends (no copyrighted text, no 7-digit numbers)."""
    r = random.Random(seed)
    subj = ["The founder", "A startup", "The investor", "Every programmer", "The small team", "Our city",
            "The old library", "A good essay", "The market", "Most people"]
    verb = ["builds", "questions", "ignores", "remembers", "changes", "notices", "writes about", "argues for",
            "learns from", "waits for"]
    obj = ["the quiet river", "a better tool", "the early users", "an odd idea", "the hard problem",
           "a long winter", "the simple plan", "their own work", "the next step", "a strange map"]
    tail = ["", " before noon", " with great care", " in the spring", " after a while", " without fear"]
    out, n = [], 0
    while n < n_words:
        s = f"{r.choice(subj)} {r.choice(verb)} {r.choice(obj)}{r.choice(tail)}."
        if r.random() < 0.15:
            s = s[:-1] + "? Yes, it does."
        if r.random() < 0.05:
            s += "\n\n"
        out.append(s)
        n += len(s.split())
    return " ".join(out)


@pytest.fixture(scope="module")
def essay_file(tmp_path_factory):
    d = tmp_path_factory.mktemp("ruler_sources")
    p = d / "PaulGrahamEssays.json"
    p.write_text(json.dumps({"text": make_essay()}), encoding="utf-8")
    return p


@pytest.fixture(scope="module")
def punkt():
    # nltk is a dependency and `make install` installs the punkt_tab data (vendored in llama-index-core)
    return N.ensure_punkt()


# ---------------------------------------------------------------------------------- helpers

NEEDLE_RE = re.compile(r"One of the special magic (numbers|uuids) for (.+?) is: ([0-9a-f-]+)\.")


def needles_in(text):
    return [(m.group(2), m.group(3)) for m in NEEDLE_RE.finditer(text)]


def query_keys(sample):
    m = re.search(r"The special magic (?:numbers?|uuids?) for (.+) mentioned in the provided text (?:is|are)$",
                  sample["answer_prefix"])
    assert m, sample["answer_prefix"]
    q = m.group(1)
    if ", and " in q:
        head, last = q.rsplit(", and ", 1)
        return head.split(", ") + [last]
    return [q]


def check_needles(sample, cfg):
    """Every answer once in the input, in exactly one needle whose key was queried; keys of the
    real needles are distinct from every other needle's key."""
    text = sample["input"]
    found = needles_in(text)
    keys = query_keys(sample)
    assert len(keys) == cfg["num_needle_q"]
    # answers = the values of the queried keys, key by key in query order (the needles themselves are
    # shuffled, so the values of one key may appear in any order in the text)
    nv = cfg["num_needle_v"]
    for i, k in enumerate(keys):
        assert sorted(v for kk, v in found if kk == k) == sorted(sample["outputs"][i * nv:(i + 1) * nv])
    assert len(sample["outputs"]) == cfg["num_needle_q"] * cfg["num_needle_v"]
    for v in sample["outputs"]:
        assert text.count(v) == 1, v
    for k in keys:
        assert sum(1 for kk, _ in found if kk == k) == cfg["num_needle_v"], k
    k_needles = max(cfg["num_needle_k"], cfg["num_needle_q"]) * cfg["num_needle_v"]
    if cfg["type_haystack"] == "needle":
        assert len(found) > 20  # distractor needles
    else:
        assert len(found) == k_needles
    return found


def fill_ok(samples, L, lo):
    for s in samples:
        assert s["length"] <= L
        assert s["length"] >= lo * L, (s["length"], L)


# ---------------------------------------------------------------------------------- task data


SPEC_NIAH = json.loads(r"""{
  "tokens_to_generate": 128,
  "template": "Some special magic {type_needle_v} are hidden within the following text. Make sure to memorize it. I will quiz you about the {type_needle_v} afterwards.\n{context}\nWhat are all the special magic {type_needle_v} for {query} mentioned in the provided text?",
  "answer_prefix": " The special magic {type_needle_v} for {query} mentioned in the provided text are"
}""")


def test_task_data_verbatim():
    assert NIAH_TEMPLATE == SPEC_NIAH["template"]
    assert NIAH_ANSWER_PREFIX == SPEC_NIAH["answer_prefix"]
    assert NIAH_TOKENS_TO_GENERATE == 128
    np = pytest.importorskip("numpy")
    assert list(DEPTHS) == [int(x) for x in np.round(np.linspace(0, 100, num=40, endpoint=True)).astype(int)]
    assert isinstance(GENERATOR_VERSION, str) and GENERATOR_VERSION
    table = {  # spec §2: haystack, key, value, k, v, q
        "niah_single_1": ("noise", "words", "numbers", 1, 1, 1),
        "niah_single_2": ("essay", "words", "numbers", 1, 1, 1),
        "niah_single_3": ("essay", "words", "uuids", 1, 1, 1),
        "niah_multikey_1": ("essay", "words", "numbers", 4, 1, 1),
        "niah_multikey_2": ("needle", "words", "numbers", 1, 1, 1),
        "niah_multikey_3": ("needle", "uuids", "uuids", 1, 1, 1),
        "niah_multivalue": ("essay", "words", "numbers", 1, 4, 1),
        "niah_multiquery": ("essay", "words", "numbers", 4, 1, 4),
    }
    assert set(NIAH_TASKS) == set(table)
    for name, row in table.items():
        c = NIAH_TASKS[name]
        assert (c["type_haystack"], c["type_needle_k"], c["type_needle_v"], c["num_needle_k"],
                c["num_needle_v"], c["num_needle_q"]) == row
        assert c["metric"] == "string_match_all" and c["tokens_to_generate"] == 128
    assert SELF_CONTAINED_TASKS == ("niah_single_1", "niah_multikey_2", "niah_multikey_3")
    assert set(ESSAY_TASKS) == set(table) - set(SELF_CONTAINED_TASKS)


def test_word_keys_lazy_equals_sorted_set():
    # tricky lists: hyphenated adjectives extending others (interleaving blocks), a space, upper
    # case, duplicates and a collision ("high-pitched" + "x" == "high" + "pitched-x")
    adjs = ["high", "high-pitched", "high-pitched-ish", "ad hoc", "ad", "Early", "zany", "high", "teeny-tiny", "a"]
    nouns = ["pitched-x", "x", "ATM", "contact lens", "zoo", "b-c", "ish-b", "pitched"]
    brute = sorted(set(f"{a}-{n}" for a in adjs for n in nouns))
    lazy = N.AdjNounKeys(adjs, nouns)
    assert len(lazy) == len(brute)
    assert [lazy[i] for i in range(len(lazy))] == brute
    assert lazy[-1] == brute[-1]
    with pytest.raises(IndexError):
        lazy[len(brute)]
    # random.choice only needs len + indexing: same stream -> same keys
    assert [random.Random(3).choice(lazy) for _ in range(5)] == [random.Random(3).choice(brute) for _ in range(5)]


def test_word_keys_real_lists():
    import wonderwords.random_word as rw

    # same reading as RULER's wonderwords.random_word._get_words_from_text_file
    assert N._read_wordlist("nounlist.txt") == rw._get_words_from_text_file("nounlist.txt")
    assert N._read_wordlist("adjectivelist.txt") == rw._get_words_from_text_file("adjectivelist.txt")
    keys = N.word_keys()
    # wonderwords 3.0.1: 910 distinct adjectives x 6782 nouns, verified once against the 6.2 M-entry
    # materialized sorted(set(...)) list (all entries equal)
    assert len(keys) == 6_171_620
    assert keys[0] == "Early-ATM" and keys[-1] == "zonked-zucchini"


# ---------------------------------------------------------------------------------- generator, real tokenizer


@pytest.fixture(scope="module")
def smollm_samples(tok):
    return {t: N.generate_niah_samples(t, tok, 4096, 4, seed=42) for t in SELF_CONTAINED_TASKS}


@pytest.mark.parametrize("task", SELF_CONTAINED_TASKS)
def test_self_contained_properties_smollm2(tok, smollm_samples, task):
    samples = smollm_samples[task]
    cfg = NIAH_TASKS[task]
    assert [s["index"] for s in samples] == [0, 1, 2, 3]
    for s in samples:
        assert s["task"] == task and s["metric"] == "string_match_all" and s["max_new_tokens"] == 128
        assert s["chat_template"] is True
        assert s["length"] == len(tok.tokenize(s["input"])) + 128
        # answer prefix at the very end, right after the generation prompt
        assert s["input"].endswith(s["answer_prefix"])
        head = s["input"][: -len(s["answer_prefix"])]
        assert head.endswith("<|im_start|>assistant\n")
        content = head.split("<|im_start|>user\n", 1)[1].rsplit("<|im_end|>\n<|im_start|>assistant\n", 1)[0]
        assert head == tok.apply_chat_template([{"role": "user", "content": content}],
                                               add_generation_prompt=True, tokenize=False)
        # single-needle rewrite in the task text, chat template untouched
        assert content.startswith("A special magic ") and "You are a helpful AI assistant" in head
        check_needles(s, cfg)
        assert 0 < s["token_position_answer"] < s["length"]
    # close to the target: the search fits one line at a time; a too-long redraw loses one 25-line unit
    assert max(s["length"] for s in samples) >= 0.97 * 4096
    fill_ok(samples, 4096, 0.7)


def test_generation_speed_self_contained(tok):
    t0 = time.perf_counter()
    for task in SELF_CONTAINED_TASKS:
        N.generate_niah_samples(task, tok, 4096, 4, seed=1)
    assert time.perf_counter() - t0 < 5.0


# ---------------------------------------------------------------------------------- generator, whitespace stub


@pytest.mark.parametrize("L", [512, 4096])
@pytest.mark.parametrize("task", SELF_CONTAINED_TASKS)
def test_fill_whitespace_stub(ws, task, L):
    samples = N.generate_niah_samples(task, ws, L, 5, seed=42, chat_template=False)
    assert len(samples) == 5
    fill_ok(samples, L, 0.9)
    for s in samples:
        assert s["chat_template"] is False
        assert s["length"] == len(s["input"].split()) + 128
        check_needles(s, NIAH_TASKS[task])
    unit = 5 if L < 4096 else 25
    assert all(s["num_haystack"] >= unit for s in samples)


def test_single_needle_rewrite_text(ws):
    s = N.generate_niah_samples("niah_single_1", ws, 1024, 1, chat_template=False)[0]
    key = query_keys(s)[0]
    assert s["input"].startswith(
        "A special magic number is hidden within the following text. Make sure to memorize it. "
        "I will quiz you about the number afterwards.\n")
    assert s["answer_prefix"] == f" The special magic number for {key} mentioned in the provided text is"
    assert s["input"].endswith(
        f"\nWhat is the special magic number for {key} mentioned in the provided text?" + s["answer_prefix"])
    assert f"One of the special magic numbers for {key} is: {s['outputs'][0]}." in s["input"]  # needle stays plural
    u = N.generate_niah_samples("niah_multikey_3", ws, 1024, 1, chat_template=False)[0]
    assert u["input"].startswith("A special magic uuid is hidden within the following text.")
    assert "I will quiz you about the uuid afterwards.\n" in u["input"]
    assert u["answer_prefix"].startswith(" The special magic uuid for ") and u["answer_prefix"].endswith(" is")
    assert re.fullmatch(r"[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}", u["outputs"][0])
    (line,) = [ln for ln in u["input"].split("\n") if u["outputs"][0] in ln]
    assert line == f"One of the special magic uuids for {query_keys(u)[0]} is: {u['outputs'][0]}."


def test_noise_haystack_layout(ws):
    s = N.generate_niah_samples("niah_single_1", ws, 1024, 1, chat_template=False)[0]
    body = s["input"].split("afterwards.\n", 1)[1].rsplit("\nWhat is the special", 1)[0]
    lines = body.split("\n")
    assert len(lines) == s["num_haystack"] + 1
    noise = [ln for ln in lines if not ln.startswith("One of the special magic")]
    assert set(noise) == {"The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again."}
    assert re.fullmatch(r"\d{7}", s["outputs"][0])


def test_multikey_distractors_distinct(ws, smollm_samples):
    for s in smollm_samples["niah_multikey_2"] + smollm_samples["niah_multikey_3"]:
        found = needles_in(s["input"])
        (key,) = query_keys(s)
        assert [k for k, _ in found].count(key) == 1
        assert all(v != s["outputs"][0] for k, v in found if k != key)
    for s in N.generate_niah_samples("niah_multikey_2", ws, 4096, 3, seed=5, chat_template=False):
        keys = [k for k, _ in needles_in(s["input"])]
        assert keys.count(query_keys(s)[0]) == 1 and len(keys) > 100


def test_deterministic_and_seed_dependent(ws):
    before = random.getstate()
    a = N.generate_niah_samples("niah_multikey_2", ws, 2048, 3, seed=42, chat_template=False)
    assert random.getstate() == before  # no global random state used
    b = N.generate_niah_samples("niah_multikey_2", ws, 2048, 3, seed=42, chat_template=False)
    c = N.generate_niah_samples("niah_multikey_2", ws, 2048, 3, seed=43, chat_template=False)
    assert a == b
    assert [s["input"] for s in a] != [s["input"] for s in c]
    assert a[0]["input"] != a[1]["input"]  # samples differ within a run


def test_chat_template_switch_recorded(tok):
    a = N.generate_niah_samples("niah_single_1", tok, 1024, 1, chat_template=True)[0]
    b = N.generate_niah_samples("niah_single_1", tok, 1024, 1, chat_template=False)[0]
    assert a["chat_template"] is True and b["chat_template"] is False
    assert a["input"].startswith("<|im_start|>system\n")
    assert b["input"].startswith("A special magic number is hidden")
    assert a["length"] <= 1024 and b["length"] <= 1024


# ---------------------------------------------------------------------------------- errors


def test_unknown_task():
    with pytest.raises(ValueError) as e:
        N.generate_niah_samples("niah_single_9", WhitespaceTokenizer(), 4096, 1)
    for name in NIAH_TASKS:
        assert name in str(e.value)


@pytest.mark.parametrize("task", ESSAY_TASKS)
def test_missing_essay_file(task, tmp_path):
    with pytest.raises(FileNotFoundError) as e:
        N.generate_niah_samples(task, WhitespaceTokenizer(), 4096, 1)
    msg = str(e.value)
    assert task in msg and "benchmark.essay_path=" in msg and "PaulGrahamEssays.json" in msg
    missing = tmp_path / "nope.json"
    with pytest.raises(FileNotFoundError) as e:
        N.generate_niah_samples(task, WhitespaceTokenizer(), 4096, 1, essay_path=str(missing))
    assert str(missing) in str(e.value) and "benchmark.essay_path=" in str(e.value)


@pytest.mark.timeout(30)
@pytest.mark.parametrize("task", SELF_CONTAINED_TASKS)
def test_context_too_small_exits(ws, task):
    # upstream loops forever when one haystack unit does not fit (ruler.md pitfall 6)
    with pytest.raises(ValueError, match="too small"):
        N.generate_niah_samples(task, ws, 200, 2, chat_template=False)


@pytest.mark.timeout(30)
def test_essay_context_too_small_exits(ws, essay_file, punkt):
    # essay unit = 500 words even below 4096: 512 tokens cannot hold one unit
    with pytest.raises(ValueError, match="too small"):
        N.generate_niah_samples("niah_single_2", ws, 512, 2, chat_template=False, essay_path=str(essay_file))


def test_missing_punkt_message(monkeypatch):
    nltk = pytest.importorskip("nltk")

    def nope(*a, **k):
        raise LookupError("gone")

    monkeypatch.setattr(nltk.data, "find", nope)
    monkeypatch.setattr(N, "_vendored_nltk_dir", lambda: None)
    with pytest.raises(FileNotFoundError, match="punkt_tab") as e:
        N.ensure_punkt()
    assert "nltk.downloader punkt_tab" in str(e.value)


# ---------------------------------------------------------------------------------- essay tasks


def test_essay_loading_json_and_txt(essay_file, tmp_path):
    words = N.load_essay_words(str(essay_file))
    txt = tmp_path / "essay.txt"
    txt.write_text(json.loads(essay_file.read_text())["text"], encoding="utf-8")
    assert N.load_essay_words(str(txt)) == words
    assert 2900 < len(words) < 3200 and all(w == w.strip() for w in words)
    bad = tmp_path / "bad.json"
    bad.write_text('{"body": "x"}')
    with pytest.raises(ValueError, match="text"):
        N.load_essay_words(str(bad))


def _check_essay_depths(s, essay_words):
    """Needles sit between sentences of sent_tokenize(first num_haystack words) at int(n * depth/100)."""
    import nltk

    n = s["num_haystack"]
    words = essay_words
    if n > len(words):
        words = words * (-(-n // len(words)))
    sents = nltk.sent_tokenize(" ".join(words[:n]).strip())
    allowed = {int(len(sents) * (d / 100)) for d in DEPTHS}
    text = s["input"]
    ctx = text.split("afterwards.\n", 1)[1].rsplit("\nWhat ", 1)[0]
    spans = [m.span() for m in NEEDLE_RE.finditer(ctx)]
    # removing the needles leaves exactly the sentences (single spaces)
    stripped = ctx
    for a, b in reversed(spans):
        stripped = stripped[:a] + stripped[b:]
    assert " ".join(stripped.split(" ")).split() == " ".join(sents).split()
    for a, _ in spans:
        before = NEEDLE_RE.sub("", ctx[:a]).split()
        # count whole sentences before the needle
        joined, k = [], 0
        while len(joined) < len(before):
            joined += sents[k].split()
            k += 1
        assert joined == before
        assert k in allowed


@pytest.mark.parametrize("task", ESSAY_TASKS)
def test_essay_tasks_properties(tok, essay_file, punkt, task):
    samples = N.generate_niah_samples(task, tok, 4096, 3, seed=42, essay_path=str(essay_file))
    words = N.load_essay_words(str(essay_file))
    cfg = NIAH_TASKS[task]
    for s in samples:
        assert s["length"] == len(tok.tokenize(s["input"])) + 128 and s["length"] <= 4096
        assert s["input"].endswith(s["answer_prefix"])
        assert s["input"][: -len(s["answer_prefix"])].endswith("<|im_start|>assistant\n")
        found = check_needles(s, cfg)
        assert len({k for k, _ in found}) == max(cfg["num_needle_k"], cfg["num_needle_q"])
        _check_essay_depths(s, words)
    # the search fits to the word, but a sample whose random keys make it too long is redrawn one
    # 500-word unit (~570 tokens here) smaller (upstream rule), so only ~86% is guaranteed
    assert max(s["length"] for s in samples) >= 0.85 * 4096
    fill_ok(samples, 4096, 0.75)
    if cfg["num_needle_q"] * cfg["num_needle_v"] > 1:
        assert "Some special magic numbers are hidden" in samples[0]["input"]
        assert samples[0]["answer_prefix"].endswith(" mentioned in the provided text are")
    else:
        assert "\nWhat is the special magic " in samples[0]["input"]


def test_essay_whitespace_fill_and_determinism(ws, essay_file, punkt):
    a = N.generate_niah_samples("niah_multiquery", ws, 4096, 5, seed=42, chat_template=False,
                                essay_path=str(essay_file))
    fill_ok(a, 4096, 0.85)
    assert max(s["length"] for s in a) >= 0.99 * 4096
    q = query_keys(a[0])
    assert len(q) == 4 and f"{q[0]}, {q[1]}, {q[2]}, and {q[3]}" in a[0]["answer_prefix"]
    b = N.generate_niah_samples("niah_multiquery", ws, 4096, 5, seed=42, chat_template=False,
                                essay_path=str(essay_file))
    assert a == b


# ---------------------------------------------------------------------------------- metrics R1-R11


@pytest.mark.parametrize("rid,metric,preds,refs,expected", [
    ("R1", "string_match_all", ["The numbers are 123 and 456"], [["123", "456", "789"]], 66.67),
    ("R2", "string_match_all", ["ABC-DEF"], [["abc-def"]], 100.0),
    ("R3", "string_match_all", ["1234567", "nothing"], [["1234567"], ["7654321"]], 50.0),
    ("R4", "string_match_all", ["a", "b", "c"], [["a"], ["a"], ["a"]], 33.33),
    ("R5", "string_match_all", ["12345678"], [["1234567"]], 100.0),
    ("R6", "string_match_part", ["Paris"], [["paris", "Paris, France"]], 100.0),
    ("R7", "string_match_part", ["It is in France"], [["Paris", "France"]], 100.0),
    ("R8", "string_match_all", ["  12\u000034 "], [["1234"]], 0.0),
    ("R9", "string_match_all", ["12\t34"], [["12\t34"]], 0.0),
])
def test_metric_cases(rid, metric, preds, refs, expected):
    pp = [M.postprocess(p) for p in preds]
    assert M.METRICS[metric](pp, refs) == pytest.approx(expected, abs=1e-6)
    per = [M.sample_score(p, r, metric) for p, r in zip(preds, refs)]
    assert M.task_score(per) == pytest.approx(expected, abs=1e-6)


def test_postprocess():
    assert M.postprocess("  12\u000034 ") == "12\n34"
    assert M.postprocess("12\t34") == "12\n34"
    assert M.postprocess("\n\t x \x1f\r\n") == "x"
    assert M.postprocess(" a\x7fb ") == "a\x7fb"  # only \x00-\x1f
    for s in ["  12\u000034 ", "a\r\nb", "", " \t "]:
        assert M.postprocess(M.postprocess(s)) == M.postprocess(s)
    assert M.count_nulls(["", " \n ", "x"]) == 2


def test_metric_details():
    assert M.string_match_part(["nothing"], [["a", "b"]]) == 0.0
    assert M.string_match_all(["a b"], [["A", "B", "c", "d"]]) == 50.0
    assert M.sample_score("  The special magic number is 1234567\n", ["1234567"], "string_match_all") == 100.0
    with pytest.raises(ValueError):
        M.sample_score("x", ["x"], "rouge")
    with pytest.raises(ValueError):
        M.string_match_all(["a", "b"], [["a"]])


def test_aggregation_r10_r11():
    r10 = M.aggregate_lengths({4096: 95.5, 8192: 93.8, 16384: 91.6, 32768: 87.4, 65536: 84.7, 131072: 77.0})
    assert r10["avg"] == pytest.approx(88.33, abs=1e-6)
    assert r10["wavg_inc"] == pytest.approx(85.38, abs=1e-6)
    assert r10["wavg_dec"] == pytest.approx(91.29, abs=1e-6)
    assert r10["effective_length"] == 32768  # 87.4 > 85.6 at 32K, 84.7 at 64K
    assert M.length_score([100.0] * 12 + [35.0]) == pytest.approx(95.0, abs=1e-6)
    assert M.aggregate_lengths({4096: 50.0})["effective_length"] is None
