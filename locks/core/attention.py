"""The attention function registered with transformers under the name `sparse_kv`, and the reference sparse decode.

Prefill is dense (transformers' own SDPA path, GQA-native). At decode the layer's selector picks the tokens and
`sparse_decode` attends exactly to them: gather at KV-head granularity (K/V are never repeated for GQA), softmax in
fp32, output plus each query head's log-sum-exp. The attention function knows nothing about any method.

The function finds its cache through the `sparse_cache` keyword that the runner passes to `model(...)`; transformers
forwards unknown model kwargs to the attention function unchanged.
"""
from __future__ import annotations

import functools
import time

import torch
from torch import Tensor
from transformers import AttentionInterface, AttentionMaskInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import sdpa_mask

from locks.core.batch import RowBatch, row_attention
from locks.core.cache import SOFTCAP_ERROR
from locks.core.reference import (add_sinks, attended_mean, attended_per_kv_head, dense_attention, dense_lse,
                                  lse_with_sinks, paged_tokens, sparse_decode)
from locks.core.paging import CERTIFICATE_NAMES
from locks.core.selector import PrefillContext, Selection, StepStats, check_finite, row_length
from locks.errors import ConfigError

ATTENTION_NAME = "sparse_kv"


def register_attention() -> str:
    """Register `sparse_kv` (and the matching SDPA mask, without which transformers silently drops the causal mask)."""
    AttentionInterface.register(ATTENTION_NAME, sparse_kv_attention)
    AttentionMaskInterface.register(ATTENTION_NAME, sdpa_mask)
    return ATTENTION_NAME


def _alive_selection(alive: Tensor) -> Selection:
    B, H, L = alive.shape
    idx = torch.arange(L, device=alive.device).expand(B, H, 1, L)
    return Selection(indices=idx, valid=alive[:, :, None, :].clone())


def dense_prefill(module, query, key, value, attention_mask, dropout, scaling, backend: str, **kwargs) -> Tensor:
    """Dense causal attention of the prompt: flash-attn's kernel when `backend == "flash_attn"` and the prompt is one
    unpadded causal block (no mask tensor, as many queries as keys), else transformers' SDPA; a layer with attention
    sinks (`s_aux`) through the fp32 reference, which has them in its softmax. -> [B, q, Hq, d]."""
    sinks = kwargs.get("s_aux")
    if sinks is not None:
        mask = attention_mask if attention_mask is None or attention_mask.dtype == torch.bool else None
        if attention_mask is not None and mask is None:
            raise ConfigError("attention sinks need a boolean mask (the sparse_kv mask interface gives one)")
        return dense_attention(query, key, value, mask, scaling, sinks, causal=mask is None)[0]
    if backend == "flash_attn" and attention_mask is None and query.shape[2] == key.shape[2]:
        from flash_attn import flash_attn_func  # GQA-native: K/V keep their H_kv heads

        return flash_attn_func(query.transpose(1, 2), key.transpose(1, 2), value.transpose(1, 2), dropout_p=dropout,
                               softmax_scale=scaling, causal=True)
    out, _ = sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, **kwargs)
    return out


def sparse_kv_attention(module, query, key, value, attention_mask, dropout=0.0, scaling=None, **kwargs):
    """transformers attention-function contract: query [B, Hq, q, d], key/value [B, Hkv, L, d] (whole cache)."""
    cache = kwargs.get("sparse_cache")
    if cache is None:
        raise ConfigError(
            "the sparse_kv attention needs its SelectorCache: call the model with `cache=c, sparse_cache=c` "
            "(locks.core.generation.generate does this)"
        )
    if kwargs.get("softcap") is not None:
        raise ConfigError(SOFTCAP_ERROR.format(kwargs["softcap"]))
    if isinstance(cache, RowBatch):  # several samples, each on its own cache (locks/core/batch.py)
        return row_attention(sparse_kv_attention, module, query, attention_mask, dropout, scaling, cache,
                             **{k: v for k, v in kwargs.items() if k != "sparse_cache"})
    layer_idx = module.layer_idx
    if cache.phase == "prefill":  # what transformers passes decides the layer's type (docs/architecture.md)
        cache.configure_layer(layer_idx, kwargs.get("sliding_window"),
                              cache.infos[layer_idx].scaling if scaling is None else scaling)
    selector = cache.selector(layer_idx)
    info = cache.infos[layer_idx]
    scaling = info.scaling if scaling is None else scaling
    sinks = kwargs.get("s_aux")

    if cache.phase == "prefill":
        check_finite("prompt keys", key[:, :, key.shape[2] - query.shape[2] :])  # this chunk's (the whole prompt's)
        out = dense_prefill(module, query, key, value, attention_mask, dropout, scaling, cache.prefill_backend, **kwargs)
        queries = cache.prompt_queries(layer_idx, query.detach())  # a chunked prefill's, over its chunks
        if not cache.prefill_last:  # a chunk before the last: the selector's prefill runs after the last
            return out, None
        positions = kwargs.get("position_ids")
        if positions is None or positions.shape[-1] != key.shape[2]:  # none given, or a chunk's: prompts start at 0
            positions = torch.arange(key.shape[2], device=key.device).expand(key.shape[0], -1)
        positions = positions.expand(key.shape[0], -1)
        k, v = key.detach(), value.detach()  # selector state never takes part in autograd
        ctx = PrefillContext(
            keys=k, values=v, queries=queries, positions=positions,
            pre_rope_keys=lambda: cache.rotation.unrotate(k, positions, layer_idx),
            max_new_tokens=cache.max_new_tokens, max_length=cache.max_length,
            rotate=functools.partial(cache.rotation.rotate, layer_idx=layer_idx), rotation=cache.rotation,
        )
        selector.prefill(ctx)
        return out, None

    if cache.phase == "decode_static":
        return static_decode_step(query, key, value, cache, layer_idx, scaling, sinks), None
    if query.shape[2] != 1:
        raise ConfigError("decode steps take one token per sequence; set cache.phase='prefill' for prompts")
    check_no_padding(attention_mask, key.shape[2], info.sliding_window)
    check_finite("decoded keys", key[:, :, -1])
    if info.sliding_window is not None:
        return window_decode(module, query, key, value, attention_mask, cache, info, scaling, sinks, dropout, **kwargs)
    selector.append(key.detach(), value.detach())
    q = query[:, :, 0]
    sel = selector.select(q.detach(), key.detach(), value.detach())
    B, Hkv, L, d = key.shape
    alive = None if selector.alive is None else selector.alive_mask(L)
    if sel.dense and alive is not None:
        sel = _alive_selection(alive)
    full_bytes = L * info.token_kv_bytes
    lse = None
    if sel.dense:
        out = dense_decode(module, query, key, value, attention_mask, scaling, sinks, dropout, **kwargs)
        attended = float(L)
    else:
        o, lse = attend(q, key, value, sel, scaling, cache.backend)
        o, lse_sink = add_sinks(o, lse, sinks)
        out = o.unsqueeze(1)  # [B, 1, Hq, d]
        attended = float(attended_per_kv_head(sel, L).mean())
    kv_bytes = sel.kv_bytes if sel.kv_bytes is not None else attended * info.token_kv_bytes
    stats = StepStats(
        attended_tokens=attended,
        forced_tokens=float(sel.forced_tokens),
        metadata_bytes=float(sel.metadata_bytes),
        kv_bytes=float(kv_bytes),
        h2d_bytes=float(sel.h2d_bytes),
        full_bytes=full_bytes,
    )
    start = time.perf_counter()  # the instrumentation below is timed apart from the decode (docs/architecture.md)
    coverage = None
    if cache.measure_coverage:  # the mass of the full attention (sinks included) that the attended set carries
        coverage = (torch.ones(B, q.shape[1]) if lse is None else
                    torch.exp(lse_sink - lse_with_sinks(dense_lse(q, key, scaling), sinks)).detach().cpu())
    # a method's diagnostics (LOCKS's certificate) are about the tokens: they get the tokens' lse, without sinks;
    # a certificate on the tokens' share of the mass also bounds the share with the sink added to both sides
    measured = cache.measure_coverage and sel.diagnostics is not None and lse is not None  # as a static step
    diagnostics = sel.diagnostics(lse) if measured else None
    if diagnostics is not None and coverage is not None and hasattr(sel.diagnostics, "soundness"):
        diagnostics = {**diagnostics, **sel.diagnostics.soundness(lse, coverage)}
    cache.stats.add(stats, L, coverage, diagnostics)
    cache.instrumentation_seconds += time.perf_counter() - start
    return out, None


def check_no_padding(mask: Tensor | None, length: int, window: int | None) -> None:
    """A decode step's boolean mask [B, 1, 1, L] must admit every cached token (full attention) or exactly the last
    `window` (a sliding layer); anything else means padding, which would put pad tokens into the selectors' pages."""
    if mask is None or mask.dtype != torch.bool:
        return
    expected = torch.ones(length, dtype=torch.bool, device=mask.device)
    if window is not None:
        expected = torch.arange(length, device=mask.device) >= length - window
    if not bool((mask == expected).all()):
        raise ConfigError("batches with left padding are not supported by the selectors (pads would enter their "
                          "pages); decode rows of their own lengths instead (batch_size, docs/batching.md)")


def dense_decode(module, query, key, value, attention_mask, scaling, sinks, dropout=0.0, **kwargs) -> Tensor:
    """Attention of the decode token over every token the mask admits -> [B, 1, Hq, d]: SDPA, or the fp32
    reference where the layer has attention sinks."""
    if sinks is not None:
        return dense_attention(query, key, value, attention_mask, scaling, sinks)[0]
    kwargs.pop("s_aux", None)
    out, _ = sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, **kwargs)
    return out


def window_decode(module, query, key, value, attention_mask, cache, info, scaling, sinks, dropout=0.0, **kwargs):
    """A sliding-window layer's decode step (locks/core/window.py): what stock transformers computes there (the
    mask admits the last W tokens), no selector asked; the bytes model counts the window for every method, FullKV
    included. -> (out [B, 1, Hq, d], None)."""
    L = key.shape[2]
    if attention_mask is None and L > info.sliding_window:  # no mask given: restrict to the window ourselves
        attention_mask = (torch.arange(L, device=key.device) >= L - info.sliding_window).view(1, 1, 1, L)
    out = dense_decode(module, query, key, value, attention_mask, scaling, sinks, dropout, **kwargs)
    window = float(min(L, info.sliding_window))
    cache.stats.add(StepStats(attended_tokens=window, forced_tokens=0.0, metadata_bytes=0.0,
                              kv_bytes=window * info.token_kv_bytes, h2d_bytes=0.0,
                              full_bytes=window * info.token_kv_bytes, layer_type=info.layer_type), L, None)
    return out, None


def attend(q: Tensor, keys: Tensor, values: Tensor, sel: Selection, scaling: float, backend: str,
           length: Tensor | None = None) -> tuple[Tensor, Tensor]:
    """Exact attention of q [B, Hq, d] over a (non-dense) Selection -> (out [B, Hq, d], lse [B, Hq] fp32): the fused
    kernels of locks/kernels/ with backend "triton", the PyTorch reference otherwise and whenever the selection
    brings its own keys/values (reconstructed keys, offloaded values) or logit biases, except compacted ones (`key_count`: each row's
    first key_count slots, FullKV's kernel with backend "triton"). Page lists are truncated at `length` (the
    device length of a static step; default: the whole cache). A selection that brings its step's attention
    (`Selection.attention`) is returned as it is."""
    if sel.attention is not None:
        return sel.attention
    if sel.key_count is not None:  # compacted keys/values: each row's first key_count slots
        if backend == "triton":
            from locks.kernels import full_decode

            return full_decode(q, sel.keys.flatten(1, 2), sel.values.flatten(1, 2), scaling, length=sel.key_count)
        B, H, Gs, S = sel.keys.shape[:4]
        slots = torch.arange(S, device=q.device).view(1, 1, 1, S)
        valid = (slots < sel.key_count.view(-1, 1, 1, 1)).expand(B, H, Gs, S)
        sel = Selection(indices=slots.expand(B, H, Gs, S), valid=valid, keys=sel.keys, values=sel.values)
    if sel.keys is not None or sel.values is not None or sel.logit_bias is not None or backend != "triton":
        if sel.pages is not None:
            length = keys.new_full((1,), keys.shape[2], dtype=torch.long) if length is None else length
            indices, valid = paged_tokens(sel, length, keys.shape[2])
            sel = Selection(indices=indices, valid=valid)
        return sparse_decode(q, keys, values, sel, scaling)
    from locks.kernels import paged_decode
    from locks.kernels import sparse_decode as fused_sparse_decode

    if sel.pages is not None:
        return paged_decode(q, keys, values, sel.pages, scaling, sel.page_valid, page_size=sel.page_size, length=length)
    return fused_sparse_decode(q, keys, values, sel.indices, sel.valid, scaling)


def valid_slots(length: Tensor, capacity: int) -> Tensor:
    """[1 or B, 1, 1, capacity] bool: the slots below each row's static length ([1] or [B])."""
    return torch.arange(capacity, device=length.device) < row_length(length, 4)


def masked_dense_decode(query: Tensor, keys: Tensor, values: Tensor, length: Tensor, scaling: float) -> Tensor:
    """Attention of query [B, Hq, d] over the first `length` ([1] or [B] device tensor) of the preallocated
    keys/values [B, Hkv, capacity, d] -> [B, Hq, d]: SDPA (GQA-native) with a boolean mask, fixed shapes."""
    out = torch.nn.functional.scaled_dot_product_attention(
        query.unsqueeze(2), keys, values, attn_mask=valid_slots(length, keys.shape[2]), scale=scaling,
        enable_gqa=True)
    return out[:, :, 0]


def static_decode_step(query: Tensor, keys: Tensor, values: Tensor, cache, layer_idx: int, scaling: float,
                       sinks: Tensor | None = None) -> Tensor:
    """One layer of a static decode step (capturable in a CUDA graph): keys/values are the preallocated cache with
    `cache.static_length` valid slots; the selector's `select_static` names a fixed number of tokens or pages, attended
    by the fused kernels (backend triton) or the reference. Attended tokens the host cannot count are added to
    `cache.static_attended` on the device (their K/V bytes to `cache.static_bytes`, with the selection's own
    `device_bytes`), as is the coverage when measured. -> [B, 1, Hq, d]."""
    selector = cache.selector(layer_idx)
    length = cache.static_length
    q = query[:, :, 0].detach()
    if cache.static_host_step:  # outside any graph: e.g. LOCKS summarizes the page this step completes
        cache.static_host_work(layer_idx, keys, values)
    sel = selector.select_static(q, keys, values, length)
    triton = cache.backend == "triton"
    B, Hq = q.shape[:2]
    C = keys.shape[2]
    lse = None
    if sel.dense:
        if triton:
            from locks.kernels import full_decode

            out, lse = full_decode(q, keys, values, scaling, length=length)
            out, _ = add_sinks(out, lse, sinks)
        elif sinks is not None:
            out = dense_attention(q.unsqueeze(2), keys, values, valid_slots(length, C), scaling, sinks)[0][:, 0]
        else:
            out = masked_dense_decode(q, keys, values, length, scaling)
    else:
        out, lse = attend(q, keys, values, sel, scaling, cache.backend, length)
        out, lse_sink = add_sinks(out, lse, sinks)
    if cache.infos[layer_idx].sliding_window is not None:  # a sliding layer: counted on the host, no coverage
        return out.unsqueeze(1)
    # accounting per row (cache.static_* [layers, B]): attended tokens are means over the row's KV heads
    if not sel.attended_on_host and cache.device_accounting:
        if sel.dense:
            attended = length.to(torch.float64).expand(B)
        else:
            attended = attended_mean(sel, length, C)
        cache.static_attended[layer_idx].add_(attended)
        if sel.kv_bytes is None:  # else the selector's static_step_cost names the step's K/V bytes
            cache.static_bytes[layer_idx, :, 1].add_(attended * cache.infos[layer_idx].token_kv_bytes)
    if sel.device_bytes is not None and cache.device_accounting:
        cache.static_bytes[layer_idx].add_(sel.device_bytes)
    if cache.measure_coverage:
        # backend triton: coverage and a page selector's certificate in two launches (locks/kernels/coverage.py)
        certificate = getattr(sel.diagnostics, "kernel_inputs", None)
        if triton and not sel.dense and (sel.diagnostics is None or (
                certificate is not None and selector.diagnostic_names == CERTIFICATE_NAMES)):
            from locks.kernels.coverage import coverage_step

            coverage_step(q, keys, length, scaling, lse, sinks, cache.static_coverage[layer_idx], certificate,
                          cache.static_diagnostics[layer_idx])
            return out.unsqueeze(1)
        if sel.dense:
            coverage = torch.full((B,), float(Hq), dtype=torch.float64, device=q.device)
        else:
            alive = valid_slots(length, C)[:, :, 0].expand(B, keys.shape[1], -1)
            per_head = torch.exp(lse_sink - lse_with_sinks(dense_lse(q, keys, scaling, alive), sinks))  # [B, Hq]
            coverage = per_head.sum(-1).to(torch.float64)
        cache.static_coverage[layer_idx].add_(coverage)
        if sel.diagnostics is not None and lse is not None:
            diagnostics = sel.diagnostics(lse, per_row=True)
            if hasattr(sel.diagnostics, "soundness"):
                diagnostics = {**diagnostics, **sel.diagnostics.soundness(lse, per_head, per_row=True)}
            cache.add_static_diagnostics(layer_idx, diagnostics)
    return out.unsqueeze(1)
