"""Regenerate the LongBench scorer goldens under tests/fixtures/conformance/longbench/ (not run in CI).

Builds a deterministic prediction/answer set for each of the 21 LongBench tasks (`CASES_PER_TASK` examples each,
from the answer pools below and seeded perturbations of them: exact, case and punctuation changes, partial and
padded answers, wrong answers, empty and blank answers, several lines, Chinese, numbers such as "88.0", code with
comment lines, ...), then runs the official scorer of a LongBench checkout (`LongBench/eval.py` + `metrics.py`,
imported from the path given on the command line) on it:

* per example: upstream's `scorer(task, [pred], [answers], all_classes)` -- its own first-line rule, max over the
  answers and metric -- with the module's `round` made the identity for that call, so the value is 100 x the
  unrounded example score (the golden stores it divided by 100);
* per task: upstream's `scorer` on all examples (rounded as upstream rounds), and for the 13 LongBench-E tasks
  upstream's `scorer_e` by the examples' `length`, once on all examples and once on those shorter than 8000 (so the
  8k+ bucket is empty; upstream gives NaN there, stored as null).

The libraries the metrics call are the ones installed (rouge 1.0.1, jieba 0.42.1, fuzzywuzzy 0.18.0 with
python-Levenshtein 0.27.5 in this project).  Nothing of upstream is copied here: the goldens are outputs of
upstream code.  The exact command and the commit are in the fixture directory's README.md.
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import math
import random
import sys
import warnings
from pathlib import Path

TASKS = ("narrativeqa", "qasper", "multifieldqa_en", "multifieldqa_zh", "hotpotqa", "2wikimqa", "musique",
         "dureader", "gov_report", "qmsum", "multi_news", "vcsum", "trec", "triviaqa", "samsum", "lsht",
         "passage_count", "passage_retrieval_en", "passage_retrieval_zh", "lcc", "repobench-p")
TASKS_E = ("qasper", "multifieldqa_en", "hotpotqa", "2wikimqa", "gov_report", "multi_news", "trec", "triviaqa",
           "samsum", "passage_count", "passage_retrieval_en", "lcc", "repobench-p")
CASES_PER_TASK = 300
SEED = 20240614

# ------------------------------------------------------------------------------------------ answer pools
EN_ANSWERS = [
    "Ann Vale", "Bo Rill", "1901", "the Eiffel Tower", "yes", "no", "unanswerable", "Paris", "Berlin, Germany",
    "88", "88.0", "3.5 million", "October 12, 1492", "the BLEU score", "a convolutional neural network",
    "He wanted to escape his father's debts", "Because the river had flooded the only road",
    "The Royal Society of London", "Mount Kilimanjaro", "twenty-three", "F1 and exact match",
    "They used 5,000 annotated sentences", "an LSTM with attention", "Queen Victoria", "the 1980s",
    "Harvard University", "Jean-Paul Sartre", "New York City", "The Beatles", "to save her brother",
    "Sir Arthur Conan Doyle", "the United States Navy", "1,024", "42", "Lake Baikal", "Microsoft",
    "English and German", "a stolen painting", "the captain", "O'Brien",
]
TRIVIA_ALIASES = [
    ["Paris", "Paris, France", "City of Light"], ["Mount Everest", "Everest", "Chomolungma"],
    ["William Shakespeare", "Shakespeare", "The Bard"], ["Au", "gold"], ["1066"], ["The Nile", "Nile", "Nile River"],
    ["Jupiter"], ["H2O", "water"], ["Leonardo da Vinci", "da Vinci", "Leonardo"], ["Canberra"],
]
ZH_ANSWERS = [
    "北京", "上海市", "1949年10月1日", "鲁迅", "长江", "三个月", "因为天气太冷了", "中国科学院", "李白和杜甫",
    "是", "否", "百分之八十八", "88.0", "周恩来总理", "清华大学", "黄河流经九个省区", "他想回到故乡",
    "人工智能", "5000万元", "《红楼梦》",
]
EN_SENTENCES = [
    "The committee reviewed the budget for the next fiscal year.",
    "Members agreed that the program needs more oversight.",
    "The report finds that costs rose by 12 percent since 2015.",
    "Several agencies did not track their spending consistently.",
    "The professor proposed a new evaluation for the course.",
    "Students raised concerns about the workload and the deadlines.",
    "The marketing team will present the design on Monday.",
    "Sales in the northern region fell during the winter.",
    "Officials said the bridge would reopen in the spring.",
    "The storm damaged hundreds of homes along the coast.",
    "Researchers found that the drug reduced symptoms in most patients.",
    "The mayor announced a plan to expand public transport.",
    "Critics argued that the law would hurt small businesses.",
    "The company reported record profits for the third quarter.",
    "Amanda baked cookies and will bring Jerry some tomorrow.",
    "Tom is running late because his train was cancelled.",
    "Lena and Mark will meet at the cinema at 8 pm.",
    "Peter cannot find his keys and asks Sue to check the car.",
    "The GAO recommends that the agency improve its data collection.",
    "Congress should consider requiring annual progress reports.",
    "The project manager suggested a remote control shaped like a banana.",
    "The group decided to use a rubber case and a simple button layout.",
]
ZH_SENTENCES = [
    "先把米洗干净，加水后用电饭锅煮二十分钟。", "会议讨论了明年的预算安排。", "专家认为应当加强监管。",
    "这款手机的电池续航时间较长。", "多数患者在服药后症状明显减轻。", "市政府宣布扩大公共交通网络。",
    "产品经理建议采用更简洁的按钮布局。", "团队决定下周一提交设计方案。", "北方地区冬季销量有所下降。",
    "暴雨导致沿海数百间房屋受损。", "大家一致同意推迟项目上线时间。", "可以在银行柜台或网上办理挂失。",
    "首先打开设置，然后选择网络选项。", "这部电影讲述了一个关于友情的故事。",
]
TREC_CLASSES = [
    "Abbreviation", "Expression abbreviated", "Animal", "Organ of body", "Color",
    "Invention, book and other creative piece", "Currency name", "Disease and medicine", "Event", "Food",
    "Musical instrument", "Language", "Letter like a-z", "Other entity", "Plant", "Product", "Religion", "Sport",
    "Element and substance", "Symbols and sign", "Techniques and method", "Equivalent term", "Vehicle",
    "Word with a special property", "Definition of something", "Description of something", "Manner of an action",
    "Reason", "Group or organization of persons", "Individual", "Title of a person", "Description of a person",
    "City", "Country", "Mountain", "Other location", "State", "Postcode or other code", "Number of something",
    "Date", "Distance, linear measure", "Price", "Order, rank", "Other number", "Lasting time of something",
    "Percent, fraction", "Speed", "Temperature", "Size, area and volume", "Weight",
]
LSHT_CLASSES = [
    "农业、农村", "军事", "文学、艺术", "体育", "传媒业", "电子信息产业", "文化、休闲娱乐", "社会、劳动", "经济",
    "服务业、旅游业", "环境、气象", "能源、水务、水利", "财政、金融", "教育", "科学技术", "对外关系、国际关系",
    "矿业、工业", "政治", "交通运输、邮政、物流", "灾难、事故", "基本建设、建筑业、房地产", "医药、卫生",
    "法律、司法", "商业、外贸、海关",
    # stand-ins that are parts of other class names, so that upstream's remove-while-iterating quirk in
    # classification_score is exercised (two adjacent ones: the second is skipped)
    "金融", "财政", "工业",
]
CODE_LINES = [
    "    return add(x, 1)", "        self.assertEqual(result, expected)", "    for i in range(len(items)):",
    "        if not os.path.exists(path):", "    public static void main(String[] args) {",
    "        return this.name;", "    x = np.zeros((n, m), dtype=np.float32)", "        }",
    "    raise ValueError(f\"bad value: {value}\")", "            logger.info(\"done\")",
    "    int count = 0;", "        const result = await fetch(url);", "    print(\"#\" * 10)",
    "    url = \"http://example.com/api\"",
]


# ------------------------------------------------------------------------------------------ perturbations
def _tokens_drop(rng, s):
    words = s.split()
    if len(words) <= 1:
        return s
    return " ".join(w for w in words if rng.random() > 0.4) or words[0]


def _shuffle(rng, s):
    words = s.split()
    rng.shuffle(words)
    return " ".join(words)


PERTURB = [
    lambda rng, s, other: s,
    lambda rng, s, other: s.upper(),
    lambda rng, s, other: s.lower() + ".",
    lambda rng, s, other: f"The answer is {s}.",
    lambda rng, s, other: f"Answer: {s}\nExplanation: it says so in the passage.",
    lambda rng, s, other: f"\n\n{s}\n{other}",
    lambda rng, s, other: f"{other}\n{s}",
    lambda rng, s, other: f"  {s}  ",
    lambda rng, s, other: _tokens_drop(rng, s),
    lambda rng, s, other: _shuffle(rng, s),
    lambda rng, s, other: other,
    lambda rng, s, other: "",
    lambda rng, s, other: " \n ",
    lambda rng, s, other: f"{s}, {other}",
    lambda rng, s, other: f"\"{s}\" (see paragraph 3)",
    lambda rng, s, other: f"I think it is the {s}!!",
    lambda rng, s, other: f"{s} {s}",
    lambda rng, s, other: s.replace(" ", "  ") + " 88.0",
    lambda rng, s, other: f"答案是{s}。",
    lambda rng, s, other: f"{s}\n\nQuestion: what else?\nAnswer: {other}",
]


def _qa_case(rng, pool, alias_lists=None):
    if alias_lists is not None:
        answers = list(rng.choice(alias_lists))
        other = rng.choice(rng.choice(alias_lists))
    else:
        answers = rng.sample(pool, rng.choice((1, 1, 1, 2, 3)))
        other = rng.choice(pool)
    gold = rng.choice(answers)
    return rng.choice(PERTURB)(rng, gold, other), answers


def _summary_case(rng, sentences, joiner):
    gold_sents = rng.sample(sentences, rng.randint(1, 5))
    gold = joiner.join(gold_sents)
    mode = rng.randrange(11)
    if mode == 0:
        pred = gold
    elif mode == 1:
        pred = joiner.join(rng.sample(gold_sents, max(1, len(gold_sents) - 1)) + rng.sample(sentences, 1))
    elif mode == 2:
        pred = joiner.join(rng.sample(sentences, rng.randint(1, 4)))
    elif mode == 3:
        pred = gold.lower()
    elif mode == 4:
        pred = "\n".join(gold_sents)
    elif mode == 5:
        pred = gold[: max(1, len(gold) // 2)]
    elif mode == 6:
        pred = rng.choice(("", " ", ".", "...", "\n"))
    elif mode == 7:
        pred = _shuffle(rng, gold)
    elif mode == 8:
        pred = gold + joiner + gold
    elif mode == 9:
        pred = "Summary:\n" + gold.replace(".", ",").replace("。", "，")
    else:
        pred = _tokens_drop(rng, gold)
    return pred, [gold]


def _long_single_sentence(rng, sentences, n_words):
    words = " ".join(sentences).replace(".", "").split()
    return " ".join(rng.choice(words) for _ in range(n_words))


def _classification_case(rng, classes):
    gold = rng.choice(classes)
    other = rng.choice(classes)
    mode = rng.randrange(9)
    pred = [gold, f"{gold}\n{other}", f"{other}\n{gold}", f"{gold}, {other}", other, "", f"Type: {gold.lower()}",
            f"\n{gold} or maybe {other}", "Other"][mode]
    return pred, [gold]


def _retrieval_case(rng, zh):
    n = rng.randint(1, 30)
    gold = f"段落{n}" if zh else f"Paragraph {n}"
    m = rng.randint(1, 30)
    mode = rng.randrange(10)
    word = "段落" if zh else "Paragraph "
    pred = [gold, str(n), f"{word}{n}和{word}{m}" if zh else f"Paragraph {n} and Paragraph {m}", f"{word}{m}",
            "", f"The answer is paragraph {n}.", f"{n}{n}", f"Paragraph {n}\nParagraph {n}", f"第{n}段",
            f"{word}{n}, {n}, {m}"][mode]
    return pred, [gold]


def _count_case(rng):
    n = rng.randint(1, 30)
    m = rng.randint(1, 30)
    mode = rng.randrange(8)
    pred = [str(n), f"There are {n} unique paragraphs.", f"{m}", f"{n} or {m}", "", "none",
            f"{n}.0", f"Paragraph 1, Paragraph {m}: {n} in total"][mode]
    answer = n if rng.random() < 0.2 else str(n)  # a bare number as well as a string
    return pred, [answer]


def _code_case(rng):
    gold = rng.choice(CODE_LINES)
    other = rng.choice(CODE_LINES)
    mode = rng.randrange(11)
    pred = [gold, f"\n{gold}\n{other}", f"```python\n{gold}\n```", f"# next line\n{gold}", f"// comment\n{other}",
            gold.strip(), gold.replace("(", " ("), other, "", f"\n\n\n{gold}", f"`{gold}`\n{other}"][mode]
    return pred, [gold]


def build_cases(task: str):
    rng = random.Random(f"{SEED}/{task}")
    cases = []
    for i in range(CASES_PER_TASK):
        all_classes = None
        if task in ("narrativeqa", "qasper", "multifieldqa_en", "hotpotqa", "2wikimqa", "musique"):
            pred, answers = _qa_case(rng, EN_ANSWERS)
        elif task == "triviaqa":
            pred, answers = _qa_case(rng, EN_ANSWERS, TRIVIA_ALIASES)
        elif task == "multifieldqa_zh":
            pred, answers = _qa_case(rng, ZH_ANSWERS)
        elif task in ("gov_report", "qmsum", "multi_news", "samsum"):
            if i == 0:  # one very long single sentence: rouge's recursive LCS overflows -> upstream's except -> 0
                pred = _long_single_sentence(rng, EN_SENTENCES, 700)
                answers = [_long_single_sentence(rng, EN_SENTENCES, 700)]
            else:
                pred, answers = _summary_case(rng, EN_SENTENCES, " ")
        elif task in ("dureader", "vcsum"):
            pred, answers = _summary_case(rng, ZH_SENTENCES, "")
        elif task == "trec":
            pred, answers = _classification_case(rng, TREC_CLASSES)
            all_classes = TREC_CLASSES
        elif task == "lsht":
            pred, answers = _classification_case(rng, LSHT_CLASSES)
            all_classes = LSHT_CLASSES
        elif task == "passage_count":
            pred, answers = _count_case(rng)
        elif task in ("passage_retrieval_en", "passage_retrieval_zh"):
            pred, answers = _retrieval_case(rng, task.endswith("_zh"))
        else:
            pred, answers = _code_case(rng)
        length = rng.choice((rng.randint(100, 3999), rng.randint(4000, 7999), rng.randint(8000, 20000),
                             rng.choice((3999, 4000, 7999, 8000))))
        cases.append({"id": f"{task}/{i}", "task": task, "pred": pred, "answers": answers,
                      "all_classes": all_classes, "length": length})
    # all_classes is the same for every example of a task; it is written once, to task_scores.json
    return cases


# ------------------------------------------------------------------------------------------ upstream
def load_upstream_eval(checkout: Path):
    """Import `<checkout>/LongBench/eval.py` (it imports `metrics` from its own directory) under a private name."""
    src = checkout / "LongBench"
    sys.path.insert(0, str(src))
    try:
        spec = importlib.util.spec_from_file_location("_longbench_upstream_eval", src / "eval.py")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    finally:
        sys.path.remove(str(src))
    return module


def upstream_example_score(module, case) -> float:
    """100 x the example score from upstream's scorer on a one-example list, with its final rounding disabled."""
    module.round = lambda value, ndigits=None: value
    try:
        return module.scorer(case["task"], [case["pred"]], [case["answers"]], case["all_classes"]) / 100
    finally:
        del module.round


def _nan_to_none(buckets: dict) -> dict:
    return {k: (None if isinstance(v, float) and math.isnan(v) else v) for k, v in buckets.items()}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--checkout", type=Path, required=True, help="THUDM/LongBench checkout at 2e00731")
    parser.add_argument("--out", type=Path, default=Path("tests/fixtures/conformance/longbench"))
    args = parser.parse_args(argv)
    upstream = load_upstream_eval(args.checkout)
    args.out.mkdir(parents=True, exist_ok=True)
    task_scores = {}
    for task in TASKS:
        cases = build_cases(task)
        for case in cases:
            case["official"] = upstream_example_score(upstream, case)
        preds = [c["pred"] for c in cases]
        answers = [c["answers"] for c in cases]
        classes = cases[-1]["all_classes"]  # eval.py uses the last record's all_classes for the whole task
        entry = {"all_classes": classes, "score": upstream.scorer(task, preds, answers, classes)}
        if task in TASKS_E:
            lengths = [c["length"] for c in cases]
            short = [i for i, c in enumerate(cases) if c["length"] < 8000]
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", RuntimeWarning)  # np.mean of the empty 8k+ bucket
                entry["e_buckets"] = _nan_to_none(upstream.scorer_e(task, preds, answers, lengths, classes))
                entry["e_buckets_below_8000"] = _nan_to_none(upstream.scorer_e(
                    task, [preds[i] for i in short], [answers[i] for i in short], [lengths[i] for i in short],
                    classes))
        task_scores[task] = entry
        with open(args.out / f"{task}.jsonl", "w", encoding="utf-8") as fh:
            for case in cases:
                row = {k: v for k, v in case.items() if k != "all_classes"}
                fh.write(json.dumps(row, ensure_ascii=False, sort_keys=True) + "\n")
    (args.out / "task_scores.json").write_text(json.dumps(task_scores, indent=1, ensure_ascii=False) + "\n",
                                               encoding="utf-8")
    print(f"wrote {len(TASKS)} tasks x {CASES_PER_TASK} examples to {args.out}")


if __name__ == "__main__":
    main()
