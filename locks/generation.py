"""Greedy decoding through a `SelectorCache`: one dense prefill, then one token per step (gpt-fast style loop).

The loop sets the cache's phase explicitly and passes the cache to the attention function as `sparse_cache`.
"""
from __future__ import annotations

import torch

from locks.cache import SelectorCache


@torch.inference_mode()
def generate(model, cache: SelectorCache, input_ids: torch.Tensor, max_new_tokens: int,
             eos_token_ids: list[int] | tuple[int, ...] = ()) -> torch.Tensor:
    """input_ids [B, L] (no padding) -> generated ids [B, <= max_new_tokens], stopping when every row hit an EOS."""
    eos = torch.tensor(list(eos_token_ids), device=input_ids.device, dtype=torch.long)
    cache.phase = "prefill"
    logits = model(input_ids=input_ids, cache=cache, sparse_cache=cache, use_cache=True, logits_to_keep=1).logits
    token = logits[:, -1].argmax(-1)
    out = [token]
    finished = torch.isin(token, eos)
    cache.phase = "decode"
    position = input_ids.shape[1]
    for _ in range(max_new_tokens - 1):
        if bool(finished.all()):
            break
        positions = torch.full((input_ids.shape[0], 1), position, device=input_ids.device, dtype=torch.long)
        logits = model(input_ids=token[:, None], position_ids=positions, cache=cache, sparse_cache=cache,
                       use_cache=True).logits
        cache.stats.steps += 1
        position += 1
        token = logits[:, -1].argmax(-1)
        token = torch.where(finished, eos[0] if len(eos) else token, token)
        out.append(token)
        finished |= torch.isin(token, eos)
    return torch.stack(out, dim=1)
