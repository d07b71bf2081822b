"""Regenerate the Twilight conformance goldens (tests/fixtures/conformance/twilight/) from upstream code.

    git --git-dir /work/.mirror/tsinghua-ideal+Twilight/repo archive 843ebcc61c23 twilight | tar -x -C /tmp/twilight
    .venv/bin/python scripts/conformance/twilight.py --upstream /tmp/twilight \
        --git-dir /work/.mirror/tsinghua-ideal+Twilight/repo --out tests/fixtures/conformance/twilight

``--upstream`` holds tsinghua-ideal/Twilight's ``twilight/`` folder at the commit recorded in the goldens. Nothing of
upstream is copied into this repository. Four of its pure-torch modules are loaded from their files as they are:
``pyimpl/quest.py`` (``quest_selector``, Twilight's Quest), ``pyimpl/double_sparse.py`` (``double_sparse_selector``,
its DoubleSparsity), ``pyimpl/quantize.py`` (``min_max_per_token_quant_kv``, the 4-bit estimate) and
``pyimpl/top_p.py`` (``top_p_unnormalized``: fp32 softmax, then the CUDA top-p kernel). The package's ``__init__``
files are not run (they import transformers 4.45 internals and JIT-build CUDA ops); ``get_label_tensor`` (a Triton
channel gather) is replaced by ``channel_gather``, and the CUDA kernel ``twilight.kernel.top_p_fp32_return_mask`` by
``kernel_top_p_mask`` below: the loop of
``TopPReturnMaskKernel`` (csrc/include/sampling.cuh) per row, in numpy float32, one probability at a time; an
emulation written here apart from the harness's vectorized one (baselines/twilight/selector.py), which the test
compares with it.

Per case (float32, CPU, batch 1, one decode step over n cached tokens, every step as upstream's
``attention_forward`` does for a layer >= 2 with the config_quest_twi settings): K is repeated to the query heads;
M0 = quest_selector(q, K, 16, B0) or double_sparse_selector(q, K, channels[:, :d/2], d/2, 2, B0); e = q K^_4bit^T / sqrt(d) with e = finfo(fp32).min off M0; M1 =
top_p_unnormalized(e, p); M = M0 & M1; out = softmax over M of q K^T / sqrt(d), times V.

Output: ``<out>/cases.pt`` (plain dicts of CPU tensors, ints, floats) and ``<out>/manifest.json`` (upstream, commit,
the entry points' git blobs, versions, command, sha256 of cases.pt, per-case counts). Not run in CI.
"""
from __future__ import annotations

import argparse
import hashlib
import importlib.util
import json
import math
import shlex
import subprocess
import sys
import types
from importlib import metadata
from pathlib import Path

import numpy as np
import torch

REPO = Path(__file__).resolve().parents[2]
DEFAULT_OUT = REPO / "tests" / "fixtures" / "conformance" / "twilight"
DEFAULT_COMMIT = "843ebcc61c23021f451364f199cc50368c3cff01"
UPSTREAM_REPO = "tsinghua-ideal/Twilight"
ENTRIES = {"quest": "twilight/pyimpl/quest.py", "quantize": "twilight/pyimpl/quantize.py",
           "top_p": "twilight/pyimpl/top_p.py", "double_sparse": "twilight/pyimpl/double_sparse.py"}

# name: (base, Hq, Hkv, d, n, B0, top_p, sink, seed); sink: how strongly token 0's key points along the queries
CASES = {
    "gqa_sink_heaviest": ("quest", 8, 2, 64, 500, 256, 0.85, 20.0, 2001),  # P_0 the largest weight: kernel = exact
    "gqa_light_sink": ("quest", 8, 2, 64, 500, 256, 0.85, 0.0, 2002),  # the kernel keeps a superset of exact top-p
    "b0_covers_context": ("quest", 4, 2, 64, 300, 512, 0.85, 1.0, 2003),  # M0 = every token: top-p of the estimate
    "mha_d128": ("quest", 4, 4, 128, 400, 128, 0.85, 10.0, 2004),
    "partial_page": ("quest", 6, 2, 64, 453, 192, 0.9, 2.0, 2005),  # n mod 16 != 0: upstream pads the last page
    "p_half": ("quest", 8, 2, 64, 480, 320, 0.5, 2.5, 2006),
    "ds_gqa": ("ds", 8, 2, 64, 500, 200, 0.85, 10.0, 2007),  # DoubleSparsity base: r = 32 labels, 2-bit keys
    "ds_d128": ("ds", 4, 2, 128, 300, 96, 0.9, 3.0, 2008),  # r = 64, the official config's
    "ds_covers_context": ("ds", 4, 1, 64, 150, 256, 0.85, 1.0, 2009),
}


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def git_blob_id(path: Path) -> str:
    data = path.read_bytes()
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def kernel_top_p_mask(probs: torch.Tensor, top_p: float) -> torch.Tensor:
    """TopPReturnMaskKernel, one row (the last axis) at a time: low = 0, high = probs[0]; repeat: mid = (low +
    high) / 2, min_gt_low = min(high, min{p > low}), max_le_high = max(low, max{p <= high}); the mass above mid
    >= top_p moves low to mid, else high to min(mid, max_le_high); stop when max_le_high - min_gt_low <= 1e-5.
    Mask: p > low."""
    rows = probs.detach().reshape(-1, probs.shape[-1]).numpy().astype(np.float32)
    out = np.zeros(rows.shape, dtype=bool)
    p, eps, two = np.float32(top_p), np.float32(1e-5), np.float32(2)
    for r, row in enumerate(rows):
        low, high = np.float32(0), np.float32(row[0])
        while True:
            mid = np.float32((low + high) / two)
            mass = np.float32(0)
            min_gt_low, max_le_high = high, low
            for value in row:
                if value > mid:
                    mass = np.float32(mass + value)
                if value > low:
                    min_gt_low = min(min_gt_low, value)
                if value <= high:
                    max_le_high = max(max_le_high, value)
            if mass >= p:
                low = mid
            else:
                high = np.float32(min(mid, max_le_high))
            if not np.float32(max_le_high - min_gt_low) > eps:
                break
        out[r] = row > low
    return torch.from_numpy(out).view(probs.shape)


def channel_gather(x: torch.Tensor, channels: torch.Tensor, out: torch.Tensor, r: int) -> None:
    """What upstream's Triton `get_label_tensor` writes: out[n, h] = x[n, h, channels[h, :r]]."""
    out.copy_(x.gather(-1, channels[None, :, :r].expand(x.shape[0], -1, -1)))


def load_upstream(up: Path) -> dict:
    """The entry modules from their files as `twilight.pyimpl.<name>` (their relative imports resolve, the package
    `__init__`s do not run), with the CUDA kernel package stubbed by the functions above."""
    kernel = types.ModuleType("twilight.kernel")
    kernel.top_p_fp32_return_mask = kernel_top_p_mask
    kernel.get_label_tensor = channel_gather
    for name, folder in (("twilight", "twilight"), ("twilight.pyimpl", "twilight/pyimpl")):
        package = types.ModuleType(name)
        package.__path__ = [str(up / folder)]
        sys.modules[name] = package
    sys.modules["twilight.kernel"] = kernel
    return {name: importlib.import_module(f"twilight.pyimpl.{name}") for name in ENTRIES}


def check_commit(up: Path, commit: str, git_dir: Path | None) -> dict:
    blobs = {rel: git_blob_id(up / rel) for rel in ENTRIES.values()}
    if git_dir is not None:
        for rel, blob in blobs.items():
            expected = subprocess.run(["git", "--git-dir", str(git_dir), "rev-parse", f"{commit}:{rel}"],
                                      capture_output=True, text=True, check=True).stdout.strip()
            if expected != blob:
                raise SystemExit(f"{rel} is not the blob of {commit} ({blob} != {expected})")
    return blobs


def make_case(up, name, base, Hq, Hkv, d, n, budget, top_p, sink, seed) -> dict:
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(1, Hq, d, generator=g)
    scales = 1 + 2 * torch.rand(1, Hkv, 1, d, generator=g)
    keys = torch.randn(1, Hkv, n, d, generator=g) * scales
    keys[:, :, 0] += sink * q.view(1, Hkv, Hq // Hkv, d).mean(2) / q.norm(dim=-1).mean()  # token 0: a sink
    values = torch.randn(1, Hkv, n, d, generator=g)
    rep_k = keys.repeat_interleave(Hq // Hkv, dim=1)  # upstream caches K/V repeated to the query heads
    rep_v = values.repeat_interleave(Hq // Hkv, dim=1)
    q4 = q.unsqueeze(2)  # [1, Hq, 1, d]

    extra = {}
    if base == "quest":
        m0 = up["quest"].quest_selector(types.SimpleNamespace(num_heads=Hq), q4, rep_k, 16, budget)  # [1, Hq, 1, n]
    else:  # config_ds_twi: r label channels of the q ranking (here a seeded permutation per head), 2-bit key labels
        r = d // 2
        channels = torch.stack([torch.randperm(d, generator=g) for _ in range(Hq)])
        m0 = up["double_sparse"].double_sparse_selector(q4, rep_k, channels[:, :r].contiguous(), r, 2, budget)
        extra = {"channels": channels, "label_scores": up["double_sparse"].double_sparse(
            q4, rep_k, channels[:, :r].contiguous(), r, 2)[:, :, 0]}
    estimate_keys = up["quantize"].min_max_per_token_quant_kv(rep_k, 4)
    e = torch.matmul(q4, estimate_keys.transpose(2, 3)) / math.sqrt(d)
    e[~m0] = torch.finfo(e.dtype).min
    m1 = up["top_p"].top_p_unnormalized(e, top_p)
    mask = m0 & m1
    logits = torch.matmul(q4, rep_k.transpose(2, 3)) / math.sqrt(d)
    logits[~mask] = torch.finfo(logits.dtype).min
    out = torch.matmul(torch.softmax(logits, dim=-1, dtype=torch.float32), rep_v)
    return {**extra, "name": name, "base": base, "Hq": Hq, "Hkv": Hkv, "d": d, "n": n, "budget": budget, "top_p": top_p, "seed": seed,
            "query": q, "keys": keys, "values": values, "m0": m0[:, :, 0], "estimate": e[:, :, 0],
            "probs": torch.softmax(e, dim=-1, dtype=torch.float32)[:, :, 0], "m1": m1[:, :, 0],
            "mask": mask[:, :, 0], "out": out[:, :, 0]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--upstream", type=Path, required=True, help="a folder holding upstream's twilight/")
    parser.add_argument("--commit", default=DEFAULT_COMMIT)
    parser.add_argument("--git-dir", type=Path, default=None, help="a clone or mirror of upstream, to check blobs")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = parser.parse_args()
    torch.set_num_threads(1)
    blobs = check_commit(args.upstream, args.commit, args.git_dir)
    upstream = load_upstream(args.upstream)
    cases = [make_case(upstream, name, *spec) for name, spec in CASES.items()]
    out = args.out
    out.mkdir(parents=True, exist_ok=True)
    torch.save(cases, out / "cases.pt")
    manifest = {
        "upstream": UPSTREAM_REPO,
        "commit": args.commit,
        "commit_check": ("each entry file equals the blob of the commit in a git dir" if args.git_dir
                         else "not checked (no --git-dir)"),
        "entry_points": {"quest_selector": ENTRIES["quest"], "min_max_per_token_quant_kv": ENTRIES["quantize"],
                         "top_p_unnormalized": ENTRIES["top_p"], "double_sparse_selector": ENTRIES["double_sparse"]},
        "entry_point_git_blobs": blobs,
        "kernel": "twilight.kernel.top_p_fp32_return_mask emulated (csrc/include/sampling.cuh TopPReturnMaskKernel): "
                  "scripts/conformance/twilight.py kernel_top_p_mask; get_label_tensor: channel_gather",
        "command": "python " + " ".join(shlex.quote(a) for a in sys.argv),
        "versions": {"torch": torch.__version__, "numpy": metadata.version("numpy"),
                     "transformers": metadata.version("transformers")},
        "python": sys.version.split()[0],
        "torch_threads": 1,
        "cases_pt_sha256": sha256(out / "cases.pt"),
        "cases": {c["name"]: {"base": c["base"], "Hq": c["Hq"], "Hkv": c["Hkv"], "d": c["d"], "n": c["n"], "budget": c["budget"],
                              "top_p": c["top_p"], "seed": c["seed"],
                              "candidates_per_head": c["m0"].sum(-1)[0].tolist(),
                              "kept_per_head": c["mask"].sum(-1)[0].tolist()} for c in cases},
    }
    (out / "manifest.json").write_text(json.dumps(manifest, indent=1) + "\n", encoding="utf-8")
    print(f"wrote {len(cases)} cases to {out / 'cases.pt'} and manifest.json")


if __name__ == "__main__":
    main()
