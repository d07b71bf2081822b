"""DoubleSparsity (docs/methods/doublesparsity.md): the label quantizer, the per-query-head top-k against a reference
written from the paper's rule, the official implementation's outputs on identical inputs (tie-aware), and the
offline calibration against a direct computation of the same means."""
import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM
from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

from baselines.doublesparsity.calibration import (calibrated_file, calibration_blocks, channel_rankings,
                                                  check_channel_file, layer_key)
from baselines.doublesparsity.selector import pseudo_quantize
from locks.core.dense import DenseAttention
from locks.core.reference import sparse_decode
from locks.core.registry import MethodSpec
from locks.core.selector import LayerInfo, PrefillContext
from locks.core.topk import top_units, top_units_lowest_first
from locks.errors import ConfigError
from tests.helpers import TINY_LLAMA, random_rankings

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "conformance" / "doublesparsity" / "cases.pt"


def reference_quantize(x: np.ndarray, bits: int) -> np.ndarray:
    """The official pseudo-quantizer, row by row in float64 from its formula."""
    out = np.empty_like(x, dtype=np.float64)
    for index in np.ndindex(x.shape[:-1]):
        row = x[index].astype(np.float64)
        low, high = row.min(), row.max()
        scale = (2**bits - 1) / ((high - low) or 1.0)
        out[index] = np.clip(np.round((row - low) * scale), 0, 2**bits - 1) / scale + low
    return out


def channel_file(tmp_path, rankings: dict) -> str:
    path = tmp_path / "channels.json"
    path.write_text(json.dumps(rankings))
    return str(path)


def selector(tmp_path, budget, Hq, Hkv, d, rankings=None, layer=2, **options):
    rankings = rankings or random_rankings(layer + 1, Hq, d)
    info = LayerInfo(layer_idx=layer, num_heads=Hq, num_kv_heads=Hkv, head_dim=d, scaling=d**-0.5)
    options = {"channel_config": channel_file(tmp_path, rankings), **options}
    return MethodSpec("doublesparsity", budget, options).build(info)


def run_prefill(s, keys, values, Hq):
    B, _, L, d = keys.shape
    s.prefill(PrefillContext(keys, values, torch.randn(B, Hq, L, d), torch.arange(L).expand(B, -1), lambda: keys))


@pytest.mark.parametrize("bits", [1, 2, 4, 8])
def test_pseudo_quantize_is_the_official_formula(bits):
    x = torch.randn(3, 5, 17, generator=torch.Generator().manual_seed(bits))
    x[0, 0] = 0.7  # a constant row: range 0 counts as 1
    got = pseudo_quantize(x, bits).double().numpy()
    assert np.allclose(got, reference_quantize(x.numpy(), bits), atol=1e-5)
    assert torch.equal(pseudo_quantize(x, 16), x)


def test_lowest_first_top_k_is_the_stable_sorts():
    for seed in range(20):
        x = torch.randint(-3, 4, (4, 3, 50), generator=torch.Generator().manual_seed(seed)).float() / 2
        x[0, 0, :7] = float("-inf")
        x[1, 1, 3] = -0.0
        assert torch.equal(top_units_lowest_first(x, 9), top_units(x, 9, stable=True))


@pytest.mark.parametrize("Hq,Hkv,d,L,budget,gf,bits", [(8, 2, 32, 300, 40, 2, 2), (4, 4, 16, 90, 16, 4, 4),
                                                       (6, 2, 32, 120, 24, 1, 16), (4, 2, 32, 50, 64, 2, 2)])
def test_each_query_head_attends_its_top_budget_by_label_score(tmp_path, Hq, Hkv, d, L, budget, gf, bits):
    """Per query head h: S_h = its first d / gf ranked channels; s_i = Q(q[S_h]) . Q(k_i[S_h]) / sqrt(r) over every
    token; the selection is the top `budget` (exact ties to the lower index), every token while L <= budget."""
    g = torch.Generator().manual_seed(L)
    keys, values = torch.randn(1, Hkv, L, d, generator=g) * 2, torch.randn(1, Hkv, L, d, generator=g)
    query = torch.randn(1, Hq, d, generator=g)
    rankings = random_rankings(3, Hq, d, seed=L)
    s = selector(tmp_path, budget, Hq, Hkv, d, rankings, group_factor=gf, label_bits=bits)
    run_prefill(s, keys, values, Hq)
    sel = s.select(query, keys, values)
    if L <= budget:
        assert sel.dense
        return
    r, G = d // gf, Hq // Hkv
    for h in range(Hq):
        S = rankings[layer_key(2, "q_proj")][h][:r]
        q = reference_quantize(query[0, h, S].numpy()[None], bits)[0]
        k = reference_quantize(keys[0, h // G][:, S].numpy(), bits)
        scores = k @ q / math.sqrt(r)
        want = sorted(sorted(range(L), key=lambda i: (-scores[i], i))[:budget])
        got = sel.indices[0, h // G, h % G][sel.valid[0, h // G, h % G]].tolist()
        assert got == want, h
    assert sel.metadata_bytes == Hq * L * (r * bits / 8 + (4 if bits < 16 else 0))


def test_the_first_layers_are_the_cores_dense_layers(tmp_path):
    assert isinstance(selector(tmp_path, 64, 4, 2, 16, layer=1), DenseAttention)
    assert not isinstance(selector(tmp_path, 64, 4, 2, 16, layer=1, dense_layers=1), DenseAttention)


@pytest.mark.skipif(not FIXTURE.exists(), reason="the official fixture is not in this checkout")
def test_selections_and_outputs_equal_the_official_implementation(tmp_path):
    """tests/fixtures/conformance/doublesparsity: the official LlamaAttention_heavy_hitter on identical post-RoPE
    tensors. Where the budget's boundary is tied (2-bit labels tie often), any tied token may be chosen: both
    sets must then hold the same tokens above the boundary and as many at it."""
    for case in torch.load(FIXTURE, weights_only=True):
        Hq, Hkv, d = case["num_heads"], case["num_kv_heads"], case["head_dim"]
        rankings = {layer_key(2, "q_proj"): case["sorted_channel"].tolist()}
        s = selector(tmp_path, case["heavy_const"], Hq, Hkv, d, rankings, group_factor=case["group_factor"],
                     label_bits=case["label_bits"])
        keys, values, query = case["keys"][None], case["values"][None], case["query"][None]
        n = keys.shape[2]
        run_prefill(s, keys, values, Hq)
        sel = s.select(query, keys, values)
        mine = torch.zeros(Hq, n, dtype=torch.bool)
        if sel.dense:
            mine[:] = True
        else:
            G = Hq // Hkv
            for h in range(Hq):
                mine[h, sel.indices[0, h // G, h % G][sel.valid[0, h // G, h % G]]] = True
        official = case["selected"]
        scores = s._scores(query, n).reshape(Hq, n)
        assert torch.allclose(scores, case["label_scores"], rtol=1e-5, atol=1e-5), case["name"]  # what it ranks
        for h in range(Hq):
            k = int(official[h].sum())
            assert int(mine[h].sum()) == k == min(n, case["heavy_const"]), (case["name"], h)
            boundary = scores[h].topk(k).values[-1]
            tol = 1e-5 * max(1.0, float(boundary.abs()))
            above, tied = scores[h] > boundary + tol, (scores[h] - boundary).abs() <= tol
            for chosen in (mine[h], official[h]):
                assert bool(chosen[above].all()) and bool((chosen <= (above | tied)).all()), (case["name"], h)
            if not bool((tied & ~(mine[h] & official[h])).any()):  # no tie at the boundary: identical sets
                assert torch.equal(mine[h], official[h]), (case["name"], h)
        if torch.equal(mine, official):
            out = sparse_decode(query, keys, values, sel, d**-0.5)[0].reshape(Hq, d) if not sel.dense else None
            if out is not None:
                assert torch.allclose(out, case["output"], atol=1e-5), case["name"]


def test_static_selection_writes_each_new_label_and_masks_unwritten_slots(tmp_path):
    """Static step at length L equals the eager step at L (same rule over preallocated slots), row by row."""
    Hq, Hkv, d, L0, budget = 4, 2, 16, 40, 12
    g = torch.Generator().manual_seed(3)
    keys, values = torch.randn(1, Hkv, 64, d, generator=g), torch.randn(1, Hkv, 64, d, generator=g)
    rankings = random_rankings(3, Hq, d)
    eager, static = (selector(tmp_path, budget, Hq, Hkv, d, rankings) for _ in range(2))
    run_prefill(eager, keys[:, :, :L0], values[:, :, :L0], Hq)
    run_prefill(static, keys[:, :, :L0], values[:, :, :L0], Hq)
    static.start_static(64)
    for L in range(L0 + 1, 60):
        query = torch.randn(1, Hq, d, generator=g)
        want = eager.select(query, keys[:, :, :L], values[:, :, :L])
        got = static.select_static(query, keys, values, torch.tensor([L]))
        assert torch.equal(got.indices[got.valid].sort().values, want.indices[want.valid].sort().values)
        static.after_static_step(keys, values, L)


def tiny_model(seed=0):
    torch.manual_seed(seed)
    return LlamaForCausalLM(LlamaConfig(**TINY_LLAMA)).eval()


def test_calibration_ranks_channels_by_their_mean_magnitude():
    """Against a direct computation: each layer's q_proj / k_proj outputs (before RoPE) and the RoPE'd q * k."""
    model = tiny_model()
    blocks = list(torch.randint(0, TINY_LLAMA["vocab_size"], (3, 1, 64), generator=torch.Generator().manual_seed(1)))
    got = channel_rankings(model, blocks, progress=False)
    Hq, Hkv, d = TINY_LLAMA["num_attention_heads"], TINY_LLAMA["num_key_value_heads"], TINY_LLAMA["head_dim"]
    sums = {}
    with torch.no_grad():
        for block in blocks:
            hidden = model(input_ids=block, output_hidden_states=True).hidden_states
            position_ids = torch.arange(block.shape[1])[None]
            for layer, attention in enumerate(model.model.layers):
                x = attention.input_layernorm(hidden[layer])
                q = attention.self_attn.q_proj(x).view(1, -1, Hq, d).transpose(1, 2)
                k = attention.self_attn.k_proj(x).view(1, -1, Hkv, d).transpose(1, 2)
                cos, sin = model.model.rotary_emb(x, position_ids)
                q_rot, k_rot = apply_rotary_pos_emb(q, k, cos, sin)
                for kind, value in (("q_proj", q.abs().mean((0, 2))), ("k_proj", k.abs().mean((0, 2))),
                                    ("qk_proj", (q_rot * k_rot.repeat_interleave(Hq // Hkv, 1)).abs().mean((0, 2)))):
                    key = layer_key(layer, kind)
                    sums[key] = sums.get(key, 0) + value
    assert sorted(got) == sorted(sums)
    for key, value in sums.items():
        assert got[key] == value.argsort(dim=-1, descending=True, stable=True).tolist(), key


def test_a_model_calibrates_once_into_the_official_format(tmp_path):
    model = tiny_model(seed=2)
    model.locks_cache_dir = str(tmp_path)
    path = calibrated_file(model)
    assert calibrated_file(model) == path and path.parent == tmp_path / "doublesparsity"
    data = json.loads(path.read_text())
    d = TINY_LLAMA["head_dim"]
    for layer in range(TINY_LLAMA["num_hidden_layers"]):
        for kind, heads in (("q_proj", 4), ("k_proj", 2), ("qk_proj", 4)):
            rows = data[layer_key(layer, kind)]
            assert len(rows) == heads and all(sorted(row) == list(range(d)) for row in rows)
    # the cache builds the model's selectors from that file (channel_config=auto)
    spec = MethodSpec("doublesparsity", 64, {"dense_layers": 1}).for_model(model)
    assert spec.options["channel_config"] == str(path)


def test_calibration_text_is_blocks_of_the_shipped_text():
    from locks.core.models import _embedded_tokenizer

    tokenizer = _embedded_tokenizer()
    blocks = calibration_blocks(tokenizer, len(tokenizer))
    assert len(blocks) > 50 and all(b.shape == (1, 512) for b in blocks)
    assert all(torch.equal(a, b) for a, b in zip(blocks, calibration_blocks(tokenizer, len(tokenizer))))


def test_a_channel_file_for_another_model_is_one_line_error(tmp_path):
    config = LlamaConfig(**TINY_LLAMA)
    good = channel_file(tmp_path, random_rankings(2, 4, 16, kinds=("q_proj",)))
    check_channel_file(good, config, "q", dense_layers=0)
    (tmp_path / "other.json").write_text(json.dumps(random_rankings(2, 8, 16)))
    for path, match in ((str(tmp_path / "other.json"), "calibrated for another model"),
                        (str(tmp_path / "missing.json"), "no such file")):
        with pytest.raises(ConfigError, match=match) as err:
            check_channel_file(path, config, "q", dense_layers=0)
        assert "\n" not in str(err.value)
    with pytest.raises(ConfigError, match="has no 'model.layers.0.self_attn.qk_proj'"):
        check_channel_file(good, config, "qk", dense_layers=0)


@pytest.mark.parametrize("options,match", [({"channel": "k"}, "channel=q or qk"),
                                           ({"group_factor": 3}, "must divide head_dim"),
                                           ({"label_bits": 0}, "method.label_bits"),
                                           ({"channel_config": ""}, "method.channel_config")])
def test_bad_options_are_one_line_errors(tmp_path, options, match):
    with pytest.raises(ConfigError, match=match) as err:
        selector(tmp_path, 64, 4, 2, 16, **options)
    assert "\n" not in str(err.value)


@pytest.mark.parametrize("options", [{}, {"label_bits": 4}, {"label_bits": 16}, {"variant": "twilight"},
                                     {"group_factor": 4, "channel": "qk"}])
@pytest.mark.parametrize("per_row", [False, True])
def test_the_fused_static_selection_is_the_pytorch_one(tmp_path, options, per_row):
    """backend triton (baselines/doublesparsity/kernels.py, one launch + torch.topk) writes the same labels and
    selects the same tokens as the PyTorch static step, at every step, for rows of one length or of their own
    ([B] lengths), newest slots inside and at the edges of the kernel's 128-slot blocks."""
    B, Hq, Hkv, d, prompt, cap, budget = 2, 8, 2, 64, 250, 300, 40
    g = torch.Generator().manual_seed(5)
    keys = torch.randn(B, Hkv, cap, d, generator=g) * torch.linspace(0.5, 3, d)
    rankings = random_rankings(3, Hq, d)
    built = {}
    for backend in ("torch", "triton"):
        info = LayerInfo(layer_idx=2, num_heads=Hq, num_kv_heads=Hkv, head_dim=d, scaling=d**-0.5, backend=backend)
        s = MethodSpec("doublesparsity", budget, {"channel_config": channel_file(tmp_path, rankings), **options}
                       ).build(info)
        s.prefill(PrefillContext(keys[:, :, :prompt], keys[:, :, :prompt], torch.zeros(B, Hq, prompt, d),
                                 torch.arange(prompt).expand(B, -1), lambda: keys[:, :, :prompt], max_new_tokens=50))
        s.start_static(cap)
        built[backend] = s
    for step, L in enumerate((251, 256, 257, 260, 285)):
        length = torch.tensor([L, L - 7 * step] if per_row else [L])
        query = torch.randn(B, Hq, d, generator=g)
        ref, fused = (built[b].select_static(query, keys, keys, length) for b in ("torch", "triton"))
        assert torch.equal(built["triton"].labels, built["torch"].labels), step
        assert torch.equal(fused.indices, ref.indices) and torch.equal(fused.valid, ref.valid), step


def test_scores_made_a_few_slots_at_a_time_are_the_scores_made_at_once(tmp_path, monkeypatch):
    """The fp64 labels converted SCORE_CHUNK_BYTES at a time (here 5 slots, so the last chunk is partial) give the
    same scores, bit for bit, and so the same selection."""
    import baselines.doublesparsity.selector as doublesparsity

    torch.manual_seed(4)
    Hq, Hkv, d, L = 4, 2, 16, 23
    keys, values = torch.randn(1, Hkv, L, d), torch.randn(1, Hkv, L, d)
    s = selector(tmp_path, 8, Hq, Hkv, d, label_bits=2)
    run_prefill(s, keys, values, Hq)
    query = torch.randn(1, Hq, d)
    whole, sel = s._scores(query, L), s.select(query, keys, values)
    monkeypatch.setattr(doublesparsity, "SCORE_CHUNK_BYTES", 5 * Hq * s.r * 8)
    assert torch.equal(s._scores(query, L), whole)
    chunked = s.select(query, keys, values)
    assert torch.equal(chunked.indices, sel.indices) and torch.equal(chunked.valid, sel.valid)
