"""Regenerate the MagicPIG conformance goldens (tests/fixtures/conformance/magicpig/) from upstream code.

    mkdir -p /tmp/upstream/MagicPIG/refs && git -C <MagicPIG clone> show dc682a3:refs/hf_cache_ref.py \
        > /tmp/upstream/MagicPIG/refs/hf_cache_ref.py
    .venv/bin/python -m scripts.conformance.magicpig --upstream /tmp/upstream/MagicPIG \
        --git-dir <MagicPIG clone>/.git --out tests/fixtures/conformance/magicpig

``--upstream`` holds ``refs/hf_cache_ref.py`` of Infini-AI-Lab/MagicPIG at ``--commit`` (branch main): class
``SimCache``, the pure-torch reference of the MagicPIG decode attention. Its ``refs/`` folder is put on
``sys.path`` and the module imported and driven as it is (nothing of it is copied here); it runs with this
project's torch and transformers. With ``--git-dir`` the script checks the file is the blob of that commit.

Per case (float32, CPU, one thread, batch 1): a model of 4 layers, so that SimCache attends layers 0 and 2 densely
and samples in 1 and 3. Seeded inputs, rounded to bfloat16 values so the fixture stores them exactly at half the
size: R (``hash_matrix[0]``, [1, Hkv, d, K L], table t's bit b in column t K + b), per layer prompt K/V (keys with a
shared offset, so centring matters), then per decode step a query drawn near a few middle keys (so the tables
collide beyond chance), a key and a value. The cache is driven as upstream's model does: ``update(k, v, q, layer)``
per layer with the prompt, ``select_kv_cache(4, None, layer, 64, d)`` per layer, then per step and layer
``update(k_t, v_t, q_t, layer)``, whose return is the attention output [1, Hq, 1, d]. The sampled set is read from
the logits upstream hands to ``F.softmax`` (its finite middle entries), through a wrapper that only records.

Output: ``<out>/cases.pt`` (a list of dicts: the inputs of the sampled layers, their outputs and sampled sets) and
``<out>/manifest.json``. Not run in CI.
"""
from __future__ import annotations

import argparse
import json
import shlex
import subprocess
import sys
from pathlib import Path

import torch

from scripts.conformance.doublesparsity import git_blob_id, sha256, version

REPO = Path(__file__).resolve().parents[2]
DEFAULT_OUT = REPO / "tests" / "fixtures" / "conformance" / "magicpig"
DEFAULT_COMMIT = "dc682a3d98bc4beddbb71e6679df1bdd69e341dd"
UPSTREAM_REPO = "Infini-AI-Lab/MagicPIG"
ENTRY = "refs/hf_cache_ref.py"
LAYERS, SPARSE = 4, (1, 3)  # SimCache attends layers 0 and LAYERS // 2 densely
SINK, LOCAL, STEPS = 4, 64, 3

# name: (Hq, Hkv, d, n, K, L, seed)
CASES = {
    "paper_gqa2": (4, 2, 64, 300, 10, 150, 2001),
    "gqa3_k8_l40": (6, 2, 32, 260, 8, 40, 2002),
    "mha_k6_l20": (4, 4, 32, 200, 6, 20, 2003),
    "short_middle": (4, 2, 32, 100, 10, 150, 2004),  # 32 middle tokens
}


def bf16(x: torch.Tensor) -> torch.Tensor:
    return x.bfloat16().float()


def make_inputs(Hq, Hkv, d, n, K, L, seed) -> dict:
    g = torch.Generator().manual_seed(seed)
    G = Hq // Hkv
    R = bf16(torch.randn(1, Hkv, d, K * L, generator=g))
    offset = 2.0 * torch.randn(1, Hkv, 1, d, generator=g)
    pre_k = [bf16(torch.randn(1, Hkv, n, d, generator=g) + offset) for _ in range(LAYERS)]
    pre_v = [bf16(torch.randn(1, Hkv, n, d, generator=g)) for _ in range(LAYERS)]
    dec_q, dec_k, dec_v = [], [], []
    for _ in range(STEPS):
        qs, ks, vs = [], [], []
        for layer in range(LAYERS):
            middle = pre_k[layer][0, :, SINK : n - LOCAL]
            centred = middle - middle.mean(1, keepdim=True)
            q = torch.randn(1, Hq, 1, d, generator=g)
            for h in range(Hq):
                near = torch.randint(0, centred.shape[1], (4,), generator=g)
                q[0, h, 0] += 1.5 * centred[h // G, near].sum(0)
            qs.append(bf16(q))
            ks.append(bf16(torch.randn(1, Hkv, 1, d, generator=g) + offset))
            vs.append(bf16(torch.randn(1, Hkv, 1, d, generator=g)))
        dec_q.append(qs), dec_k.append(ks), dec_v.append(vs)
    return dict(R=R, pre_k=pre_k, pre_v=pre_v, dec_q=dec_q, dec_k=dec_k, dec_v=dec_v)


def run_upstream(hc, x: dict, Hq, Hkv, d, n, K, L) -> tuple[dict, dict]:
    """-> ({(step, layer): output [Hq, d]}, {(step, layer): sampled [Hq, |M|] bool}) of the sampled layers."""
    softmax_inputs = []
    original = hc.F.softmax

    def recording_softmax(x_, *args, **kwargs):
        softmax_inputs.append(x_.detach().clone())
        return original(x_, *args, **kwargs)

    cache = hc.SimCache(K, L, window=LOCAL, num_qh=Hq, num_kh=Hkv, head_dim=d, num_layers=LAYERS, device="cpu",
                        dtype=torch.float32)
    cache.hash_matrix[0] = x["R"].clone()
    for layer in range(LAYERS):
        cache.update(x["pre_k"][layer], x["pre_v"][layer], torch.zeros(1, Hq, n, d), layer)
    for layer in range(LAYERS):
        cache.select_kv_cache(SINK, None, layer, LOCAL, d)
    outputs, sampled = {}, {}
    hc.F.softmax = recording_softmax
    try:
        for t in range(STEPS):
            for layer in range(LAYERS):
                softmax_inputs.clear()
                out = cache.update(x["dec_k"][t][layer], x["dec_v"][t][layer], x["dec_q"][t][layer], layer)
                if layer in SPARSE:
                    outputs[(t, layer)] = out[0, :, 0].clone()
                    exact = SINK + LOCAL + t + 1  # sink, local window, the generated tokens so far
                    sampled[(t, layer)] = torch.isfinite(softmax_inputs[0][0, :, 0, exact:])
    finally:
        hc.F.softmax = original
    return outputs, sampled


def check_commit(up: Path, commit: str, git_dir: Path | None) -> str:
    if git_dir is None:
        print(f"warning: no --git-dir given; recording --commit {commit} unchecked")
        return "unchecked"
    blob = subprocess.run(["git", "--git-dir", str(git_dir), "rev-parse", f"{commit}:{ENTRY}"], capture_output=True,
                          text=True, check=True).stdout.strip()
    if blob != git_blob_id(up / ENTRY):
        raise SystemExit(f"{up / ENTRY} is not the blob of {commit} in {git_dir}")
    return f"{ENTRY} equals the blob of the commit in a git dir (git rev-parse {commit[:12]}:{ENTRY})"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--upstream", type=Path, required=True, help=f"{UPSTREAM_REPO}'s refs/ at --commit")
    ap.add_argument("--commit", default=DEFAULT_COMMIT)
    ap.add_argument("--git-dir", type=Path, default=None)
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = ap.parse_args()
    up = args.upstream.resolve()
    if not (up / ENTRY).is_file():
        raise SystemExit(f"{up}: not a MagicPIG archive ({ENTRY} missing)")
    checked = check_commit(up, args.commit, args.git_dir)
    torch.set_num_threads(1)
    sys.path.insert(0, str(up / "refs"))
    import hf_cache_ref as hc  # upstream's module, as it is

    cases, summaries = [], {}
    for name, spec in CASES.items():
        Hq, Hkv, d, n, K, L, seed = spec
        x = make_inputs(*spec)
        outputs, sampled = run_upstream(hc, x, Hq, Hkv, d, n, K, L)
        cases.append({
            "name": name, "Hq": Hq, "Hkv": Hkv, "d": d, "n": n, "K": K, "L": L, "seed": seed,
            "sink": SINK, "local": LOCAL, "steps": STEPS, "layers": LAYERS, "sparse_layers": list(SPARSE),
            "R": x["R"].bfloat16(),
            "pre_k": {layer: x["pre_k"][layer].bfloat16() for layer in SPARSE},
            "pre_v": {layer: x["pre_v"][layer].bfloat16() for layer in SPARSE},
            "dec_q": {layer: torch.cat([x["dec_q"][t][layer] for t in range(STEPS)]).bfloat16() for layer in SPARSE},
            "dec_k": {layer: torch.cat([x["dec_k"][t][layer] for t in range(STEPS)]).bfloat16() for layer in SPARSE},
            "dec_v": {layer: torch.cat([x["dec_v"][t][layer] for t in range(STEPS)]).bfloat16() for layer in SPARSE},
            "outputs": outputs, "sampled": sampled,
        })
        counts = {f"t{t} layer {layer}": m.sum(-1).tolist() for (t, layer), m in sorted(sampled.items())}
        summaries[name] = {"Hq": Hq, "Hkv": Hkv, "d": d, "n": n, "K": K, "L": L, "seed": seed,
                           "sampled_per_query_head": counts}
        print(f"{name}: sampled per query head {counts}")
    out = args.out if args.out.is_absolute() else Path.cwd() / args.out
    out.mkdir(parents=True, exist_ok=True)
    torch.save(cases, out / "cases.pt")

    manifest = {
        "upstream": UPSTREAM_REPO, "commit": args.commit, "commit_check": checked,
        "entry_point": f"{ENTRY}: SimCache.update / select_kv_cache", "entry_point_git_blob": git_blob_id(up / ENTRY),
        "command": " ".join([".venv/bin/python", "-m", "scripts.conformance.magicpig", *map(shlex.quote, sys.argv[1:])]),
        "versions": {p: version(p) for p in ("torch", "transformers")}, "python": sys.version.split()[0],
        "torch_threads": 1, "cases_pt_sha256": sha256(out / "cases.pt"), "cases": summaries,
    }
    (out / "manifest.json").write_text(json.dumps(manifest, indent=1) + "\n")
    print(f"wrote {out / 'cases.pt'} and {out / 'manifest.json'}")


if __name__ == "__main__":
    main()
