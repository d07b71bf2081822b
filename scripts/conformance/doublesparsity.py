"""Regenerate the DoubleSparsity conformance goldens (tests/fixtures/conformance/doublesparsity/) from upstream code.

    /tmp/ds-venv/bin/python scripts/conformance/doublesparsity.py --upstream /tmp/upstream/DoubleSparse \
        --out tests/fixtures/conformance/doublesparsity

``--upstream`` is a checkout (or ``git archive``) of andy-yang-1/DoubleSparse at the commit recorded in the
goldens (``--commit``).  It is checked against ``git rev-parse HEAD`` when the checkout is a git work tree; for
an archive, ``--git-dir`` (a clone or bare mirror of the repository) lets the script check that
``evaluation/modify_llama.py`` is the blob of that commit; otherwise the commit is only recorded.  Nothing of
upstream is copied into this repository: its ``evaluation/`` folder is put on ``sys.path`` and
``modify_llama.LlamaAttention_heavy_hitter`` (DoubleSparsity's pure-torch decode attention) is imported and
called as it is.  Upstream needs its own environment (transformers 4.47.1, its pin), not this project's, e.g.
``python3.11 -m venv /tmp/ds-venv && /tmp/ds-venv/bin/pip install torch transformers==4.47.1 numpy``.

Per case (float32, CPU, batch 1, one decode step at position n-1, layer_idx 2 so the sparse path runs): a
``LlamaConfig`` with the case's heads and head size; the module's weights are drawn under
``torch.manual_seed(seed)`` and ``o_proj`` is set to the identity (so the returned output is the heads' attention
outputs side by side); ``sorted_channel`` is one seeded permutation of range(d) per query head; a transformers
``DynamicCache`` holds n-1 seeded past keys/values (keys with per-channel scales in [1, 3] and a few large-offset
channels per KV head).  ``forward(..., output_attentions=True)`` is run once; the post-RoPE query is rebuilt from
a hook on ``q_proj`` with transformers' own ``apply_rotary_pos_emb`` and the same cos/sin, the keys/values are read
from the cache afterwards (n tokens, the new one last), and the label scores upstream ranks are read from its
``sort`` call through a ``TorchFunctionMode`` that only records (it changes nothing).

Output: ``<out>/cases.pt`` (a list of plain dicts of float32/int64/bool CPU tensors, ints and strs) and
``<out>/manifest.json`` (upstream, commit, versions, command, sha256 of cases.pt, per-case checks).
Not run in CI.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import math
import shlex
import subprocess
import sys
from importlib import metadata
from pathlib import Path

import torch
from torch.overrides import TorchFunctionMode

REPO = Path(__file__).resolve().parents[2]
DEFAULT_OUT = REPO / "tests" / "fixtures" / "conformance" / "doublesparsity"
DEFAULT_COMMIT = "b0575e638a279d9b2bdd2359dc3fcb5616a1c67a"
UPSTREAM_REPO = "andy-yang-1/DoubleSparse"
ENTRY = "evaluation/modify_llama.py"
LAYER_IDX = 2  # upstream runs the dense flash_forward for layer_idx < 2

# name: (Hq, Hkv, d, n, heavy_const, group_factor, label_bits, seed)
CASES = {
    "gqa_2bit": (8, 2, 64, 200, 32, 2, 2, 1001),
    "gqa_4bit_r16": (8, 2, 64, 180, 48, 4, 4, 1002),
    "mha_2bit": (4, 4, 32, 150, 24, 2, 2, 1003),
    "unquantized": (8, 2, 32, 160, 40, 2, 16, 1004),
    "fits": (4, 2, 32, 60, 64, 2, 2, 1005),  # n <= heavy_const: every token attended
    "gf1_2bit": (4, 2, 32, 120, 16, 1, 2, 1006),
}


def sha256(path: Path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def version(pkg: str) -> str | None:
    """The installed version of a distribution, None when it is not installed (for a manifest)."""
    try:
        return metadata.version(pkg)
    except metadata.PackageNotFoundError:
        return None


def git_blob_id(path: Path) -> str:
    data = Path(path).read_bytes()
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


class RecordSort(TorchFunctionMode):
    """Records the input and output of every ``sort`` call made inside the block; returns results unchanged."""

    def __init__(self):
        super().__init__()
        self.calls = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if func in (torch.Tensor.sort, torch.sort):
            self.calls.append((args[0].detach().clone(), out[0].detach().clone(), out[1].detach().clone()))
        return out


def check_commit(up: Path, commit: str, git_dir: Path | None) -> str:
    if (up / ".git").exists():
        head = subprocess.run(["git", "-C", str(up), "rev-parse", "HEAD"], capture_output=True,
                              text=True).stdout.strip()
        if head != commit:
            raise SystemExit(f"{up} is at {head}, expected {commit}")
        return "git rev-parse HEAD of the checkout"
    if git_dir is not None:
        full = subprocess.run(["git", "--git-dir", str(git_dir), "rev-parse", commit], capture_output=True,
                              text=True).stdout.strip()
        if full != commit:
            raise SystemExit(f"{git_dir}: {commit} resolves to {full!r}")
        blob = subprocess.run(["git", "--git-dir", str(git_dir), "rev-parse", f"{commit}:{ENTRY}"],
                              capture_output=True, text=True).stdout.strip()
        if blob != git_blob_id(up / ENTRY):
            raise SystemExit(f"{up / ENTRY} is not the blob {blob} of {commit}")
        return f"{ENTRY} equals the blob of the commit in a git dir (git rev-parse {commit[:12]}:{ENTRY})"
    print(f"warning: {up} is not a git work tree and no --git-dir given; recording --commit {commit} unchecked")
    return "not checked (recorded from --commit)"


def make_case(ds, name, Hq, Hkv, d, n, heavy, gf, bits, seed):
    from transformers import DynamicCache, LlamaConfig
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding, apply_rotary_pos_emb

    config = LlamaConfig(hidden_size=Hq * d, num_attention_heads=Hq, num_key_value_heads=Hkv,
                         attention_bias=False, max_position_embeddings=4096, rope_theta=10000.0)
    torch.manual_seed(seed)
    attn = ds.LlamaAttention_heavy_hitter(config, layer_idx=LAYER_IDX).float().eval()
    with torch.no_grad():
        attn.o_proj.weight.copy_(torch.eye(Hq * d))

    g = torch.Generator().manual_seed(seed)
    sorted_channel = torch.stack([torch.randperm(d, generator=g) for _ in range(Hq)]).long()
    attn.sorted_channel = sorted_channel
    attn.heavy_const = heavy
    attn.group_factor = gf
    attn.label_bits = bits

    hidden = torch.randn(1, 1, Hq * d, generator=g) * 1.5
    chan_scale = 1.0 + 2.0 * torch.rand(1, Hkv, 1, d, generator=g)
    past_k = torch.randn(1, Hkv, n - 1, d, generator=g) * chan_scale
    for h in range(Hkv):  # a few large-magnitude channels per KV head, as in real keys
        chans = torch.randperm(d, generator=g)[:3]
        offsets = (6.0 + 6.0 * torch.rand(3, generator=g)) * torch.where(torch.rand(3, generator=g) < 0.5, -1.0, 1.0)
        past_k[0, h, :, chans] += offsets + 2.0 * torch.randn(n - 1, 3, generator=g)
    past_v = torch.randn(1, Hkv, n - 1, d, generator=g)

    cache = DynamicCache()
    cache.update(past_k, past_v, LAYER_IDX)
    position_ids = torch.tensor([[n - 1]])
    cos, sin = LlamaRotaryEmbedding(config=config)(hidden, position_ids)

    seen = {}
    hq = attn.q_proj.register_forward_hook(lambda m, i, o: seen.__setitem__("q", o.detach().clone()))
    ho = attn.o_proj.register_forward_hook(lambda m, i, o: seen.__setitem__("o_in", i[0].detach().clone()))
    rec = RecordSort()
    with torch.no_grad(), rec:
        out, weights, cache_out = attn.forward(hidden_states=hidden, attention_mask=None, position_ids=position_ids,
                                               past_key_value=cache, output_attentions=True,
                                               cache_position=torch.tensor([n - 1]), position_embeddings=(cos, sin))
    hq.remove()
    ho.remove()

    q = seen["q"].view(1, 1, Hq, d).transpose(1, 2)
    query, _ = apply_rotary_pos_emb(q, q, cos, sin)
    keys = cache_out.key_cache[LAYER_IDX][0]
    values = cache_out.value_cache[LAYER_IDX][0]
    assert keys.shape == (Hkv, n, d) and values.shape == (Hkv, n, d)
    assert torch.equal(keys[:, : n - 1], past_k[0]) and torch.equal(values[:, : n - 1], past_v[0])
    output = out[0, 0].view(Hq, d)
    if not torch.equal(out, seen["o_in"]):
        print(f"warning [{name}]: identity o_proj changed the output (max diff "
              f"{(out - seen['o_in']).abs().max().item():.3g})")
    selected = weights[0, :, 0, :] > 0

    # checks (nothing below is stored except label_scores)
    notes = []
    counts = selected.sum(-1).tolist()
    want = min(n, heavy)
    if any(c != want for c in counts):
        notes.append(f"selected counts {counts} != min(n, heavy_const) = {want}")
    if len(rec.calls) != 1:
        notes.append(f"{len(rec.calls)} sort calls recorded, expected 1")
    scores, sorted_vals, order = rec.calls[0]
    label_scores = scores[0, :, 0, :]
    by_sort = torch.zeros(Hq, n, dtype=torch.bool)
    by_sort.scatter_(1, order[0, :, 0, :heavy], True)
    if not torch.equal(by_sort, selected):
        notes.append("attn_weights > 0 differs from the top-heavy_const of upstream's sort")
    margin = None
    ties = 0
    if n > heavy:
        sv = sorted_vals[0, :, 0, :]
        gap = sv[:, heavy - 1] - sv[:, heavy]
        margin = gap.min().item()
        rel = (gap / sv[:, heavy - 1: heavy + 1].abs().amax(-1).clamp_min(1e-30)).min().item()
        ties = int((gap == 0).sum())
        if ties:
            notes.append(f"{ties} heads have a tie at the heavy_const boundary (selection then depends on sort order)")
        elif rel < 1e-5:
            notes.append(f"boundary gap is tiny (relative {rel:.2g})")
    rk = keys.repeat_interleave(Hq // Hkv, 0)
    rv = values.repeat_interleave(Hq // Hkv, 0)
    logits = torch.einsum("hd,hnd->hn", query[0, :, 0], rk) / math.sqrt(d)
    dense = torch.softmax(logits.masked_fill(~selected, float("-inf")), -1)
    ref = torch.einsum("hn,hnd->hd", dense, rv)
    err = (ref - output).abs().max().item()
    if err > 1e-5:
        notes.append(f"softmax over the selected tokens differs from the output by {err:.3g}")
    for note in notes:
        print(f"warning [{name}]: {note}")

    case = {
        "name": name, "seed": seed, "num_heads": Hq, "num_kv_heads": Hkv, "head_dim": d,
        "heavy_const": heavy, "group_factor": gf, "label_bits": bits,
        "sorted_channel": sorted_channel.clone(),
        "query": query[0, :, 0].contiguous().clone(),
        "keys": keys.contiguous().clone(), "values": values.contiguous().clone(),
        "selected": selected.contiguous().clone(),
        "output": output.contiguous().clone(),
        "label_scores": label_scores.contiguous().clone(),
    }
    summary = {"n": n, "selected_counts": counts, "expected_count": want, "min_boundary_gap": margin,
               "boundary_ties": ties, "dense_recheck_max_abs_err": err, "warnings": notes}
    return case, summary


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--upstream", type=Path, required=True, help=f"{UPSTREAM_REPO} checkout or archive at --commit")
    ap.add_argument("--commit", default=DEFAULT_COMMIT)
    ap.add_argument("--git-dir", type=Path, default=None,
                    help="optional git dir of the repository, to check an archive's modify_llama.py against --commit")
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = ap.parse_args()

    up = args.upstream.resolve()
    if not (up / ENTRY).is_file():
        raise SystemExit(f"{up}: not a DoubleSparse checkout ({ENTRY} missing)")
    checked = check_commit(up, args.commit, args.git_dir)

    torch.set_num_threads(1)
    torch.set_default_dtype(torch.float32)
    sys.path.insert(0, str(up / "evaluation"))
    import modify_llama as ds  # upstream's module, as it is

    cases, summaries = [], {}
    for name, spec in CASES.items():
        case, summary = make_case(ds, name, *spec)
        cases.append(case)
        summaries[name] = summary
        print(f"{name}: n={summary['n']} selected per head {summary['selected_counts']} "
              f"(min(n, heavy_const) = {summary['expected_count']}), min boundary gap {summary['min_boundary_gap']}")

    out = args.out if args.out.is_absolute() else Path.cwd() / args.out
    out.mkdir(parents=True, exist_ok=True)
    torch.save(cases, out / "cases.pt")

    manifest = {
        "upstream": UPSTREAM_REPO, "commit": args.commit, "commit_check": checked,
        "entry_point": f"{ENTRY}: LlamaAttention_heavy_hitter.forward (layer_idx {LAYER_IDX}, output_attentions=True)",
        "entry_point_git_blob": git_blob_id(up / ENTRY),
        "command": " ".join(["python", "scripts/conformance/doublesparsity.py", *map(shlex.quote, sys.argv[1:])]),
        "interpreter": sys.executable,
        "versions": {p: version(p) for p in ("torch", "transformers", "numpy")},
        "torch_build": torch.__version__, "python": sys.version.split()[0], "torch_threads": 1,
        "cases_pt_sha256": sha256(out / "cases.pt"),
        "cases": {name: {"Hq": s[0], "Hkv": s[1], "d": s[2], "n": s[3], "heavy_const": s[4], "group_factor": s[5],
                         "label_bits": s[6], "seed": s[7], **summaries[name]} for name, s in CASES.items()},
    }
    (out / "manifest.json").write_text(json.dumps(manifest, indent=1) + "\n", encoding="utf-8")
    print(f"wrote {len(cases)} cases to {out / 'cases.pt'} and manifest.json")


if __name__ == "__main__":
    main()
