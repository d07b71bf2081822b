"""Compile every Triton kernel configuration the harness launches, ahead of time for Hopper / Ampere, without a GPU.

How the configurations are found (docs/kernels.md): every entry point of `locks.kernels` launches through
`locks.kernels._common.launch`; inside `recording_launches()` the launches are recorded instead of run. This script
calls the entry points the way their call sites do (the eager and static decode of `locks/core/attention.py`, the
LOCKS, Quest and RocketKV selectors, `scripts/bench_decode.py` with its `--tune` variants, `scripts/bench_e2e.py`
through the same selectors) on tensors of the "meta" device (1M-token shapes cost no memory), over

    dtypes bf16 / fp16 / fp32, head dims 64 / 128, GQA groups 1 2 3 4 7 8 16, page size 16, the models' shapes,
    contexts 4K (+ a length that is not a multiple of 16) / 128K / 256K / 1M, budgets 64 ... 2048, batch 1 / 4
    (the static decode's device length one for every row, and at batch 4 also one per row),

so the block sizes, num_warps and constexpr branches are the ones the entry points pick at launch. Each launch is
turned into its compile key by Triton's own launch-time specialization (the JIT's binder: argument types, ints equal
to 1 folded, 16-divisibility attributes), keys are deduplicated, and each configuration is compiled with
`triton.compile` for GPUTarget("cuda", arch, 32) with the ptxas inside the triton wheel. Per configuration:
compiled or the compiler's error, registers per thread and spills (ptxas -v), shared memory, blocks per SM and
whether it fits the target (registers <= 255, shared memory <= 227 KB on sm_90 / 163 KB on sm_80, >= 1 block per
SM). For the launches at the GPU benchmark's shapes (Llama-3.1-8B 32/8 and GLM-4-9B 32/2 heads, d 128, bf16, 128K
and 1M tokens) it also writes the grid, the waves it needs on the target's SMs and the tiles each program loops over.

    python scripts/compile_kernels.py                                  # sm_90 + sm_80, the installed triton
    PYTHONPATH=.venv/triton-3.6 python scripts/compile_kernels.py      # the H200 image's triton 3.6
    python scripts/compile_kernels.py --arch 90 --out /tmp/k.json --md /tmp/k.md   # what the CI test runs

Results: --out JSON (default results/kernels_compile.json; one entry per triton version and arch, entries of other
versions already in the file are kept) and --md, the Markdown table regenerated from the whole JSON. Exit status 1
when any configuration fails to compile or violates a limit, 2 on bad usage.
"""
from __future__ import annotations

import argparse
import concurrent.futures as cf
import contextlib
import hashlib
import importlib
import io
import itertools
import json
import math
import multiprocessing
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.shapes import CONFIGURED

ROOT = Path(__file__).resolve().parents[1]

# ---------------------------------------------------------------------------------------------------------------
# targets

SMS = {90: 132, 80: 108}  # H100/H200 SXM, A100
SMEM_PER_BLOCK = {90: 227 * 1024, 80: 163 * 1024}  # opt-in maximum per block
SMEM_PER_SM = {90: 228 * 1024, 80: 164 * 1024}
SMEM_RESERVED_PER_BLOCK = 1024  # reserved by the driver for every resident block (sm_80 and later)
REGS_PER_SM = 65536
MAX_REGS_PER_THREAD = 255
MAX_THREADS_PER_SM = 2048
MAX_BLOCKS_PER_SM = 32

# ---------------------------------------------------------------------------------------------------------------
# the configuration space (the axes plus the shapes of every configured model and of the GPU benchmarks)

DTYPES = ("bf16", "fp16", "fp32")
MODEL_SHAPES = CONFIGURED  # name: (query heads, KV heads, head dim): every configured model (bench/shapes.py)
GROUPS = (1, 2, 3, 4, 7, 8, 16)
HEAD_DIMS = (64, 128)
MATRIX_KV_HEADS = 2
CONTEXTS = (4096, 4101, 131072, 262144, 1048576)  # 4101: eager decode lengths are any integer
BUDGETS = (64, 128, 512, 2048)
BATCHES = (1, 4)
PAGE = 16
RANK = 8  # conf/method/locks.yaml
SINK_PAGES, RECENT_PAGES = 0, 0  # conf/method/locks.yaml: sink_pages 0, recent_window 0 (the partial page only)
BENCH_SHAPES = ("llama-3.1-8b", "glm-4-9b")
BENCH_CONTEXTS = (131072, 1048576)


def shapes():
    out = dict(MODEL_SHAPES)
    for g, d in itertools.product(GROUPS, HEAD_DIMS):
        out.setdefault(f"G{g}-d{d}", (g * MATRIX_KV_HEADS, MATRIX_KV_HEADS, d))
    return out


# ---------------------------------------------------------------------------------------------------------------
# call sites: each calls the public entry points as its harness code does (the comment names that code)


def call_sites(torch, K, LK, QK, QuantizedPageSummaries, tuning_variants):
    """Yields (site, params, thunk): thunk() calls the kernel entry points (K: locks.kernels, LK: locks.method.kernels,
    QK: baselines.quest.kernels; RK: baselines.rocketkv.kernels; SK: baselines.shadowkv.kernels; LR:
    baselines.lrqk.kernels; DS: baselines.doublesparsity.kernels; TW: baselines.twilight.kernels; MP:
    baselines.magicpig.kernels) on meta tensors."""
    from baselines.doublesparsity import kernels as DS
    from baselines.twilight import kernels as TW
    from baselines.magicpig import kernels as MP
    from baselines.lrqk import kernels as LR
    from baselines.rocketkv import kernels as RK
    from baselines.shadowkv import kernels as SK
    from baselines.rocketkv import rocket_params

    dt = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}

    def meta(*shape, dtype):
        return torch.empty(*shape, dtype=dtype, device="meta")

    def summaries(B, H, P, d):
        return QuantizedPageSummaries(
            mu_int=meta(B, H, P, d, dtype=torch.int8), mu_scale=meta(B, H, P, dtype=torch.float16),
            head_mean=meta(B, H, d, dtype=torch.float32), v_pack=meta(B, H, P, RANK, d // 2, dtype=torch.uint8),
            c_int=meta(B, H, P, PAGE, RANK, dtype=torch.int8), w=meta(B, H, P, RANK, dtype=torch.float32),
            rho=meta(B, H, P, dtype=torch.float16))

    length_t = meta(1, dtype=torch.int64)
    for (shape, (Hq, H, d)), dname, L, budget, B in itertools.product(shapes().items(), DTYPES, CONTEXTS, BUDGETS,
                                                                       BATCHES):
        if B > 1 and shape not in BENCH_SHAPES:
            continue  # batch only changes grids and strides; the benchmarks run batch 4 on their two shapes
        if budget + 2 * PAGE > L:
            continue
        G = Hq // H
        dtype = dt[dname]
        scaling = d ** -0.5
        p = dict(shape=shape, Hq=Hq, Hkv=H, d=d, G=G, dtype=dname, context=L, budget=budget, batch=B)
        q = meta(B, Hq, d, dtype=dtype)
        k = meta(B, H, L, d, dtype=dtype)
        v = meta(B, H, L, d, dtype=dtype)
        P = L // PAGE
        nq = -(-L // PAGE)

        # locks/core/attention.py sparse_kv, eager decode: every selector's Selection, group-shared (Gs = 1) or per query
        # head (Gs = G: Quest gqa=per_head, LRQK, RocketKV), with or without a validity mask
        for gs, valid in itertools.product(sorted({1, G}), (False, True)):
            idx = meta(B, H, gs, budget, dtype=torch.int64)
            ok = meta(B, H, gs, budget, dtype=torch.bool) if valid else None
            yield "attention.sparse_kv (eager)", dict(p, Gs=gs, valid=valid), (
                lambda q=q, k=k, v=v, idx=idx, ok=ok, s=scaling: K.sparse_decode(q, k, v, idx, ok, s))

        # locks/core/attention.py static_decode_step: FullKV, LOCKS's page list (int32 + validity), Quest's (int64);
        # the device length one for every row, or one per row (a batch of rows of different lengths: PER_ROW)
        lengths = [(length_t, p)] + ([(meta(B, dtype=torch.int64), dict(p, per_row=True))] if B > 1 else [])
        kp = budget // PAGE + 1  # Kt + S + R + 1 (locks/core/paging.py static_page_list)
        for lt, lp in lengths:
            yield "static_decode_step fullkv", lp, (lambda q=q, k=k, v=v, s=scaling, lt=lt: K.full_decode(
                q, k, v, s, length=lt))
            yield "static_decode_step locks", lp, (lambda q=q, k=k, v=v, s=scaling, kp=kp, B=B, H=H, lt=lt:
                                                    K.paged_decode(q, k, v, meta(B, H, 1, kp, dtype=torch.int32), s,
                                                                   meta(B, H, 1, kp, dtype=torch.bool),
                                                                   page_size=PAGE, length=lt))
            for gs in sorted({1, G}):
                yield "static_decode_step quest", dict(lp, Gs=gs), (
                    lambda q=q, k=k, v=v, s=scaling, gs=gs, B=B, H=H, lt=lt: K.paged_decode(
                        q, k, v, meta(B, H, gs, budget // PAGE, dtype=torch.int64), s, None, page_size=PAGE,
                        length=lt))

        # locks/core/attention.py static_decode_step with measure_coverage: every method's coverage (with and without
        # attention sinks) and a page selector's certificate (LOCKS: rho of the quantized summaries), into the layer's
        # per-row counters (cache.static_coverage[layer] [B], cache.static_diagnostics[layer] [B, 3, 2])
        lse, cov, diag = (meta(B, Hq, dtype=torch.float32), meta(B, dtype=torch.float64),
                          meta(B, 3, 2, dtype=torch.float64))
        cert = dict(scores=meta(B, Hq, P, dtype=torch.float32), rho=meta(B, H, P, dtype=torch.float16),
                    pages=meta(B, H, 1, kp, dtype=torch.int32), valid=meta(B, H, 1, kp, dtype=torch.bool),
                    sink_pages=SINK_PAGES, recent_pages=RECENT_PAGES, page_size=PAGE, budget=budget, tol=1e-5)
        for lt, lp in lengths:
            for sinks in (None, meta(Hq, dtype=dtype)):
                yield "static_decode_step coverage", dict(lp, sinks=sinks is not None), (
                    lambda q=q, k=k, s=scaling, lse=lse, sinks=sinks, cov=cov, lt=lt: K.coverage_step(
                        q, k, lt, s, lse, sinks, cov))
            yield "static_decode_step coverage locks", lp, (
                lambda q=q, k=k, s=scaling, lse=lse, cov=cov, cert=cert, diag=diag, lt=lt: K.coverage_step(
                    q, k, lt, s, lse, None, cov, cert, diag))

        # locks/method/selector.py: scored_pages (eager, candidate range as ints) and static_candidate_scores (the
        # range read from the device length); every aggregation mode of conf/method/locks.yaml
        s = summaries(B, H, P, d).kernel_tensors()
        for mode in ("norm", "raw", "max"):
            yield "locks_selector.scored_pages", dict(p, mode=mode), (
                lambda q=q, s=s, sc=scaling, G=G, mode=mode, P=P: LK.locks_aggregated_scores(
                    q, s, sc, G, mode=mode, lo=SINK_PAGES, hi=P - RECENT_PAGES, return_heads=True))
            for lt, lp in lengths:
                yield "locks_selector.static_candidate_scores", dict(lp, mode=mode), (
                    lambda q=q, s=s, sc=scaling, G=G, mode=mode, lt=lt: LK.locks_aggregated_scores(
                        q, s, sc, G, mode=mode, lo=SINK_PAGES, hi=RECENT_PAGES, length=lt, return_heads=True))
        # locks/method/selector.py select_static: the step's page list in one launch
        kt = budget // PAGE - SINK_PAGES - RECENT_PAGES
        for lt, lp in lengths if kt > 0 else ():
            yield "locks_selector.select_static", lp, (lambda B=B, H=H, kt=kt, budget=budget, lt=lt: K.static_pages(
                meta(B, H, kt, dtype=torch.int64), lt, budget, PAGE, SINK_PAGES, RECENT_PAGES))

        # baselines/quest.py: page_bounds (eager and static; metadata in the keys' dtype) and the static min/max update
        kmax = meta(B, H, nq, d, dtype=dtype)
        kmin = meta(B, H, nq, d, dtype=dtype)
        yield "quest.page_bounds", p, (lambda q=q, a=kmax, b=kmin: QK.quest_page_scores(q, a, b))
        for lt, lp in lengths:
            yield "quest.select_static", lp, (lambda k=k, a=kmax, b=kmin, lt=lt: QK.quest_append(k, a, b, lt, PAGE))
            yield "quest.select_static bounds", lp, (lambda q=q, a=kmax, b=kmin, lt=lt: QK.quest_page_scores(
                q, a, b, length=lt, page_size=PAGE))
            for reduce in (None, "max"):  # page_rule=eval (Twilight's base): the ranking keys, per head or group max
                yield "quest.select_static eval keys", dict(lp, reduce=reduce), (
                    lambda q=q, a=kmax, b=kmin, lt=lt, r=reduce: QK.quest_eval_keys(q, a, b, lt, PAGE, r))
            for sets in sorted({1, G}):  # gqa=group: one page set per KV head; per_head: G sets, their union counted
                yield "quest.select_static pages", dict(lp, sets=sets), (
                    lambda B=B, H=H, sets=sets, pb=budget // PAGE, lt=lt: QK.quest_static_pages(
                        meta(B, H, sets, pb - 1, dtype=torch.int64), lt, PAGE, pb, count=sets > 1))

        # baselines/rocketkv/selector.py select_static: the survivors' chunk update, their ranking keys and the token
        # list (the decomposition of a traffic budget 2 * budget at this context; min/max in the keys' dtype)
        rp = rocket_params(L, 2 * budget, 0, d)
        cap, chunks = rp.T, -(-rp.T // rp.cs)
        rmin, rmax = meta(B, H, chunks, d, dtype=dtype), meta(B, H, chunks, d, dtype=dtype)
        index, rprm = meta(B, H, cap, dtype=torch.int64), meta(B, 4, dtype=torch.int64)
        for lt, lp in lengths:
            yield "rocketkv.select_static", lp, (lambda k=k, a=rmin, b=rmax, i=index, r=rprm, lt=lt: RK.rocket_append(
                k, a, b, i, r, lt))
            yield "rocketkv.select_static scores", lp, (lambda q=q, a=rmin, b=rmax, r=rprm, lt=lt, cap=cap:
                                                        RK.rocket_token_scores(q, a, b, r, lt, cap))
            yield "rocketkv.select_static tokens", lp, (
                lambda B=B, H=H, i=index, r=rprm, lt=lt, kk=min(budget, cap), L=L: RK.rocket_static_tokens(
                    meta(B, H, kk, dtype=torch.int64), i, r, lt, L))

        # baselines/doublesparsity/selector.py select_static (backend triton): the newest label, every slot's label
        # score and ranking key in one launch; the official 2-bit labels, Twilight's variant, unquantized labels
        r = d // 2
        channels, labels = meta(Hq, r, dtype=torch.int64), meta(B, Hq, L, r, dtype=torch.float32)
        for (lt, lp), quantizers in itertools.product(lengths, (("official", "official"), ("none", "twilight"),
                                                                ("none", "none"))):
            yield "doublesparsity.select_static", dict(lp, labels=quantizers[1]), (
                lambda q=q, k=k, ch=channels, lab=labels, lt=lt, qz=quantizers, r=r: DS.ds_static_keys(
                    q, k, ch, lab, lt, 2, *qz, r ** 0.5))

        # baselines/twilight/selector.py prune (backend triton, eager and static): the 4-bit estimate, P and the
        # bisection (kernel_compat) or P alone (exact) over a base's candidates, shared by a KV head (LOCKS's page
        # list, with its partial page) or per query head (Quest, DoubleSparsity)
        top_p = meta(1, dtype=torch.float64)
        for gs, n, bisection in itertools.product(sorted({1, G}), (budget, budget + PAGE), (True, False)):
            yield "twilight.prune", dict(p, Gs=gs, candidates=n, kernel_compat=bisection), (
                lambda q=q, k=k, B=B, H=H, gs=gs, n=n, bisection=bisection, s=scaling, tp=top_p: TW.twilight_prune(
                    q, k, meta(B, H, gs, n, dtype=torch.int64), meta(B, H, gs, n, dtype=torch.bool), s, tp, 4,
                    bisection, 20))

        # its static step over a page list (Quest's per query head; LOCKS's per KV head, with page validity) at the
        # device length, and the step's count (kept tokens, each KV head's union, bytes) in one program per row
        kp, width = budget // PAGE, budget
        seen, kept = meta(B, H, -(-L // 32), dtype=torch.int32), meta(B, 3, dtype=torch.float64)
        for (lt, lp), gs, bisection in itertools.product(lengths, sorted({1, G}), (True, False)):
            yield "twilight.select_static", dict(lp, Gs=gs, kernel_compat=bisection), (
                lambda q=q, k=k, B=B, H=H, gs=gs, kp=kp, G=G, bisection=bisection, s=scaling, tp=top_p, lt=lt:
                TW.twilight_prune(q, k, meta(B, H, gs, kp, dtype=torch.int64),
                                  meta(B, H, gs, kp, dtype=torch.bool) if gs < G else None, s, tp, 4, bisection, 20,
                                  length=lt, page_size=PAGE))
        for gs in sorted({1, G}):
            yield "twilight.select_static count", dict(p, Gs=gs), (
                lambda B=B, H=H, G=G, gs=gs, w=width, seen=seen, kept=kept, d=d: TW.twilight_count(
                    meta(B, H, G, w, dtype=torch.bool), meta(B, H, gs, w, dtype=torch.int64),
                    meta(B, H, G, dtype=torch.int32), seen, kept, d / 2 + 4))

        # baselines/magicpig/selector.py select_static (backend triton): the query codes, the sampling pass over every
        # slot, the merge and the count (the budget changes no shape: the paper's 150 tables, codes over the prompt)
        if budget == BUDGETS[0]:
            tables, n = 150, L - 64
            state = (meta(H, d, tables, 15, dtype=torch.float32), meta(B, H, n, tables, dtype=torch.int16),
                     meta(B, H, n, dtype=torch.float32), meta(B, H, d, dtype=torch.float32),
                     meta(B, 2, dtype=torch.int64), meta(B, 2, dtype=torch.float32), meta(B, 3, dtype=torch.float64))
            for lt, lp in lengths:
                yield "magicpig.select_static", lp, (lambda q=q, k=k, v=v, st=state, lt=lt, s=scaling:
                                                     MP.magicpig_static_attention(q, k, v, *st, lt, s))

        # locks/core/host_rows.py gather_missed_rows, the static steps of the offloading methods: ShadowKV's value
        # chunks (8 tokens of d values, budget // 8 chunks) and LRQK's cold [K|V] rows (2d values, G * top_k rows)
        if budget > 64:
            yield "shadowkv.select_static", p, (lambda B=B, H=H, d=d, n=budget // 8, dtype=dtype: K.gather_rows(
                meta(B, H, L // 8, 8 * d, dtype=dtype), meta(B, H, n, dtype=torch.int64),
                meta(B, H, n, dtype=torch.bool)))
            yield "lrqk.select_static", p, (lambda B=B, H=H, d=d, m=G * (budget - 64), dtype=dtype: K.gather_rows(
                meta(B, H, L, 2 * d, dtype=dtype), meta(B, H, m, dtype=torch.int64), meta(B, H, m, dtype=torch.bool)))

        # baselines/shadowkv/selector.py select_static (backend triton): the landmark scores, then the compacted K/V
        # of a step (default options: rank 160, chunks of 8, a 32-token window + 64 generated, fair mode's outlier
        # chunks; offloading or not), and paper mode selecting every candidate without RoPE
        if budget > 64:
            C, r = 8, min(160, H * d, L)
            O = min(48, budget // 1024 * 24)
            nc, nt = L // C - 4 - O, (budget - C * O - 33) // C
            sprm, f64 = meta(B, 6, dtype=torch.int64), torch.float64
            yield "shadowkv.select_static scores", p, (lambda q=q, B=B, H=H, nc=nc, d=d, dtype=dtype, sprm=sprm:
                                                       SK.shadow_scores(q, meta(B, H, nc, d, dtype=dtype), sprm,
                                                                        128 ** -0.5))
            variants = [(False, True, True, offload) for offload in (False, True)] + [(True, False, False, True)]
            for (lt, lp), (paper, ranked, rope, offload) in itertools.product(lengths, variants):
                yield "shadowkv.select_static gather", dict(lp, paper=paper, ranked=ranked, rope=rope,
                                                            offload=offload), (
                    lambda k=k, v=v, B=B, H=H, d=d, L=L, O=O, r=r, nc=nc, nt=nt, dtype=dtype, sprm=sprm, lt=lt,
                    paper=paper, ranked=ranked, rope=rope, offload=offload, budget=budget: SK.shadow_gather(
                        k, v, meta(B, H, nt, dtype=torch.int64) if ranked else None, meta(B, H, nc, dtype=torch.int64),
                        meta(B, H, C * O, dtype=torch.int64), meta(B, L, r, dtype=dtype),
                        meta(B, H, r, d, dtype=dtype), meta(B, H, r, d, dtype=dtype) if rope else None,
                        meta(B, L, d, dtype=dtype) if rope else None, meta(B, L, d, dtype=dtype) if rope else None,
                        meta(B, 2, H, nt, dtype=torch.int64), meta(B, 2, H, nt, C * d, dtype=dtype) if offload else None,
                        meta(B, H, L // C, C * d, dtype=dtype) if offload else None, sprm, lt,
                        slots=C * O + C * nt + budget, chunk_size=C, budget=budget, paper=paper, elem_bytes=2,
                        step_bytes=meta(B, 3, dtype=f64), hit_sum=meta(B, dtype=f64)))

        # baselines/lrqk/selector.py select_static (backend triton): the decode solves, the proxy scores with the
        # Kaczmarz updates, and the slot replacement (default options: rank 32, 64 lite tokens, top_k = budget - 64,
        # two decode iterations)
        if budget > 64:
            kt, r = budget - 64, min(32, d)
            f64, i64 = torch.float64, torch.int64
            for lt, lp in lengths:
                state = dict(Kh=meta(B, Hq, budget, d, dtype=dtype), Vh=meta(B, Hq, budget, d, dtype=dtype),
                             slots=meta(B, Hq, kt, dtype=i64), A_K=meta(B, Hq, L, r, dtype=dtype),
                             B_Q=meta(B, Hq, r, d, dtype=dtype), B_K=meta(B, Hq, r, d, dtype=dtype),
                             step_bytes=meta(B, 3, dtype=f64), attended=meta(B, H, dtype=f64))
                ws = (meta(B * Hq, 2, 32, dtype=torch.float32), meta(B * Hq, 2, 32, dtype=torch.float32),
                      meta(B * Hq, 2, dtype=torch.float32), meta(B * H, -(-L // 32), dtype=torch.int32))
                yield "lrqk.select_static solve", lp, (lambda q=q, k=k, v=v, lt=lt, st=state, B=B: LR.lrqk_solve(
                    q, k, v, lt, meta(B, dtype=i64), st["Kh"], st["Vh"], meta(B, 64, dtype=i64), st["slots"],
                    st["A_K"], st["B_Q"], st["B_K"], meta(B, dtype=torch.int32), st["step_bytes"], st["attended"],
                    max_iter=2, lambda1=1.0, lambda2=1.0))
                yield "lrqk.select_static scores", lp, (lambda q=q, k=k, lt=lt, st=state, ws=ws: LR.lrqk_scores(
                    q, k, lt, st["A_K"], st["B_Q"], st["B_K"], ws, lite_tokens=64, off_by_one=True, tol=1e-2))
                yield "lrqk.select_static replace", lp, (lambda lt=lt, st=state, B=B, H=H, G=G, L=L, d=d, kt=kt, ws=ws:
                                                         LR.lrqk_replace(
                    meta(B, H * G, kt, dtype=i64), st["slots"], meta(B, H * G, kt, dtype=i64), lt, st["Kh"], st["Vh"],
                    meta(B, H, L, 2 * d, dtype=st["Kh"].dtype), meta(B, dtype=f64), st["step_bytes"], st["attended"],
                    ws, group=G, elem_bytes=2))

        # the rest of the public API (every constexpr branch): per-head LOCKS scores, the one-pass log Z variant,
        # Quest's group reductions
        yield "api locks_page_scores", p, (lambda q=q, s=s, sc=scaling: LK.locks_page_scores(q, s, sc))
        for mode in ("norm", "max"):
            yield "api locks_aggregated_scores(log_z)", dict(p, mode=mode), (
                lambda q=q, s=s, sc=scaling, G=G, mode=mode, B=B, Hq=Hq: LK.locks_aggregated_scores(
                    q, s, sc, G, mode, 0, None, log_z=meta(B, Hq, dtype=torch.float32)))
        for reduce in ("max", "sum"):
            yield "api quest_group_scores", dict(p, reduce=reduce), (
                lambda q=q, a=kmax, b=kmin, r=reduce: QK.quest_group_scores(q, a, b, r))

        # scripts/bench_decode.py (bf16 on the GPU; its steps and --tune variants) -- the same entry points, the page
        # lists of select_pages (int64, no validity) and the length as an int
        if dname == "bf16":
            kl = (budget - L % PAGE) // PAGE + (1 if L % PAGE else 0)  # select_pages: top-k + forced + partial
            yield "bench_decode triton_full", p, (lambda q=q, k=k, v=v, s=scaling: K.full_decode(q, k, v, s))
            yield "bench_decode locks_fused", p, (lambda q=q, k=k, v=v, s=scaling, kl=kl, B=B, H=H, L=L:
                                                  K.paged_decode(q, k, v, meta(B, H, kl, dtype=torch.int64), s,
                                                                 page_size=PAGE, length=L))
            yield "bench_decode locks_score", p, (lambda q=q, s=s, sc=scaling, G=G, P=P: LK.locks_aggregated_scores(
                q, s, sc, G, "norm", SINK_PAGES, P - RECENT_PAGES))
            yield "bench_decode quest_fused", p, (lambda q=q, a=kmax, b=kmin, nq=nq: QK.quest_group_scores(
                q, a[:, :, :nq - 1], b[:, :, :nq - 1], "max"))
            yield "bench_decode quest_fused_per_head", p, (
                lambda q=q, k=k, v=v, s=scaling, B=B, H=H, G=G, L=L, budget=budget: K.paged_decode(
                    q, k, v, meta(B, H, G, budget // PAGE, dtype=torch.int64), s, page_size=PAGE, length=L))
            if shape in BENCH_SHAPES and L == max(BENCH_CONTEXTS):  # --tune runs at the largest context
                for entry, variants in tuning_variants.items():
                    for kw in variants:
                        call = {
                            "locks_aggregated_scores": lambda q=q, s=s, sc=scaling, G=G, P=P, kw=kw:
                                LK.locks_aggregated_scores(q, s, sc, G, "norm", SINK_PAGES, P - RECENT_PAGES, **kw),
                            "full_decode": lambda q=q, k=k, v=v, sc=scaling, kw=kw: K.full_decode(q, k, v, sc, **kw),
                            "quest_group_scores": lambda q=q, a=kmax, b=kmin, kw=kw: QK.quest_group_scores(
                                q, a, b, "max", **kw),
                        }[entry]
                        yield f"bench_decode --tune {entry}", dict(p, **kw), call


# ---------------------------------------------------------------------------------------------------------------
# compile keys: Triton's own launch-time specialization, without a driver


def kernel_modules() -> list[str]:
    """Every module with Triton kernels: the generic ones (locks/kernels/) and each method's `kernels` module."""
    import pkgutil

    import baselines
    import locks

    out = []
    for package in (locks, baselines):
        for m in pkgutil.walk_packages(package.__path__, prefix=f"{package.__name__}."):
            if m.name.startswith("locks.kernels.") or m.name.endswith(".kernels"):
                out.append(m.name)
    return sorted(out)


def compile_key(launch, backend):
    """(signature, constexprs, attrs, option kwargs) exactly as `JITFunction.run` derives them for this launch."""
    from triton.runtime.jit import create_function_from_signature

    kernel = launch.kernel
    binder = getattr(kernel, "_aot_binder", {}).get(id(backend))
    if binder is None:
        binder = create_function_from_signature(kernel.signature, kernel.params, backend)
        kernel.__dict__.setdefault("_aot_binder", {})[id(backend)] = binder
    kwargs = dict(launch.meta)
    bound, specialization, options = binder(*launch.args, **kwargs)
    _, signature, constexprs, attrs = kernel._pack_args(backend, kwargs, bound, specialization, options)
    params = {p.name for p in kernel.params}
    option_kwargs = {k: v for k, v in kwargs.items() if k not in params}
    bound_values = {name: (val if isinstance(val, (int, float, bool)) else None) for name, val in bound.items()}
    return signature, constexprs, attrs, option_kwargs, bound_values


def key_of(kernel, signature, constexprs, attrs, option_kwargs):
    return json.dumps([kernel.__module__, kernel.__name__, signature, sorted(map(repr, constexprs.items())),
                       sorted(map(repr, attrs.items())), sorted(option_kwargs.items())])


# ---------------------------------------------------------------------------------------------------------------
# compiling one configuration (in a worker process)

_PTXAS_REGS = re.compile(r"Used (\d+) registers")
_PTXAS_SPILL = re.compile(r"(\d+) bytes spill stores, (\d+) bytes spill loads")
_CUOBJDUMP = re.compile(r"REG:(\d+) STACK:(\d+) SHARED:(\d+) LOCAL:(\d+)")


def compile_job(job: dict) -> dict:
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource, make_backend

    kernel = getattr(importlib.import_module(job["module"]), job["name"])
    target = GPUTarget("cuda", job["arch"], 32)
    backend = make_backend(target)
    options = backend.parse_options(job["option_kwargs"])
    constexprs = {tuple(k): v for k, v in job["constexprs"]}
    attrs = {tuple(k): v for k, v in job["attrs"]}
    src = ASTSource(kernel, job["signature"], constexprs, attrs)
    log = io.StringIO()
    t0 = time.time()
    out = dict(status="compiled")
    try:
        with contextlib.redirect_stdout(log):  # TRITON_DUMP_PTXAS_LOG=1: triton prints ptxas -v
            ck = triton.compile(src, target=target, options=options.__dict__)
    except Exception as e:  # the compiler's error, whole, into the table
        msg = str(e).strip() or type(e).__name__
        return dict(status="error", error=f"{type(e).__name__}: {msg}"[-4000:], seconds=time.time() - t0)
    out["seconds"] = round(time.time() - t0, 3)
    md = ck.metadata
    out["shared_dynamic"] = int(md.shared)
    out["num_warps"] = int(md.num_warps)
    out["num_stages"] = int(md.num_stages)
    text = log.getvalue()
    m = _PTXAS_REGS.findall(text)
    s = _PTXAS_SPILL.findall(text)
    cubin = ck.asm.get("cubin")
    res = _cuobjdump(cubin, job["cuobjdump"]) if cubin else None
    if res:
        out.update(regs=res[0], stack=res[1], shared_static=res[2], local=res[3])
    elif m:
        out["regs"] = int(m[-1])
    if s:
        out["spill_stores"], out["spill_loads"] = int(s[-1][0]), int(s[-1][1])
    elif res:  # no ptxas log (a cached compile): local memory per thread is the spill bound
        out["spill_stores"] = out["spill_loads"] = None
    return out


def _cuobjdump(cubin: bytes, tool: str):
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        r = subprocess.run([tool, "--dump-resource-usage", f.name], capture_output=True, text=True)
    m = _CUOBJDUMP.search(r.stdout)
    return tuple(int(x) for x in m.groups()) if m else None


# ---------------------------------------------------------------------------------------------------------------
# limits and occupancy


def occupancy(arch: int, regs: int, num_warps: int, smem: int) -> dict:
    from locks.kernels._common import blocks_per_sm

    blocks, limiter = blocks_per_sm(regs, num_warps, smem, regs_per_sm=REGS_PER_SM, smem_per_sm=SMEM_PER_SM[arch],
                                    threads_per_sm=MAX_THREADS_PER_SM, max_blocks=MAX_BLOCKS_PER_SM,
                                    smem_reserved=SMEM_RESERVED_PER_BLOCK)
    return dict(blocks_per_sm=blocks, occupancy_limiter=limiter, warps_per_sm=blocks * num_warps)


def check_limits(arch: int, r: dict) -> list[str]:
    if r["status"] != "compiled":
        return ["compile error"]
    bad = []
    if r.get("regs", 0) > MAX_REGS_PER_THREAD:
        bad.append(f"{r['regs']} registers > {MAX_REGS_PER_THREAD}")
    if r["shared"] > SMEM_PER_BLOCK[arch]:
        bad.append(f"shared memory {r['shared']} B > {SMEM_PER_BLOCK[arch]} B")
    if r["blocks_per_sm"] < 1:
        bad.append("no block fits on an SM")
    return bad


# loops of each kernel, for the benchmark-shape analysis: tiles one program walks (from its launch arguments)
def loop_tiles(name: str, a: dict) -> int | None:
    cdiv = lambda x, y: -(-int(x) // int(y))  # noqa: E731
    if name == "_decode_split_kernel":
        return cdiv(a["TPS"], a["BLOCK_N"])
    if name == "_combine_kernel":
        return cdiv(a["NSPLIT"], a["BLOCK_S"])
    if name == "_logz_kernel":
        return cdiv(a["NB"], a["BLOCK_R"])
    return 1


# reductions that should see their whole input in one tile (one program per row, nothing else to hide latency)
SINGLE_TILE_REDUCTIONS = ("_combine_kernel", "_logz_kernel")


# ---------------------------------------------------------------------------------------------------------------
# main


def kernel_sources() -> list[Path]:
    """The files a compile run reads its configurations from: every kernel module (kernel_modules's files), the
    summaries layout and the model shapes the entry points are called with, and this script. Not the interpreter's
    patch (locks/kernels/interpreter.py): it changes CPU runs only, never a compiled kernel."""
    files = {*ROOT.glob("locks/kernels/*.py"), *ROOT.glob("*/**/kernels.py"), ROOT / "locks/method/summaries.py",
             ROOT / "bench/shapes.py", Path(__file__).resolve()} - {ROOT / "locks/kernels/interpreter.py"}
    return sorted(f for f in files if ".venv" not in f.parts)


def sources_sha256() -> str:
    """sha256 over kernel_sources()'s paths and contents: a run recorded with the same value compiled these sources."""
    h = hashlib.sha256()
    for f in kernel_sources():
        h.update(str(f.relative_to(ROOT)).encode() + b"\0" + f.read_bytes() + b"\0")
    return h.hexdigest()


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--arch", type=int, nargs="+", default=[90, 80], choices=sorted(SMS),
                   help="compute capabilities to compile for (90: Hopper, 80: Ampere)")
    p.add_argument("--out", default=str(ROOT / "results/kernels_compile.json"), help="JSON results (merged)")
    p.add_argument("--md", default=str(ROOT / "results/kernels_compile.md"), help="Markdown table (from the JSON)")
    p.add_argument("--jobs", type=int, default=os.cpu_count() or 1, help="parallel compiler processes")
    p.add_argument("--kernels", nargs="+", default=None, help="only these kernels (debugging; the run is then partial)")
    p.add_argument("--limit", type=int, default=None, help="compile only the first N configurations (debugging)")
    p.add_argument("--quiet", action="store_true", help="no line per configuration")
    return p.parse_args(argv)


def record(arch, backend, resident, torch, K, LK, QK, common, QuantizedPageSummaries, tuning_variants):
    """Every launch of every call site on this target -> ({compile key: configuration}, benchmark-shape launches,
    number of launches)."""
    configs: dict[str, dict] = {}
    bench = []
    n_launches = 0
    with common.recording_launches(sms=SMS[arch], resident=resident) as launches:
        for site, params, thunk in call_sites(torch, K, LK, QK, QuantizedPageSummaries, tuning_variants):
            start = len(launches)
            thunk()
            for ln in launches[start:]:
                n_launches += 1
                sig, cx, attrs, okw, bound = compile_key(ln, backend)
                key = key_of(ln.kernel, sig, cx, attrs, okw)
                c = configs.get(key)
                if c is None:
                    c = configs[key] = dict(
                        kernel=ln.kernel.__name__, module=ln.kernel.__module__, signature=sig,
                        constexprs={ln.kernel.arg_names[k[0]]: v for k, v in cx.items()},
                        attrs=[[list(k), v] for k, v in attrs.items()], _cx=[[list(k), v] for k, v in cx.items()],
                        option_kwargs=okw, sites=set(), example=dict(params, site=site))
                c["sites"].add(site)
                if (params["shape"] in BENCH_SHAPES and params["context"] in BENCH_CONTEXTS
                        and params["dtype"] == "bf16" and params["budget"] == 2048 and params["batch"] == 1
                        and not site.startswith("api") and "--tune" not in site):
                    bench.append(dict(site=site, kernel=ln.kernel.__name__, key=key, grid=list(ln.grid),
                                      programs=math.prod(ln.grid), shape=params["shape"], context=params["context"],
                                      loop_tiles=loop_tiles(ln.kernel.__name__, bound),
                                      **{k: v for k, v in params.items() if k in ("Gs", "valid", "mode")}))
            del launches[start:]
    return configs, bench, n_launches


def main(argv=None) -> int:
    args = parse_args(argv)
    if os.environ.get("TRITON_INTERPRET", "0") not in ("", "0"):
        print("compile_kernels: unset TRITON_INTERPRET (the kernels must be JIT functions, not interpreted)",
              file=sys.stderr)
        return 2
    cache = tempfile.TemporaryDirectory(prefix="triton-aot-")
    os.environ["TRITON_CACHE_DIR"] = cache.name  # a fresh cache: ptxas runs (and reports) for every configuration
    os.environ["TRITON_DUMP_PTXAS_LOG"] = "1"
    os.environ.setdefault("TRITON_DEFAULT_FP_FUSION", "1")  # the default of every triton so far, said explicitly
    import torch
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import make_backend

    from baselines.quest import kernels as QK
    from locks import kernels as K
    from locks.kernels import _common
    from locks.kernels.tuning import TUNING_VARIANTS
    from locks.method import kernels as LK
    from locks.method.summaries import QuantizedPageSummaries

    cuobjdump = str(Path(triton.__file__).parent / "backends/nvidia/bin/cuobjdump")
    version = triton.__version__
    print(f"compile_kernels: triton {version} ({Path(triton.__file__).parent}), torch {torch.__version__}, "
          f"targets {', '.join(f'sm_{a}' for a in args.arch)}", flush=True)

    all_kernels = sorted({name for mod in kernel_modules()
                          for name, obj in vars(importlib.import_module(mod)).items()
                          if isinstance(obj, triton.runtime.JITFunction) and name.endswith("_kernel")})
    results = _load(args.out)
    failed = 0
    ctx = multiprocessing.get_context("spawn")
    for arch in args.arch:
        t0 = time.time()
        backend = make_backend(GPUTarget("cuda", arch, 32))
        rows: dict[str, dict] = {}  # compile key -> result row

        def resident(kernel, a, meta):  # resident_blocks() while recording: from this run's compile results
            r = rows.get(key_of(kernel, *compile_key(_common.Launch(kernel, (1,), a, meta), backend)[:4]))
            ok = r is not None and r["status"] == "compiled" and r["blocks_per_sm"] > 0
            return r["blocks_per_sm"] if ok else _common.DEFAULT_RESIDENT_BLOCKS

        # Record, compile what is new, record again with the compiled kernels' occupancy (grids follow it) until no
        # new configuration appears: the table holds every configuration the entry points launch on this target.
        for _ in range(4):
            configs, bench, n_launches = record(arch, backend, resident, torch, K, LK, QK, _common,
                                                QuantizedPageSummaries, TUNING_VARIANTS)
            todo = [kc for kc in configs.items() if kc[0] not in rows
                    and (not args.kernels or kc[1]["kernel"] in args.kernels)]
            todo = todo[: max(0, args.limit - len(rows))] if args.limit else todo
            if not todo:
                break
            print(f"sm_{arch}: {n_launches} launches -> {len(configs)} distinct configurations of "
                  f"{len({c['kernel'] for c in configs.values()})} kernels; compiling {len(todo)} with "
                  f"{args.jobs} process(es)", flush=True)
            jobs = [dict(module=c["module"], name=c["kernel"], arch=arch, signature=c["signature"],
                         constexprs=c["_cx"], attrs=c["attrs"], option_kwargs=c["option_kwargs"], cuobjdump=cuobjdump)
                    for _, c in todo]
            with cf.ProcessPoolExecutor(max_workers=max(1, args.jobs), mp_context=ctx) as pool:
                for (key, c), r in zip(todo, pool.map(compile_job, jobs)):
                    rows[key] = _row(arch, c, r)
                    if not args.quiet:
                        print("  " + _line(rows[key]), flush=True)
        for key, r in rows.items():
            r["sites"] = sorted(configs[key]["sites"]) if key in configs else r["sites"]
        for b in bench:
            r = rows.get(b["key"])
            if r is not None and r["status"] == "compiled":
                slots = SMS[arch] * max(1, r["blocks_per_sm"])
                waves = -(-b["programs"] // slots)
                b.update(blocks_per_sm=r["blocks_per_sm"], waves=waves,
                         wave_fill=round(b["programs"] / (slots * waves), 3))
        bench = _unique_bench(bench)
        missing = sorted(set(all_kernels) - {c["kernel"] for c in configs.values()})
        bad = [r for r in rows.values() if r["violations"]]
        failed += len(bad) + len(missing)
        partial = bool(args.kernels or args.limit)
        results[f"triton {version} sm_{arch}"] = dict(
            triton=version, arch=arch, target=f"cuda:{arch}", sms=SMS[arch], launches=n_launches,
            kernels=all_kernels, kernels_not_launched=missing, partial=partial,
            configurations=list(rows.values()), benchmark_launches=bench, seconds=round(time.time() - t0, 1),
            torch=torch.__version__, time=time.strftime("%Y-%m-%d %H:%M:%S"), sources_sha256=sources_sha256())
        print(f"sm_{arch}: {len(rows) - len(bad)} of {len(rows)} configurations compiled within the limits "
              f"({time.time() - t0:.0f} s)" + (f"; kernels never launched: {', '.join(missing)}" if missing else "")
              + (" [partial run]" if partial else ""), flush=True)
        for r in bad:
            print(f"  FAIL {_line(r)}\n       {r.get('error', '; '.join(r['violations']))[:600]}", flush=True)
    _save(args.out, results)
    Path(args.md).write_text(markdown(results))
    print(f"compile_kernels: wrote {args.out} and {args.md}")
    return 1 if failed else 0


def _row(arch, c, r):
    row = dict(kernel=c["kernel"], constexprs=c["constexprs"], signature=c["signature"],
               num_warps=c["option_kwargs"].get("num_warps", 4), sites=sorted(c["sites"]), example=c["example"])
    row.update(r)
    if r["status"] == "compiled":
        row["shared"] = r["shared_dynamic"] + r.get("shared_static", 0)
        row.update(occupancy(arch, r.get("regs", 0), r["num_warps"], row["shared"]))
    row["violations"] = check_limits(arch, row)
    return row


def _unique_bench(bench):
    seen, out = set(), []
    for b in bench:
        k = (b["site"], b["kernel"], b["shape"], b["context"], b.get("Gs"), b.get("valid"), b.get("mode"))
        if k not in seen:
            seen.add(k)
            out.append({k2: v for k2, v in b.items() if k2 != "key"})
    return out


def _short_cx(cx: dict) -> str:
    return " ".join(f"{k}={int(v) if isinstance(v, bool) else v}" for k, v in cx.items())


def _ptr_types(sig: dict) -> str:
    return ",".join(sorted({v[1:] for v in sig.values() if v.startswith("*")}))


def _line(r):
    res = (f"regs {r.get('regs', '?'):>3} spill {r.get('spill_stores', '?')} smem {r.get('shared', 0):>6} B "
           f"blocks/SM {r.get('blocks_per_sm', '?')}" if r["status"] == "compiled" else "COMPILE ERROR")
    return f"{r['kernel']:<22} w{r['num_warps']} [{_ptr_types(r['signature'])}] {_short_cx(r['constexprs'])}: {res}"


def _load(path):
    try:
        return json.loads(Path(path).read_text())["runs"]
    except (FileNotFoundError, KeyError, json.JSONDecodeError):
        return {}


def _save(path, runs):
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text(json.dumps({"runs": dict(_ordered(runs))}, default=sorted) + "\n")


def _ordered(runs: dict):
    """Newest triton first, sm_90 before sm_80."""
    key = lambda kv: (tuple(int(x) for x in re.findall(r"\d+", kv[1]["triton"])[:3]), kv[1]["arch"])  # noqa: E731
    return sorted(runs.items(), key=key, reverse=True)


# ---------------------------------------------------------------------------------------------------------------
# the Markdown table


def markdown(runs: dict) -> str:
    out = ["# Triton kernels compiled ahead of time", "",
           "Written by `scripts/compile_kernels.py` (docs/kernels.md): every configuration the harness and the GPU "
           "benchmarks launch, compiled without a GPU. `regs`: registers per thread; `spill`: bytes of spill stores "
           "(ptxas -v); `smem`: shared memory per block (dynamic + static); `blocks/SM`: resident blocks by "
           "registers, shared memory and threads, and what limits them.", ""]
    out += ["## Summary", "", "| triton | arch | configurations | compiled | within limits | spilling | "
            "max regs | max smem (B) | min blocks/SM | compile time (s) |", "|---|---|---|---|---|---|---|---|---|---|"]
    runs = dict(_ordered(runs))
    for name, run in runs.items():
        rows = run["configurations"]
        ok = [r for r in rows if r["status"] == "compiled"]
        out.append(f"| {run['triton']} | sm_{run['arch']} | {len(rows)} | {len(ok)} | "
                   f"{sum(not r['violations'] for r in rows)} | {sum((r.get('spill_stores') or 0) > 0 for r in ok)} | "
                   f"{max((r.get('regs', 0) for r in ok), default=0)} | {max((r['shared'] for r in ok), default=0)} | "
                   f"{min((r['blocks_per_sm'] for r in ok), default=0)} | {run['seconds']} |")
    for name, run in runs.items():
        rows = run["configurations"]
        out += ["", f"## triton {run['triton']}, sm_{run['arch']} ({run['sms']} SMs)", ""]
        if run.get("kernels_not_launched"):
            out += [f"Kernels no call site launches: {', '.join(run['kernels_not_launched'])}", ""]
        out += ["### Per kernel", "", "| kernel | configurations | errors | regs (min-max) | spilling | "
                "smem (max, B) | blocks/SM (min) | limiter |", "|---|---|---|---|---|---|---|---|"]
        for kname in sorted({r["kernel"] for r in rows}):
            kr = [r for r in rows if r["kernel"] == kname]
            ok = [r for r in kr if r["status"] == "compiled"]
            regs = [r.get("regs", 0) for r in ok]
            worst = min(ok, key=lambda r: r["blocks_per_sm"]) if ok else None
            spilling = sum((r.get("spill_stores") or 0) > 0 for r in ok)
            out.append(f"| {kname} | {len(kr)} | {len(kr) - len(ok)} | "
                       f"{min(regs, default=0)}-{max(regs, default=0)} | {spilling} | "
                       f"{max((r['shared'] for r in ok), default=0)} | {worst['blocks_per_sm'] if worst else '-'} | "
                       f"{worst['occupancy_limiter'] if worst else '-'} |")
        bench = run.get("benchmark_launches") or []
        if bench:
            out += ["", "### At the GPU benchmark's shapes (bf16, batch 1, budget 2048)", "",
                    "`waves`: programs / (SMs x resident blocks per SM), rounded up; `fill`: how full the last wave "
                    "runs on average; `tiles`: tiles each program loops over.", "",
                    "| shape | context | call site | kernel | grid | programs | blocks/SM | waves | fill | tiles |",
                    "|---|---|---|---|---|---|---|---|---|---|"]
            for b in sorted(bench, key=lambda b: (b["shape"], b["context"], b["site"], b["kernel"])):
                extra = " ".join(f"{k}={b[k]}" for k in ("Gs", "valid", "mode") if k in b)
                out.append(f"| {b['shape']} | {b['context']} | {b['site']} {extra} | {b['kernel']} | "
                           f"{'x'.join(map(str, b['grid']))} | {b['programs']} | {b.get('blocks_per_sm', '-')} | "
                           f"{b.get('waves', '-')} | {b.get('wave_fill', '-')} | {b['loop_tiles']} |")
        out += ["", "### Every configuration", "", "| kernel | pointer types | constexprs | warps | status | regs | "
                "spill | smem (B) | blocks/SM | limits | call sites |", "|---|---|---|---|---|---|---|---|---|---|---|"]
        for r in sorted(rows, key=lambda r: (r["kernel"], json.dumps(r["constexprs"]), _ptr_types(r["signature"]))):
            st = r["status"] if r["status"] == "compiled" else "**error**"
            lim = "ok" if not r["violations"] else "**" + "; ".join(r["violations"]) + "**"
            out.append(f"| {r['kernel']} | {_ptr_types(r['signature'])} | {_short_cx(r['constexprs'])} | "
                       f"{r['num_warps']} | {st} | {r.get('regs', '-')} | {r.get('spill_stores', '-')} | "
                       f"{r.get('shared', '-')} | {r.get('blocks_per_sm', '-')} | {lim} | {', '.join(r['sites'])} |")
    return "\n".join(out) + "\n"


if __name__ == "__main__":
    sys.exit(main())
