"""Greedy decoding through a `SelectorCache`: one dense prefill, then one token per step (gpt-fast style loop).

The loop sets the cache's phase explicitly and passes the cache to the attention function as `sparse_cache`.
Decode steps run eagerly (`static_decode=False`) or as a static step over a preallocated cache, captured as a CUDA
graph on CUDA (`locks/core/static_decode.py`); "auto" picks the static step on CUDA when every layer's selector has one.
"""
from __future__ import annotations

import time

import torch

from locks.core.cache import SelectorCache
from locks.core.static_decode import StaticDecodeStep
from locks.errors import ConfigError

STATIC_DECODE = ("auto", True, False)


def use_static_decode(requested, cache: SelectorCache, device) -> bool:
    """static_decode: auto (static + CUDA graph on CUDA when the method supports it) | true | false -> bool."""
    if requested not in STATIC_DECODE:
        raise ConfigError(f"static_decode must be one of auto, true, false (got {requested!r})")
    if requested == "auto":
        return torch.device(device).type == "cuda" and all(
            layer.selector.static_decode_error() is None for layer in cache.layers)
    return bool(requested)


@torch.inference_mode()
def generate(model, cache: SelectorCache, input_ids: torch.Tensor, max_new_tokens: int,
             eos_token_ids: list[int] | tuple[int, ...] = (), min_new_tokens: int = 0,
             static_decode=False, prefill_logits: torch.Tensor | None = None) -> torch.Tensor:
    """input_ids [B, L] (no padding) -> generated ids [B, <= max_new_tokens], stopping when every row hit an EOS.

    Before `min_new_tokens` tokens exist the EOS logits are masked (as transformers' MinLengthLogitsProcessor does).
    The decode mode used is left in `cache.decode_mode` ("eager", "static" or "cuda_graph"). `prefill_logits`: the
    prompt is already in `cache` (locks/core/prefill.py: replay_prefill) and these are its last position's logits
    [B, vocab]; the model's prefill is not run again.
    """
    eos = torch.tensor(list(eos_token_ids), device=input_ids.device, dtype=torch.long)
    static = use_static_decode(static_decode, cache, input_ids.device) and max_new_tokens > 1

    def pick(logits: torch.Tensor, produced: int) -> torch.Tensor:
        if produced < min_new_tokens and len(eos):
            logits = logits.index_fill(-1, eos, float("-inf"))
        return logits.argmax(-1)

    start = time.perf_counter()
    if prefill_logits is None:
        cache.phase = "prefill"
        cache.max_new_tokens = int(max_new_tokens)
        logits = model(input_ids=input_ids, cache=cache, sparse_cache=cache, use_cache=True, logits_to_keep=1).logits
        prefill_logits = logits[:, -1]
    elif cache.get_seq_length() != input_ids.shape[1]:
        raise ValueError(f"the cache holds {cache.get_seq_length()} tokens, the prompt {input_ids.shape[1]}")
    if input_ids.device.type == "cuda":
        torch.cuda.synchronize()
    cache.prefill_seconds = time.perf_counter() - start  # about 0 when the prefill was replayed (the caller's time)
    start = time.perf_counter()
    token = pick(prefill_logits, 0)
    out = [token]
    finished = torch.isin(token, eos)
    position = input_ids.shape[1]
    if static:
        step = StaticDecodeStep(model, cache, input_ids.shape[0], position + max_new_tokens)
        cache.decode_mode = step.mode
    else:
        cache.phase = "decode"
        cache.decode_mode = "eager"

        def step(token: torch.Tensor, position: int) -> torch.Tensor:
            positions = torch.full((input_ids.shape[0], 1), position, device=input_ids.device, dtype=torch.long)
            return model(input_ids=token[:, None], position_ids=positions, cache=cache, sparse_cache=cache,
                         use_cache=True).logits[:, -1]

    for _ in range(max_new_tokens - 1):
        if bool(finished.all()):
            break
        logits = step(token, position)
        cache.stats.steps += 1
        position += 1
        token = pick(logits, len(out))
        token = torch.where(finished, eos[0] if len(eos) else token, token)
        out.append(token)
        finished |= torch.isin(token, eos)
    if static:
        cache.finish_static()
    if input_ids.device.type == "cuda":
        torch.cuda.synchronize()
    cache.decode_seconds = time.perf_counter() - start  # the first token's pick, then every decode step
    return torch.stack(out, dim=1)
