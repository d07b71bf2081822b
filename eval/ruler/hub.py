"""RULER's QA sources through `datasets` when no local file is given and the Hub is reachable.

RULER reads SQuAD v2.0 dev (`squad.json`) and HotpotQA dev distractor (`hotpotqa.json`) in their original JSON
layouts. The Hub mirrors hold the same records flattened into rows, in file order:

    rajpurkar/squad_v2 (validation):     id, title, context, question, answers{text, answer_start}
    hotpotqa/hotpot_qa distractor (validation): id, question, answer, type, level,
                                         supporting_facts{title, sent_id}, context{title, sentences}

`to_squad_json` / `to_hotpotqa_json` rebuild the original layouts (articles -> paragraphs -> qas in order of first
appearance; a SQuAD question is unanswerable iff it has no answer) and the file is written once under
`cache_dir`, so the generators read exactly what they read from a local copy. The essay corpus and
`english_words.json` have no Hub source (RULER builds the first from web pages, the second is a Git-LFS file in its
repository): they are local files only.
"""
from __future__ import annotations

import json
import os
from pathlib import Path

HUB_SOURCES = {
    "squad": ("rajpurkar/squad_v2", None, "validation"),
    "hotpotqa": ("hotpotqa/hotpot_qa", "distractor", "validation"),
}


def hub_offline() -> bool:
    return any(os.environ.get(v, "").strip().lower() in ("1", "true", "yes", "on")
               for v in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "TRANSFORMERS_OFFLINE"))


def to_squad_json(rows) -> dict:
    articles: dict[str, dict[str, list]] = {}
    for r in rows:
        paragraphs = articles.setdefault(r["title"], {})
        answers = [{"text": t, "answer_start": int(s)}
                   for t, s in zip(r["answers"]["text"], r["answers"]["answer_start"])]
        paragraphs.setdefault(r["context"], []).append(
            {"id": r["id"], "question": r["question"], "answers": answers, "is_impossible": not answers})
    return {"version": "v2.0", "data": [
        {"title": t, "paragraphs": [{"context": c, "qas": qas} for c, qas in ps.items()]} for t, ps in articles.items()]}


def to_hotpotqa_json(rows) -> list[dict]:
    return [{
        "_id": r["id"], "question": r["question"], "answer": r["answer"], "type": r["type"], "level": r["level"],
        "supporting_facts": [[t, int(i)] for t, i in zip(r["supporting_facts"]["title"], r["supporting_facts"]["sent_id"])],
        "context": [[t, list(s)] for t, s in zip(r["context"]["title"], r["context"]["sentences"])],
    } for r in rows]


def fetch_from_hub(kind: str, file_name: str, cache_dir: str | os.PathLike) -> Path:
    """The RULER-layout file for `kind`, built from its Hub mirror once; FileNotFoundError when that fails."""
    path = Path(cache_dir) / file_name
    if path.is_file():
        return path
    repo, config, split = HUB_SOURCES[kind]
    where = f"{repo!r}" + (f" (config {config!r})" if config else "") + f" split {split!r}"
    if hub_offline():
        raise FileNotFoundError(f"the HF Hub is switched off (HF_HUB_OFFLINE / HF_DATASETS_OFFLINE), so {where} "
                                f"could not be loaded")
    try:
        import datasets

        rows = datasets.load_dataset(repo, config, split=split)
    except Exception as exc:  # no network, hub layout change: the caller turns it into one clear message
        first = str(exc).splitlines()[0] if str(exc) else ""
        raise FileNotFoundError(f"loading {where} through datasets failed ({type(exc).__name__}: {first})") from None
    data = to_squad_json(rows) if kind == "squad" else to_hotpotqa_json(rows)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(data), encoding="utf-8")
    os.replace(tmp, path)
    return path
