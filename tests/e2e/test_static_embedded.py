"""On the embedded model (SmolLM2-135M, the default suite: RULER niah_single_2 at 2K, budget 128), every method's
static step predicts what its eager step predicts, with the same bytes (docs/architecture.md, static decode). The
random tiny model of tests/core/test_static_decode.py checks the same token by token; this is the real model's
attention, on the harness's own prompts."""
import pytest

from locks.core.registry import discover
from tests.helpers import ROUNDING_SENSITIVE

SAMPLES = 2


def test_every_static_step_predicts_what_its_eager_step_predicts(default_suite):
    from eval.runner import sample_row
    from locks.core.generation import generate

    config, loaded, samples, captures, method_named = default_suite(SAMPLES)
    checked = []
    for name in sorted(discover()):
        method = method_named(name)
        for i, (sample, capture) in enumerate(zip(samples, captures)):
            out = {}
            for static in (False, True):
                row = sample_row(loaded, method, sample, config, capture)[0]
                tokens = generate(loaded.model, row.cache, row.input_ids, row.max_new_tokens, row.eos_token_ids,
                                  min_new_tokens=row.min_new_tokens, prefill_logits=row.prefill_logits,
                                  static_decode=static)[0].tolist()
                out[static] = (tokens, row.cache)
            (eager_tokens, eager), (static_tokens, static) = out[False], out[True]
            assert static.decode_mode == "static" and eager.decode_mode == "eager", name
            assert static_tokens == eager_tokens, f"{name} sample {i}"
            a, b = eager.stats.summary(), static.stats.summary()
            # a rounding-sensitive method may swap a tied token at some step (tests/helpers.py)
            rel = 1e-4 if name in ROUNDING_SENSITIVE else 1e-9
            for key in ("bytes_read_per_step", "metadata_bytes_per_step", "h2d_bytes_per_step",
                        "attended_tokens_per_step"):
                assert b[key] == pytest.approx(a[key], rel=rel), (name, i, key)
            checked.append(name)
    assert set(checked) == set(discover())  # every registered method, the oracles included
