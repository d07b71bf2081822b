"""RULER QA tasks ("qa_1" = SQuAD v2.0 dev, "qa_2" = HotpotQA dev distractor), docs/benchmarks/ruler.md (haystack sizing §4, unit = 10 documents).

Reproduces NVIDIA/RULER c3f5e3b ``scripts/data/synthetic/qa.py`` ("upstream") byte for byte (checked by
tests/eval/test_conformance_ruler.py): one ``random.Random(seed)`` stream draws the extra documents (probe and
binary search use question 0, sample i uses question i), every document list is shuffled with a fresh
``Random(seed)``, and the search bound comes from a prompt-only probe (common.probe_upper_bound).  Data
are read from local files (RULER's names ``squad.json`` / ``hotpotqa.json`` in ``data_dir``) or, when
missing there and the Hub is reachable, rebuilt from their ``datasets`` mirrors (hub.py).
Deliberate differences (none changes a sample of the real SQuAD v2 / HotpotQA files):
  * a question without ``is_impossible`` counts as answerable (SQuAD v1 layout; upstream: KeyError), and an
    answerable question without any answer text is skipped (upstream would keep it with no references);
  * ValueError when more samples are asked than the file has (answerable) questions (upstream: IndexError);
  * ValueError instead of an endless loop when even one unit does not fit (pitfall 6).
"""

from __future__ import annotations

import functools
import json
import os
import random
from pathlib import Path

from .common import count_tokens, probe_upper_bound, resolve_data_file, sample_records, search_and_generate, wrap
from .tasks import OTHER_TASKS, QA_DOC_UNIT, QA_DOCUMENT, QA_FAMILY, SEARCH_SLACK


def _schema_error(path, what, e=None):
    return ValueError(f"{path}: not in the {what} schema{': ' + repr(e) if e else ''}")


def read_squad(path) -> tuple[list[dict], list[str]]:
    """(questions, documents): documents = sorted unique paragraph contexts; questions = answerable
    QAs in file order with refs = all answer texts, own doc and the other docs of the same article
    (in article order, a repeated paragraph repeated, as upstream)."""
    with open(path, encoding="utf-8") as f:
        data = json.load(f)
    try:
        docs = sorted({p["context"] for d in data["data"] for p in d["paragraphs"]})
        idx = {c: i for i, c in enumerate(docs)}
        qas = []
        for d in data["data"]:
            article = [idx[p["context"]] for p in d["paragraphs"]]
            for p in d["paragraphs"]:
                own = idx[p["context"]]
                for qa in p["qas"]:
                    if qa.get("is_impossible", False):
                        continue
                    refs = [a["text"] for a in qa["answers"]]
                    if not refs:
                        continue
                    # a paragraph listed twice in its article stays twice here, as upstream has it
                    qas.append({"query": qa["question"], "outputs": refs, "context": [own],
                                "more_context": [j for j in article if j != own]})
    except (KeyError, TypeError) as e:
        raise _schema_error(path, "SQuAD v2.0 (dev-v2.0.json)", e) from e
    return qas, docs


def _hotpot_doc(title, sentences) -> str:
    return f"{title}\n{''.join(sentences)}"


def read_hotpotqa(path) -> tuple[list[dict], list[str]]:
    """(questions, documents): document = title + "\\n" + "".join(sentences); every question with its
    10 context docs (gold + distractors, in file order, a repeated one repeated, as upstream); refs = [answer]."""
    with open(path, encoding="utf-8") as f:
        data = json.load(f)
    try:
        docs = sorted({_hotpot_doc(t, s) for d in data for t, s in d["context"]})
        idx = {c: i for i, c in enumerate(docs)}
        qas = [{"query": d["question"], "outputs": [d["answer"]],
                "context": [idx[_hotpot_doc(t, s)] for t, s in d["context"]],  # duplicates kept, as upstream
                "more_context": []} for d in data]
    except (KeyError, TypeError, ValueError) as e:
        raise _schema_error(path, "HotpotQA dev distractor (hotpot_dev_distractor_v1.json)", e) from e
    return qas, docs


@functools.lru_cache(maxsize=4)
def _load_cached(kind: str, path: str, mtime_ns: int, size: int):
    return read_squad(path) if kind == "squad" else read_hotpotqa(path)


def load_qa(kind: str, path) -> tuple[list[dict], list[str]]:
    p = str(Path(path).resolve())
    st = os.stat(p)
    return _load_cached(kind, p, st.st_mtime_ns, st.st_size)


def generate_qa_samples(task: str, tokenizer, context_length: int, num_samples: int, seed: int = 42,
                        chat_template: bool = True, data_dir=None, data_path=None, hub_cache=None) -> list[dict]:
    """``num_samples`` QA samples sized to ``context_length`` tokens (same record fields as NIAH;
    ``num_haystack`` = documents).  ``data_path`` overrides ``data_dir/<squad|hotpotqa>.json``."""
    cfg = OTHER_TASKS[task]
    if cfg["family"] != "qa":
        raise ValueError(f"{task!r} is not a qa task")
    path = resolve_data_file(cfg["dataset"], task, data_dir, data_path, hub_cache)
    qas, docs = load_qa(cfg["dataset"], path)
    if num_samples > len(qas):
        raise ValueError(f"RULER {task}: {num_samples} samples asked but {path} has only {len(qas)} "
                         f"answerable questions")
    if not qas:
        raise ValueError(f"RULER {task}: {path} has no answerable question")
    ttg = cfg["tokens_to_generate"]
    rng = random.Random(seed)
    prefix_tmpl = QA_FAMILY["answer_prefix"]

    def build_for(index: int, num_docs: int):
        q = qas[index]
        own, more = q["context"], q["more_context"]
        if num_docs < len(docs):
            if num_docs - len(own) > len(more):
                excluded = set(own) | set(more)
                others = [i for i in range(len(docs)) if i not in excluded]
                chosen = own + more + rng.sample(others, max(0, num_docs - len(own) - len(more)))
            else:
                chosen = own + rng.sample(more, max(0, num_docs - len(own)))
            picked = [docs[i] for i in chosen]
        else:  # §5.5: the whole pool, repeated and cut
            picked = (docs * -(-num_docs // len(docs)))[:num_docs]
        random.Random(seed).shuffle(picked)
        context = "\n\n".join(QA_DOCUMENT.format(i=i + 1, document=d) for i, d in enumerate(picked))
        task_text = QA_FAMILY["template"].format(context=context, query=q["query"])
        prefix = prefix_tmpl  # has no placeholders
        return wrap(tokenizer, task_text, chat_template, task) + prefix, prefix, list(q["outputs"])

    def tokens(built) -> int:
        return count_tokens(tokenizer, built[0]) + ttg

    def sample(i: int, n: int):
        built = build_for(i, n)
        return built, tokens(built)

    # upstream: the probe (question 0, one unit of documents) counts prompt tokens only
    probe = count_tokens(tokenizer, build_for(0, QA_DOC_UNIT)[0])
    upper = probe_upper_bound(task, context_length, probe, QA_DOC_UNIT, SEARCH_SLACK, QA_DOC_UNIT)
    results, _ = search_and_generate(task, lambda n: tokens(build_for(0, n)), sample, context_length, QA_DOC_UNIT,
                                     upper, num_samples, kind="documents")
    return sample_records(task, cfg, results, chat_template)
