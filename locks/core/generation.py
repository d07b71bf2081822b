"""Greedy decoding through a `SelectorCache`: one dense prefill, then one token per step (gpt-fast style loop).

The loop sets the cache's phase explicitly and passes the cache to the attention function as `sparse_cache`.
Decode steps run eagerly (`static_decode=False`) or as a static step over a preallocated cache, captured as a CUDA
graph on CUDA (`locks/core/static_decode.py`); "auto" picks the static step on CUDA when every layer's selector has one.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable

import torch

from locks.core.batch import RowBatch
from locks.core.cache import SelectorCache
from locks.core.chunked_prefill import prefill_prompt
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


def static_after_prefill(requested, static: bool, caches: list[SelectorCache]) -> bool:
    """Whether the prefilled caches decode statically: a selector may need more of this sample than its
    configuration says (LRQK fits its factors only on a prompt of >= top_k tokens); auto then decodes eagerly,
    true says why not (one line)."""
    if not static:
        return False
    reason = next((r for cache in caches if (r := cache.static_sample_error()) is not None), None)
    if reason is None:
        return True
    if requested == "auto":
        return False
    raise ConfigError(f"static (CUDA-graph) decode is not available for this sample: {reason}")


@torch.inference_mode()
def generate(model, cache: SelectorCache, input_ids: torch.Tensor, max_new_tokens: int,
             eos_token_ids: list[int] | tuple[int, ...] = (), min_new_tokens: int = 0,
             static_decode=False, prefill_logits: torch.Tensor | None = None,
             prefill_chunk_size: int | None = None) -> torch.Tensor:
    """input_ids [B, L] (no padding) -> generated ids [B, <= max_new_tokens], stopping when every row hit an EOS.

    Before `min_new_tokens` tokens exist the EOS logits are masked (as transformers' MinLengthLogitsProcessor does).
    The decode mode used is left in `cache.decode_mode` ("eager", "static" or "cuda_graph"). `prefill_logits`: the
    prompt is already in `cache` (locks/core/prefill.py: replay_prefill) and these are its last position's logits
    [B, vocab]; the model's prefill is not run again. `prefill_chunk_size`: the prompt goes through the model in
    chunks of that many tokens (locks/core/chunked_prefill.py; None: one forward).
    """
    eos = torch.tensor(list(eos_token_ids), device=input_ids.device, dtype=torch.long)
    static = use_static_decode(static_decode, cache, input_ids.device) and max_new_tokens > 1

    def pick(logits: torch.Tensor, produced: int) -> torch.Tensor:
        if produced < min_new_tokens and len(eos):
            logits = logits.index_fill(-1, eos, float("-inf"))
        return logits.argmax(-1)

    start = time.perf_counter()
    if prefill_logits is None:
        cache.max_new_tokens = int(max_new_tokens)
        prefill_logits = prefill_prompt(model, cache, input_ids, prefill_chunk_size)
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
    static = static_after_prefill(static_decode, static, [cache])
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
        cache.capture_seconds = step.capture_seconds
    if input_ids.device.type == "cuda":
        torch.cuda.synchronize()
    # the first token's pick, then every decode step; a CUDA graph's capture apart (capture_seconds)
    cache.decode_seconds = time.perf_counter() - start - cache.capture_seconds
    return torch.stack(out, dim=1)


@dataclass(eq=False)  # a row is itself: compared by identity
class Row:
    """One sample of a batched generation (`generate_rows`): its own cache, prompt and stopping rule; the
    generated tokens and its share of the decode time are filled in."""

    cache: SelectorCache
    input_ids: torch.Tensor  # [1, L] (no padding)
    max_new_tokens: int
    eos_token_ids: list[int] | tuple[int, ...] = ()
    min_new_tokens: int = 0
    prefill_logits: torch.Tensor | None = None  # [1, vocab]: the prompt is already in `cache` (replay_prefill)
    tokens: list[int] = field(default_factory=list)
    finished: bool = False
    decode_seconds: float = 0.0  # the first token's pick plus its share of every batched step it took part in

    @property
    def position(self) -> int:  # where the next step's input token (the last generated one) goes
        return self.input_ids.shape[1] + len(self.tokens) - 1

    def pick(self, logits: torch.Tensor) -> int:
        """The next token from logits [vocab], as `generate` picks it (EOS masked before min_new_tokens)."""
        if len(self.tokens) < self.min_new_tokens and len(self.eos_token_ids):
            eos = torch.tensor(list(self.eos_token_ids), device=logits.device, dtype=torch.long)
            logits = logits.index_fill(-1, eos, float("-inf"))
        return int(logits.argmax(-1))

    def take(self, token: int) -> None:
        self.tokens.append(token)
        self.finished = token in self.eos_token_ids or len(self.tokens) >= self.max_new_tokens


@torch.inference_mode()
def generate_rows(model, rows: list[Row], static_decode=False,
                  on_finish: Callable[[Row], None] | None = None, prefill_chunk_size: int | None = None) -> list[Row]:
    """Greedy decoding of several samples at once (docs/batching.md): each row's prefill on its own cache (or
    replayed), then decode steps over every unfinished row together, each row at its own position and length.

    Every row generates the tokens `generate` gives its sample alone and its cache's stats are the ones batch 1
    records (steps, bytes, coverage, diagnostics). `on_finish(row)` is called as soon as a row is finished, with
    its cache's decode_mode / prefill_seconds / decode_seconds set. Eager steps drop finished rows; a static step
    (one capture per batch) keeps them in place and stops advancing them.
    """
    if not rows:
        return rows
    device = rows[0].input_ids.device
    static = use_static_decode(static_decode, rows[0].cache, device) and max(r.max_new_tokens for r in rows) > 1
    for row in rows:
        start = time.perf_counter()
        if row.prefill_logits is None:
            row.cache.max_new_tokens = int(row.max_new_tokens)
            row.prefill_logits = prefill_prompt(model, row.cache, row.input_ids, prefill_chunk_size)
        elif row.cache.get_seq_length() != row.input_ids.shape[1]:
            raise ValueError(f"a row's cache holds {row.cache.get_seq_length()} tokens, its prompt "
                             f"{row.input_ids.shape[1]}")
        if device.type == "cuda":
            torch.cuda.synchronize()
        row.cache.prefill_seconds = time.perf_counter() - start
        start = time.perf_counter()
        row.take(row.pick(row.prefill_logits[0]))
        row.decode_seconds = time.perf_counter() - start
    step = None
    static = static_after_prefill(static_decode, static, [r.cache for r in rows])
    if static:
        batch = RowBatch([r.cache for r in rows])
        step = StaticDecodeStep(model, batch, len(rows), [r.input_ids.shape[1] + r.max_new_tokens for r in rows])
    for row in rows:
        # a row that cannot take a step decodes nothing, which batch 1 records as eager
        row.cache.decode_mode = step.mode if static and row.max_new_tokens > 1 else "eager"
        if not static:
            row.cache.phase = "decode"

    def finish(row: Row) -> None:
        if static:
            batch.live[rows.index(row)] = False
            row.cache.finish_static()
            row.cache.capture_seconds = step.capture_seconds  # the batch's capture, which every row waited for
        row.cache.decode_seconds = row.decode_seconds
        if on_finish is not None:
            on_finish(row)

    for row in rows:
        if row.finished:
            finish(row)
    while not all(r.finished for r in rows):
        active = rows if static else [r for r in rows if not r.finished]
        start = time.perf_counter()
        captured = step.capture_seconds if static else 0.0
        tokens = torch.tensor([r.tokens[-1] for r in active], device=device)
        positions = [r.position for r in active]
        if static:
            logits = step(tokens, positions)
        else:
            cache = RowBatch([r.cache for r in active])
            logits = model(input_ids=tokens[:, None], position_ids=torch.tensor(positions, device=device)[:, None],
                           cache=cache, sparse_cache=cache, use_cache=True).logits[:, -1]
        stepping = [(i, r) for i, r in enumerate(active) if not r.finished]
        for i, row in stepping:
            row.cache.stats.steps += 1
            row.take(row.pick(logits[i]))
        if device.type == "cuda":
            torch.cuda.synchronize()
        captured = (step.capture_seconds if static else 0.0) - captured  # a capture in this step is not decode time
        share = (time.perf_counter() - start - captured) / len(stepping)
        for _, row in stepping:
            row.decode_seconds += share
            if row.finished:
                finish(row)
    return rows
