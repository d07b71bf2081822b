"""InfiniteBench: metric cases IB1-IB33 (both scorer variants), fixtures loader, prompts, truncation, errors."""
import json
import os
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")

import pytest  # noqa: E402
from omegaconf import OmegaConf  # noqa: E402

from eval.infinitebench import (
    InfiniteBench,  # noqa: E402
    scoring,  # noqa: E402
)
from eval.infinitebench.benchmark import create_prompt, templates, truncate_middle  # noqa: E402
from eval.infinitebench.data import load_task  # noqa: E402

FIXTURES = Path(__file__).parents[1] / "fixtures" / "infinitebench"
KV = "c14cb8ba-002b-43be-bdc7-8a83f0fe1ac8"
CHOICE_D = ["repack_carchive", "B"]
TE = TypeError

# (id, task, prediction, label, S = "2024-06", L = "2024-08", model)
CASES = [
    ("IB1", "passkey", "The pass key is 71432. Remember it.", ["71432"], 1, 1, None),
    ("IB2", "passkey", "Not 12345; it is 71432", ["71432"], 0, 0, None),
    ("IB3", "number_string", "The sequence of digits is 3000077442.", ["3000077442"], 1, 1, None),
    ("IB4", "kv_retrieval", f'The value is "{KV}".', KV, 1, 1, None),
    ("IB5", "kv_retrieval", f'The value is "{KV}".', [KV], 0, 1, None),
    ("IB6", "kv_retrieval", "c14cb8ba-002b-43be", KV, 0, 0, None),
    ("IB7", "code_run", "The return value is: 4.", [4], 1, 1, None),
    ("IB8", "code_run", "The return value is: 4.", ["4"], 0, 1, None),
    ("IB9", "code_run", "func_3(2) returns -7", [-7], 1, 1, None),
    ("IB10", "code_debug", "B. repack_carchive", CHOICE_D, 1, 1, None),
    ("IB11", "code_debug", "The correct option is: B", CHOICE_D, 1, 1, None),
    ("IB12", "code_debug", "B", CHOICE_D, 0, 1, None),
    ("IB13", "math_find", "88", [88], 1, 1, None),
    ("IB14", "math_find", "88", ["88"], TE, 1, None),
    ("IB15", "math_find", "The median is 49.5", [49.5], 1, 1, None),
    ("IB16", "longdialogue_qa_eng", "Ace Rothstein", ["ACE", "ACE ROTHSTEIN"], 1, 1, None),
    ("IB17", "longdialogue_qa_eng", "STAMP PAID", ["STAMP PAID"], 0, 1, None),
    ("IB18", "longdialogue_qa_eng", "Grace", ["ACE"], 0, 1, None),
    ("IB19", "longbook_choice_eng", "A", ["Walking Georgie", "A"], 1, 1, None),
    ("IB20", "longbook_choice_eng", "The answer is: C", ["Snowfield", "C"], 1, 1, None),
    ("IB21", "longbook_choice_eng", "Snowfield", ["Snowfield", "C"], 1, 1, None),
    ("IB22", "longbook_choice_eng", "A is wrong; the answer is D", ["x", "D"], 0, 1, None),
    ("IB23", "longbook_qa_eng", "fighting in World War 1.", ["fighting in world war 1"], 1.0, 1.0, None),
    ("IB24", "longbook_qa_eng", "He died fighting in the war", ["fighting in world war 1"], 0.6, 0.6, None),
    ("IB25", "longbook_qa_chn", "北京", ["北京市"], 0.8, 0.8, None),
    ("IB26", "longbook_qa_chn", "胡一刀，马行空", ["胡一刀, 马行空, 商老太"], 0.8, 0.8, None),
    ("IB27", "math_calc", "[1, 4, 8]", [1, 4, 9], 0.666667, 0.666667, None),
    ("IB28", "math_calc", "[1, 4, 9]", [[1, 4, 9]], 1.0, 1.0, None),
    ("IB29", "math_calc", "0, 1, 4, 8", [1, 4, 8], 1.0, 1.0, "gpt4"),
    ("IB30", "math_calc", "[5, -1, 2]", [5, 1, 2], 1.0, 1.0, None),
    ("IB31", "longbook_sum_eng", "the cat sat on the mat", ["the cat is on the mat"], 0.833333, 0.833333, None),
    ("IB32", "longbook_sum_eng", "The Cat.", ["the cat"], 1.0, 1.0, None),
    ("IB33", "longbook_sum_eng", "a b\nc d", ["a b c d"], 1.0, 1.0, None),
]


def _params():
    for cid, task, pred, label, s, lv, model in CASES:
        yield pytest.param(task, pred, label, "2024-06", s, model, id=f"{cid}-S")
        yield pytest.param(task, pred, label, "2024-08", lv, model, id=f"{cid}-L")


@pytest.mark.parametrize("task,pred,label,variant,expected,model", list(_params()))
def test_metric_cases(task, pred, label, variant, expected, model):
    if expected is TypeError:
        with pytest.raises(TypeError):
            scoring.score(task, pred, label, variant, model=model)
        return
    assert scoring.score(task, pred, label, variant, model=model) == pytest.approx(expected, abs=1e-6)


def test_unknown_variant_rejected():
    with pytest.raises(ValueError, match="2024-08"):
        scoring.score("passkey", "1", ["1"], "2023-01")


@pytest.mark.parametrize("task,answer,options,expected", [
    ("passkey", "71432", [], "71432"),
    ("passkey", ["71432"], [], "71432"),
    ("math_find", [98], [], 98),
    ("math_find", ["98"], [], 98),
    ("math_find", ["49.5"], [], 49.5),
    ("code_run", [7], [], 7),
    ("code_run", ["-7"], [], -7),
    ("math_calc", [[4, 8, 6]], [], [4, 8, 6]),
    ("math_calc", ["4", "8", "6"], [], [4, 8, 6]),
    ("kv_retrieval", [KV], [], KV),
    ("longdialogue_qa_eng", "ACE", [], ["ACE"]),
    ("longbook_choice_eng", ["Snowfield"], ["Hall Farm", "Walking Georgie", "Snowfield", "The mill"],
     ["Snowfield", "C"]),
    ("code_debug", "repack_carchive", ["cmd_gen", "repack_carchive", "_parser", "x"], ["repack_carchive", "B"]),
    ("code_debug", ["repack_carchive", "B"], [], ["repack_carchive", "B"]),
])
def test_label_normalization(task, answer, options, expected):
    assert scoring.normalize_label(task, answer, options) == expected


# ------------------------------------------------------------------------------------------------ loader
def test_templates_file_complete():
    t = templates()
    for family in ("yarn_mistral_templates", "gpt4_templates", "max_new_tokens"):
        assert set(t[family]) == set(scoring.TASKS)
    assert t["max_new_tokens"]["math_calc"] == 30000 and t["max_new_tokens"]["passkey"] == 6
    assert "funtion" in t["gpt4_templates"]["code_debug"]  # official typo kept


@pytest.mark.parametrize("task", scoring.TASKS)
def test_fixture_loads_with_features(task):
    records = load_task(task, str(FIXTURES))
    assert records and records[0]["id"] == 0
    assert isinstance(records[0]["answer"], list) and all(isinstance(a, str) for a in records[0]["answer"])
    assert isinstance(records[0]["options"], list)


def test_raw_typed_copies_load_and_normalize(tmp_path):
    rows = {"math_find": {"id": 0, "context": "[1, 98]", "input": "The largest number of the list is: ",
                          "answer": [98], "options": []},
            "math_calc": {"id": 0, "context": "1 + 3 + 4 - 2", "input": "", "answer": [[4, 8, 6]], "options": []},
            "passkey": {"id": 0, "context": "x", "input": "What is the pass key?", "answer": "71432", "options": []},
            "code_run": {"id": 0, "context": "x", "input": "func_1(5)", "answer": [7], "options": []}}
    want = {"math_find": 98, "math_calc": [4, 8, 6], "passkey": "71432", "code_run": 7}
    for task, row in rows.items():
        (tmp_path / f"{task}.jsonl").write_text(json.dumps(row) + "\n")
        rec = load_task(task, str(tmp_path))[0]
        assert scoring.normalize_label(task, rec["answer"]) == want[task]


def test_missing_data_offline_is_clear(tmp_path):
    with pytest.raises(FileNotFoundError) as err:
        load_task("passkey", str(tmp_path))
    msg = str(err.value)
    assert str(tmp_path / "passkey.jsonl") in msg and "benchmark.data_dir" in msg and "passkey.jsonl" in msg


def test_missing_data_without_data_dir_is_clear(monkeypatch, tmp_path):
    monkeypatch.setenv("HF_DATASETS_CACHE", str(tmp_path / "cache"))
    with pytest.raises(FileNotFoundError, match="benchmark.data_dir"):
        load_task("kv_retrieval", None)


def test_hub_path_uses_the_explicit_features(monkeypatch):
    """Online path: load_dataset(HF id, features=..., split=task) -> the same records as the local file."""
    import datasets

    from eval.infinitebench import data as D

    tasks = ("passkey", "longbook_choice_eng", "kv_retrieval")
    expected = {task: load_task(task, str(FIXTURES)) for task in tasks}
    calls = []
    real_load_dataset = datasets.load_dataset

    def fake_load_dataset(repo, features=None, split=None, **kw):
        calls.append((repo, split, features))
        return real_load_dataset("json", data_files=str(FIXTURES / f"{split}.jsonl"), features=features,
                                     split="train")

    monkeypatch.setattr(datasets, "load_dataset", fake_load_dataset)
    for task in tasks:
        assert load_task(task, None) == expected[task]
    assert [c[:2] for c in calls] == [(D.HF_DATASET_ID, t) for t in tasks]
    assert all(c[2] == D.features() for c in calls)


# ------------------------------------------------------------------------------------------------ prompts
def _rec(task):
    return load_task(task, str(FIXTURES))[0]


def test_prompt_golden_checks():
    p = create_prompt(_rec("math_find"), "math_find", "yarn_mistral")
    assert p.startswith("What is the largest number in the following list?\n\n[3, 98, 7, 55, 98, 12]\n\n")
    p = create_prompt(_rec("code_run"), "code_run", "yarn_mistral")
    assert p.startswith("There is a function called func_1 in the following Python code.")
    assert p.endswith("Please compute the exact value of func_1(5). The value of func_1(5) is")
    p = create_prompt(_rec("code_run"), "code_run", "gpt4")
    assert "named func_1." in p and "return value of func_1(5). Be concise." in p
    p = create_prompt(_rec("passkey"), "passkey", "yarn_mistral")
    assert p.endswith("What is the pass key?\n\nThe pass key is")
    p = create_prompt(_rec("longbook_choice_eng"), "longbook_choice_eng", "gpt4")
    assert "\nA. Hall Farm\nB. Walking Georgie\nC. Snowfield\nD. The mill" in p
    assert create_prompt(_rec("math_calc"), "math_calc", "gpt4") == "1 + 3 + 4 - 2"
    assert create_prompt(_rec("math_calc"), "math_calc", "yarn_mistral").endswith("Expression: 1 + 3 + 4 - 2\nValues:")
    assert scoring.normalize_label("longbook_choice_eng", _rec("longbook_choice_eng")["answer"],
                                   _rec("longbook_choice_eng")["options"]) == ["Snowfield", "C"]
    assert scoring.normalize_label("code_debug", _rec("code_debug")["answer"],
                                   _rec("code_debug")["options"]) == ["repack_carchive", "B"]


@pytest.fixture(scope="module")
def tok():
    import transformers

    from locks.core.embedded_model import smollm2_gguf_path

    p = smollm2_gguf_path()
    return transformers.AutoTokenizer.from_pretrained(p.parent, gguf_file=p.name)


def _bench(**kw):
    cfg = dict(name="infinitebench", tasks=list(scoring.TASKS), num_samples=None, max_length=7500,
               context_length=8192, template="chat", scorer="2024-08", data_dir=str(FIXTURES))
    cfg.update(kw)
    return InfiniteBench(OmegaConf.create(cfg))


@pytest.mark.parametrize("template", ["chat", "completion"])
def test_samples_both_families(tok, template):
    bench = _bench(template=template, num_samples=1)
    samples = bench.samples(tok, seed=0)
    assert [s["task"] for s in samples] == list(scoring.TASKS)
    assert len({s["id"] for s in samples}) == len(samples)
    by = {s["task"]: s for s in samples}
    for s in samples:
        assert s["index"] == 0 and s["input_ids"] and isinstance(s["outputs"], list)
        assert tok.encode(s["input"], add_special_tokens=template == "completion") == s["input_ids"]
        json.dumps({k: s[k] for k in ("id", "task", "index", "outputs", "max_new_tokens")})
    assert by["passkey"]["max_new_tokens"] == 6 and by["code_debug"]["max_new_tokens"] == 5
    assert by["longbook_choice_eng"]["outputs"] == ["Snowfield", "C"]
    assert by["code_run"]["outputs"] == [7] and by["math_calc"]["outputs"] == [4, 8, 6]
    if template == "chat":
        assert "You are a helpful assistant" in by["passkey"]["input"]
        assert "You are a calculator" in by["math_calc"]["input"] and "[1, 3, -1, -11]" in by["math_calc"]["input"]
        assert by["passkey"]["input"] != create_prompt(_rec("passkey"), "passkey", "gpt4")
    else:
        assert by["passkey"]["input"] == create_prompt(_rec("passkey"), "passkey", "yarn_mistral")
        assert by["passkey"]["input"].endswith("The pass key is")
    # 8K window: the official math_calc budget (30000) cannot fit; summary truncation leaves room for 1200 tokens
    assert by["math_calc"]["max_new_tokens"] <= 8192 - 7500
    rec = bench.run_record(tok)
    assert rec["truncate_len"]["longbook_sum_eng"] <= 8192 - 1200 and rec["truncate_len"]["passkey"] == 7500
    assert rec["template_family"] == ("gpt4" if template == "chat" else "yarn_mistral")
    assert rec["scorer_variant"] == "2024-08" and rec["versions"]["rouge_score"] == "0.1.2"


def test_num_samples_first_n(tok):
    bench = _bench(tasks=["passkey", "math_find"], num_samples=1, template="completion")
    assert [(s["task"], s["index"]) for s in bench.samples(tok, 0)] == [("passkey", 0), ("math_find", 0)]
    bench = _bench(tasks=["passkey", "math_find"], num_samples=None, template="completion")
    ss = bench.samples(tok, 0)
    assert [(s["task"], s["index"]) for s in ss] == [("passkey", 0), ("passkey", 1), ("math_find", 0),
                                                      ("math_find", 1)]
    assert ss[3]["input"].startswith("What is the smallest number in the following list?")


def test_middle_truncation(tok):
    filler = " ".join(f"w{i}" for i in range(3000))
    prompt = "BEGIN instruction. " + filler + " END question?"
    ids = tok.encode(prompt)
    out, n_before, truncated = truncate_middle(tok, prompt, 101)
    assert truncated and n_before == len(ids) > 101
    assert out == tok.decode(ids[:50] + ids[-50:], skip_special_tokens=True)
    assert out.startswith("BEGIN instruction.") and out.endswith("END question?")
    assert truncate_middle(tok, "short prompt", 101) == ("short prompt", len(tok.encode("short prompt")), False)


def test_truncation_applies_to_whole_prompt(tok, tmp_path):
    noise = " ".join(["The grass is green."] * 200)
    row = {"id": 0, "context": noise + "\nThe pass key is 12345. Remember it.\n" + noise,
           "input": "What is the pass key?", "answer": ["12345"], "options": []}
    (tmp_path / "passkey.jsonl").write_text(json.dumps(row) + "\n")
    for template in ("completion", "chat"):
        s = _bench(tasks=["passkey"], max_length=128, context_length=None, template=template,
                   data_dir=str(tmp_path)).samples(tok, 0)[0]
        assert s["truncated"] and "The pass key is 12345" not in s["input"]
        assert "There is an important info hidden" in s["input"] and "What is the pass key?" in s["input"]
        if template == "completion":
            assert s["prompt_tokens"] <= 130 and s["input"].endswith("The pass key is")


def test_scorer_variant_switch_and_aggregate(tok):
    sample = {"task": "code_debug", "outputs": ["repack_carchive", "B"], "options": []}
    assert _bench(scorer="2024-06").score("B", sample) == 0.0
    assert _bench(scorer="2024-08").score("B", sample) == 100.0
    kv = {"task": "kv_retrieval", "outputs": [KV]}
    assert _bench(scorer="2024-06").score(f"value {KV}", kv) == 100.0  # labels normalized in both modes
    calc = {"task": "math_calc", "outputs": [1, 4, 8]}
    assert _bench(template="chat").score("0, 1, 4, 8", calc) == 100.0
    assert _bench(template="completion").score("0, 1, 4, 8", calc) == 0.0
    bench = _bench()
    p = {"task": "passkey", "outputs": ["71432"]}
    rows = [{"task": "passkey", "score": bench.score("The pass key is 71432. Remember it.", p)},
            {"task": "passkey", "score": bench.score("Not 12345; it is 71432", p)},
            {"task": "code_debug", "score": 100.0}]
    agg = bench.aggregate(rows)
    assert agg["scores"] == {"passkey": 50.0, "code_debug": 100.0} and agg["average"] == 75.0
    assert agg["num_samples"] == {"passkey": 2, "code_debug": 1}


def test_config_errors():
    from locks.errors import ConfigError

    with pytest.raises(ConfigError, match="_eng"):
        _bench(tasks=["longbook_qa_en"])
    with pytest.raises(ConfigError):
        _bench(scorer="2023")
    with pytest.raises(ConfigError):
        _bench(template="gpt5")


def test_default_config_file():
    cfg = OmegaConf.load(Path(__file__).parents[2] / "conf" / "benchmark" / "infinitebench.yaml")
    assert cfg.name == "infinitebench" and list(cfg.tasks) == list(scoring.TASKS)
    assert cfg.scorer == "2024-08" and cfg.template == "chat" and cfg.max_length == 7500
    assert cfg.num_samples is None and cfg.data_dir is None
