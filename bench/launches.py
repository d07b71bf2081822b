"""Launches per decode step: what one static step of each method launches, per layer, and the GPU step time that
count implies (docs/launches.md).

A captured CUDA graph removes Python, not kernels: every kernel in it is a graph node, and a node costs a few
microseconds however little it reads. So a selector saves time only if the bytes it does not read outweigh the nodes
it adds. This benchmark counts the nodes without a GPU. One static step (`locks/core/static_decode.py`, the step a
graph captures) of a small random-weight Llama (bench/shapes.py LAUNCH_MODEL: 4 layers, GQA group 4 as
Llama-3.1-8B, a 700-token prompt) runs under a `TorchDispatchMode` with every Triton launch intercepted:

  aten ops   every aten op the step dispatches (the count of the issue that asked for this benchmark)
  kernels    the aten ops that launch a kernel on a GPU (views and allocations excluded) plus each Triton launch
             counted once (the Triton interpreter's own tensor copies on CPU are not counted)

attributed to the decoder layer that runs them (forward hooks; what runs outside the layers, the embedding, the
final norm and the LM head, is "outside"). A step that runs outside the graph (LOCKS summarizing the page it
completes, one step in page_size) is not the one counted: the counted step is a replayable one.

Modeled GPU step time of a whole model (the GLM-4-9B and Llama-3.1-8B shapes of bench/byte_model.py), at context L
and batch B:

    t_step = bytes(L, B) / bandwidth + nodes(B) * t_node

bytes: the weights once plus each row's K/V (FullKV) or LOCKS's reads (summaries, scores, the attended K/V), from
the selectors' own accounting (bench/byte_model.py). nodes: the counted outside-the-layers kernels plus, for each
of the model's layers, the count of the small model's layer at the same index (its last layer for every later one,
so a method's dense first layers count as such). The counts are taken at batch 1 and 8; batch B in between or past
is linear in B (the per-row cost of today's batched step is a loop over rows). t_node and the bandwidth are
parameters (defaults: T_NODE_US, BANDWIDTH), documented with their sources in docs/launches.md.

    python scripts/bench_launches.py --out results/launches.json
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
from collections import Counter
from pathlib import Path

import torch
from torch.utils._python_dispatch import TorchDispatchMode

T_NODE_US = 2.5  # seconds per captured graph node on an H200, in microseconds: about 2-3 (docs/launches.md)
BANDWIDTH = 4.5e12  # H200 HBM, bytes/s, as FullKV's cuDNN SDPA reaches it at 1M tokens (docs/launches.md)
METHODS = ("fullkv", "locks", "quest", "rocketkv", "shadowkv", "lrqk", "doublesparsity", "twilight",
           "magicpig")
BATCHES = (1, 8)
BUDGET = 128
PROMPT = 700
MODELED_CONTEXTS = (131072, 1048576)
MODELED_BATCHES = (1, 4, 16)
# aten ops that launch no kernel on a GPU: allocations (a captured graph takes them from its pool) and metadata
NO_KERNEL = {"aten.empty.memory_format", "aten.empty_strided.default", "aten.new_empty.default",
             "aten.new_empty_strided.default", "aten.empty_like.default", "aten.lift_fresh.default",
             "aten.detach.default", "aten.alias.default", "aten.sym_size.int", "aten.sym_stride.int",
             "aten.sym_numel.default", "aten.sym_storage_offset.default", "aten.is_same_size.default",
             "prim.device.default", "aten.resize_.default"}
OUTSIDE = "outside"


class LaunchCounter(TorchDispatchMode):
    """The aten ops and kernels of a region by decoder layer (see the module docstring)."""

    def __init__(self):
        super().__init__()
        self.layer: int | str = OUTSIDE
        self.aten: Counter = Counter()
        self.kernels: Counter = Counter()
        self.triton: Counter = Counter()
        self.in_triton = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if not self.in_triton:
            self.aten[self.layer] += 1
            if not (func.is_view or str(func) in NO_KERNEL):
                self.kernels[self.layer] += 1
        return func(*args, **(kwargs or {}))

    @contextlib.contextmanager
    def hooks(self, model=None):
        """Attribute what runs inside decoder layer i of `model` to i, and count every Triton launch (once, not its
        internals)."""
        def enter(i):
            def hook(*_):
                self.layer = i
            return hook

        def leave(*_):
            self.layer = OUTSIDE

        handles = []
        for i, layer in enumerate(model.model.layers if model is not None else []):
            handles += [layer.register_forward_pre_hook(enter(i)), layer.register_forward_hook(leave)]
        patched = _patch_triton(self)
        try:
            yield self
        finally:
            for h in handles:
                h.remove()
            for cls, run in patched:
                cls.run = run


def _patch_triton(counter: LaunchCounter) -> list:
    """Wrap the Triton launcher (interpreted or compiled) so that each launch counts once as a kernel of the layer."""
    try:
        from triton.runtime.interpreter import InterpretedFunction
        from triton.runtime.jit import JITFunction
    except ImportError:
        return []
    patched = []
    for cls in (InterpretedFunction, JITFunction):
        run = cls.run

        def counting_run(self, *args, _run=run, grid, warmup=False, **kwargs):
            if not warmup:
                counter.triton[counter.layer] += 1
                counter.kernels[counter.layer] += 1
            counter.in_triton += 1
            try:
                return _run(self, *args, grid=grid, warmup=warmup, **kwargs)
            finally:
                counter.in_triton -= 1

        cls.run = counting_run
        patched.append((cls, run))
    return patched


def build_launch_model(device):
    from bench.e2e import build_model
    from bench.shapes import LAUNCH_MODEL

    torch.manual_seed(0)
    kind, overrides = LAUNCH_MODEL
    return build_model(kind, overrides, device, torch.float32)


def count_step(model, method: str, backend: str, batch: int, coverage: bool, budget: int = BUDGET,
               prompt: int = PROMPT) -> dict:
    """Prefill `batch` rows (row r: a prompt of prompt + 7 r random tokens, so rows have their own lengths), step
    them statically past the first few steps, and count one replayable step -> {"aten", "kernels", "triton":
    {layer or "outside": count}, "position": the counted step's slot in row 0}."""
    from locks.core.cache import SelectorCache
    from locks.core.generation import decode_cache
    from locks.core.registry import MethodSpec
    from locks.core.static_decode import StaticDecodeStep

    device = next(model.parameters()).device
    gen = torch.Generator().manual_seed(1)
    vocab = model.config.vocab_size
    caches, lengths = [], []
    with torch.inference_mode():
        for r in range(batch):
            ids = torch.randint(0, vocab, (1, prompt + 7 * r), generator=gen).to(device)
            cache = SelectorCache(model, MethodSpec(method, budget, backend=backend), measure_coverage=coverage)
            cache.phase = "prefill"
            cache.max_new_tokens = 64
            model(input_ids=ids, cache=cache, sparse_cache=cache, use_cache=True, logits_to_keep=1)
            caches.append(cache)
            lengths.append(ids.shape[1])
        rows = decode_cache(caches)
        step = StaticDecodeStep(model, rows, batch, [n + 64 for n in lengths], cuda_graph=False)
        token = torch.zeros(batch, dtype=torch.long, device=device)
        for k in range(40):
            position = [n + k for n in lengths]
            step.place(token, position)
            if k >= 4 and not rows.static_host_step:
                counter = LaunchCounter()
                with counter.hooks(model), counter:
                    logits = step.forward()
                rows.finish_static_step()
                return {"aten": dict(counter.aten), "kernels": dict(counter.kernels),
                        "triton": dict(counter.triton), "position": lengths[0] + k}
            logits = step.forward()
            rows.finish_static_step()
            token = logits.argmax(-1)
    raise RuntimeError(f"{method}: no replayable static step among the first 40")


def per_layer(counts: dict, layers: int) -> list[int]:
    return [int(counts.get(i, 0)) for i in range(layers)]


def count_all(methods=METHODS, batches=BATCHES, backends=("torch", "triton"), device="cpu") -> list[dict]:
    """One record per (method, backend, batch, coverage): the per-layer counts of one static step."""
    from tqdm import tqdm

    model = build_launch_model(torch.device(device))
    layers = model.config.num_hidden_layers
    cases = [(m, be, b, cov) for be in backends for m in methods for b in batches for cov in (False, True)
             if not (cov and m == "fullkv")]
    records = []
    for method, backend, batch, coverage in tqdm(cases, desc="static steps counted", unit="step"):
        c = count_step(model, method, backend, batch, coverage)
        records.append(dict(kind="launches", method=method, backend=backend, batch=batch, coverage=coverage,
                            budget=BUDGET, prompt=PROMPT, layers=layers, position=c["position"],
                            aten_per_layer=per_layer(c["aten"], layers), kernels_per_layer=per_layer(c["kernels"], layers),
                            triton_per_layer=per_layer(c["triton"], layers),
                            aten_outside=int(c["aten"].get(OUTSIDE, 0)),
                            kernels_outside=int(c["kernels"].get(OUTSIDE, 0))))
    return records


def model_nodes(record: dict, layers: int) -> float:
    """Kernels of one step of a `layers`-layer model with this record's per-layer counts (module docstring)."""
    counted = record["kernels_per_layer"]
    return record["kernels_outside"] + sum(counted[min(i, len(counted) - 1)] for i in range(layers))


def nodes_at_batch(one: dict, eight: dict, layers: int, batch: int) -> float:
    """Nodes at batch B, linear through the counts at batch 1 and 8."""
    n1, n8 = model_nodes(one, layers), model_nodes(eight, layers)
    return n1 + (n8 - n1) * (batch - 1) / 7


def modeled(records: list[dict], t_node_us: float = T_NODE_US, bandwidth: float = BANDWIDTH) -> list[dict]:
    """FullKV against LOCKS (fused backend, coverage off and on) at the bench/byte_model.py shapes: the modeled
    step times, the modeled speedup and the byte-bound ceiling it is capped by."""
    from bench.byte_model import step_bytes, weights_and_layers

    def find(method, batch, coverage):
        return next(r for r in records if r["method"] == method and r["backend"] == "triton"
                    and r["batch"] == batch and r["coverage"] == coverage)

    out = []
    for shape in ("glm", "llama"):
        weights, layers = weights_and_layers(shape)
        for context in MODELED_CONTEXTS:
            full_kv, locks_kv = step_bytes(shape, context)
            for batch in MODELED_BATCHES:
                full_bytes = weights + batch * layers * full_kv
                locks_bytes = weights + batch * layers * locks_kv
                full_nodes = nodes_at_batch(find("fullkv", 1, False), find("fullkv", 8, False), layers, batch)
                t_full = 1e3 * full_bytes / bandwidth + full_nodes * t_node_us / 1e3
                for coverage in (False, True):
                    nodes = nodes_at_batch(find("locks", 1, coverage), find("locks", 8, coverage), layers, batch)
                    t_locks = 1e3 * locks_bytes / bandwidth + nodes * t_node_us / 1e3
                    out.append(dict(kind="modeled", shape=shape, context=context, batch=batch, coverage=coverage,
                                    t_node_us=t_node_us, bandwidth=bandwidth, fullkv_nodes=full_nodes,
                                    locks_nodes=nodes, fullkv_ms=t_full, locks_ms=t_locks,
                                    modeled_speedup=t_full / t_locks, byte_ceiling=full_bytes / locks_bytes))
    return out


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--methods", nargs="+", default=list(METHODS), choices=METHODS)
    p.add_argument("--backends", nargs="+", default=["torch", "triton"], choices=["torch", "triton"])
    p.add_argument("--t-node-us", type=float, default=T_NODE_US, help="seconds per graph node, in microseconds")
    p.add_argument("--bandwidth", type=float, default=BANDWIDTH, help="HBM bytes per second")
    p.add_argument("--out", type=Path, required=True, help="JSON file of the counts and the model")
    return p.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cpu":
        os.environ["TRITON_INTERPRET"] = "1"  # before locks.kernels is imported: kernels run on CPU tensors
    records = count_all(args.methods, BATCHES, args.backends, device)
    model = modeled(records, args.t_node_us, args.bandwidth) if {"fullkv", "locks"} <= set(args.methods) and \
        "triton" in args.backends else []
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(dict(device=device, torch=torch.__version__, machine=platform.machine(),
                                        counts=records, modeled=model), indent=1) + "\n")
    for r in records:
        print(f"{r['method']:<9} {r['backend']:<6} B={r['batch']} coverage={str(r['coverage']):<5} kernels/layer "
              f"{r['kernels_per_layer']} aten/layer {r['aten_per_layer']} outside {r['kernels_outside']}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
