"""InfiniteBench scorers against the official code, example by example, for both scorer variants.

The goldens in tests/fixtures/conformance/infinitebench/ are the per-example scores of upstream's own
`compute_scores.py` (2024-06: 88b3daa, 2024-08: ae04ef1) on upstream's results/ predictions (sampled) and on edge
cases; fixtures/conformance/infinitebench/README.md names the commits and the command.  Every golden example is
scored by the harness four ways: the label as upstream's files carry it, through `normalize_label` (what the
benchmark does) and passed straight to `scoring.score`; and the answer as the Hub dataset carries it (a list of
strings, options alongside), through `normalize_label` and, where the scorer can take it, straight.  The only
tolerated differences are the two deviations recorded in the `eval.infinitebench.scoring` docstring; each is
checked to be exactly what the docstring says.
"""
import json
import math
from pathlib import Path

import pytest

from eval.infinitebench import scoring

GOLDEN = Path(__file__).parents[1] / "fixtures" / "conformance" / "infinitebench"
CHOICE_TASKS = ("code_debug", "longbook_choice_eng")
NUMBER_LABEL_TASKS = ("code_run", "math_find", "math_calc")
# Deviation 2 (label shapes): where upstream reads the Hub's answer shape differently from its own JSONL labels.
UPSTREAM_HUB_SHAPE_DIFFERS = {("kv_retrieval", "2024-06")} | {(t, v) for t in NUMBER_LABEL_TASKS
                                                              for v in scoring.SCORER_VARIANTS}


def _load(task):
    with open(GOLDEN / f"{task}.jsonl", encoding="utf-8") as fh:
        return [json.loads(line) for line in fh]


def _hub_shape(task, label):
    """The Hub form of a JSONL label (for the results/ rows; the edge rows carry theirs): a list of strings, and
    for the multiple-choice tasks the option text plus four options with it at the letter's position."""
    if task in CHOICE_TASKS:
        options = [f"other option {k}" for k in range(4)]
        options["ABCD".index(label[1])] = label[0]
        return [label[0]], options
    if task == "math_calc":
        values = label[0] if label and isinstance(label[0], list) else label
        return [str(v) for v in values], []
    if task in ("passkey", "number_string", "kv_retrieval", "code_run", "math_find"):
        while isinstance(label, list):
            label = label[0]
        return [str(label)], []
    return list(label), []


def _official(value, task):
    """What the harness must give where upstream gave `value` (a score, or the name of the exception it raised)."""
    if task == "math_find" and value == "ValueError":
        return 0.0  # deviation 1: a decimal first number against an int label ("88.0") scores 0 instead of raising
    return value


def _run(task, pred, label, variant, model):
    try:
        return float(scoring.score(task, pred, label, variant, model="gpt4" if model == "gpt4" else None))
    except Exception as exc:  # noqa: BLE001 -- compared with the exception upstream raised
        return type(exc).__name__


def _same(got, want):
    if isinstance(want, str) or isinstance(got, str):
        return got == want
    return math.isclose(got, want, rel_tol=0.0, abs_tol=1e-9)


def _checks(row, variant):
    """(what, harness value, expected value) for one golden row and variant."""
    task, pred, label, model = row["task"], row["pred"], row["label"], row["model"]
    want = _official(row["official"][variant], task)
    out = [("normalized label", _run(task, pred, scoring.normalize_label(task, label, []), variant, model), want),
           ("label as given", _run(task, pred, label, variant, model), want)]
    if "hub_answer" in row:
        answer, options = row["hub_answer"], row["options"]
    else:
        answer, options = _hub_shape(task, label)
    # Deviation 2: a Hub answer, once normalized, scores as upstream scores its own JSONL label.
    out.append(("hub answer, normalized",
                _run(task, pred, scoring.normalize_label(task, answer, options), variant, model), want))
    if "official_hub" in row and task not in CHOICE_TASKS:
        want_hub = _official(row["official_hub"][variant], task)
        if variant == "2024-08" and task in NUMBER_LABEL_TASKS:
            want_hub = want  # deviation 2: the 2024-08 scorer reads number strings as numbers
        out.append(("hub answer as given", _run(task, pred, answer, variant, model), want_hub))
    return out


@pytest.mark.parametrize("variant", scoring.SCORER_VARIANTS)
@pytest.mark.parametrize("task", scoring.TASKS)
def test_per_example_scores_match_upstream(task, variant):
    rows = _load(task)
    assert sum(r["id"].startswith("results/") for r in rows) > 0, f"{task}: no upstream results/ rows in the golden"
    assert sum(r["id"].startswith("edge/") for r in rows) > 0, f"{task}: no edge-case rows in the golden"
    failures = []
    for row in rows:
        for what, got, want in _checks(row, variant):
            if not _same(got, want):
                failures.append(f"{row['id']} ({what}): pred={row['pred'][:200]!r} label={str(row['label'])[:200]} "
                                f"-> harness {got!r}, official {want!r}")
    assert not failures, f"{task} [{variant}]: {len(failures)} differing check(s); first: {failures[0]}"


@pytest.mark.parametrize("task", scoring.TASKS)
def test_upstream_hub_shape_differences_are_the_recorded_ones(task):
    """Deviation 2 is only claimed where upstream really reads the Hub shape differently from its JSONL label."""
    for row in _load(task):
        if "official_hub" not in row:
            continue
        for variant in scoring.SCORER_VARIANTS:
            if row["official_hub"][variant] != row["official"][variant]:
                assert (task, variant) in UPSTREAM_HUB_SHAPE_DIFFERS, (row["id"], variant, row["official"],
                                                                       row["official_hub"])


def test_deviation_1_is_in_the_goldens():
    """The recorded math_find deviation is exercised: upstream raised on it, the harness scores 0."""
    raised = [r for r in _load("math_find") if "ValueError" in r["official"].values()]
    assert raised and all(r["pred"].startswith("88.0") for r in raised)
