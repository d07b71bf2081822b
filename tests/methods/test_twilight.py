"""Twilight against its official code (tests/fixtures/conformance/twilight/: upstream's Quest selector, 4-bit
estimate and top-p on identical tensors, scripts/conformance/twilight.py), and its top-p rules against references
written from their definitions."""
import json
import math
from pathlib import Path

import pytest
import torch

from baselines.twilight.selector import BISECTION_STEPS, top_p_bisection, top_p_exact
from locks.core.quantize import min_max_quantize
from locks.core.reference import sparse_decode
from locks.core.registry import MethodSpec
from locks.core.selector import LayerInfo, PrefillContext
from locks.errors import ConfigError

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "conformance" / "twilight"
CASES = torch.load(FIXTURES / "cases.pt")
IDS = [case["name"] for case in CASES]


def twilight(case, tmp_path=None, **options):
    Hq, Hkv, d, n = case["Hq"], case["Hkv"], case["d"], case["n"]
    info = LayerInfo(layer_idx=0, num_heads=Hq, num_kv_heads=Hkv, head_dim=d, scaling=d ** -0.5)
    options = {"dense_layers": 0, "top_p": case["top_p"], **options}
    if case["base"] == "ds":  # the case's channel ranking as a file in the official format
        path = tmp_path / f"{case['name']}.json"
        path.write_text(json.dumps({"model.layers.0.self_attn.q_proj": case["channels"].tolist()}))
        options.update(base="doublesparsity", channel_config=str(path))
    s = MethodSpec("twilight", case["budget"], options).build(info)
    keys, values = case["keys"], case["values"]
    s.prefill(PrefillContext(keys, values, torch.zeros(1, Hq, n, d), torch.arange(n)[None], lambda: keys))
    return s


def per_head_mask(sel, n: int) -> torch.Tensor:
    """[Hq, n] bool: the tokens each query head attends (batch row 0)."""
    B, Hkv, G, K = sel.indices.shape
    mask = torch.zeros(B, Hkv, G, n, dtype=torch.int8)  # amax: padding may repeat a valid token, masked
    mask.scatter_reduce_(-1, sel.indices, sel.valid.to(torch.int8), reduce="amax")
    return mask[0].reshape(Hkv * G, n).bool()


def exact_reference(P: torch.Tensor, p: float) -> torch.Tensor:
    """One row: tokens in decreasing P (ties: lower index), kept while the mass before them is below p."""
    kept, mass = torch.zeros(len(P), dtype=torch.bool), 0.0
    for i in sorted(range(len(P)), key=lambda i: (-float(P[i]), i)):
        if mass >= p:
            break
        kept[i] = True
        mass += float(P[i])
    return kept


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_candidates_estimate_and_kept_tokens_equal_the_official_code(case, tmp_path):
    """M0 = upstream's quest_selector (every page scored, the top B0 / 16 per query head) or double_sparse_selector
    (its label scores too), the 4-bit estimate on M0, and the kept set M = M0 & top-p (kernel_compat = upstream's
    kernel, emulated by the conformance script)."""
    s = twilight(case, tmp_path)
    q, keys, values, n = case["query"], case["keys"], case["values"], case["n"]
    base = s.base.select(q, keys, values)
    m0 = torch.ones(case["Hq"], n, dtype=torch.bool) if base.dense else per_head_mask(base, n)
    assert torch.equal(m0, case["m0"][0])
    d = case["d"]
    if case["base"] == "ds":
        scores = s.base._scores(q, n).reshape(case["Hq"], n)
        assert torch.allclose(scores, case["label_scores"][0], rtol=1e-5, atol=1e-5)
    rep = keys.repeat_interleave(case["Hq"] // case["Hkv"], dim=1)[0]
    estimate = torch.einsum("hd,hnd->hn", q[0].double(), min_max_quantize(rep, 4).double()) / math.sqrt(d)
    assert torch.allclose(estimate[m0], case["estimate"][0][m0].double(), rtol=1e-5, atol=1e-5)
    sel = s.select(q, keys, values)
    assert torch.equal(per_head_mask(sel, n), case["mask"][0])
    out, _ = sparse_decode(q, keys, values, sel, d ** -0.5)
    assert torch.allclose(out, case["out"][0], atol=1e-5)
    kept = s.extra_metrics()
    assert kept["twilight_tokens"] == pytest.approx(case["mask"].sum(-1).double().mean().item())
    assert kept["twilight_tokens_max"] == case["mask"].sum(-1).max().item()


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_exact_top_p_is_the_smallest_high_mass_set(case, tmp_path):
    """top_p_mode=exact on the official probabilities equals the definition; through the selector, M0 & that set."""
    P, m0, p = case["probs"][0], case["m0"][0], case["top_p"]
    tokens = torch.arange(case["n"]).expand_as(P)
    expected = torch.stack([exact_reference(row, p) for row in P])
    assert torch.equal(top_p_exact(P, tokens, p), expected)
    sel = twilight(case, tmp_path, top_p_mode="exact").select(case["query"], case["keys"], case["values"])
    assert torch.equal(per_head_mask(sel, case["n"]), expected & m0)


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_the_bisection_is_the_official_kernel(case):
    """top_p_bisection on the official probabilities = upstream's kernel (emulated) row by row, within its steps;
    where token 0 is the heaviest it is exact top-p, where token 0 weighs nothing it keeps every candidate."""
    P, p = case["probs"][0], case["top_p"]
    keep, searching = top_p_bisection(P, P[:, 0], p)
    assert not searching.any()
    assert torch.equal(keep, case["m1"][0])
    tokens = torch.arange(case["n"]).expand_as(P)
    heaviest = P.argmax(-1) == 0
    assert torch.equal(keep[heaviest], top_p_exact(P, tokens, p)[heaviest])
    empty = P[:, 0] == 0
    assert torch.equal(keep[empty], (P > 0)[empty])


def test_the_bisection_ends_within_its_steps_and_is_a_superset_of_exact_top_p():
    g = torch.Generator().manual_seed(0)
    for sharpness in (0.5, 2.0, 8.0):
        P = torch.softmax(torch.randn(64, 500, generator=g) * sharpness, -1)
        keep, searching = top_p_bisection(P, P[:, 0], 0.85, steps=BISECTION_STEPS)
        assert not searching.any()
        exact = top_p_exact(P, torch.arange(500).expand_as(P), 0.85)
        assert (keep | ~exact).all()  # every exact token kept
        assert (P * keep).sum(-1).min() >= 0.85 - 1e-6


def test_int4_keys_are_the_per_token_min_max_quantizer():
    k = torch.randn(3, 40, 64) * torch.linspace(0.1, 4, 64)
    k[0, 0] = 2.5  # a constant token: range 0 -> scale 1e-9 / 15
    hat = min_max_quantize(k, 4)
    low, high = k.amin(-1, keepdim=True), k.amax(-1, keepdim=True)
    step = (high - low).clamp(min=1e-9) / 15
    codes = (hat - low) / step
    assert torch.allclose(codes, codes.round(), atol=1e-3) and codes.min() >= -1e-3 and codes.max() <= 15 + 1e-3
    assert ((hat - k).abs() <= step / 2 + 1e-5).all()
    assert torch.equal(hat[0, 0], k[0, 0])


def test_budget_and_bytes():
    case = CASES[0]
    s = twilight(case)  # base quest
    sel = s.select(case["query"], case["keys"], case["values"])
    d, Hq = case["d"], case["Hq"]
    base = s.base.select(case["query"], case["keys"], case["values"])
    candidates = Hq * case["budget"]  # every query head's B0 tokens, 4-bit keys plus an fp16 scale and zero each
    assert sel.metadata_bytes == pytest.approx(base.metadata_bytes + candidates * (d / 2 + 4))
    assert s.memory_bytes(1000)["state"] == pytest.approx(s.base.memory_bytes(1000)["state"] + 2 * 1000 * (d / 2 + 4))
    assert (sel.valid.sum(-1) <= case["budget"]).all()  # B0 caps every head's set


@pytest.mark.parametrize("options,budget,match", [({"top_p": 0.0}, 256, "top_p"), ({}, 200, "multiple of"),
                                                  ({"base": "h2o"}, 256, "method.base"),
                                                  ({"top_p_mode": "sort"}, 256, "top_p_mode")])
def test_bad_options_stop_with_one_line(options, budget, match):
    info = LayerInfo(layer_idx=2, num_heads=4, num_kv_heads=2, head_dim=64, scaling=0.125)
    with pytest.raises(ConfigError, match=match) as error:
        MethodSpec("twilight", budget, options).build(info)
    assert "\n" not in str(error.value)


def test_manifest_records_the_upstream_commit():
    manifest = json.loads((FIXTURES / "manifest.json").read_text())
    assert manifest["upstream"] == "tsinghua-ideal/Twilight" and len(manifest["commit"]) == 40
    assert set(manifest["cases"]) == set(IDS)


def test_a_doublesparsity_base_checks_its_channel_file_before_the_model_loads(tmp_path):
    """base=doublesparsity: the base's calibration checks run through Twilight's hooks (a file for another model stops
    the run in one line; channel_config=auto resolves to the model's calibration)."""
    from transformers import LlamaConfig

    from tests.helpers import TINY_LLAMA, random_rankings

    other = tmp_path / "other.json"
    other.write_text(json.dumps(random_rankings(2, 8, 16)))
    spec = MethodSpec("twilight", 64, {"base": "doublesparsity", "channel_config": str(other)})
    with pytest.raises(ConfigError, match="calibrated for another model") as error:
        spec.check_model_config(LlamaConfig(**TINY_LLAMA))
    assert "\n" not in str(error.value)
    MethodSpec("twilight", 64, {"channel_config": str(other)}).check_model_config(LlamaConfig(**TINY_LLAMA))  # quest


@pytest.mark.parametrize("mode", ["kernel_compat", "exact"])
@pytest.mark.parametrize("per_head", [False, True])
def test_the_fused_pruning_is_the_pytorch_one(mode, per_head):
    """backend triton (baselines/twilight/kernels.py: the estimate, P and the bisection in one launch) keeps what the
    PyTorch rule keeps, token for token, with its P, on candidate lists shared by a KV head's query heads or per
    query head, with masked padding (token 0 repeated) and token 0 a candidate or not."""
    B, Hq, Hkv, d, L, K = 2, 6, 2, 64, 400, 150
    g = torch.Generator().manual_seed(11)
    keys = torch.randn(B, Hkv, L, d, generator=g) * torch.linspace(0.5, 2, d)
    keys[:, :, 0] += 3  # a heavy token 0 for some heads
    Gs = Hq // Hkv if per_head else 1
    tokens = torch.stack([torch.randperm(L, generator=g)[:K] for _ in range(B * Hkv * Gs)]).view(B, Hkv, Gs, K)
    tokens[0, 0, 0, 5] = 0
    valid = torch.rand(B, Hkv, Gs, K, generator=g) > 0.1
    tokens = torch.where(valid, tokens, 0)
    query = torch.randn(B, Hq, d, generator=g) * 2
    out = {}
    for backend in ("torch", "triton"):
        info = LayerInfo(layer_idx=2, num_heads=Hq, num_kv_heads=Hkv, head_dim=d, scaling=d ** -0.5, backend=backend)
        s = MethodSpec("twilight", 128, {"top_p_mode": mode}).build(info)
        s.prefill(PrefillContext(keys, keys, torch.zeros(B, Hq, L, d), torch.arange(L).expand(B, -1), lambda: keys))
        out[backend] = (s.prune(query, keys, tokens, valid), s.kept.clone())
    assert torch.equal(out["triton"][0], out["torch"][0])
    assert torch.equal(out["triton"][1], out["torch"][1])
    assert 0 < out["torch"][0].sum() < valid.expand(B, Hkv, Hq // Hkv, K).sum()  # it pruned, not everything


@pytest.mark.parametrize("mode", ["kernel_compat", "exact"])
@pytest.mark.parametrize("per_head,page_valid", [(True, False), (False, True)])
def test_the_fused_static_step_is_the_pytorch_one(mode, per_head, page_valid):
    """A static step over a base's page list (Quest's per query head; one per KV head with page validity, as LOCKS's),
    rows of their own lengths: the fused pruning reads the pages' tokens itself and the fused count adds what the
    PyTorch step and the core's reference count: kept tokens, each KV head's union (attended_per_kv_head), the 4-bit
    keys' bytes. Its slot bitmaps are clear again after every step."""
    from locks.core.reference import attended_per_kv_head
    from locks.core.selector import Selection

    B, Hq, Hkv, d, C, n, Kp = 3, 6, 2, 64, 320, 16, 7
    g = torch.Generator().manual_seed(12)
    keys = torch.randn(B, Hkv, C, d, generator=g) * torch.linspace(0.5, 2, d)
    query = torch.randn(B, Hq, d, generator=g) * 2
    length = torch.tensor([C - 3, 200, 97])
    Gs = Hq // Hkv if per_head else 1
    pages = torch.stack([torch.randperm(C // n, generator=g)[:Kp] for _ in range(B * Hkv * Gs)]).view(B, Hkv, Gs, Kp)
    pages[1, 0, 0, 0] = 0  # token 0 a candidate
    base = Selection(pages=pages, page_size=n,
                     page_valid=torch.rand(B, Hkv, Gs, Kp, generator=g) > 0.2 if page_valid else None)
    out = {}
    for backend in ("torch", "triton"):
        info = LayerInfo(layer_idx=2, num_heads=Hq, num_kv_heads=Hkv, head_dim=d, scaling=d ** -0.5, backend=backend)
        s = MethodSpec("twilight", 128, {"top_p_mode": mode}).build(info)
        s.prefill(PrefillContext(keys, keys, torch.zeros(B, Hq, C, d), torch.arange(C).expand(B, -1), lambda: keys))
        s.start_static(C)
        s.base.select_static = lambda *args: base
        sels = [s.select_static(query, keys, keys, length) for _ in range(2)]
        out[backend] = (sels, s.kept.clone())
        if backend == "triton":
            assert not s.seen.any()
    for ref, fused in zip(out["torch"][0], out["triton"][0]):
        assert torch.equal(fused.valid, ref.valid) and torch.equal(fused.indices[fused.valid], ref.indices[ref.valid])
        assert torch.equal(fused.attended_rows, attended_per_kv_head(ref, C).double())
        assert torch.equal(fused.device_bytes, ref.device_bytes)
    assert torch.equal(out["triton"][1], out["torch"][1])
    keep = out["torch"][0][0].valid
    assert 0 < keep.sum() < keep.numel()
