"""Greedy decoding through a `SelectorCache`: one dense prefill, then one token per step (gpt-fast style loop).

The loop sets the cache's phase explicitly and passes the cache to the attention function as `sparse_cache`.
"""
from __future__ import annotations

import torch

from locks.cache import SelectorCache


@torch.inference_mode()
def generate(model, cache: SelectorCache, input_ids: torch.Tensor, max_new_tokens: int,
             eos_token_ids: list[int] | tuple[int, ...] = (), min_new_tokens: int = 0) -> torch.Tensor:
    """input_ids [B, L] (no padding) -> generated ids [B, <= max_new_tokens], stopping when every row hit an EOS.

    Before `min_new_tokens` tokens exist the EOS logits are masked (as transformers' MinLengthLogitsProcessor does).
    """
    eos = torch.tensor(list(eos_token_ids), device=input_ids.device, dtype=torch.long)

    def pick(logits: torch.Tensor, produced: int) -> torch.Tensor:
        logits = logits[:, -1]
        if produced < min_new_tokens and len(eos):
            logits = logits.index_fill(-1, eos, float("-inf"))
        return logits.argmax(-1)

    cache.phase = "prefill"
    cache.max_new_tokens = int(max_new_tokens)
    logits = model(input_ids=input_ids, cache=cache, sparse_cache=cache, use_cache=True, logits_to_keep=1).logits
    token = pick(logits, 0)
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
        token = pick(logits, len(out))
        token = torch.where(finished, eos[0] if len(eos) else token, token)
        out.append(token)
        finished |= torch.isin(token, eos)
    return torch.stack(out, dim=1)
