"""Per-layer decode-attention benchmark: FullKV (cuDNN / flash SDPA, our Triton full decode) against the LOCKS and
Quest fused Triton paths, the LOCKS PyTorch reference, ShadowKV's, RocketKV's and LRQK's own static steps, and the
token Oracle's exact top-k.

For every shape (llama: 32 query / 8 KV heads, glm: 32 / 2; d = 128, bf16), context and batch it times one decode
step of one layer, all heads, with fresh random K/V (never zeros):
  sdpa_cudnn, sdpa_flash   F.scaled_dot_product_attention (enable_gqa, GQA-native) forced onto one backend with
                           torch.nn.attention.sdpa_kernel; a backend that refuses is recorded as a skip with the error
  flash_attn_kvcache       flash_attn.flash_attn_with_kvcache (the optional flash-attn package; a skip when absent)
  triton_full              locks.kernels.full_decode (the split-K kernel over all tokens)
  locks_fused              locks_aggregated_scores (norm, exact two-pass) + torch.topk + paged_decode
  locks_score / topk / locks_decode   the three parts of locks_fused timed alone (topk = torch.topk on the
                           aggregated scores [B, Hkv, P], P = 65,536 pages at 1M; its share of locks_fused is recorded:
                           a Triton top-k is only worth writing if that share is large)
  quest_fused              quest_group_scores (max over the group, one page set per KV head) + torch.topk +
                           paged_decode; Quest's kernel page rule: the last page is always attended, budget//16 - 1
                           pages chosen among the others
  quest_fused_per_head     quest_page_scores (one page set per query head, Quest's default gqa=per_head) + torch.topk
                           + paged_decode with Gs = G
  locks_torch              the PyTorch reference path: page_scores + aggregate_heads + torch.topk + forced set +
                           locks.core.reference.sparse_decode (gather + fp32 softmax)
  shadowkv_static, rocketkv_static, lrqk_static   the selector's own static step as the model runs it
                           (`select_static` + locks.core.attention.attend, backend triton): one decode step after its
                           own `prefill` on the first L - 1 tokens (bench/prefill_state.py: the expensive parts
                           random in their exact layout on GPU, computed in --dry-run), ShadowKV's keys rebuilt and
                           rotated by a Llama RoPE (theta 500,000), its and LRQK's misses read from pinned host memory
  oracle_token_topk        the token Oracle's exact top-`budget` per query head (logits over every key, torch.topk)
                           + the fused sparse decode: what an exact top-k costs
LOCKS uses the harness's fair budget through a real `LocksSelector` (its `plan`: the partial page + the top-k
pages, 128 at budget 2048, every complete page a candidate; --sink-pages and --recent add the harness's options),
and its reference step is that selector's own `select` (backend torch); Quest's page budget is
`QuestSelector.page_budget`. Nothing here restates a selection rule.

Timing: CUDA events around each step, warm-up first, median of --reps (>= 20) steps; every method is captured in a
CUDA graph (one per rotation slot) and replayed (`ms`), and also timed eagerly (`ms_eager`, includes Python launch
overhead); when capture fails the eager time is used and the reason recorded. Inputs are rotated over several
copies (slots) whenever a per-step working set would fit twice in L2, so no step reads data cached by the previous
one: every slot has its own query; summaries, Quest min/max and K/V get per-slot copies when they are smaller than
2 x L2 (larger tensors cannot stay in L2 between steps).
The selector steps' bytes are the selector's own accounting (`static_step_cost` + the step's `device_bytes`, as
SelectorCache counts them), `h2d_bytes` separately, with `h2d_floor_ms` at the pinned-copy bandwidth measured at the
start of the run (a record of kind "bandwidth") and `floor_ms` = bytes / --bandwidth + h2d_floor_ms; their misses
are those of the first step after the prefill, whose query is unrelated to the prefill's (random inputs), so the
host traffic is a worst case for their buffers. Their state is one copy per rotation slot when its device bytes
(`Selector.memory_bytes`) are below 2 x L2, else shared. Peak device memory (CUDA): `state_bytes` allocated by the
selector's prefill and static preallocation, `step_peak_bytes` above what was allocated before one step.
Bytes per step (analytic, all KV heads and batch rows; s = 2 B for bf16):
  fullkv  2*L*d*s;  locks  summary_bytes_per_page * candidate pages + 2*d*s*attended + G*d*s (queries);
  quest   2*d*s * scored pages + 2*d*s*attended (per_head: the union over the group) + G*d*s;
plus `bytes_with_intermediates` for the fused paths (per-head score round trip, aggregated scores, top-k read),
achieved GB/s = bytes / time, and `speedup_vs_fastest_fullkv` = fastest FullKV time of the same configuration / time.
Correctness, once per configuration (records of kind "check"): triton_full and the SDPA backends against a chunked
fp32 dense reference; the fused scores against the PyTorch scores; the fused selections against the reference's
(`set_agreement`, ties allowed); the fused outputs against locks.core.reference.sparse_decode on the same pages.
Summaries: random values in the exact quantized layout (`--summaries random`, default on GPU: building 2M pages
with batched eigh costs minutes of GPU time and timing does not depend on the values, only on the layout), or
locks.method.summaries.build_summaries on the random keys in chunks of <= 32,768 pages per call (`--summaries build`,
default in --dry-run; cuSOLVER's batched eigh failed on 65,536 16x16 matrices in one call).
Not included here: the end-to-end CUDA-graph decode step of a random-weight model (bench/e2e.py).

Every measurement is printed as soon as it is taken and appended to --out as one JSON object per line (flushed).
--dry-run runs everything on CPU at tiny sizes under the Triton interpreter (timings meaningless; plumbing and
correctness asserts only; exits non-zero if a check fails).

    python scripts/bench_decode.py --out results/gpu/decode.jsonl
    python scripts/bench_decode.py --dry-run --out /tmp/dry.jsonl
"""
from __future__ import annotations

import argparse
import math
import os
import platform
import sys
import time
from dataclasses import dataclass, field

import torch

from baselines.quest import QuestSelector
from bench.inputs import (
    build_summaries_chunked,
    clone_summaries,
    dense_reference,
    quest_metadata,
    random_summaries,
    rel_err,
    set_agreement,
    summaries_bytes,
)
from bench.records import Recorder, out_path
from bench.shapes import ATTENTION, ATTENTION_DRY
from bench.timing import Timer, h2d_bandwidth, step_peak_bytes
from locks.core.paging import pages_to_tokens
from locks.core.reference import sparse_decode as ref_sparse_decode
from locks.core.selector import LayerInfo, Selection
from locks.method import LocksSelector
from locks.method.summaries import summary_bytes_per_page

FULLKV_METHODS = ["sdpa_cudnn", "sdpa_flash", "flash_attn_kvcache", "triton_full"]
# the selectors timed through their own static step (registry name -> options of the benchmark)
SELECTOR_STEPS = {"shadowkv_static": ("shadowkv", {}), "rocketkv_static": ("rocketkv", {}),
                  "lrqk_static": ("lrqk", {}), "oracle_token_topk": ("oracle_token", {})}
METHODS = FULLKV_METHODS + ["locks_fused", "locks_score", "topk", "locks_decode", "quest_fused",
                            "quest_fused_per_head", "locks_torch", *SELECTOR_STEPS]
COMPONENTS = ("locks_score", "topk", "locks_decode")  # parts of locks_fused, timed alone
TOL = {"out": 1e-2, "scores": 1e-3}  # bf16 outputs vs fp32 references; fp32 scores


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--dry-run", action="store_true", help="tiny sizes on CPU under the Triton interpreter")
    p.add_argument("--out", default=None, help="JSON-lines file, appended as it goes (default results/gpu/decode.jsonl; "
                                               "with --dry-run a scratch file in the temporary directory)")
    p.add_argument("--contexts", type=int, nargs="+", default=[131072, 262144, 1048576])
    p.add_argument("--shapes", nargs="+", default=["llama", "glm"], choices=sorted(ATTENTION))
    p.add_argument("--batch", type=int, nargs="+", default=[1, 4])
    p.add_argument("--budget", type=int, default=2048, help="tokens attended by LOCKS / Quest (fair mode)")
    p.add_argument("--page-size", type=int, default=16)
    p.add_argument("--recent", type=int, default=0, help="LOCKS recent window (tokens; 0, as conf/method/locks.yaml)")
    p.add_argument("--sink-pages", type=int, default=0, help="LOCKS sink pages (0, as conf/method/locks.yaml)")
    p.add_argument("--reps", type=int, default=30, help="timed steps per method (median; >= 20 on GPU)")
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--methods", nargs="+", default=METHODS, choices=METHODS)
    p.add_argument("--summaries", choices=["random", "build"], default=None,
                   help="random quantized layout (GPU default) or build_summaries on the keys (dry-run default); "
                        "the selector steps' prefill state follows it (random / real)")
    p.add_argument("--bandwidth", type=float, default=4.5e12, help="HBM bytes/s of floor_ms (H200 measured)")
    p.add_argument("--no-graph", action="store_true", help="eager timing only")
    p.add_argument("--tune", action="store_true", help="also time a few block-size variants of the Triton kernels "
                                                       "at the largest context (records of kind 'tune')")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    if args.dry_run:
        args.contexts = [1000]  # not a multiple of 16: a partial page
        args.batch = [2]
        args.budget = 256
        args.reps = 2
        args.warmup = 1
        args.summaries = args.summaries or "build"
    else:
        args.summaries = args.summaries or "random"
        if args.reps < 20:
            p.error("--reps must be >= 20 (median of at least 20 steps)")
    return args


# ----------------------------------------------------------------------------------------------------------------
# one configuration: inputs, the selectors' plans, the steps, their bytes, checks, timings


@dataclass
class Case:
    """One (shape, context, batch) configuration: inputs on the device, rotation slots, and what the selectors plan."""

    shape: str
    L: int
    B: int
    Hq: int
    H: int
    d: int
    n: int
    base: dict
    keys: torch.Tensor
    values: torch.Tensor
    summaries: object
    qmax: torch.Tensor
    qmin: torch.Tensor
    slots: list = field(default_factory=list)
    selectors: dict = field(default_factory=dict)  # SELECTOR_STEPS name -> one prefilled selector per slot
    state_bytes: dict = field(default_factory=dict)  # name -> device bytes its prefill and preallocation allocated
    h2d_bytes: dict = field(default_factory=dict)  # name -> host-to-device bytes of its step (all batch rows)
    locks: LocksSelector | None = None  # fused scoring (backend triton): its plan and candidate range
    locks_ref: LocksSelector | None = None  # the same selector with backend torch: the reference step
    quest_pages: int = 0  # pages chosen besides the last one (QuestSelector's kernel rule)

    @property
    def G(self) -> int:
        return self.Hq // self.H

    @property
    def scaling(self) -> float:
        return self.d ** -0.5

    @property
    def P(self) -> int:
        return self.L // self.n

    @property
    def tail(self) -> int:
        return self.L % self.n

    @property
    def nq(self) -> int:  # Quest's pages, the partial one included
        return -(-self.L // self.n)


def make_case(args, device, shape_name, dims, L, B, l2_bytes) -> Case:
    """Fresh random K/V (never zeros), summaries, Quest min/max; the LOCKS and Quest selectors that plan the steps;
    rotation slots (a new query per slot; per-slot copies of whatever fits twice in L2)."""
    Hq, H, d = dims
    n = args.page_size
    dtype = torch.bfloat16
    gen = torch.Generator(device=device).manual_seed(args.seed + L + 7 * B + sum(map(ord, shape_name)))
    gen_dtype = torch.float32 if device.type == "cpu" else dtype  # CPU randn has no bf16 generator path
    keys = torch.randn(B, H, L, d, generator=gen, device=device, dtype=gen_dtype).to(dtype)
    values = torch.randn(B, H, L, d, generator=gen, device=device, dtype=gen_dtype).to(dtype)
    summ = (build_summaries_chunked(keys, n, 8) if args.summaries == "build"
            else random_summaries(B, H, L // n, d, 8, n, device, gen))
    qmax, qmin = quest_metadata(keys, n)
    base = dict(shape=shape_name, context=L, batch=B, Hq=Hq, Hkv=H, d=d, budget=args.budget, dtype="bf16",
                device=str(device))
    case = Case(shape_name, L, B, Hq, H, d, n, base, keys, values, summ, qmax, qmin)

    def selector(backend):
        s = LocksSelector(LayerInfo(0, Hq, H, d, d ** -0.5, kv_element_bytes=2, backend=backend), args.budget,
                          page_size=n, rank=8, recent_window=args.recent, sink_pages=args.sink_pages)
        s.use_summaries(summ)
        return s

    case.locks, case.locks_ref = selector("triton"), selector("torch")
    plan = case.locks.plan(L)
    if case.locks.candidate_range(plan.num_pages, plan.forced) is None or plan.k_pages <= 0:
        raise ValueError(f"context {L} is too short for budget {args.budget}")
    quest = QuestSelector(LayerInfo(0, Hq, H, d, d ** -0.5, backend="triton"), args.budget, page_size=n)
    case.quest_pages = quest.page_budget - 1  # the kernel rule: budget // n pages including the last one

    sb, qb = summaries_bytes(summ), qmax.nbytes + qmin.nbytes
    kvb = keys.nbytes + values.nbytes
    n_rot = 2 if device.type == "cpu" else max(1, min(8, math.ceil(2 * l2_bytes / max(1, min(sb, qb, kvb)))))
    for i in range(n_rot):
        sl = dict(q=torch.randn(B, Hq, d, generator=gen, device=device).to(dtype))
        sl["summ"] = summ if (i == 0 or sb >= 2 * l2_bytes) else clone_summaries(summ)
        sl["qmax"], sl["qmin"] = (qmax, qmin) if (i == 0 or qb >= 2 * l2_bytes) else (qmax.clone(), qmin.clone())
        sl["k"], sl["v"] = (keys, values) if (i == 0 or kvb >= 2 * l2_bytes) else (keys.clone(), values.clone())
        case.slots.append(sl)
    base.update(rotation_slots=n_rot, summaries=args.summaries, locks_pages_selected=plan.k_pages,
                locks_forced_pages=len(plan.forced), quest_pages_selected=case.quest_pages)
    for m in args.methods:
        if m in SELECTOR_STEPS:
            try:
                case.selectors[m] = prefilled_selectors(args, case, m, gen, l2_bytes)
            except Exception as e:  # out of device or pinned host memory: recorded by the timing as a skip
                case.selectors[m] = e
    return case


def prefilled_selectors(args, case: Case, method: str, gen, l2_bytes: int) -> list:
    """The selector of a SELECTOR_STEPS method after its own prefill on the first L - 1 tokens and its static
    preallocation for L: one per rotation slot when its device state is below 2 x L2 (else one, shared)."""
    import functools

    from bench.inputs import rope_rotate
    from bench.prefill_state import prefill_selector
    from locks.core.registry import MethodSpec

    c = case
    name, options = SELECTOR_STEPS[method]
    info = LayerInfo(0, c.Hq, c.H, c.d, c.scaling, kv_element_bytes=2, backend="triton")
    spec = MethodSpec(name, args.budget, options=options, backend="triton")
    cuda = c.keys.device.type == "cuda"
    before = torch.cuda.memory_allocated() if cuda else 0
    out = []
    mode = "real" if args.summaries == "build" else "random"
    rotate = functools.partial(rope_rotate, theta=500000.0)
    for i in range(len(c.slots)):
        selector = spec.build(info)
        if i and sum(v for k, v in selector.memory_bytes(c.L).items() if k != "host") >= 2 * l2_bytes:
            out.append(out[0])
            continue
        prefill_selector(selector, c.keys[:, :, : c.L - 1], c.values[:, :, : c.L - 1], gen, mode, max_new_tokens=1,
                         rotate=rotate, unrotate=functools.partial(rope_rotate, theta=500000.0, inverse=True))
        if selector.static_decode_error() is None:
            selector.start_static(c.L)
        out.append(selector)
    c.state_bytes[method] = (torch.cuda.memory_allocated() - before) / len({id(s) for s in out}) if cuda else None
    return out


class Steps:
    """The timed steps of a case, each a function of one rotation slot."""

    def __init__(self, case: Case):
        from baselines.quest import kernels as QK
        from locks import kernels as K
        from locks.method import kernels as LK

        self.case, self.K, self.QK, self.LK = case, K, QK, LK
        c = case
        plan = c.locks.plan(c.L)
        self.lo, self.hi = c.locks.candidate_range(plan.num_pages, plan.forced)
        self.kp = plan.k_pages
        # the pages always attended: the forced complete pages and the partial page (page id P)
        self.forced_pages = torch.tensor(sorted(plan.forced) + ([c.P] if c.tail else []), device=c.keys.device)
        self.attended_locks = (plan.k_pages + len(plan.forced)) * c.n + c.tail
        self.last_page = torch.tensor([c.nq - 1], device=c.keys.device)
        self.length = torch.tensor([c.L], device=c.keys.device)  # the selector steps' valid length
        self.attended_quest = c.quest_pages * c.n + (c.L - (c.nq - 1) * c.n)

    def sdpa(self, backend):
        import torch.nn.functional as F
        from torch.nn.attention import SDPBackend, sdpa_kernel

        be = {"cudnn": SDPBackend.CUDNN_ATTENTION, "flash": SDPBackend.FLASH_ATTENTION}[backend]
        scaling = self.case.scaling

        def step(sl):
            with sdpa_kernel([be]):
                return F.scaled_dot_product_attention(sl["q"].unsqueeze(2), sl["k"], sl["v"], scale=scaling,
                                                      enable_gqa=True)[:, :, 0]
        return step

    def triton_full(self, sl):
        return self.K.full_decode(sl["q"], sl["k"], sl["v"], self.case.scaling)

    def flash_attn_kvcache(self, sl):
        # the optional flash-attn package (pip install '.[gpu]'): its decode kernel over the [B, L, H_kv, d] cache
        from flash_attn import flash_attn_with_kvcache

        return flash_attn_with_kvcache(sl["q"].unsqueeze(1), sl["k"].transpose(1, 2), sl["v"].transpose(1, 2),
                                       softmax_scale=self.case.scaling, causal=False)[:, 0]

    def locks_score(self, sl):
        c = self.case
        return self.LK.locks_aggregated_scores(sl["q"], sl["summ"].kernel_tensors(), c.scaling, c.G, "norm", self.lo,
                                               self.hi)

    def locks_pages(self, agg):
        return self.K.select_pages(agg, self.kp, self.forced_pages)

    def paged(self, sl, pages):
        c = self.case
        return self.K.paged_decode(sl["q"], sl["k"], sl["v"], pages, c.scaling, page_size=c.n, length=c.L)

    def locks_fused(self, sl):
        return self.paged(sl, self.locks_pages(self.locks_score(sl)))

    def quest_group_pages(self, sl):
        c = self.case
        U = self.QK.quest_group_scores(sl["q"], sl["qmax"][:, :, :c.nq - 1], sl["qmin"][:, :, :c.nq - 1], "max")
        return self.K.select_pages(U, c.quest_pages, self.last_page)

    def quest_per_head_pages(self, sl):
        c = self.case
        U = self.QK.quest_page_scores(sl["q"], sl["qmax"][:, :, :c.nq - 1], sl["qmin"][:, :, :c.nq - 1])
        top = self.K.topk_pages(U, c.quest_pages).view(c.B, c.H, c.G, c.quest_pages)
        return torch.cat([top, self.last_page.expand(c.B, c.H, c.G, 1)], -1)

    def quest_fused(self, sl):
        return self.paged(sl, self.quest_group_pages(sl))

    def quest_fused_per_head(self, sl):
        return self.paged(sl, self.quest_per_head_pages(sl))

    def locks_torch(self, sl):
        """The harness's PyTorch reference step: the LOCKS selector's own select, then the reference decode."""
        sel = self.case.locks_ref.select(sl["q"], sl["k"], sl["v"])
        return ref_sparse_decode(sl["q"], sl["k"], sl["v"], sel, self.case.scaling)

    def selector_step(self, method: str, i: int):
        """Slot i's step of a SELECTOR_STEPS method -> (the Selection, (out, lse))."""
        from locks.core.attention import attend

        c = self.case
        selector, sl = c.selectors[method][i], c.slots[i]
        if selector.static_decode_error() is None:
            sel = selector.select_static(sl["q"], sl["k"], sl["v"], self.length)
        else:  # a configuration without a static path: its eager select
            sel = selector.select(sl["q"], sl["k"], sl["v"])
        return sel, attend(sl["q"], sl["k"], sl["v"], sel, c.scaling, "triton", self.length)

    def table(self, methods) -> dict[str, list]:
        """method -> one callable per rotation slot (components get their inputs computed outside the timing)."""
        c = self.case
        one = {"sdpa_cudnn": self.sdpa("cudnn"), "sdpa_flash": self.sdpa("flash"), "triton_full": self.triton_full,
               "flash_attn_kvcache": self.flash_attn_kvcache, "locks_fused": self.locks_fused,
               "locks_score": self.locks_score, "quest_fused": self.quest_fused,
               "quest_fused_per_head": self.quest_fused_per_head, "locks_torch": self.locks_torch}
        out = {m: [(lambda sl=sl, f=one[m]: f(sl)) for sl in c.slots] for m in methods if m in one}
        for m in methods:
            if m in SELECTOR_STEPS and not isinstance(c.selectors.get(m), Exception):
                out[m] = [lambda m=m, i=i: self.selector_step(m, i)[1] for i in range(len(c.slots))]
        if "topk" in methods or "locks_decode" in methods:
            fixed_agg = [self.locks_score(sl) for sl in c.slots]
            fixed_pages = [self.locks_pages(a) for a in fixed_agg]
            out["topk"] = [lambda a=a: self.K.topk_pages(a, self.kp) for a in fixed_agg]
            out["locks_decode"] = [lambda sl=sl, pg=pg: self.paged(sl, pg) for sl, pg in zip(c.slots, fixed_pages)]
        return out


def bytes_of(case: Case, steps: Steps) -> dict[str, tuple]:
    """method -> (bytes per step, bytes with the fused paths' intermediates or None, attended tokens); all KV heads
    and batch rows, s = 2 B (bf16). See the module docstring for the formulas."""
    c, s_el = case, 2
    B, H, Hq, G, d, L, nq = c.B, c.H, c.Hq, c.G, c.d, c.L, c.nq
    cand = steps.hi - steps.lo
    spp = summary_bytes_per_page(c.summaries)
    qbytes = G * d * s_el
    full_bytes = 2 * L * d * s_el * H * B
    locks_bytes = (spp * cand + 2 * d * s_el * steps.attended_locks + qbytes) * H * B
    locks_inter = (8 * G + 4 + 4) * cand * H * B  # S written + read, aggregated written, read by top-k
    with torch.no_grad():  # the union of the group's pages per KV head (what per_head reads)
        pg = steps.quest_per_head_pages(c.slots[0])
        seen = torch.zeros(B, H, nq, dtype=torch.bool, device=c.keys.device)
        seen.scatter_(2, pg.reshape(B, H, -1), True)
        page_len = torch.full((nq,), float(c.n), device=c.keys.device)
        page_len[-1] = L - (nq - 1) * c.n
        quest_union = float((seen.float() * page_len).sum(-1).mean())
    score_bytes = (spp * cand + qbytes) * H * B
    quest_group = (2 * d * s_el * (nq - 1) + 2 * d * s_el * steps.attended_quest + qbytes) * H * B
    quest_head = (2 * d * s_el * (nq - 1) + 2 * d * s_el * quest_union + qbytes) * H * B
    return {
        "sdpa_cudnn": (full_bytes, None, L), "sdpa_flash": (full_bytes, None, L), "triton_full": (full_bytes, None, L),
        "flash_attn_kvcache": (full_bytes, None, L),
        "locks_fused": (locks_bytes, locks_bytes + locks_inter, steps.attended_locks),
        "locks_torch": (locks_bytes, None, steps.attended_locks),
        "locks_score": (score_bytes, score_bytes + (8 * G + 4) * cand * H * B, None),
        "topk": (4 * cand * H * B, None, None),
        "locks_decode": (2 * d * s_el * steps.attended_locks * H * B, None, steps.attended_locks),
        "quest_fused": (quest_group, quest_group + 4 * (nq - 1) * H * B * 2, steps.attended_quest),
        "quest_fused_per_head": (quest_head, quest_head + 4 * (nq - 1) * Hq * B * 2, quest_union),
    }


def selector_step_bytes(selector, sel: Selection, L: int) -> tuple[float, float, float]:
    """(HBM bytes, host-to-device bytes, attended tokens per KV head) of one selector step at L tokens, one layer,
    per batch row, as SelectorCache accounts a step (locks/core/cache.py, locks/core/attention.py): a static step's
    `static_step_cost` plus its `device_bytes` and, when the device counts them, the attended tokens' K/V; an eager
    selection's own metadata / K/V / host bytes."""
    from locks.core.reference import attended_mean

    info = selector.info
    if sel.dense:
        return float(L * info.token_kv_bytes), 0.0, float(L)
    length = torch.tensor([L], device=sel.pages.device if sel.pages is not None else "cpu")  # read by page lists
    counted = float(attended_mean(sel, length, L).mean())
    if selector.static_decode_error() is not None:  # an eager selection (a configuration without a static path)
        kv = sel.kv_bytes if sel.kv_bytes is not None else counted * info.token_kv_bytes
        return float(sel.metadata_bytes + kv), float(sel.h2d_bytes), counted
    _, metadata, attended, *kv = selector.static_step_cost(L)
    device = ([0.0, 0.0, 0.0] if sel.device_bytes is None else  # per row ([B, 3]) or the batch's ([3]): the mean
              [float(x) for x in sel.device_bytes.reshape(-1, 3).mean(0).tolist()])
    kv_bytes = kv[0] if kv else (attended or 0.0) * info.token_kv_bytes
    if attended is None:
        attended = counted
        if sel.kv_bytes is None:
            kv_bytes += counted * info.token_kv_bytes
    return float(metadata + device[0] + kv_bytes + device[1]), device[2], float(attended)


def check_selector_steps(rec, case: Case, steps: Steps, table: dict, bytes_table: dict) -> None:
    """Once per configuration, slot 0's first step after the prefill of each SELECTOR_STEPS method: its output against
    the reference attention (fp32 gather, locks.core.reference) over the same Selection, and its bytes."""
    from locks.core.attention import attend

    c, sl0 = case, case.slots[0]
    for m in SELECTOR_STEPS:
        if m not in table:
            if isinstance(c.selectors.get(m), Exception):
                _skip(rec, c.base, m, c.selectors[m])
            continue
        with torch.no_grad():
            sel, (o, lse) = steps.selector_step(m, 0)
            ro, rl = attend(sl0["q"].float(), sl0["k"], sl0["v"], sel, c.scaling, "torch", steps.length)
        err = max(rel_err(o, ro), rel_err(lse, rl))
        ok = bool(torch.isfinite(o).all()) and err <= TOL["out"]
        _check(rec, c.base, m, err, TOL["out"], "reference attention (fp32) over the same selection",
               {"output_rel_err": err}, ok=ok)
        hbm, h2d, attended = selector_step_bytes(c.selectors[m][0], sel, c.L)
        bytes_table[m] = (hbm * c.B, None, attended)
        c.h2d_bytes[m] = h2d * c.B


def _reference_on_pages(case: Case, pages):
    """The reference decode on the tokens of a page list (pages [B, Hkv, Kp] or [B, Hkv, Gs, Kp])."""
    c = case
    pg = pages if pages.dim() == 4 else pages.unsqueeze(2)
    tok = pages_to_tokens(pg.clamp(max=c.nq - 1), c.n)
    sel = Selection(indices=tok.clamp(max=c.L - 1), valid=tok < c.L)
    return ref_sparse_decode(c.slots[0]["q"].float(), c.keys, c.values, sel, c.scaling)


def check(args, rec, case: Case, steps: Steps, table: dict) -> None:
    """Correctness once per configuration (slot 0): FullKV paths against a chunked fp32 dense reference; the fused
    LOCKS / Quest scores against the selectors' PyTorch scores, their page sets (ties allowed) and outputs."""
    c, sl0, base = case, case.slots[0], case.base
    with torch.no_grad():
        ref_out, ref_lse = dense_reference(sl0["q"], c.keys, c.values, c.scaling)
        for m in ("triton_full", "sdpa_cudnn", "sdpa_flash", "flash_attn_kvcache"):
            if m not in table:
                continue
            try:
                o = table[m][0]()
                o = o[0] if isinstance(o, tuple) else o
                details = {}
                err = rel_err(o, ref_out)
                if m == "triton_full":
                    details["lse_rel_err"] = rel_err(steps.triton_full(sl0)[1], ref_lse)
                    err = max(err, details["lse_rel_err"])
                _check(rec, base, m, err, TOL["out"], "dense fp32 reference", details)
            except Exception as e:
                if m == "triton_full":
                    raise
                _skip(rec, base, m, e)
                del table[m]
        if "locks_fused" in table:
            plan = c.locks_ref.plan(c.L)
            _, agg_ref = c.locks_ref.scored_pages(sl0["q"], c.keys, plan.num_pages, set(plan.forced), None)
            agg = steps.locks_score(sl0)[..., :plan.num_pages]
            score_err = rel_err(agg, agg_ref)
            pages = steps.locks_pages(steps.locks_score(sl0))
            agree = set_agreement(pages[..., :steps.kp], torch.topk(agg_ref, steps.kp, dim=-1).indices, agg_ref)
            o, lse = steps.paged(sl0, pages)
            ro, rl = _reference_on_pages(c, pages)
            out_err = max(rel_err(o, ro), rel_err(lse, rl))
            _check(rec, base, "locks_fused", max(out_err, score_err / TOL["scores"] * TOL["out"]), TOL["out"],
                   "LocksSelector (backend torch) scores; reference decode on the same pages",
                   {"score_rel_err": score_err, "output_rel_err": out_err, "set_agreement": agree},
                   ok=score_err <= TOL["scores"] and out_err <= TOL["out"] and agree == 1.0)
        for m, per_head in (("quest_fused", False), ("quest_fused_per_head", True)):
            if m not in table:
                continue
            B, H, G, d, nq, kq = c.B, c.H, c.G, c.d, c.nq, c.quest_pages
            qf = sl0["q"].float().view(B, H, G, d)
            Mx, Mn = c.qmax[:, :, :nq - 1].float(), c.qmin[:, :, :nq - 1].float()
            Uref = qf.clamp(min=0) @ Mx.transpose(-1, -2) + qf.clamp(max=0) @ Mn.transpose(-1, -2)  # [B,H,G,P]
            if per_head:
                U = steps.QK.quest_page_scores(sl0["q"], c.qmax[:, :, :nq - 1], c.qmin[:, :, :nq - 1]).view(B, H, G, -1)
                pages = steps.quest_per_head_pages(sl0)
            else:
                Uref = Uref.amax(2)
                U = steps.QK.quest_group_scores(sl0["q"], c.qmax[:, :, :nq - 1], c.qmin[:, :, :nq - 1], "max")
                pages = steps.quest_group_pages(sl0)
            agree = set_agreement(pages[..., :kq], torch.topk(Uref, kq, dim=-1).indices, Uref)
            score_err = rel_err(U, Uref)
            o, lse = steps.paged(sl0, pages)
            ro, rl = _reference_on_pages(c, pages)
            out_err = max(rel_err(o, ro), rel_err(lse, rl))
            _check(rec, base, m, max(out_err, score_err / TOL["scores"] * TOL["out"]), TOL["out"],
                   "PyTorch q+.M + q-.m bound; reference decode on the same pages",
                   {"score_rel_err": score_err, "output_rel_err": out_err, "set_agreement": agree},
                   ok=score_err <= TOL["scores"] and out_err <= TOL["out"] and agree == 1.0)


def time_all(args, rec, timer, case: Case, steps: Steps, table: dict, bytes_table: dict) -> None:
    """Median step times in the order of --methods (FullKV first: speedups are against the fastest of them)."""
    fastest = None
    locks_fused_ms = None
    for m in args.methods:
        if m not in table:
            continue  # skipped by the checks
        try:
            with torch.no_grad():
                peak = step_peak_bytes(table[m][0], case.keys.device)
                t = timer.time(table[m])
        except Exception as e:
            _skip(rec, case.base, m, e)
            continue
        b, b_inter, attended = bytes_table[m]
        r = dict(kind="measurement", method=m, **case.base, **t, bytes=b, gbps=b / (t["ms"] * 1e-3) / 1e9,
                 attended_tokens=attended, step_peak_bytes=peak)
        h2d = case.h2d_bytes.get(m, 0.0)
        r.update(h2d_bytes=h2d, h2d_floor_ms=1e3 * h2d / args.h2d_bps, floor_ms=1e3 * b / args.bandwidth
                 + 1e3 * h2d / args.h2d_bps)
        if m in case.state_bytes:
            r["state_bytes"] = case.state_bytes[m]
        if b_inter is not None:
            r["bytes_with_intermediates"] = b_inter
        if m in FULLKV_METHODS and (fastest is None or t["ms"] < fastest[1]):
            fastest = (m, t["ms"])
        if fastest is not None and m not in COMPONENTS:
            r["speedup_vs_fastest_fullkv"] = fastest[1] / t["ms"]
            r["fastest_fullkv"] = fastest[0]
            r["byte_ceiling"] = 1e3 * bytes_table["triton_full"][0] / args.bandwidth / r["floor_ms"]
        if m == "locks_fused":
            locks_fused_ms = t["ms"]
        if m in COMPONENTS and locks_fused_ms:
            r["share_of_locks_fused"] = t["ms"] / locks_fused_ms
        if m == "topk":
            r["topk_shape"] = [case.B, case.H, case.P]
            r["k"] = steps.kp
        rec.emit(r)


def tune(args, rec, timer, case: Case, steps: Steps) -> None:
    """The block-size variants of locks/kernels/tuning.py (to pick defaults on the GPU)."""
    from locks.kernels.tuning import TUNING_VARIANTS

    c = case
    calls = {
        "locks_aggregated_scores": ("locks_score", lambda sl, kw: steps.LK.locks_aggregated_scores(
            sl["q"], sl["summ"].kernel_tensors(), c.scaling, c.G, "norm", steps.lo, steps.hi, **kw)),
        "full_decode": ("triton_full", lambda sl, kw: steps.K.full_decode(sl["q"], sl["k"], sl["v"], c.scaling, **kw)),
        "quest_group_scores": ("quest_group", lambda sl, kw: steps.QK.quest_group_scores(
            sl["q"], sl["qmax"], sl["qmin"], "max", **kw)),
    }
    for entry, kws in TUNING_VARIANTS.items():
        method, call = calls[entry]
        for kw in kws:
            name = f"{method} " + " ".join(f"{k}={v}" for k, v in kw.items())
            try:
                with torch.no_grad():
                    t = timer.time([lambda sl=sl, kw=kw, call=call: call(sl, kw) for sl in c.slots])
                rec.emit(dict(kind="tune", method=method, config=name, **c.base, **t))
            except Exception as e:
                _skip(rec, c.base, name, e)


def run_config(args, rec: Recorder, timer: Timer, device, shape_name, dims, L, B, l2_bytes) -> None:
    case = make_case(args, device, shape_name, dims, L, B, l2_bytes)
    steps = Steps(case)
    table = steps.table(args.methods)
    bytes_table = bytes_of(case, steps)
    check(args, rec, case, steps, table)
    check_selector_steps(rec, case, steps, table, bytes_table)
    time_all(args, rec, timer, case, steps, table, bytes_table)
    if args.tune and L == max(args.contexts):
        tune(args, rec, timer, case, steps)


def _check(rec, base, method, err, tol, compared_to, details=None, ok=None):
    ok = (err <= tol) if ok is None else ok
    r = dict(kind="check", method=method, **base, max_rel_err=err, tolerance=tol, ok=bool(ok), compared_to=compared_to,
             **(details or {}))
    r["details"] = " ".join(f"{k}={v:.3g}" for k, v in (details or {}).items() if isinstance(v, float))
    rec.emit(r)
    if not ok:
        rec.failures.append(f"{base['shape']} L={base['context']} B={base['batch']} {method}: {err:.3g}")


def _skip(rec, base, method, e):
    msg = f"{type(e).__name__}: {str(e).strip().splitlines()[0] if str(e).strip() else ''}"
    rec.emit(dict(kind="skip", method=method, **base, reason=msg[:500]))
    return None


# ----------------------------------------------------------------------------------------------------------------


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.dry_run:
        os.environ["TRITON_INTERPRET"] = "1"  # before locks.kernels is imported: kernels run on CPU tensors
        device = torch.device("cpu")
    else:
        if not torch.cuda.is_available():
            print("bench_decode: no CUDA device (use --dry-run for the CPU plumbing check)", file=sys.stderr)
            return 2
        device = torch.device("cuda")
    import triton

    rec = Recorder(out_path(args.out, args.dry_run, "results/gpu/decode.jsonl"))
    print(f"records -> {rec.path}", flush=True)
    l2 = 0
    dev_name = platform.processor() or "cpu"
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        l2 = int(getattr(props, "L2_cache_size", 0) or 50 * 2**20)
        dev_name = props.name
        torch.backends.cuda.matmul.allow_tf32 = False
    rec.emit(dict(kind="run", device=dev_name, torch=torch.__version__, triton=triton.__version__,
                  cuda=torch.version.cuda, l2_bytes=l2, args=vars(args), argv=sys.argv[1:],
                  time=time.strftime("%Y-%m-%d %H:%M:%S"), host=platform.node()))
    args.h2d_bps = h2d_bandwidth(device)
    rec.emit(dict(kind="bandwidth", what="pinned host-to-device copy", bytes_per_s=args.h2d_bps, device=dev_name))
    timer = Timer(device, args.reps, args.warmup, graphs=not args.no_graph and device.type == "cuda")
    shapes = ATTENTION_DRY if args.dry_run else ATTENTION
    for L in args.contexts:
        for shape in args.shapes:
            for B in args.batch:
                try:
                    run_config(args, rec, timer, device, shape, shapes[shape], L, B, l2)
                except torch.cuda.OutOfMemoryError as e:
                    _skip(rec, dict(shape=shape, context=L, batch=B), "config", e)
                finally:
                    if device.type == "cuda":
                        torch.cuda.empty_cache()
    if rec.failures:
        print("bench_decode: correctness checks failed:\n  " + "\n  ".join(rec.failures), file=sys.stderr)
        return 1 if args.dry_run else 0
    return 0


