"""LongBench v1 / LongBench-E: metric cases LB1-LB32 (docs/benchmarks/README.md), loader, prompts,
middle truncation, chat policy, samsum stop, first-line rule, aggregation, run record."""
from __future__ import annotations

import json
import math
import random
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from eval.longbench import metrics as M
from eval.longbench.benchmark import (
    DATASET2MAXLEN,
    DATASET2PROMPT,
    NO_CHAT_TASKS,
    TASKS,
    TASKS_E,
    LongBench,
    LongBenchE,
    build_prompt,
    middle_truncate,
)
from eval.longbench.data import load_task

ROOT = Path(__file__).resolve().parents[2]
FIX = ROOT / "tests" / "fixtures" / "longbench"


@pytest.fixture(scope="module")
def tok():
    import transformers

    from locks.core.embedded_model import smollm2_gguf_path

    p = smollm2_gguf_path()
    return transformers.AutoTokenizer.from_pretrained(p.parent, gguf_file=p.name)


def make_cfg(name="longbench", **kw):
    base = OmegaConf.load(ROOT / "conf" / "benchmark" / f"{name}.yaml")
    base = OmegaConf.merge(base, {"data_dir": str(FIX)}, kw)
    return base


def _words(n, seed):
    rng = random.Random(seed)
    vocab = [f"w{i}" for i in range(60)]
    return " ".join(rng.choice(vocab) for _ in range(n))


# ---------------------------------------------------------------- LB1-LB27: metric functions

CLASS_CASES = {
    "LB14": ("City or Country", "City", ["City", "Country", "State"], 0.5),
    "LB15": ("Other number", "Other number", ["Other number", "number"], 1.0),
    "LB16": ("Other location", "Other location", ["Other", "location", "Other location"], 0.5),
    "LB17": ("Animal", "City", ["City", "Animal"], 0.0),
}

METRIC_CASES = [
    ("LB1", "qa_f1_score", "The Eiffel Tower", "Eiffel Tower", 1.0),
    ("LB2", "qa_f1_score", "Paris, France", "Paris", 2 / 3),
    ("LB3", "qa_f1_score", "an apple a day", "the apple", 2 / 3),
    ("LB4", "qa_f1_score", "New York New York", "New York", 2 / 3),
    ("LB5", "qa_f1_score", "no", "unanswerable", 0.0),
    ("LB6", "qa_f1_zh_score", "北京是中国的首都。", "北京", 1 / 3),
    ("LB7", "qa_f1_zh_score", "答案是北京", "北京", 0.5),
    ("LB8", "rouge_score", "the cat sat on the mat", "the cat is on the mat", 0.8),
    ("LB9", "rouge_score", "The cat", "the cat", 0.5),
    ("LB10", "rouge_score", "Tom went home. He slept.", "Tom went home and slept.", 0.8),
    ("LB11", "rouge_score", "", "the cat", 0.0),
    ("LB11b", "rouge_score", "the cat. ", "the cat", 0.8),
    ("LB11b-nospace", "rouge_score", "the cat.", "the cat", 1.0),
    ("LB13", "rouge_zh_score", "今天天气很好", "今天天气不错", 0.4),
    ("LB18", "retrieval_score", "Paragraph 3", "Paragraph 3", 1.0),
    ("LB19", "retrieval_score", "Paragraph 3, not Paragraph 30", "Paragraph 3", 0.5),
    ("LB20", "retrieval_score", "I don't know", "Paragraph 3", 0.0),
    ("LB21", "retrieval_zh_score", "答案是段落5", "段落5", 1.0),
    ("LB22", "count_score", "There are 5 unique paragraphs out of 12", "5", 0.5),
    ("LB23", "code_sim_score", "# comment\nx = 1", "x = 1", 1.0),
    ("LB24", "code_sim_score", "```python\n    return x + 1\n```", "return x + 1", 0.86),
    ("LB25", "code_sim_score", "\n\n    x = foo(1)\n", "x = foo(1)", 0.83),
    ("LB26", "code_sim_score", "# only comment", "x = 1", 0.0),
    ("LB27", "code_sim_score", "kitten", "sitting", 0.62),
]


@pytest.mark.parametrize("case_id,fn,pred,gt,expected", METRIC_CASES, ids=[c[0] for c in METRIC_CASES])
def test_metric_cases(case_id, fn, pred, gt, expected):
    assert M.METRICS[fn](pred, gt) == pytest.approx(expected, abs=1e-6)


@pytest.mark.parametrize("case_id", sorted(CLASS_CASES))
def test_classification_cases(case_id):
    pred, gt, classes, expected = CLASS_CASES[case_id]
    assert M.classification_score(pred, gt, all_classes=classes) == pytest.approx(expected, abs=1e-6)


def test_lb12_rouge_recursion_error_scores_zero():
    assert M.rouge_score(_words(600, 1), _words(600, 2)) == 0.0
    assert M.rouge_score(_words(500, 1), _words(500, 2)) > 0.0


# ---------------------------------------------------------------- LB28-LB32: scorers

SCORER_CASES = [
    ("LB28", "triviaqa", ["\nParis\nThe capital of France.", "London"], [["Paris"], ["Paris", "Paris, France"]], None, 50.0),
    ("LB29", "hotpotqa", ["Paris, France", "no idea"], [["Paris"], ["Berlin"]], None, 33.33),
    ("LB30", "trec", ["Location\nblah", "City"], [["Location"], ["Country"]], ["Location", "City", "Country"], 50.0),
    ("LB31", "samsum", ["A and B meet.\nDialogue: ..."], [["A and B meet."]], None, 100.0),
]


@pytest.mark.parametrize("case_id,task,preds,answers,classes,expected", SCORER_CASES, ids=[c[0] for c in SCORER_CASES])
def test_scorer_cases(case_id, task, preds, answers, classes, expected):
    assert M.scorer(task, preds, answers, classes) == pytest.approx(expected, abs=1e-6)


def test_lb32_scorer_e():
    got = M.scorer_e("hotpotqa", ["Paris", "x", "Berlin"], [["Paris"], ["y"], ["Berlin"]], [3000, 5000, 9000])
    assert got == {"0-4k": 100.0, "4-8k": 0.0, "8k+": 100.0}
    empty = M.scorer_e("hotpotqa", ["Paris"], [["Paris"]], [100])
    assert empty["0-4k"] == 100.0 and math.isnan(empty["8k+"])


def test_first_line_rule():
    assert M.postprocess("samsum", "\n\nA meets B.\nDialogue: more") == "A meets B."
    assert M.postprocess("hotpotqa", "\nParis\nmore") == "\nParis\nmore"
    assert set(M.FIRST_LINE_TASKS) == {"trec", "triviaqa", "samsum", "lsht"}


# ---------------------------------------------------------------- data tables

def test_tables():
    assert len(TASKS) == 21 and len(TASKS_E) == 13 and set(TASKS_E) <= set(TASKS)
    assert set(NO_CHAT_TASKS) == {"trec", "triviaqa", "samsum", "lsht", "lcc", "repobench-p"}
    assert DATASET2MAXLEN["gov_report"] == 512 and DATASET2MAXLEN["hotpotqa"] == 32 and DATASET2MAXLEN["lcc"] == 64
    assert "asconcisely" in DATASET2PROMPT["narrativeqa"]
    assert DATASET2PROMPT["qasper"].count("\n\n Answer the question") == 1
    assert DATASET2PROMPT["passage_count"].endswith("The final answer is: ")
    assert DATASET2PROMPT["lcc"] == "Please complete the code given below. \n{context}Next line of code:\n"
    assert M.DATASET2METRIC_NAME["dureader"] == "rouge_zh_score"


# ---------------------------------------------------------------- loader

@pytest.mark.parametrize("task", TASKS)
def test_loader_v1_fixtures(task):
    recs = load_task(task, e=False, data_dir=str(FIX))
    assert recs and all(r["dataset"] == task for r in recs)
    assert set(recs[0]) == {"input", "context", "answers", "length", "dataset", "language", "all_classes", "_id"}
    build_prompt(task, recs[0])  # every template formats its record


def test_loader_e_fixtures():
    for task in TASKS_E:
        recs = load_task(task, e=True, data_dir=str(FIX))
        assert sorted(M.length_bucket(r["length"]) for r in recs) == ["0-4k", "4-8k", "8k+"]
    trec = load_task("trec", data_dir=str(FIX))[0]
    assert trec["all_classes"][2] == "City" and load_task("hotpotqa", data_dir=str(FIX))[0]["all_classes"] is None


def test_loader_schema_drift(tmp_path):
    rec = json.loads((FIX / "hotpotqa.jsonl").read_text().splitlines()[0])
    del rec["all_classes"]
    (tmp_path / "hotpotqa.jsonl").write_text(json.dumps(rec) + "\n")
    with pytest.raises(ValueError, match="all_classes"):
        load_task("hotpotqa", data_dir=str(tmp_path))


def test_missing_local_file_is_clear(tmp_path):
    with pytest.raises(FileNotFoundError) as ei:
        load_task("qasper", e=True, data_dir=str(tmp_path))
    msg = str(ei.value)
    assert "qasper_e.jsonl" in msg and "data_dir" in msg and "\n" not in msg


def test_hub_offline_is_clear_file_not_found(monkeypatch, tmp_path):
    import datasets

    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", True, raising=False)
    monkeypatch.setattr(datasets.config, "HF_DATASETS_OFFLINE", True, raising=False)
    with pytest.raises(FileNotFoundError) as ei:
        load_task("hotpotqa", e=False, data_dir=None)
    msg = str(ei.value)
    assert "THUDM/LongBench" in msg and "'hotpotqa'" in msg and "data_dir" in msg


def test_hub_path_loads_the_config_test_split(monkeypatch):
    """Online path: datasets.load_dataset("THUDM/LongBench", config, split="test") rows become the same records."""
    import datasets

    calls = []

    def fake_load_dataset(repo, config=None, split=None):
        calls.append((repo, config, split))
        rows = [json.loads(line) for line in (FIX / f"{config}.jsonl").read_text(encoding="utf-8").splitlines() if line.strip()]
        return datasets.Dataset.from_list(rows)

    monkeypatch.setattr(datasets, "load_dataset", fake_load_dataset)
    for task, e in (("hotpotqa", False), ("trec", False), ("qasper", True)):
        assert load_task(task, e=e, data_dir=None) == load_task(task, e=e, data_dir=str(FIX))
    assert calls == [("THUDM/LongBench", "hotpotqa", "test"), ("THUDM/LongBench", "trec", "test"),
                     ("THUDM/LongBench", "qasper_e", "test")]


# ---------------------------------------------------------------- prompts and truncation

def test_prompt_hotpotqa_verbatim():
    rec = load_task("hotpotqa", data_dir=str(FIX))[0]
    p = build_prompt("hotpotqa", rec)
    assert p == ("Answer the question based on the given passages. Only give me the answer and do not output any "
                 "other words.\n\nThe following are given passages.\n" + rec["context"] + "\n\nAnswer the question "
                 "based on the given passages. Only give me the answer and do not output any other words.\n\n"
                 "Question: Which city is the Eiffel Tower in?\nAnswer:")
    lcc = load_task("lcc", data_dir=str(FIX))[0]
    assert build_prompt("lcc", lcc) == ("Please complete the code given below. \ndef add(a, b):\n    return a + b\n\n"
                                        "def inc(x):\nNext line of code:\n")


class StubTok:
    """Whitespace tokenizer that prepends a BOS (id 0), like Llama's default special tokens."""

    def __init__(self):
        self.vocab, self.inv = {"<s>": 0}, {0: "<s>"}

    def _id(self, w):
        if w not in self.vocab:
            self.vocab[w] = len(self.vocab)
            self.inv[self.vocab[w]] = w
        return self.vocab[w]

    def __call__(self, text, truncation=False, add_special_tokens=True):
        ids = [self._id(w) for w in text.split()]
        return {"input_ids": ([0] if add_special_tokens else []) + ids}

    def decode(self, ids, skip_special_tokens=False):
        return " ".join(self.inv[i] for i in ids if not (skip_special_tokens and i == 0))


def test_middle_truncation_stub_drops_bos():
    tok = StubTok()
    prompt = " ".join(f"t{i}" for i in range(100))
    out, n, truncated = middle_truncate(prompt, tok, 10)
    assert truncated and n == 101
    # BOS counted in the first half and dropped by the decode: 4 content tokens + 5 from the end
    assert out == "t0 t1 t2 t3" + "t95 t96 t97 t98 t99"
    assert middle_truncate("a b c", tok, 10) == ("a b c", 4, False)


def test_middle_truncation_embedded_tokenizer(tok):
    rec = {"input": "Which city?", "context": _words(5000, 3), "answers": ["x"]}
    prompt = build_prompt("hotpotqa", rec)
    ids = tok(prompt)["input_ids"]
    assert len(ids) > 64
    out, n, truncated = middle_truncate(prompt, tok, 64)
    assert truncated and n == len(ids)
    assert out == tok.decode(ids[:32], skip_special_tokens=True) + tok.decode(ids[-32:], skip_special_tokens=True)
    assert out.startswith("Answer the question based on the given passages.")
    assert out.endswith("Question: Which city?\nAnswer:")


# ---------------------------------------------------------------- benchmark class

def test_samples_chat_policy_and_stop(tok):
    bench = LongBench(make_cfg(tasks=["hotpotqa", "trec", "samsum", "lcc", "multifieldqa_zh"]))
    samples = bench.samples(tok, seed=42)
    by = {s["task"]: s for s in samples}
    assert len({s["id"] for s in samples}) == len(samples)
    hp = by["hotpotqa"]
    prompt = build_prompt("hotpotqa", load_task("hotpotqa", data_dir=str(FIX))[0])
    assert hp["input"] == tok.apply_chat_template([{"role": "user", "content": prompt}], tokenize=False,
                                                  add_generation_prompt=True)
    assert hp["input"].startswith("<|im_start|>") and hp["chat_template"] is True
    assert hp["input_ids"] == tok(hp["input"], add_special_tokens=False)["input_ids"]
    assert hp["max_new_tokens"] == 32 and hp["outputs"] == ["Paris"] and "stop_token_ids" not in hp
    for t in ("trec", "samsum", "lcc"):
        assert by[t]["chat_template"] is False and by[t]["input"] == build_prompt(t, load_task(t, data_dir=str(FIX))[0])
    assert by["samsum"]["stop_token_ids"] == [198] and tok.decode([198]) == "\n"
    assert by["samsum"]["max_new_tokens"] == 128 and by["trec"]["max_new_tokens"] == 64
    assert by["multifieldqa_zh"]["input"].count("阅读以下文字并用中文简短回答") == 1
    # chat off: raw prompts everywhere
    raw = LongBench(make_cfg(tasks=["hotpotqa"], chat_template=False)).samples(tok, 0)[0]
    assert raw["input"] == prompt and raw["chat_template"] is False


def test_samples_truncated_to_max_length(tok):
    bench = LongBench(make_cfg(tasks=["gov_report"], max_length=16))
    s = bench.samples(tok, 0)[0]
    assert s["truncated"] and s["prompt_tokens_before_truncation"] > 16
    assert s["input"].startswith("<|im_start|>") and "Summary:" in s["input"]


def test_num_samples_first_n(tok):
    bench = LongBench(make_cfg(tasks=["hotpotqa", "lcc"], num_samples=1))
    samples = bench.samples(tok, 0)
    assert [(s["task"], s["index"]) for s in samples] == [("hotpotqa", 0), ("lcc", 0)]
    e = LongBenchE(make_cfg("longbench_e", tasks=["hotpotqa"], num_samples=2)).samples(tok, 0)
    assert [s["length"] for s in e] == [3000, 5000] and e[0]["id"] == "hotpotqa_e/0"


def test_score_uses_first_line_and_classes():
    bench = LongBench(make_cfg())
    assert bench.score("\nParis\nmore", {"task": "triviaqa", "outputs": ["Paris"], "all_classes": None}) == 100.0
    assert bench.score("City", {"task": "trec", "outputs": ["City"], "all_classes": ["City", "Country"]}) == 100.0
    assert bench.score("Paris, France", {"task": "hotpotqa", "outputs": ["Paris"]}) == pytest.approx(200 / 3)


def test_aggregate_v1():
    bench = LongBench(make_cfg(tasks=["hotpotqa", "narrativeqa", "trec"]))
    rows = [
        {"task": "hotpotqa", "score": bench.score(p, {"task": "hotpotqa", "outputs": a}), "length": 1}
        for p, a in [("Paris, France", ["Paris"]), ("no idea", ["Berlin"])]
    ] + [{"task": "narrativeqa", "score": 100.0, "length": 1}, {"task": "trec", "score": 50.0, "length": 1}]
    agg = bench.aggregate(rows)
    assert agg["scores"] == {"hotpotqa": 33.33, "narrativeqa": 100.0, "trec": 50.0}
    assert agg["average"] == pytest.approx(round((33.33 + 100 + 50) / 3, 2))
    assert agg["num_samples"] == {"hotpotqa": 2, "narrativeqa": 1, "trec": 1}
    assert agg["category_scores"] == {"single_doc_qa": 100.0, "multi_doc_qa": 33.33, "few_shot": 50.0}
    assert agg["leaderboard_avg"] == pytest.approx(round((100 + 33.33 + 50) / 3, 2))
    assert "scores_by_length" not in agg


def test_aggregate_e():
    bench = LongBenchE(make_cfg("longbench_e", tasks=["hotpotqa"]))
    preds, refs, lengths = ["Paris", "x", "Berlin"], [["Paris"], ["y"], ["Berlin"]], [3000, 5000, 9000]
    rows = [{"task": "hotpotqa", "length": L, "score": bench.score(p, {"task": "hotpotqa", "outputs": r})}
            for p, r, L in zip(preds, refs, lengths)]
    agg = bench.aggregate(rows)
    assert agg["scores_by_length"]["hotpotqa"] == M.scorer_e("hotpotqa", preds, refs, lengths)
    assert agg["scores"]["hotpotqa"] == 66.67 and agg["average_by_length"]["4-8k"] == 0.0
    agg1 = bench.aggregate(rows[:1])
    assert agg1["scores_by_length"]["hotpotqa"]["8k+"] is None
    json.dumps(agg1, allow_nan=False)


def test_run_record_and_config_errors(tok):
    bench = LongBench(make_cfg())
    rec = bench.run_record(tok)
    assert rec["max_length"] == 7500 and rec["chat_template"] is True and rec["e"] is False
    assert rec["answer_prefix"] == "n/a" and rec["metric_versions"]["rouge"] == "1.0.1"
    assert rec["metric_versions"]["jieba"] == "0.42.1" and rec["metric_versions"]["fuzzywuzzy"] == "0.18.0"
    assert rec["metric_versions"]["fuzzywuzzy_backend"] in ("python-Levenshtein", "difflib")
    assert LongBenchE(make_cfg("longbench_e")).run_record(tok)["e"] is True
    assert list(OmegaConf.load(ROOT / "conf/benchmark/longbench.yaml").tasks) == list(TASKS)
    assert list(OmegaConf.load(ROOT / "conf/benchmark/longbench_e.yaml").tasks) == list(TASKS_E)
    with pytest.raises(Exception, match="unknown"):
        LongBench(make_cfg("longbench_e", tasks=["musique"]))
    with pytest.raises(Exception, match="num_samples"):
        LongBench(make_cfg(num_samples=0))
