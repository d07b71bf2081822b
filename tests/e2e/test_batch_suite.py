"""The default suite (the embedded model, RULER niah_single_2 at 2K) at batch 8 predicts what batch 1 predicts, for
every registered method at budget 128 (docs/batching.md). A prediction that differs is named with its logit margin
at the first token where the two generations part: batch 1's logit of its own token minus its logit of the token
the batch chose (a margin near 0 is a near-tie the batched rounding flipped; a large one is a bug)."""
import pytest
import torch

from locks.core.registry import discover

BATCH = 8

pytestmark = pytest.mark.slow


def test_the_default_suite_at_batch_8_predicts_what_batch_1_predicts(default_suite):
    from eval.runner import sample_row
    from locks.core.generation import generate, generate_rows

    config, loaded, samples, captures, method_named = default_suite(BATCH)
    model = loaded.model
    logits: list[torch.Tensor] = []
    hook = model.lm_head.register_forward_hook(lambda m, i, out: logits.append(out[0, -1].clone()))
    differing, generated = [], 0
    try:
        for name in sorted(discover()):
            method = method_named(name)

            def row(sample, capture):
                return sample_row(loaded, method, sample, config, capture)[0]

            alone = []
            for sample, capture in zip(samples, captures):
                one = row(sample, capture)
                logits.clear()
                tokens = generate(model, one.cache, one.input_ids, one.max_new_tokens, one.eos_token_ids,
                                  min_new_tokens=one.min_new_tokens, prefill_logits=one.prefill_logits)[0].tolist()
                alone.append((tokens, list(logits)))
            rows = [row(s, c) for s, c in zip(samples, captures)]
            generate_rows(model, rows)
            for sample, (tokens, steps), batched in zip(samples, alone, rows):
                generated += len(tokens)
                if batched.tokens == tokens:
                    continue
                j = next((i for i, (a, b) in enumerate(zip(tokens, batched.tokens)) if a != b),
                         min(len(tokens), len(batched.tokens)))
                # step j's logits: the prefill's (j = 0, outside the hook's window) or decode step j
                margin = (float(steps[j - 1][tokens[j]] - steps[j - 1][batched.tokens[j]])
                          if 0 < j <= len(steps) and j < min(len(tokens), len(batched.tokens)) else None)
                differing.append(f"{name} {sample['task']}/{sample['index']}: batch 1 {loaded.tokenizer.decode(tokens)!r}"
                                 f" vs batch {BATCH} {loaded.tokenizer.decode(batched.tokens)!r}, first differing "
                                 f"token {j}, logit margin {margin}")
    finally:
        hook.remove()
    assert generated > 0
    assert not differing, "\n".join(differing)
