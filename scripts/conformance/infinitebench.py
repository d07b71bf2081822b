"""Regenerate the InfiniteBench scorer goldens under tests/fixtures/conformance/infinitebench/ (not run in CI).

The official per-example scorer (`src/compute_scores.py`, `get_score_one`) of two upstream checkouts is imported
from the paths given on the command line and run on

* the prediction files that upstream ships in `results/<model>/preds_<task>.jsonl` (read from the 2024-06
  checkout; sampled and trimmed as described at DEFAULT_EVERY below), and
* the hand-written edge cases in `EDGE_CASES` below (multi-line answers, several letters, empty strings, Chinese,
  full-width digits, "88.0"-style numbers, bare and list-shaped labels).

Every example is scored with the label as upstream's own prediction files carry it (the official JSONL shape); the
edge cases also with the answer as the Hugging Face dataset delivers it when loaded with the explicit features the
maintainers recommend (every answer a list of strings, options alongside; upstream's get_answer builds the label).  A scorer
exception is recorded by its class name instead of a score.  Nothing of upstream is copied here: the goldens are the
outputs of upstream code.  The exact command and the commits are in the fixture directory's README.md.
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import sys
from collections import defaultdict
from pathlib import Path

TASKS = ("passkey", "number_string", "kv_retrieval", "longbook_sum_eng", "longbook_choice_eng", "longbook_qa_eng",
         "longbook_qa_chn", "longdialogue_qa_eng", "math_find", "math_calc", "code_run", "code_debug")
VARIANTS = ("2024-06", "2024-08")
SINGLE_VALUE_TASKS = ("passkey", "number_string", "kv_retrieval", "code_run", "math_find")
CHOICE_TASKS = ("code_debug", "longbook_choice_eng")

# Which results/ records are committed (deterministic; keeps the goldens at a few MB).  Upstream is run on every
# record of every file (summary.json has the per-file means over all of them); committed are
# * the records at file positions 0, k, 2k, ... with k = SAMPLE_EVERY[task] (default DEFAULT_EVERY), and
# * every record on which the two upstream scorer versions disagree.
# math_calc labels (about 15,000 values each) are cut to their first MATH_CALC_KEEP values before scoring.  No
# upstream prediction matches more than 8 leading values, so the cut changes only the denominator; the goldens are
# the upstream scores of the cut labels, i.e. of exactly what is committed.
DEFAULT_EVERY = 4
SAMPLE_EVERY = {"longbook_choice_eng": 2, "math_calc": 1, "longbook_sum_eng": 16}
MATH_CALC_KEEP = 32

KV1 = "c14cb8ba-002b-43be-bdc7-8a83f0fe1ac8"
KV2 = "5e6b7b90-710d-4953-9b18-3e96b2cadbf2"
DEBUG = ["repack_carchive", "B"]
PARSE = ["_parse_options", "B"]
CHOICE = ["Snowfield", "C"]
GEORGIE = ["Walking Georgie", "A"]
DIALOGUE = ["ACE", "ACE ROTHSTEIN"]

# (task, prediction, label in the official JSONL shape, model or None)
EDGE_CASES = [
    # passkey / number_string: first run of ASCII digits
    ("passkey", "71432", "71432", None),
    ("passkey", "The pass key is 71432. Remember it.", ["71432"], None),
    ("passkey", "", ["71432"], None),
    ("passkey", "   \n", "71432", None),
    ("passkey", "71,432", ["71432"], None),
    ("passkey", "714320", ["71432"], None),
    ("passkey", "-71432", ["71432"], None),
    ("passkey", "Not 12345; it is 71432", ["71432"], None),
    ("passkey", "密码是71432。", ["71432"], None),
    ("passkey", "７１４３２", ["71432"], None),
    ("passkey", "\n\n71432\n12345", ["71432"], None),
    ("passkey", "71432.0", ["71432"], None),
    ("number_string", "The sequence of digits is 3000077442.", ["3000077442"], None),
    ("number_string", "3000077442", "3000077442", None),
    ("number_string", "3000 077 442", ["3000077442"], None),
    ("number_string", "", ["3000077442"], None),
    ("number_string", "0003000077442", ["3000077442"], None),
    ("number_string", "数字序列是3000077442", ["3000077442"], None),
    # kv_retrieval: whole-word membership after blanking punctuation
    ("kv_retrieval", f'The value is "{KV1}".', KV1, None),
    ("kv_retrieval", f'The value is "{KV1}"', KV1, None),
    ("kv_retrieval", f"{KV1}", KV1, None),
    ("kv_retrieval", f"{KV1.upper()}", KV1, None),
    ("kv_retrieval", "c14cb8ba-002b-43be", KV1, None),
    ("kv_retrieval", "", KV1, None),
    ("kv_retrieval", f"{{'{KV2}': '{KV1}'}}", KV1, None),
    ("kv_retrieval", f"Key: {KV2}\nValue:{KV1}", KV1, None),
    ("kv_retrieval", f"值是：{KV1}", KV1, None),
    ("kv_retrieval", f"the value is {KV1}-x", KV1, None),
    ("kv_retrieval", f"({KV1})", KV1, None),
    # code_run: last word as an int
    ("code_run", "The return value is: 4.", 4, None),
    ("code_run", "The return value is: 4.", [4], None),
    ("code_run", "func_3(2) returns -7", -7, None),
    ("code_run", "func_3(2) returns -7", [-7], None),
    ("code_run", "The return value is: 4.0", 4, None),
    ("code_run", "The return value is 4 apples", 4, None),
    ("code_run", "", 4, None),
    ("code_run", "   ", [4], None),
    ("code_run", "4\n", 4, None),
    ("code_run", "`4`", 4, None),
    ("code_run", "\"12\"", [12], None),
    ("code_run", "The return value is: −7", -7, None),
    ("code_run", "返回值是：12", 12, None),
    ("code_run", "The answer:\n\n12", 12, None),
    ("code_run", "The return value is: ４", 4, None),
    # code_debug: [function name, letter]
    ("code_debug", "B", DEBUG, None),
    ("code_debug", "B.", DEBUG, None),
    ("code_debug", "B. repack_carchive", DEBUG, None),
    ("code_debug", "The correct option is: B", DEBUG, None),
    ("code_debug", "The answer is: repack_carchive", DEBUG, None),
    ("code_debug", "A\nB", DEBUG, None),
    ("code_debug", "B\nA", DEBUG, None),
    ("code_debug", "\n\nA B\nB", DEBUG, None),
    ("code_debug", "The answer is B.\nBut A could also be it.", DEBUG, None),
    ("code_debug", "A is tempting; the answer is B", DEBUG, None),
    ("code_debug", "Option A or option B", DEBUG, None),
    ("code_debug", "option B", DEBUG, None),
    ("code_debug", "Option: B", DEBUG, None),
    ("code_debug", "-B", DEBUG, None),
    ("code_debug", "'B'", DEBUG, None),
    ("code_debug", "`repack_carchive`", DEBUG, None),
    ("code_debug", "**B**", DEBUG, None),
    ("code_debug", "(B)", DEBUG, None),
    ("code_debug", "b", DEBUG, None),
    ("code_debug", "", DEBUG, None),
    ("code_debug", "   ", DEBUG, None),
    ("code_debug", "E", DEBUG, None),
    ("code_debug", "B or E", DEBUG, None),
    ("code_debug", "J\nB", DEBUG, None),
    ("code_debug", "答案是B", DEBUG, None),
    ("code_debug", "答案是 B", DEBUG, None),
    ("code_debug", "答案：\nB", DEBUG, None),
    ("code_debug", "repack_carchive has the bug", DEBUG, None),
    ("code_debug", "_parse_options has the bug", PARSE, None),
    ("code_debug", "_parse_options", PARSE, None),
    ("code_debug", "The bug is in _parse_options", PARSE, None),
    ("code_debug", "The answer is: _parse_options", PARSE, None),
    ("code_debug", "is: B", DEBUG, None),
    ("code_debug", "The answer is:", DEBUG, None),
    ("code_debug", "The answer is: A\nThe answer is: B", DEBUG, None),
    ("code_debug", "B_1 is the function", DEBUG, None),
    ("code_debug", "A, B, C", DEBUG, None),
    ("code_debug", "A\r\nB", DEBUG, None),
    ("code_debug", "Between the options, B", DEBUG, None),
    # math_find: first number, compared as the label's type
    ("math_find", "88", 88, None),
    ("math_find", "88", [88], None),
    ("math_find", "The largest number is 88.", 88, None),
    ("math_find", "88.0", 88, None),
    ("math_find", "88.0", 88.0, None),
    ("math_find", "The median is 49.5", 49.5, None),
    ("math_find", "The median is 49.5", [49.5], None),
    ("math_find", "49.50", 49.5, None),
    ("math_find", "49", 49.5, None),
    ("math_find", "-88", 88, None),
    ("math_find", "88, 99", 99, None),
    ("math_find", "", 88, None),
    ("math_find", "eighty-eight", 88, None),
    ("math_find", "８８", 88, None),
    ("math_find", "最大的数是88", [88], None),
    ("math_find", "1.5.3", 1.5, None),
    # math_calc: exact-match prefix of the running values
    ("math_calc", "[1, 4, 8]", [1, 4, 9], None),
    ("math_calc", "[1, 4, 9]", [[1, 4, 9]], None),
    ("math_calc", "0, 1, 4, 8", [1, 4, 8], "gpt4"),
    ("math_calc", "0, 1, 4, 8", [1, 4, 8], None),
    ("math_calc", "[5, -1, 2]", [5, 1, 2], None),
    ("math_calc", "", [5, 1, 2], None),
    ("math_calc", "5\n1\n2\n7", [5, 1, 2], None),
    ("math_calc", "５, 1, 2", [5, 1, 2], None),
    ("math_calc", "1.5, 2", [1, 5, 2], None),
    ("math_calc", "[7]", [[7, 8]], "gpt4"),
    # longdialogue_qa_eng
    ("longdialogue_qa_eng", "ACE", DIALOGUE, None),
    ("longdialogue_qa_eng", "Ace Rothstein", DIALOGUE, None),
    ("longdialogue_qa_eng", "ace.", DIALOGUE, None),
    ("longdialogue_qa_eng", "Grace", ["ACE"], None),
    ("longdialogue_qa_eng", "STAMP PAID", ["STAMP PAID"], None),
    ("longdialogue_qa_eng", "The name is\n\"Stamp Paid\"", ["STAMP PAID"], None),
    ("longdialogue_qa_eng", "", DIALOGUE, None),
    ("longdialogue_qa_eng", "$$MASK$$ is Nicky", DIALOGUE, None),
    ("longdialogue_qa_eng", "NICKY:\nACE", ["NICKY"], None),
    ("longdialogue_qa_eng", "ROTHSTEIN", DIALOGUE, None),
    # longbook_choice_eng: [option text, letter]
    ("longbook_choice_eng", "A", GEORGIE, None),
    ("longbook_choice_eng", "C", CHOICE, None),
    ("longbook_choice_eng", "The answer is: C", CHOICE, None),
    ("longbook_choice_eng", "The answer is C", CHOICE, None),
    ("longbook_choice_eng", "Snowfield", CHOICE, None),
    ("longbook_choice_eng", "The answer is Snowfield", CHOICE, None),
    ("longbook_choice_eng", "answer: Snowfield", CHOICE, None),
    ("longbook_choice_eng", "The correct option is C.", CHOICE, None),
    ("longbook_choice_eng", "A is wrong; the answer is D", ["x", "D"], None),
    ("longbook_choice_eng", "A\nC", CHOICE, None),
    ("longbook_choice_eng", "C\nA", CHOICE, None),
    ("longbook_choice_eng", "The answer is C.\nBut A could also be it.", CHOICE, None),
    ("longbook_choice_eng", "I think (C) Snowfield", CHOICE, None),
    ("longbook_choice_eng", "A) no B) no C) yes", CHOICE, None),
    ("longbook_choice_eng", "c", CHOICE, None),
    ("longbook_choice_eng", "", CHOICE, None),
    ("longbook_choice_eng", "  \n ", CHOICE, None),
    ("longbook_choice_eng", "ABCD", CHOICE, None),
    ("longbook_choice_eng", "AB", CHOICE, None),
    ("longbook_choice_eng", "Based on the text, C", CHOICE, None),
    ("longbook_choice_eng", "Based on the text, the option is C", CHOICE, None),
    ("longbook_choice_eng", "答案是C", CHOICE, None),
    ("longbook_choice_eng", "答案是 C", CHOICE, None),
    ("longbook_choice_eng", "It is E", CHOICE, None),
    ("longbook_choice_eng", "Both A and C\nare plausible, D", CHOICE, None),
    ("longbook_choice_eng", "The farm is Snowfield.", CHOICE, None),
    # longbook_qa_eng / longbook_qa_chn: token / character F1
    ("longbook_qa_eng", "fighting in World War 1.", ["fighting in world war 1"], None),
    ("longbook_qa_eng", "He died fighting in the war", ["fighting in world war 1"], None),
    ("longbook_qa_eng", "", ["Peyton"], None),
    ("longbook_qa_eng", "\"Peyton\"", ["\"Peyton\""], None),
    ("longbook_qa_eng", "Peyton\nand Jennifer", ["Peyton", "Jennifer"], None),
    ("longbook_qa_eng", "The the a an", ["the answer"], None),
    ("longbook_qa_eng", "88.0", ["88"], None),
    ("longbook_qa_eng", "佩顿", ["Peyton"], None),
    ("longbook_qa_chn", "北京", ["北京市"], None),
    ("longbook_qa_chn", "胡一刀，马行空", ["胡一刀, 马行空, 商老太"], None),
    ("longbook_qa_chn", "", ["北京市"], None),
    ("longbook_qa_chn", "Beijing 北京", ["北京", "Beijing"], None),
    ("longbook_qa_chn", "“北京市”。\n上海", ["北京市"], None),
    ("longbook_qa_chn", "ABC abc", ["abc"], None),
    ("longbook_qa_chn", "１２３", ["123"], None),
    # longbook_sum_eng: ROUGE-Lsum
    ("longbook_sum_eng", "the cat sat on the mat", ["the cat is on the mat"], None),
    ("longbook_sum_eng", "The Cat.", ["the cat"], None),
    ("longbook_sum_eng", "a b\nc d", ["a b c d"], None),
    ("longbook_sum_eng", "", ["the cat"], None),
    ("longbook_sum_eng", "猫坐在垫子上", ["猫坐在垫子上"], None),
    ("longbook_sum_eng", "Jennifer marries.\nShe moves away.\n\nThe end.", ["Jennifer moves away.\nShe marries."],
     None),
    ("longbook_sum_eng", "running runs ran", ["run runs running"], None),
    ("longbook_sum_eng", "88.0 percent", ["88 percent"], None),
]


# ----------------------------------------------------------------------------------------------- input shapes
def hub_shape(task: str, label):
    """The answer (and options) as the HF dataset loaded with the recommended explicit features carries them:
    `answer` a list of strings; for the two multiple-choice tasks the answer is the option text and the four
    options are given (the letter follows from the text's position).  Returns (answer, options)."""
    if task in CHOICE_TASKS:
        text, letter = label[0], label[1]
        options = [f"{task} distractor {k}" for k in range(4)]
        options["ABCD".index(letter)] = text
        return [text], options
    if task == "math_calc":
        values = label[0] if label and isinstance(label[0], list) else label
        return [str(v) for v in values], []
    if task in SINGLE_VALUE_TASKS:
        while isinstance(label, list):
            label = label[0]
        return [str(label)], []
    return (list(label) if isinstance(label, list) else [label]), []


# ----------------------------------------------------------------------------------------------- upstream
def _import(path: Path, name: str):
    sys.path.insert(0, str(path.parent))
    try:
        spec = importlib.util.spec_from_file_location(name, path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    finally:
        sys.path.remove(str(path.parent))
    return module


def load_upstream(checkout: Path, tag: str, rouge_script: Path):
    """Import `<checkout>/src/compute_scores.py` and `<checkout>/src/eval_utils.py` under private module names.
    The import-time `evaluate.load("rouge")` of compute_scores is pointed at a local copy of the HF `evaluate` rouge
    metric script (no network)."""
    import evaluate

    if not getattr(evaluate.load, "_conformance_shim", False):
        real_load = evaluate.load

        def load(path, *args, **kwargs):
            return real_load(str(rouge_script) if path == "rouge" else path, *args, **kwargs)

        load._conformance_shim = True
        evaluate.load = load
    tag = tag.replace("-", "_")
    src = checkout / "src"
    return (_import(src / "compute_scores.py", f"_ib_upstream_scores_{tag}"),
            _import(src / "eval_utils.py", f"_ib_upstream_eval_utils_{tag}"))


def run_upstream(modules, task, pred, label, model, options=None):
    """Upstream's score of one example; with `options` the label is first built by upstream's get_answer from a
    dataset record {"answer": label, "options": options}, as its eval_*.py scripts do."""
    scores, eval_utils = modules
    try:
        if options is not None:
            label = eval_utils.get_answer({"answer": label, "options": options}, task)
        return float(scores.get_score_one(pred, label, task, model))
    except Exception as exc:  # recorded, not raised: the golden says which exception upstream hit
        return type(exc).__name__


# ----------------------------------------------------------------------------------------------- inputs
def _read_jsonl(path: Path):
    rows, bad = [], 0
    for line in path.read_text(encoding="utf-8").splitlines():
        if not line.strip():
            continue
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:
            bad += 1
    return rows, bad


def _first_key(row, keys):
    for key in keys:
        if key in row:
            return row[key]
    raise KeyError(f"none of {keys} in {sorted(row)}")


def read_results(results_dir: Path):
    """{file: [(id, task, model, pred, label, position)]} for upstream's results/ files, in sorted order.
    `preds_code_debug_step_by_step.jsonl` counts as code_debug.  Lines that are not valid JSON are skipped (one in
    yarn-mistral/preds_longbook_qa_chn.jsonl; upstream's own loader would stop on it)."""
    files = {}
    for path in sorted(results_dir.glob("*/preds_*.jsonl")):
        model = path.parent.name
        stem = path.stem[len("preds_"):]
        task = "code_debug" if stem == "code_debug_step_by_step" else stem
        if task not in TASKS:
            continue
        rows, bad = _read_jsonl(path)
        name = f"results/{model}/{path.name}"
        examples = []
        for pos, row in enumerate(rows):
            pred = _first_key(row, ("prediction", "pred"))
            label = _first_key(row, ("ground_truth", "label"))
            if task == "math_calc":
                if label and isinstance(label[0], list):
                    label = [label[0][:MATH_CALC_KEEP]] + label[1:]
                else:
                    label = label[:MATH_CALC_KEEP]
            examples.append((f"{name}#{pos}", task, model, pred, label, pos))
        files[name] = (examples, bad)
    return files


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--checkout-2024-06", type=Path, required=True,
                        help="InfiniteBench checkout at 88b3daa (OpenBMB/InfiniteBench); its results/ is read too")
    parser.add_argument("--checkout-2024-08", type=Path, required=True,
                        help="InfiniteBench checkout at ae04ef1 (compute_scores.py unchanged up to 51d9b37)")
    parser.add_argument("--rouge-script", type=Path, required=True,
                        help="metrics/rouge/rouge.py of huggingface/evaluate v0.4.1, used in place of the Hub copy")
    parser.add_argument("--out", type=Path, default=Path("tests/fixtures/conformance/infinitebench"))
    args = parser.parse_args(argv)

    modules = {"2024-06": load_upstream(args.checkout_2024_06, "2024-06", args.rouge_script),
               "2024-08": load_upstream(args.checkout_2024_08, "2024-08", args.rouge_script)}

    def official(task, pred, label, model, options=None):
        return {v: run_upstream(m, task, pred, label, model, options) for v, m in modules.items()}

    per_task = defaultdict(list)
    summary_files = []
    for name, (examples, bad) in read_results(args.checkout_2024_06 / "results").items():
        scored = []
        for ex_id, task, model, pred, label, pos in examples:
            row = {"id": ex_id, "task": task, "model": model, "pred": pred, "label": label,
                   "official": official(task, pred, label, model)}
            scored.append(row)
            every = SAMPLE_EVERY.get(task, DEFAULT_EVERY)
            if pos % every == 0 or row["official"]["2024-06"] != row["official"]["2024-08"]:
                per_task[task].append(row)
        means = {v: round(100 * sum(r["official"][v] for r in scored) / len(scored), 4) for v in VARIANTS}
        committed = sum(1 for r in per_task[scored[0]["task"]] if r["id"].startswith(name + "#"))
        summary_files.append({"file": name, "records": len(scored), "invalid_lines_skipped": bad,
                              "committed": committed, "official_mean_all_records": means})
    for i, (task, pred, label, model) in enumerate(EDGE_CASES):
        row = {"id": f"edge/{task}/{i}", "task": task, "model": model, "pred": pred, "label": label,
               "official": official(task, pred, label, model)}
        answer, options = hub_shape(task, label)
        row["hub_answer"], row["options"] = answer, options
        row["official_hub"] = official(task, pred, answer, model, options)
        per_task[task].append(row)

    args.out.mkdir(parents=True, exist_ok=True)
    for task in TASKS:
        with open(args.out / f"{task}.jsonl", "w", encoding="utf-8") as fh:
            for row in per_task[task]:
                fh.write(json.dumps(row, ensure_ascii=False, sort_keys=True) + "\n")
    (args.out / "summary.json").write_text(json.dumps({"results_files": summary_files}, indent=1) + "\n",
                                           encoding="utf-8")
    print(f"wrote {sum(len(r) for r in per_task.values())} rows to {args.out}")


if __name__ == "__main__":
    main()
