"""Greedy decoding through SelectorCaches, the one decode loop (gpt-fast style; docs/batching.md): each sample's
prefill on its own cache, then one token per step for every unfinished sample together. The eval runner, `generate`
(one sample) and bench/e2e.py all run it.

Decode steps run eagerly (`static_decode=False`) or as a static step over preallocated caches, captured as a CUDA
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


def static_by_default(device, rows: int) -> bool:
    """What static_decode=auto asks for: the static step on CUDA (replayed as a CUDA graph), and for a batch of rows
    on any device (rows of different lengths stacked into one step: no loop over rows, locks/core/batch.py)."""
    return torch.device(device).type == "cuda" or rows > 1


def use_static_decode(requested, cache: SelectorCache, device, rows: int = 1) -> bool:
    """static_decode: auto (`static_by_default`, when the method has a static path) | true | false -> bool, for a
    decode of `rows` rows."""
    if requested not in STATIC_DECODE:
        raise ConfigError(f"static_decode must be one of auto, true, false (got {requested!r})")
    if requested == "auto":
        return static_by_default(device, rows) and all(
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


def timing_instrumented(cache: SelectorCache, static: bool, device) -> bool:
    """Whether a row's decode_seconds include instrumentation (with measure_coverage: the coverage and a method's
    diagnostics): a static step runs it inside the step (the fused backend: two launches per layer), and an eager
    step's host time on an asynchronous device (CUDA) is not its cost; an eager step on the CPU times it apart
    (instrumentation_seconds)."""
    return bool(cache.measure_coverage) and (static or torch.device(device).type != "cpu")


@dataclass(eq=False)  # a row is itself: compared by identity
class Row:
    """One sample of a generation: its own cache, prompt and stopping rule; the generated tokens and its share of
    the decode time are filled in."""

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

    @property
    def capacity(self) -> int:  # the tokens its cache holds after its last step
        return self.input_ids.shape[1] + self.max_new_tokens

    def take(self, token: int) -> None:
        self.tokens.append(token)
        self.finished = token in self.eos_token_ids or len(self.tokens) >= self.max_new_tokens


def pick(rows: list[Row], logits: torch.Tensor) -> list[int]:
    """Each row's greedy next token from logits [rows, vocab], read to the host once. A row with fewer than
    `min_new_tokens` tokens has its EOS logits masked (as transformers' MinLengthLogitsProcessor does)."""
    early = [i for i, row in enumerate(rows) if len(row.tokens) < row.min_new_tokens and len(row.eos_token_ids)]
    if early:
        logits = logits.clone()
        for i in early:
            logits[i, list(rows[i].eos_token_ids)] = float("-inf")
    return logits.argmax(-1).tolist()


def decode_cache(caches: list[SelectorCache]) -> SelectorCache | RowBatch:
    """The transformers Cache a step over these rows runs on: a lone row's own cache, else their RowBatch."""
    return caches[0] if len(caches) == 1 else RowBatch(caches)


def static_step(model, rows: list[Row], cuda_graph: bool = True) -> StaticDecodeStep:
    """A static step (CUDA graph on CUDA) over the rows' prefilled caches, preallocated for each row's generation."""
    return StaticDecodeStep(model, decode_cache([r.cache for r in rows]), len(rows), [r.capacity for r in rows],
                            cuda_graph)


@torch.inference_mode()
def generate(model, cache: SelectorCache, input_ids: torch.Tensor, max_new_tokens: int,
             eos_token_ids: list[int] | tuple[int, ...] = (), min_new_tokens: int = 0,
             static_decode=False, prefill_logits: torch.Tensor | None = None,
             prefill_chunk_size: int | None = None) -> torch.Tensor:
    """One sample: input_ids [1, L] (no padding) -> generated ids [1, <= max_new_tokens], `generate_rows` with one
    row. `prefill_logits` [1, vocab]: the prompt is already in `cache` (locks/core/prefill.py: replay_prefill)."""
    if input_ids.shape[0] != 1:
        raise ConfigError(f"generate decodes one sample per cache (input_ids has {input_ids.shape[0]} rows): give "
                          "each sample its own SelectorCache and decode them together with generate_rows")
    row = Row(cache, input_ids, max_new_tokens, eos_token_ids, min_new_tokens, prefill_logits)
    generate_rows(model, [row], static_decode, prefill_chunk_size=prefill_chunk_size)
    return torch.tensor([row.tokens], dtype=torch.long, device=input_ids.device)


@torch.inference_mode()
def generate_rows(model, rows: list[Row], static_decode=False, on_finish: Callable[[Row], None] | None = None,
                  prefill_chunk_size: int | None = None, step: StaticDecodeStep | None = None) -> list[Row]:
    """Greedy decoding of samples together (docs/batching.md): each row's prefill on its own cache (or replayed),
    then decode steps over every unfinished row together, each row at its own position and length.

    Every row generates the tokens it generates alone and its cache's stats are the ones batch 1 records (steps,
    bytes, coverage, diagnostics). `on_finish(row)` is called as soon as a row is finished, with its cache's
    decode_mode / prefill_seconds / decode_seconds / capture_seconds set. Eager steps drop finished rows; a static
    step (one capture per batch) keeps them in place and stops advancing them. `step`: a static step the caller
    built over these rows (`static_step`, after their prefill) and keeps using afterwards (bench/e2e.py).
    """
    if not rows:
        return rows
    device = rows[0].input_ids.device
    static = step is not None or (use_static_decode(static_decode, rows[0].cache, device, len(rows))
                                  and max(r.max_new_tokens for r in rows) > 1)
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
        row.take(pick([row], row.prefill_logits)[0])
        row.decode_seconds = time.perf_counter() - start
    if step is None and static_after_prefill(static_decode, static, [r.cache for r in rows]):
        step = static_step(model, rows)
    for row in rows:
        # a row that cannot take a step decodes nothing, which batch 1 records as eager
        row.cache.decode_mode = step.mode if step is not None and row.max_new_tokens > 1 else "eager"
        row.cache.decode_instrumented = timing_instrumented(row.cache, step is not None, device)
        if step is None:
            row.cache.phase = "decode"

    def finish(row: Row) -> None:
        if step is not None:
            if isinstance(step.cache, RowBatch):
                step.cache.live[rows.index(row)] = False
            row.cache.finish_static()
            row.cache.capture_seconds = step.capture_seconds  # the batch's capture, which every row waited for
        row.cache.decode_seconds = row.decode_seconds
        if on_finish is not None:
            on_finish(row)

    for row in rows:
        if row.finished:
            finish(row)
    while not all(r.finished for r in rows):
        active = rows if step is not None else [r for r in rows if not r.finished]
        start = time.perf_counter()
        captured = step.capture_seconds if step is not None else 0.0
        instrumented = sum(r.cache.instrumentation_seconds for r in active)
        tokens = torch.tensor([r.tokens[-1] for r in active], device=device)
        positions = [r.position for r in active]
        if step is not None:
            logits = step(tokens, positions)
        else:
            cache = decode_cache([r.cache for r in active])
            logits = model(input_ids=tokens[:, None], position_ids=torch.tensor(positions, device=device)[:, None],
                           cache=cache, sparse_cache=cache, use_cache=True).logits[:, -1]
        stepping = [(i, r) for i, r in enumerate(active) if not r.finished]
        if len(stepping) < len(active):  # a static step's finished rows are still in it
            logits = logits[[i for i, _ in stepping]]
        picked = pick([r for _, r in stepping], logits)
        for (_, row), token in zip(stepping, picked):
            row.cache.stats.steps += 1
            row.take(token)
        if device.type == "cuda":
            torch.cuda.synchronize()
        captured = (step.capture_seconds if step is not None else 0.0) - captured  # a capture is not decode time
        instrumented = sum(r.cache.instrumentation_seconds for r in active) - instrumented  # nor instrumentation
        share = (time.perf_counter() - start - captured - instrumented) / len(stepping)
        for _, row in stepping:
            row.decode_seconds += share
            if row.finished:
                finish(row)
    return rows
