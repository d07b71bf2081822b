"""A prompt through the model in chunks (`prefill_chunk_size`): the long-context prefill that fits in memory.

A whole-prompt forward materializes every layer's activations for all L positions at once: at 1M tokens
GLM-4-9B's MLP alone needs its gate/up outputs (about 51 GiB) and more for the activation and the product. Fed in
chunks of n tokens, each forward's projections, norms and MLP see n positions, and its attention reads the whole
prefix cached so far (the causal mask that transformers builds for a chunk after a cached prefix), so the cached
K/V, and the last position's logits, are those of the whole-prompt prefill up to float rounding.

The selectors see one prefill, after the last chunk, as if the prompt had gone through at once: every layer's
attention keeps, over the chunks, only the trailing prompt queries its selector reads (`Selector.prefill_queries`,
None: all of them; `SelectorCache.keep_prompt_queries`) and runs `Selector.prefill` on the last chunk with the
whole cached prompt.
"""
from __future__ import annotations

import torch
from torch import Tensor

from locks.errors import ConfigError


def check_chunk_size(chunk_size, auto: bool = False) -> int | str | None:
    """prefill_chunk_size: null (the whole prompt in one forward), a positive number of tokens or, in a run's
    config (`auto`), "auto": the largest chunk the memory plan fits (eval/memory_plan.py, resolved before the
    model loads)."""
    if chunk_size is None or (auto and chunk_size == "auto"):
        return chunk_size
    if isinstance(chunk_size, bool) or not isinstance(chunk_size, int) or chunk_size <= 0:
        allowed = "null (one forward), auto (from the memory plan)" if auto else "null (one forward)"
        raise ConfigError(f"prefill_chunk_size must be {allowed} or a positive number of tokens (got {chunk_size!r})")
    return chunk_size


@torch.inference_mode()
def prefill_prompt(model, cache, input_ids: Tensor, chunk_size: int | None = None) -> Tensor:
    """The prompt input_ids [B, L] (no padding, positions 0 .. L-1) into `cache` (phase "prefill"), in forwards
    of at most `chunk_size` tokens (None: one) -> the last position's logits [B, vocab]."""
    L = input_ids.shape[1]
    step = L if check_chunk_size(chunk_size) is None else chunk_size
    cache.phase = "prefill"
    logits = None
    for start in range(0, L, step):
        cache.prefill_last = start + step >= L  # the chunk after which every selector's prefill runs
        logits = model(input_ids=input_ids[:, start : start + step], cache=cache, sparse_cache=cache,
                       use_cache=True, logits_to_keep=1).logits
    cache.prefill_last = True
    return logits[:, -1]
