"""RULER conformance: every task's samples equal the official generators' output byte for byte.

The goldens in tests/fixtures/conformance/ruler/ were written by scripts/conformance/ruler.py, which runs
NVIDIA/RULER's own ``scripts/data/prepare.py`` (commit and command in manifest.json and the README there)
with the SmolLM2 tokenizer, seed 42 and the stand-in data files; for each of the 13 tasks x 2 lengths x
3 samples x 2 templates (upstream ``base`` = no template, and the SmolLM2 chat template registered in
upstream's template table) the harness must produce the same prompt, answer prefix, references, length
and (NIAH) answer token position.  Upstream's ``input`` stops before the answer prefix; the harness's
``input`` is the full prompt, so it is compared with golden ``input`` + ``answer_prefix``.  One recorded
deviation is allowed, and only in the form stated in ``_expected_input`` (NIAH single-needle rewrite of the
model template).
"""

from __future__ import annotations

import functools
import hashlib
import json
from pathlib import Path

import pytest

from eval.ruler import generate as G
from eval.ruler.common import wrap
from eval.ruler.tasks import ALL_TASKS, NIAH_TASKS

ROOT = Path(__file__).resolve().parents[2]
GOLDEN = Path(__file__).parents[1] / "fixtures" / "conformance" / "ruler"
MANIFEST = json.loads((GOLDEN / "manifest.json").read_text(encoding="utf-8"))
PROJECT_SOURCES = Path(__file__).parents[1] / "fixtures" / "ruler" / "sources"
QA_SOURCES = GOLDEN / "sources"
CHAT = "smollm2-chat"


@functools.lru_cache(maxsize=None)
def golden(task: str) -> dict:
    """(template, length) -> the upstream records of that run, in sample order."""
    out: dict = {}
    with open(GOLDEN / f"{task}.jsonl", encoding="utf-8") as f:
        for line in f:
            row = json.loads(line)
            out.setdefault((row["template"], row["max_seq_length"]), []).append(row["record"])
    return out


CASES = [(task, template, length) for task in MANIFEST["tasks"] for template in MANIFEST["templates"]
         for length in MANIFEST["lengths"]]


def _first_difference(a: str, b: str) -> str:
    i = next((k for k, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
    return (f"first difference at character {i} of {len(a)} (harness) / {len(b)} (upstream): "
            f"harness {a[max(0, i - 40):i + 40]!r} vs upstream {b[max(0, i - 40):i + 40]!r}")


# Upstream's single-needle rewrite (niah.py: q * v == 1), applied there to the whole template string.
UPSTREAM_SINGLE_NEEDLE_REWRITE = (("Some", "A"), ("are all", "is"), ("are", "is"), ("answers", "answer"))


def _rewritten(text: str) -> str:
    for old, new in UPSTREAM_SINGLE_NEEDLE_REWRITE:
        text = text.replace(old, new)
    return text


def _expected_input(task: str, template: str, want: dict, where: str) -> str:
    """golden input + answer prefix; for single-needle NIAH tasks under the chat template, with upstream's
    rewrite of the model template undone (the one recorded deviation, eval/ruler/niah.py: upstream turns
    SmolLM2's system prompt "You are a helpful ..." into "You is a helpful ..."; the task text, the answer
    prefix, the random draws and the token counts are upstream's)."""
    text = want["input"]
    cfg = ALL_TASKS[task]
    if template == CHAT and task in NIAH_TASKS and cfg["num_needle_q"] * cfg["num_needle_v"] == 1:
        head, tail = MANIFEST["templates"][CHAT].format(task_template="\0").split("\0")
        up_head, up_tail = _rewritten(head), _rewritten(tail)
        assert up_head != head, "the recorded deviation no longer applies: update this test and niah.py"
        assert text.startswith(up_head) and text.endswith(up_tail), f"{where}: golden does not have upstream's layout"
        text = head + text[len(up_head):len(text) - len(up_tail)] + tail
    return text + want["answer_prefix"]


def _check(task: str, template: str, got: dict, want: dict, where: str) -> None:
    expected_input = _expected_input(task, template, want, where)
    assert got["input"] == expected_input, f"{where}: prompt differs; {_first_difference(got['input'], expected_input)}"
    assert got["answer_prefix"] == want["answer_prefix"], \
        f"{where}: answer prefix differs; {_first_difference(got['answer_prefix'], want['answer_prefix'])}"
    assert got["outputs"] == want["outputs"], f"{where}: references {got['outputs']} vs upstream {want['outputs']}"
    assert got["length"] == want["length"] == want["length_w_model_temp"], \
        f"{where}: length {got['length']} vs upstream {want['length']}"
    if task in NIAH_TASKS:
        assert got["token_position_answer"] == want["token_position_answer"], \
            f"{where}: token_position_answer {got['token_position_answer']} vs upstream {want['token_position_answer']}"
    else:  # upstream's own 0..n-1 index (NIAH's is overwritten by a character offset upstream)
        assert got["index"] == want["index"], f"{where}: index {got['index']} vs upstream {want['index']}"


def test_manifest_inputs_are_the_files_in_this_repository(tok):
    assert MANIFEST["upstream"] == "NVIDIA/RULER" and MANIFEST["commit"].startswith("c3f5e3b")
    assert sorted(MANIFEST["tasks"]) == sorted(ALL_TASKS)
    for name, d in MANIFEST["data"].items():
        path = ROOT / d["file"]
        assert hashlib.sha256(path.read_bytes()).hexdigest() == d["sha256"], \
            f"{d['file']} changed since the goldens were made: rerun scripts/conformance/ruler.py"
    from locks.core.embedded_model import smollm2_gguf_path

    gguf = smollm2_gguf_path()
    assert gguf.name == MANIFEST["tokenizer"]["gguf"]
    assert hashlib.sha256(gguf.read_bytes()).hexdigest() == MANIFEST["tokenizer"]["gguf_sha256"], \
        "the SmolLM2 GGUF (its tokenizer) changed since the goldens were made: rerun scripts/conformance/ruler.py"
    # the template registered upstream is exactly the harness's chat wrapping of the user turn
    text = "A {context} \n x"
    assert MANIFEST["templates"][CHAT].format(task_template=text) == wrap(tok, text, True, "conformance")
    assert MANIFEST["templates"]["base"].format(task_template=text) == wrap(tok, text, False, "conformance")


@pytest.mark.parametrize("task,template,length", CASES)
def test_samples_equal_upstream(tok, task, template, length):
    want = golden(task)[(template, length)]
    data_dir = QA_SOURCES if ALL_TASKS[task]["family"] == "qa" else PROJECT_SOURCES
    got = G.generate_samples(task, tok, length, len(want), seed=MANIFEST["seed"], chat_template=template == CHAT,
                             data_dir=data_dir)
    assert len(got) == len(want) == MANIFEST["num_samples"]
    for i, (g, w) in enumerate(zip(got, want)):
        _check(task, template, g, w, f"RULER {task} @{length} template={template} sample {i}")
