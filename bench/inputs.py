"""Benchmark inputs and checks: summaries in the exact quantized layout (random or built), Quest min/max, a chunked
fp32 dense reference, relative errors and page-set agreement up to ties."""
from __future__ import annotations

import torch

from locks.method.summaries import QuantizedPageSummaries, build_summaries


def random_summaries(B, H, P, d, rank, n, device, gen):
    """Random values in the exact quantized layout of locks.method.summaries (timing does not depend on the values)."""


    def ri(lo, hi, shape, dtype):
        return torch.randint(lo, hi, shape, generator=gen, device=device, dtype=dtype)

    def rf(shape):
        return torch.rand(shape, generator=gen, device=device)

    return QuantizedPageSummaries(
        mu_int=ri(-127, 128, (B, H, P, d), torch.int8),
        mu_scale=(rf((B, H, P)) * 0.02 + 0.005).half(),
        head_mean=torch.randn(B, H, d, generator=gen, device=device) * 0.5,
        v_pack=ri(0, 256, (B, H, P, rank, d // 2), torch.uint8),
        c_int=ri(-127, 128, (B, H, P, n, rank), torch.int8),
        w=rf((B, H, P, rank)) * 2e-3 + 1e-4,
        rho=(rf((B, H, P)) + 0.5).half(),
    )


def build_summaries_chunked(keys, n, rank, max_pages_per_call=32768):
    """locks.method.summaries.build_summaries over slices of pages (<= max_pages_per_call pages per eigh call, all heads)
    against the head mean of all complete pages; equal to one build_summaries call on the whole cache."""


    B, H, L, d = keys.shape
    P = L // n
    per = max(1, max_pages_per_call // (B * H))
    hm = torch.zeros(B, H, d, device=keys.device)
    for p0 in range(0, P, per):
        hm += keys[:, :, p0 * n:min(P, p0 + per) * n].float().sum(2)
    hm /= max(1, P * n)
    parts = [build_summaries(keys[:, :, p0 * n:min(P, p0 + per) * n], n, rank, "int", head_mean=hm)
             for p0 in range(0, P, per)]
    fields = ("mu_int", "mu_scale", "v_pack", "c_int", "w", "rho")
    return QuantizedPageSummaries(head_mean=hm, **{f: torch.cat([getattr(s, f) for s in parts], 2) for f in fields})


def quest_metadata(keys, n):
    """Per-page channel-wise max / min of the keys (the partial last page included), keys' dtype."""
    B, H, L, d = keys.shape
    full = L // n
    mx = keys[:, :, :full * n].view(B, H, full, n, d).amax(3)
    mn = keys[:, :, :full * n].view(B, H, full, n, d).amin(3)
    if L % n:
        mx = torch.cat([mx, keys[:, :, full * n:].amax(2, keepdim=True)], 2)
        mn = torch.cat([mn, keys[:, :, full * n:].amin(2, keepdim=True)], 2)
    return mx.contiguous(), mn.contiguous()


def clone_summaries(s):
    from dataclasses import fields

    return type(s)(**{f.name: getattr(s, f.name).clone() for f in fields(s)})


def summaries_bytes(s) -> int:
    from dataclasses import fields

    return sum(getattr(s, f.name).nbytes for f in fields(s))


def dense_reference(q, k, v, scaling, chunk=65536):
    """Exact fp32 attention of q [B, Hq, d] over all of k/v [B, Hkv, L, d], in chunks of tokens (bounded memory)."""
    B, Hq, d = q.shape
    H, L = k.shape[1], k.shape[2]
    qf = q.float().view(B, H, Hq // H, d)
    m = torch.full((B, H, Hq // H), float("-inf"), device=q.device)
    lsum = torch.zeros_like(m)
    acc = torch.zeros(B, H, Hq // H, d, device=q.device)
    for c0 in range(0, L, chunk):
        kc, vc = k[:, :, c0:c0 + chunk].float(), v[:, :, c0:c0 + chunk].float()
        s = torch.einsum("bhgd,bhld->bhgl", qf, kc) * scaling
        m_new = torch.maximum(m, s.amax(-1))
        alpha = torch.exp(m - m_new)
        p = torch.exp(s - m_new.unsqueeze(-1))
        lsum = lsum * alpha + p.sum(-1)
        acc = acc * alpha.unsqueeze(-1) + torch.einsum("bhgl,bhld->bhgd", p, vc)
        m = m_new
    return (acc / lsum.unsqueeze(-1)).reshape(B, Hq, d), (m + lsum.log()).reshape(B, Hq)


def rel_err(out, ref) -> float:
    out, ref = out.float(), ref.float()
    fin = torch.isfinite(ref)
    if not torch.equal(fin, torch.isfinite(out)):
        return float("inf")
    if not bool(fin.any()):
        return 0.0
    return float((out[fin] - ref[fin]).abs().max() / ref[fin].abs().max().clamp(min=1e-30))


def set_agreement(a, b, ref_scores, tol=1e-5) -> float:
    """Fraction of rows whose selected page sets are equal, counting as equal sets that differ only by pages whose
    reference score ties the k-th largest (within tol)."""
    k = a.shape[-1]
    a2 = a.reshape(-1, k).sort(-1).values.cpu()
    b2 = b.reshape(-1, k).sort(-1).values.cpu()
    sc = ref_scores.reshape(a2.shape[0], -1).float().cpu()
    kth = torch.topk(sc, k, dim=-1).values[:, -1]
    same = 0
    for r in range(a2.shape[0]):
        diff = set(a2[r].tolist()) ^ set(b2[r].tolist())
        if all(abs(float(sc[r, p] - kth[r])) <= tol * max(1.0, abs(float(kth[r]))) for p in diff):
            same += 1
    return same / max(1, a2.shape[0])


def rope_rotate(keys, positions, theta=500000.0, inverse=False):
    """Llama's rotary embedding (half-split layout, base `theta`) of keys [B, H, n, d] at positions [B, n]:
    k' = k cos(p w) + rot(k) sin(p w), w_i = theta^(-2i/d), rot(k) = (-k_hi, k_lo); inverse=True rotates back."""
    d = keys.shape[-1]
    inv_freq = theta ** (-torch.arange(0, d, 2, device=keys.device, dtype=torch.float32) / d)
    angle = positions.float()[..., None] * inv_freq  # [B, n, d/2]
    cos = torch.cat([angle.cos()] * 2, -1)[:, None]
    sin = torch.cat([angle.sin()] * 2, -1)[:, None] * (-1.0 if inverse else 1.0)
    k = keys.float()
    rotated = torch.cat([-k[..., d // 2:], k[..., : d // 2]], -1)
    return (k * cos + rotated * sin).to(keys.dtype)
