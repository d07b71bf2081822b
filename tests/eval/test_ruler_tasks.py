"""RULER vt / cwe / fwe / qa generators, the generate_samples entry point with its cache, and the
aggregation helpers (docs/benchmarks/ruler.md; docs/benchmarks/README.md)."""

from __future__ import annotations

import json
import re
import shutil
import time
from collections import Counter
from pathlib import Path

import pytest

from eval.ruler import aggregate as A
from eval.ruler import generate as G
from eval.ruler import metrics as M
from eval.ruler.tasks import (
    ALL_TASKS,
    CATEGORIES,
    CWE_FAMILY,
    FWE_FAMILY,
    NIAH_TASKS,
    QA_FAMILY,
    SELF_CONTAINED_TASKS,
    VT_FAMILY,
)
from tests.helpers import WhitespaceTokenizer

SOURCES = Path(__file__).parents[1] / "fixtures" / "ruler" / "sources"
NEW_TASKS = ("vt", "cwe", "fwe", "qa_1", "qa_2")




@pytest.fixture(scope="module")
def smollm(tok):
    # the HotpotQA fixture has 2 questions, the SQuAD fixture 3 answerable ones
    return {t: G.generate_samples(t, tok, 4096, 2 if t == "qa_2" else 3, seed=42, data_dir=SOURCES)
            for t in NEW_TASKS}


# ---------------------------------------------------------------------------------- task data


def test_task_table():
    assert len(ALL_TASKS) == 13
    assert set(ALL_TASKS) == set(NIAH_TASKS) | set(NEW_TASKS)
    assert SELF_CONTAINED_TASKS == ("niah_single_1", "niah_multikey_2", "niah_multikey_3", "vt", "fwe")
    expected = {"vt": (30, "string_match_all"), "cwe": (120, "string_match_all"), "fwe": (50, "string_match_all"),
                "qa_1": (32, "string_match_part"), "qa_2": (32, "string_match_part")}
    for t, (ttg, metric) in expected.items():
        assert (ALL_TASKS[t]["tokens_to_generate"], ALL_TASKS[t]["metric"]) == (ttg, metric)
    # verbatim spec details that are easy to lose
    assert VT_FAMILY["answer_prefix"].startswith(" Answer:") and VT_FAMILY["answer_prefix"].endswith("they are: ")
    for fam in (CWE_FAMILY, FWE_FAMILY, QA_FAMILY):
        assert fam["answer_prefix"].startswith(" Answer:")
    assert sorted(t for ts in CATEGORIES.values() for t in ts) == sorted(ALL_TASKS)


# ---------------------------------------------------------------------------------- shared properties


def _common_checks(tok, samples, task, L, fill):
    cfg = ALL_TASKS[task]
    assert [s["index"] for s in samples] == list(range(len(samples)))
    for s in samples:
        assert s["task"] == task and s["metric"] == cfg["metric"]
        assert s["max_new_tokens"] == cfg["tokens_to_generate"] and s["chat_template"] is True
        assert s["length"] == len(tok.tokenize(s["input"])) + s["max_new_tokens"]
        assert fill * L <= s["length"] <= L
        # the answer prefix is at the very end, right after the generation prompt
        assert s["input"].endswith(s["answer_prefix"])
        assert s["input"][: -len(s["answer_prefix"])].endswith("<|im_start|>assistant\n")
        assert s["outputs"] and all(isinstance(o, str) and o for o in s["outputs"])
        json.dumps(s, ensure_ascii=True)


@pytest.mark.parametrize("task,fill", [("vt", 0.9), ("cwe", 0.9), ("fwe", 0.8), ("qa_1", 0.9), ("qa_2", 0.9)])
def test_common_properties_smollm2(tok, smollm, task, fill):
    _common_checks(tok, smollm[task], task, 4096, fill)


def test_vt_answers(smollm):
    for s in smollm["vt"]:
        names = s["outputs"]
        assert len(names) == 5 and len(set(names)) == 5
        assert all(re.fullmatch(r"[A-Z]{5}", n) for n in names)
        text = s["input"]
        value = re.search(r"assigned the value (\d{5}), they are: $", text).group(1)
        assert f"VAR {names[0]} = {value}\n" in text
        for a, b in zip(names, names[1:]):
            assert f"VAR {b} = VAR {a} \n" in text
        # the chain is recoverable from the prompt: follow the assignments from the value
        body = text.split("Memorize and track")[-1]  # the real task (after the ICL example)
        found, frontier = set(), {value}
        while frontier:
            nxt = set()
            for m in re.finditer(r"VAR ([A-Z]+) = (?:VAR )?(\w+)", body):
                if m.group(2) in frontier and m.group(1) not in found:
                    nxt.add(m.group(1))
            found |= nxt
            frontier = nxt
        assert found == set(names)
        # one-shot ICL example with different (3-letter) names, then a blank line before the task
        icl = text.split("Memorize and track")[1]
        icl_names = re.findall(r"VAR ([A-Z]+) = ", icl)
        assert len(icl_names) == 5 and all(len(n) == 3 for n in icl_names) and not set(icl_names) & set(names)
        assert "12345" not in text
        assert text.count("Memorize and track") == 2 and "\n\nMemorize and track" in text


def _cwe_counts(text):
    target = text[text.rindex("Below is a numbered list"):]
    return Counter(re.findall(r"\d+\. (.+?)(?= \d+\. |\n)", target))


def test_cwe_answers(smollm):
    for s in smollm["cwe"]:
        counts = _cwe_counts(s["input"])
        assert len(s["outputs"]) == 10
        assert all(counts[w] == 30 for w in s["outputs"])
        assert all(c == 3 for w, c in counts.items() if w not in s["outputs"])
        # one few-shot example with its answer before the target (chat wrapper twice)
        assert s["input"].count("Below is a numbered list") == 2
        assert s["input"].count("<|im_start|>assistant\n") == 2
        assert " Answer: The top 10 words that appear most often in the list are: 1. " in s["input"]


def test_cwe_small_context(ws):
    samples = G.generate_samples("cwe", ws, 1024, 3, chat_template=False)
    for s in samples:
        counts = _cwe_counts(s["input"])
        assert all(counts[w] == 6 for w in s["outputs"])
        assert s["length"] <= 1024


def _fwe_counts(s):
    body = s["input"].split("coded words. ", 1)[1].split("\nQuestion:", 1)[0]
    return Counter(body.split())


def test_fwe_answers(smollm, ws):
    for s in smollm["fwe"] + G.generate_samples("fwe", ws, 512, 3, chat_template=False):
        counts = _fwe_counts(s)
        ranked = [w for w, _ in counts.most_common()]
        assert ranked[0] == "..."
        assert ranked[1:4] == s["outputs"]
        fifth = counts.most_common()[4][1]
        assert all(counts[w] > fifth for w in s["outputs"])
        assert all(re.fullmatch(r"[a-z]{6}", w) for w in s["outputs"])


def test_qa_from_fixtures(smollm):
    squad = json.loads((SOURCES / "squad.json").read_text())
    paras = squad["data"][0]["paragraphs"]
    gold = [(paras[0]["context"], ["1642", "in 1642"]), (paras[1]["context"], ["paper boats", "a parade of paper boats"]),
            (paras[2]["context"], ["moorlight"])]  # answerable questions in file order (q2 is impossible)
    for s, (ctx, refs) in zip(smollm["qa_1"], gold):
        assert "Document 1:\n" in s["input"] and ctx in s["input"] and s["outputs"] == refs
        assert M.sample_score(" " + refs[0] + ".", s["outputs"], s["metric"]) == 100.0
    hotpot = json.loads((SOURCES / "hotpotqa.json").read_text())
    for s, item in zip(smollm["qa_2"], hotpot):
        assert s["outputs"] == [item["answer"]] and item["question"] in s["input"]
        for title, sents in item["context"]:
            assert f"{title}\n{''.join(sents)}" in s["input"]
    with pytest.raises(ValueError, match="only 3 answerable"):
        G.generate_samples("qa_1", WhitespaceTokenizer(), 2048, 4, data_dir=SOURCES)


def test_qa_fill_whitespace(ws):
    for task in ("qa_1", "qa_2"):
        for L in (512, 4096):
            for s in G.generate_samples(task, ws, L, 2, data_dir=SOURCES, chat_template=False):
                assert 0.9 * L <= s["length"] <= L
                assert s["length"] == len(s["input"].split()) + 32


@pytest.mark.parametrize("task", ["vt", "fwe", "cwe"])
def test_seed_determinism(ws, task):
    a = G.generate_samples(task, ws, 2048, 2, seed=42, chat_template=False)
    b = G.generate_samples(task, ws, 2048, 2, seed=42, chat_template=False)
    c = G.generate_samples(task, ws, 2048, 2, seed=43, chat_template=False)
    assert a == b
    assert [s["input"] for s in a] != [s["input"] for s in c]
    assert a[0]["input"] != a[1]["input"]


def test_qa_seed_determinism(ws):
    a = G.generate_samples("qa_2", ws, 2048, 2, seed=42, data_dir=SOURCES)
    assert a == G.generate_samples("qa_2", ws, 2048, 2, seed=42, data_dir=SOURCES)
    assert [s["input"] for s in a] != [s["input"] for s in G.generate_samples("qa_2", ws, 2048, 2, seed=7,
                                                                               data_dir=SOURCES)]


@pytest.mark.parametrize("task", ["vt", "cwe", "fwe"])
def test_fill_whitespace_stub(ws, task):
    # vt: the one-shot ICL example alone has a 500-token budget, so 512 cannot fit (as upstream)
    for L in ((1024, 4096) if task == "vt" else (512, 4096)):
        samples = G.generate_samples(task, ws, L, 3, chat_template=False)
        fill = 0.9 if (task != "fwe" or L >= 4096) else 0.0
        for s in samples:
            assert fill * L <= s["length"] <= L
            assert s["length"] == len(s["input"].split()) + s["max_new_tokens"]


@pytest.mark.parametrize("task", ["vt", "cwe", "fwe", "qa_1"])
def test_context_too_small_exits(ws, task):
    t0 = time.perf_counter()
    with pytest.raises(ValueError, match="too small"):
        G.generate_samples(task, ws, 60, 1, data_dir=SOURCES)
    assert time.perf_counter() - t0 < 10


def test_cwe_english_words_switch(ws, monkeypatch):
    from eval.ruler import common_words as C

    small = tuple(sorted(C.wonderwords_pool())[:40])
    monkeypatch.setattr(C, "wonderwords_pool", lambda: small)
    # without english_words.json: one clear error naming the file and the fix
    with pytest.raises(FileNotFoundError) as e:
        G.generate_samples("cwe", ws, 4096, 1, chat_template=False)
    assert "english_words.json" in str(e.value) and "benchmark.data_dir=" in str(e.value)
    s = G.generate_samples("cwe", ws, 4096, 2, chat_template=False, data_dir=SOURCES)
    english = set(json.loads((SOURCES / "english_words.json").read_text()).values())
    assert set(s[0]["outputs"]) <= english and s[0]["num_haystack"] > 40


# ---------------------------------------------------------------------------------- errors


@pytest.mark.parametrize("task,fname", [("qa_1", "squad.json"), ("qa_2", "hotpotqa.json"),
                                        ("niah_single_2", "PaulGrahamEssays.json")])
def test_missing_file_error(ws, tmp_path, task, fname):
    for data_dir in (None, tmp_path):
        with pytest.raises(FileNotFoundError) as e:
            G.generate_samples(task, ws, 4096, 1, data_dir=data_dir)
        msg = str(e.value)
        assert fname in msg and "benchmark.data_dir=" in msg
    if task == "niah_single_2":  # with a cache the essay tasks fall back to the offline haystack, unless a file was named
        with pytest.raises(FileNotFoundError, match=fname):
            G.generate_samples(task, ws, 4096, 1, essay_path=tmp_path / "missing.json", cache_dir=tmp_path / "cache")
        return
    with pytest.raises(FileNotFoundError):  # also through the cache-key path
        G.generate_samples(task, ws, 4096, 1, data_dir=tmp_path, cache_dir=tmp_path / "cache")


def test_essay_tasks_fall_back_to_the_offline_world_english_bible(ws, tmp_path):
    from eval.ruler.offline_text import FILE_NAME

    s = G.generate_samples("niah_single_2", ws, 2048, 1, data_dir=tmp_path, cache_dir=tmp_path / "cache")
    bible = (tmp_path / "cache" / "offline_essay" / FILE_NAME).read_text()
    assert s[0]["outputs"][0] in s[0]["input"] and "In the beginning" in bible[:2000]
    assert "In the beginning God created the heavens and the earth." in s[0]["input"]  # the text's first words


def test_essay_from_data_dir_and_essay_path(ws, tmp_path):
    a = G.generate_samples("niah_single_2", ws, 2048, 1, chat_template=False, data_dir=SOURCES)
    b = G.generate_samples("niah_single_2", ws, 2048, 1, chat_template=False,
                           essay_path=SOURCES / "PaulGrahamEssays.json")
    assert a == b and a[0]["outputs"][0] in a[0]["input"]


def test_unknown_task(ws):
    with pytest.raises(ValueError, match="valid tasks"):
        G.generate_samples("vt_2", ws, 4096, 1)


# ---------------------------------------------------------------------------------- cache


def test_cache(ws, tmp_path, monkeypatch):
    cache = tmp_path / "cache"
    first = G.generate_samples("vt", ws, 1024, 2, seed=3, cache_dir=cache)
    files = list(cache.rglob("*.jsonl"))
    assert len(files) == 1 and not list(cache.rglob("*.tmp"))
    assert files[0].with_suffix(".key.json").is_file()

    def boom(*a, **k):
        raise AssertionError("regenerated despite a cache hit")

    monkeypatch.setitem(G.GENERATORS, "variable_tracking", boom)
    assert G.generate_samples("vt", ws, 1024, 2, seed=3, cache_dir=cache) == first
    # every key component changes the key
    k0 = G.cache_key("vt", ws, 1024, 2, 3, True)[0]
    variants = [G.cache_key("vt", ws, 1024, 2, 4, True), G.cache_key("vt", ws, 2048, 2, 3, True),
                G.cache_key("vt", ws, 1024, 3, 3, True), G.cache_key("vt", ws, 1024, 2, 3, False),
                G.cache_key("fwe", ws, 1024, 2, 3, True)]
    assert len({k0} | {k for k, _ in variants}) == 6
    with pytest.raises(AssertionError, match="regenerated"):
        G.generate_samples("vt", ws, 1024, 2, seed=4, cache_dir=cache)
    monkeypatch.undo()
    # data-dependent tasks: the source file content is part of the key
    d = tmp_path / "data"
    shutil.copytree(SOURCES, d)
    ka = G.cache_key("qa_1", ws, 1024, 1, 42, True, data_dir=d)[0]
    sq = json.loads((d / "squad.json").read_text())
    sq["data"][0]["paragraphs"][0]["qas"][0]["question"] += "?"
    (d / "squad.json").write_text(json.dumps(sq))
    assert G.cache_key("qa_1", ws, 1024, 1, 42, True, data_dir=d)[0] != ka


# ---------------------------------------------------------------------------------- aggregation


def test_aggregation_r10_r11_categories():
    lengths = [4096, 8192, 16384, 32768, 65536, 131072]
    r10 = [95.5, 93.8, 91.6, 87.4, 84.7, 77.0]
    scores = {n: {t: v for t in ALL_TASKS} for n, v in zip(lengths, r10)}
    out = A.summarize_lengths(scores)
    assert out["avg"] == pytest.approx(88.33, abs=1e-6)
    assert out["wavg_inc"] == pytest.approx(85.38, abs=1e-6)
    assert out["wavg_dec"] == pytest.approx(91.29, abs=1e-6)
    assert out["effective_length"] == 32768
    assert out["per_length"][4096] == pytest.approx(95.5)
    # R11: 12 x 100 and 1 x 35 -> 95.0
    r11 = {t: 100.0 for t in ALL_TASKS}
    r11["qa_2"] = 35.0
    assert A.summarize_lengths({4096: r11})["per_length"][4096] == pytest.approx(95.0, abs=1e-6)
    cats = A.category_scores(r11)
    assert cats == pytest.approx({"NIAH": 100.0, "VT": 100.0, "Aggregation": 100.0, "QA": 67.5})
    # only present tasks/categories
    assert A.category_scores({"niah_single_1": 80.0, "niah_single_2": 60.0, "cwe": 10.0}) == \
        pytest.approx({"NIAH": 70.0, "Aggregation": 10.0})
    with pytest.raises(ValueError):
        A.category_scores({"bogus": 1.0})
    rows = [{"task": "vt", "score": 100.0, "context_length": 4096}, {"task": "vt", "score": 0.0, "context_length": 4096},
            {"task": "fwe", "score": 100.0 / 3, "context_length": 8192}]
    assert A.task_scores_from_rows(rows) == {4096: {"vt": 50.0}, 8192: {"fwe": 33.33}}


def test_generation_speed_self_contained(tok):
    t0 = time.perf_counter()
    for task in SELF_CONTAINED_TASKS:
        assert len(G.generate_samples(task, tok, 4096, 4, seed=1)) == 4
    assert time.perf_counter() - t0 < 10.0


def _squad_hub_rows(squad: dict) -> list[dict]:
    """The rajpurkar/squad_v2 row layout of a SQuAD v2 file (what `datasets` serves), written out by hand."""
    return [{"id": qa["id"], "title": art["title"], "context": p["context"], "question": qa["question"],
             "answers": {"text": [a["text"] for a in qa["answers"]],
                         "answer_start": [a["answer_start"] for a in qa["answers"]]}}
            for art in squad["data"] for p in art["paragraphs"] for qa in p["qas"]]


def _hotpot_hub_rows(hotpot: list) -> list[dict]:
    return [{"id": d["_id"], "question": d["question"], "answer": d["answer"], "type": d["type"], "level": d["level"],
             "supporting_facts": {"title": [t for t, _ in d["supporting_facts"]],
                                  "sent_id": [i for _, i in d["supporting_facts"]]},
             "context": {"title": [t for t, _ in d["context"]], "sentences": [s for _, s in d["context"]]}}
            for d in hotpot]


def test_qa_sources_rebuilt_from_the_hub_equal_the_local_files(ws, tmp_path, monkeypatch):
    import datasets

    from eval.ruler import qa as Q

    squad = json.loads((SOURCES / "squad.json").read_text())
    hotpot = json.loads((SOURCES / "hotpotqa.json").read_text())
    served = {"rajpurkar/squad_v2": datasets.Dataset.from_list(_squad_hub_rows(squad)),
              "hotpotqa/hotpot_qa": datasets.Dataset.from_list(_hotpot_hub_rows(hotpot))}
    calls = []

    def fake_load_dataset(repo, config=None, split=None):
        calls.append((repo, config, split))
        return served[repo]

    monkeypatch.setattr(datasets, "load_dataset", fake_load_dataset)
    for var in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "TRANSFORMERS_OFFLINE"):
        monkeypatch.delenv(var, raising=False)
    cache = tmp_path / "cache"
    for task, kind in (("qa_1", "squad"), ("qa_2", "hotpotqa")):
        via_hub = G.generate_samples(task, ws, 2048, 2, seed=42, cache_dir=cache)
        assert via_hub == G.generate_samples(task, ws, 2048, 2, seed=42, data_dir=SOURCES)
        rebuilt = cache / "hub" / f"{kind}.json"
        assert Q.read_squad(rebuilt) == Q.read_squad(SOURCES / "squad.json") if kind == "squad" else \
            Q.read_hotpotqa(rebuilt) == Q.read_hotpotqa(SOURCES / "hotpotqa.json")
    assert calls == [("rajpurkar/squad_v2", None, "validation"), ("hotpotqa/hotpot_qa", "distractor", "validation")]


def test_qa_source_missing_offline_names_the_file_and_the_hub(ws, tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(FileNotFoundError) as err:
        G.generate_samples("qa_1", ws, 2048, 1, cache_dir=tmp_path)
    msg = str(err.value)
    assert "squad.json" in msg and "benchmark.data_dir" in msg and "rajpurkar/squad_v2" in msg and "\n" not in msg
