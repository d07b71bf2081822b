"""Every method selects what it selected when the goldens were recorded (tests/goldens.py): the same tokens at every
decode step and layer, eager and static, and the same predictions. A change to the decode core that keeps them
passes; a change that alters a selection fails with the first step and layer that differ. Re-record only for a
change that alters a selection on purpose, and say so in its commit (python -m tests.goldens --write)."""
import json

import pytest

from tests import goldens

RECORDED = json.loads(goldens.PATH.read_text())


@pytest.fixture(scope="module")
def model():
    return goldens.build_model()


@pytest.mark.parametrize("name,budget,options", goldens.cases(), ids=lambda x: str(x))
@pytest.mark.parametrize("mode", ["eager", "static"])
def test_selections_and_predictions_are_the_recorded_ones(model, name, budget, options, mode):
    key = f"{goldens.case_key(name, budget, options)} {mode}"
    try:
        now = goldens.record_case(model, name, budget, options, mode == "static")
    except Exception as err:
        now = {"error": f"{type(err).__name__}: {str(err).splitlines()[0]}"}
    if now is None:
        assert key not in RECORDED, f"{key}: recorded, but has no static path now"
        return
    assert key in RECORDED, f"{key}: not recorded (python -m tests.goldens --write records it)"
    want = RECORDED[key]
    if "error" in want or "error" in now:
        assert now == want
        return
    for step, (a, b) in enumerate(zip(want["selections"], now["selections"])):
        assert a == b, f"{key}: decode step {step}, layers {[i for i, (x, y) in enumerate(zip(a, b)) if x != y]} differ"
    assert now["predictions"] == want["predictions"]


def test_eager_and_static_decoding_select_alike_in_the_recording():
    """The static step (pages or token lists, fixed shapes) attends exactly the eager step's tokens."""
    pairs = [(k, k[: -len(" eager")] + " static") for k in RECORDED if k.endswith(" eager")]
    compared = [(a, b) for a, b in pairs if b in RECORDED and "error" not in RECORDED[a]]
    assert len(compared) >= 12
    for a, b in compared:
        assert RECORDED[a] == RECORDED[b], a
