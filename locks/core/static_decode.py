"""The decode step as a CUDA graph: captured once per sample over a preallocated SelectorCache, replayed per token.

An eager transformers step re-runs Python for every layer and launches hundreds of small kernels, which at batch 1
hides any attention saving (gpt-fast's lesson). After the prefill the cache is preallocated for the whole generation
(`SelectorCache.start_static`); the step reads its token, position and valid length from fixed device buffers and
every selector's `select_static` has fixed shapes, so one capture serves every later step. Host-side upkeep
(accounting, LRQK's cold store) runs between replays in `SelectorCache.finish_static_step`. A step whose selection
needs host work first (LOCKS summarizes the page the step completes before scoring it, as eager decoding does: one
step in `page_size`) says so in `Selector.prepare_static_step` and runs outside the graph, over the same buffers. Off CUDA the same static step runs
eagerly, so everything but the capture itself is exercised by the CPU tests. Bytes, attended and forced tokens,
coverage and LOCKS's per-step certificate (A5.5) are accounted as in eager decoding; Quest's union-ratio metric is
only computed by eager steps.
"""
from __future__ import annotations

import time

import torch
from torch import Tensor

from locks.core.batch import RowBatch
from locks.core.cache import SelectorCache


def for_cache(cache: SelectorCache | RowBatch, values: int | list[int]) -> int | list[int]:
    """One value per row (a capacity, a position) as `cache` takes it: the list for a RowBatch (each row its own),
    the one value for a SelectorCache (its rows move together)."""
    if isinstance(values, int) or isinstance(cache, RowBatch):
        return values
    if len(set(values)) != 1:
        raise ValueError(f"the rows of one SelectorCache move together (got {values}); decode rows of different "
                         "lengths as a RowBatch")
    return values[0]


class StaticDecodeStep:
    """step(token [B], position) -> logits [B, vocab] of the next token; the cache grows by one token per call.

    `cache` is one SelectorCache (every row at the same position) or a RowBatch of rows with their own lengths
    (locks/core/batch.py); `capacity` and each step's `position` are one int, or one per row (`for_cache`). Either
    way one capture serves every step of the batch."""

    def __init__(self, model, cache: SelectorCache | RowBatch, batch: int, capacity: int | list[int],
                 cuda_graph: bool = True):
        cache.start_static(for_cache(cache, capacity))
        device = cache.static_position.device
        self.model, self.cache = model, cache
        # stacked rows run as one cache (locks/core/batch.py: stack_rows), else the cache itself
        self.step_cache = cache.step_cache if isinstance(cache, RowBatch) else cache
        self.input_ids = torch.zeros(batch, 1, dtype=torch.long, device=device)
        self.position_ids = torch.zeros(batch, 1, dtype=torch.long, device=device)
        self.cuda_graph = cuda_graph and device.type == "cuda"
        self.graph: torch.cuda.CUDAGraph | None = None
        self.logits: Tensor | None = None
        self.capture_seconds = 0.0  # the warm-ups and the capture, which a decode's time does not include

    @property
    def mode(self) -> str:
        return "cuda_graph" if self.cuda_graph else "static"

    def forward(self) -> Tensor:
        """The step itself (what the graph captures): model forward over the static buffers."""
        return self.model(input_ids=self.input_ids, position_ids=self.position_ids, cache=self.step_cache,
                          sparse_cache=self.step_cache, use_cache=True).logits[:, -1]

    def place(self, token: Tensor, position: int | list[int]) -> None:
        """Write a step's input into the static buffers: token [B], position one int or one per row."""
        position = for_cache(self.cache, position)
        self.input_ids.copy_(token.view(-1, 1))
        if isinstance(position, int):
            self.position_ids.fill_(position)
        else:
            self.position_ids.copy_(torch.tensor(position, dtype=torch.long).view(-1, 1))
        self.cache.set_static_position(position)

    def __call__(self, token: Tensor, position: int | list[int]) -> Tensor:
        self.place(token, position)
        if self.cuda_graph and not self.cache.static_host_step:
            if self.graph is None:
                self.recapture()
            logits = self.replay()
        else:
            logits = self.forward()
        self.cache.finish_static_step()
        return logits

    def replay(self) -> Tensor:
        """The step at the placed position without its host upkeep: the captured graph, or `forward` if none."""
        if self.graph is None:
            return self.forward()
        self.graph.replay()
        return self.logits

    def recapture(self) -> None:
        """Capture the step at the placed position, again after a change to what it computes (bench/e2e.py turns
        the accounting off); the time goes to `capture_seconds`."""
        start = time.perf_counter()
        self._capture()
        self.capture_seconds += time.perf_counter() - start

    def _capture(self) -> None:
        if self.cache.static_host_step:
            raise RuntimeError("a static step with host work inside (e.g. a page summarized) cannot be captured; "
                               "capture at a position whose step needs none")
        # Warm-up on a side stream (Triton compiles, cuBLAS allocates its workspace), then capture. A step at a fixed
        # position rewrites the same cache slot and metadata, so repeating it leaves the state of one step; only the
        # device-side counters accumulate, and they are restored.
        with self.cache.static_counters_kept():
            stream = torch.cuda.Stream()
            stream.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(stream):
                for _ in range(2):
                    self.forward()
            torch.cuda.current_stream().wait_stream(stream)
            self.graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(self.graph):
                self.logits = self.forward()
            torch.cuda.synchronize()
