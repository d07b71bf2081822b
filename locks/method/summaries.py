"""LOCKS page summaries: batched per-page rank-r SVD, 804 B/page quantization, page scores and bounds.

Reference definition: `docs/methods/locks.md`, sections A1-A8 (A2 construction, A3.2 folded scoring, A4 quantization,
A5.1 bounds, A6 batched Gram/eigh SVD, A7b layout). Shapes are per layer: keys `[B, H, L, d]` (H = KV heads), page
size n (power of two), rank r (0 <= r < n), P = L // n complete pages (the trailing partial page is ignored).
Query heads map to KV heads like HF `repeat_kv`: query head g belongs to KV head g // G, G = Hq // H.

Everything is computed in fp32; fp16/bf16/int only appear as storage formats. Construction runs in chunks of pages
with no Python loop over individual pages. Choices where the spec is silent are marked "[choice]".
"""
from __future__ import annotations

import math
from dataclasses import dataclass, fields

import torch
from torch import Tensor

from locks.core.paging import group_queries, page_slices

__all__ = [
    "PageSummaries",
    "QuantizedPageSummaries",
    "page_svd",
    "quantize",
    "build_summaries",
    "concat_summaries",
    "empty_summaries",
    "dequantize",
    "page_scores",
    "score_bound",
    "summary_bytes_per_page",
    "pack_int4",
    "unpack_int4",
    "TAU_REL",
    "TAU_ABS",
]

TAU_REL = 1e-3  # A6 step 4: keep column m iff sigma_m > max(TAU_REL * sigma_1, TAU_ABS * ||D||_F)
TAU_ABS = 1e-6
MU_QMAX = 127  # A4: int8 symmetric [-127, 127]
V_QMAX = 7  # A4: int4 symmetric [-7, 7]
C_QMAX = 127


@dataclass
class PageSummaries:
    """Unquantized (quant="none") fp32 summaries."""

    mu: Tensor  # [B,H,P,d]   page means
    v: Tensor  # [B,H,P,d,r] orthonormal columns (masked columns are zero)
    c: Tensor  # [B,H,P,n,r] coefficients C = D V
    rho: Tensor  # [B,H,P]     max_i ||k_i - (mu + V c_i)||_2 (evaluated in fp32)
    sigma: Tensor  # [B,H,P,n]   singular values of the centered page, descending
    head_mean: Tensor  # [B,H,d]     m_h (not used for scoring; kept so quantize/concat see the same value)

    @property
    def num_pages(self) -> int:
        return self.mu.shape[2]

    @property
    def page_size(self) -> int:
        return self.c.shape[3]

    @property
    def rank(self) -> int:
        return self.v.shape[4]


@dataclass
class QuantizedPageSummaries:
    """quant="int": the SoA layout of spec A4/A7b (804 B/page at d=128, r=8, n=16)."""

    mu_int: Tensor  # int8  [B,H,P,d]       mu^ = head_mean + mu_scale * mu_int
    mu_scale: Tensor  # fp16  [B,H,P]         a_j, rounded up to fp16
    head_mean: Tensor  # fp32  [B,H,d]         m_h
    v_pack: Tensor  # uint8 [B,H,P,r,d//2]  int4 Vint, column-major (row m = column m of V), low nibble = even c
    c_int: Tensor  # int8  [B,H,P,n,r]
    w: Tensor  # fp32  [B,H,P,r]       w_m = b_m * t_m (V column scale times C column scale)
    rho: Tensor  # fp16  [B,H,P]         rho^ = max_i ||k_i - k^_i||, rounded up to fp16

    @property
    def num_pages(self) -> int:
        return self.mu_int.shape[2]

    @property
    def page_size(self) -> int:
        return self.c_int.shape[3]

    @property
    def rank(self) -> int:
        return self.c_int.shape[4]

    def kernel_tensors(self) -> tuple[Tensor, ...]:
        """What the fused scoring kernels read (locks/method/kernels.py SUMMARY_TENSORS): all fields but rho."""
        return self.mu_int, self.mu_scale, self.head_mean, self.v_pack, self.c_int, self.w


Summaries = PageSummaries | QuantizedPageSummaries


# ----------------------------------------------------------------------------------------------------------------
# small helpers


def _check_page_rank(page_size: int, rank: int) -> None:
    if page_size < 1 or page_size & (page_size - 1):
        raise ValueError(f"page_size must be a power of two (got {page_size})")
    if not 0 <= rank < page_size:
        raise ValueError(f"rank must satisfy 0 <= rank < page_size={page_size} (got {rank})")


def _round_up(x: Tensor, dtype: torch.dtype) -> Tensor:
    """Cast x (higher precision) to `dtype`, rounding toward +inf (nextafter when round-to-nearest went down)."""
    y = x.to(dtype)
    below = y.to(x.dtype) < x
    return torch.where(below, torch.nextafter(y, torch.full_like(y, math.inf)), y)


def refit_coefficients(Wq: Tensor, DV: Tensor, zero_col: Tensor) -> Tensor:
    """C = D V^ (V^T V^)^-1 for quantized rows Wq [c, r, d] = V^T and DV = D @ Wq^T [c, n, r]. A 1 on the diagonal
    of masked (zero) columns (zero_col [c, r]) makes their coefficients exactly 0. Where the quantized rows are
    linearly dependent (low-bit V can round two columns to the same values), the page's system is singular and its
    C is the minimal-norm least-squares fit, D V^ pinv(V^T V^)."""
    if not Wq.shape[1]:
        return DV
    A = Wq @ Wq.mT + torch.diag_embed(zero_col.to(torch.float32))
    Cf, info = torch.linalg.solve_ex(A, DV.mT)
    Cf = Cf.mT
    singular = info != 0
    if bool(singular.any()):
        Cf[singular] = DV[singular] @ torch.linalg.pinv(A[singular], hermitian=True)
    return Cf


def _quant_sym(x: Tensor, qmax: int, dim: int) -> tuple[Tensor, Tensor, Tensor]:
    """Symmetric per-slice quantization along `dim`: scale = max|x|/qmax (fp32), q = clip(round_half_even(x/scale)).

    Zero scale => scale 1 and zeros. Returns (q as int8, scale, zero-slice mask), `dim` kept as size 1.
    """
    scale = x.abs().amax(dim=dim, keepdim=True) / qmax
    zero = scale == 0
    scale = torch.where(zero, torch.ones_like(scale), scale)
    q = torch.round(x / scale).clamp_(-qmax, qmax).to(torch.int8)
    return q, scale, zero


# ----------------------------------------------------------------------------------------------------------------
# int4 packing


def pack_int4(x: Tensor, dim: int = -1, check: bool = True) -> Tensor:
    """Pack int8 values in [-8, 7] (the quantizer uses [-7, 7]) two per byte along `dim` (even length).

    Element 2i goes to the low nibble, element 2i+1 to the high nibble (4-bit two's complement). check=False skips
    the range check (a device sync), for callers whose values are clipped by construction."""
    if x.dtype != torch.int8:
        raise TypeError(f"pack_int4 expects int8 (got {x.dtype})")
    x = x.movedim(dim, -1)
    if x.shape[-1] % 2:
        raise ValueError(f"pack_int4 needs an even length along dim (got {x.shape[-1]})")
    if check and x.numel() and (int(x.min()) < -8 or int(x.max()) > 7):
        raise ValueError("pack_int4 values must lie in [-8, 7]")
    x16 = x.to(torch.int16) & 0xF
    packed = (x16[..., 0::2] | (x16[..., 1::2] << 4)).to(torch.uint8)
    return packed.movedim(-1, dim)


def unpack_int4(p: Tensor, dim: int = -1) -> Tensor:
    """Inverse of pack_int4: uint8 [..., m, ...] -> int8 [..., 2m, ...] along `dim`. On the bytes read as int8,
    the low nibble sign-extended is (x << 4) >> 4 and the high one x >> 4 (arithmetic shifts)."""
    if p.dtype != torch.uint8:
        raise TypeError(f"unpack_int4 expects uint8 (got {p.dtype})")
    x = p.movedim(dim, -1).view(torch.int8)
    nib = torch.stack(((x << 4) >> 4, x >> 4), dim=-1).flatten(-2)
    return nib.movedim(-1, dim)


# ----------------------------------------------------------------------------------------------------------------
# construction
#
# All per-page work runs on the pages flattened to [N, n, d] (N = B*H*P) in chunks of pages: on CPU, chunks keep the
# [chunk, n, d] temporaries in cache and avoid the page faults of 30+ MB allocations (3-5x faster than one batch);
# on GPU a chunk bounds the temporaries. Results do not depend on the chunking (every op is per page).

_CHUNK_CPU = 512
_CHUNK_GPU = 32768


def _chunk(device: torch.device) -> int:
    return _CHUNK_CPU if device.type == "cpu" else _CHUNK_GPU


def _eigh_vectors(G: Tensor) -> Tensor:
    """Eigenvectors of a batch of symmetric matrices (ascending eigenvalues), [N, n, n].

    [choice] One batched call. (Splitting the CPU batch over Python threads halves its time on an idle machine but
    leaves MKL's OpenMP state such that later small LAPACK calls of the whole process run ~2x slower, so no.)"""
    return torch.linalg.eigh(G)[1]


def _gram_schmidt(W: Tensor, keep: Tensor) -> Tensor:
    """Two-pass classical Gram-Schmidt over the r rows of W [N, r, d] (rows = columns of V); masked or
    (numerically) dependent rows become zero. Fallback for the rare pages where Cholesky-QR is not safe."""
    Q = torch.zeros_like(W)
    for m in range(W.shape[-2]):
        row = W[:, m]
        if m:
            prev = Q[:, :m]
            for _ in range(2):
                row = row - ((prev @ row.unsqueeze(-1)).mT @ prev).squeeze(-2)
        nrm = torch.linalg.vector_norm(row, dim=-1, keepdim=True)
        ok = keep[:, m : m + 1] & (nrm > 1e-2)
        Q[:, m] = torch.where(ok, row / torch.where(ok, nrm, 1.0), 0.0)
    return Q


def _orthonormalize(W: Tensor, keep: Tensor) -> Tensor:
    """Re-orthonormalize the kept rows of W [N, r, d] (the columns of V, stored row-major; A6 step 5).

    Cholesky-QR (R = chol(W W^T), Q = R^-1 W) gives the same result as Gram-Schmidt; the rows of W are already
    orthonormal up to ~eps*sigma_1^2/(sigma_m sigma_k) <= ~0.1 thanks to the rank mask, so one pass is accurate.
    Masked rows are zero in W; a 1 on their diagonal keeps them zero. Pages where the factorization fails or a kept
    row is nearly dependent (R_mm <= 1e-2) go through the Gram-Schmidt fallback, which masks such rows."""
    r = W.shape[-2]
    if r == 0:
        return W
    A = W @ W.mT + torch.diag_embed((~keep).to(W.dtype))
    L, info = torch.linalg.cholesky_ex(A)
    eye = torch.eye(r, dtype=W.dtype, device=W.device).expand_as(A)
    Linv = torch.linalg.solve_triangular(L, eye, upper=False)
    Q = Linv @ W
    bad = (info != 0) | (keep & ~(L.diagonal(dim1=-2, dim2=-1) > 1e-2)).any(-1)
    if bool(bad.any()):
        idx = bad.nonzero().squeeze(-1)
        Q[idx] = _gram_schmidt(W[idx], keep[idx])
    return Q


def _flat_pages(keys: Tensor, page_size: int) -> tuple[Tensor, tuple[int, int, int, int]]:
    """[B,H,L,d] -> complete pages [B*H*P, n, d] (original dtype; a view when possible), and (B, H, P, d)."""
    if keys.dim() != 4:
        raise ValueError(f"keys must be [B, H, L, d] (got shape {tuple(keys.shape)})")
    B, H, L, d = keys.shape
    P = L // page_size
    return keys[:, :, : P * page_size].reshape(B * H * P, page_size, d), (B, H, P, d)


def _summarize(keys: Tensor, n: int, r: int, quant: str, head_mean: Tensor | None, layout=None) -> Summaries:
    """Shared driver of page_svd / build_summaries (A6, then A4 per chunk when quant == "int").

    Pass 1 computes the means and Gram matrices, one batched eigh follows, pass 2 computes V (and either C, rho,
    sigma or the quantized fields). For quant="int" the unquantized C/rho/sigma are not materialized; the result is
    bitwise identical to quantize(page_svd(keys), keys, head_mean) (same per-chunk code, tested). A non-default
    `layout` (locks/method/layouts.py SummaryLayout) quantizes each chunk its own way (its empty / quantize_chunk /
    result) after the same construction.
    """
    _check_page_rank(n, r)
    flat, (B, H, P, d) = _flat_pages(keys, n)
    if layout is not None:
        layout.check(d, n)
    elif quant == "int" and d % 2:
        raise ValueError(f"head dim must be even for int4 packing (got {d})")
    N = B * H * P
    dev = keys.device
    f32 = torch.float32
    ch = _chunk(dev)

    mu = torch.empty(N, d, dtype=f32, device=dev)
    gram = torch.empty(N, n, n, dtype=f32, device=dev)
    # pass 1: means and Gram matrices (A6 steps 1-2; fp32, never bf16/fp16).
    for i in range(0, N, ch):
        X = flat[i : i + ch].to(f32)
        m = X.mean(dim=1)
        D = X - m.unsqueeze(1)
        mu[i : i + ch] = m
        torch.bmm(D, D.mT, out=gram[i : i + ch])
    # step 3: scale each Gram by 1/||D||_F^2 (scale-free tolerances), batched eigh, descending order.
    fro = gram.diagonal(dim1=-2, dim2=-1).sum(-1).clamp_(min=0).sqrt_()  # ||D||_F per page
    gram /= torch.where(fro > 0, fro * fro, 1.0)[:, None, None]
    Ut = _eigh_vectors(gram).flip(-1).mT.contiguous() if N else gram  # rows = eigenvectors, descending eigenvalues
    del gram

    mu5 = mu.reshape(B, H, P, d)
    if head_mean is None:
        m_h = mu5.mean(dim=2) if P else torch.zeros(B, H, d, dtype=f32, device=dev)
    else:
        m_h = head_mean.to(device=dev, dtype=f32).expand(B, H, d).contiguous()
    if quant == "int":
        out = _empty_quant(N, n, r, d, dev) if layout is None else layout.empty(N, n, r, d, dev)
        mh_idx = torch.arange(B * H, device=dev).repeat_interleave(P)  # page -> (b, h) row of head_mean
        mh_flat = m_h.reshape(B * H, d)
    else:
        V = torch.empty(N, d, r, dtype=f32, device=dev)
        C = torch.empty(N, n, r, dtype=f32, device=dev)
        rho = torch.empty(N, dtype=f32, device=dev)
        sigma = torch.empty(N, n, dtype=f32, device=dev)

    # pass 2: sigma, rank mask, V (row-major W = V^T, [c, r, d]), then C and rho, or the quantized fields.
    for i in range(0, N, ch):
        X = flat[i : i + ch].to(f32)
        D = X - mu[i : i + ch].unsqueeze(1)
        # [choice] sigma_m = ||D^T u_m|| rather than sqrt(lambda_m): same cost as the Gram product, but its error is
        # ~eps*sigma_1 instead of ~sqrt(eps)*sigma_1, so small singular values and the rank mask are accurate.
        Y = Ut[i : i + ch] @ D  # [c, n, d]; row m = sigma_m * (right singular vector m)
        sig = torch.linalg.vector_norm(Y, dim=-1)  # [c, n], eigh order
        sig_r = sig[:, :r]
        # A6 step 4: keep column m iff sigma_m > max(tau_rel * sigma_1, tau_abs * ||D||_F).
        thresh = torch.maximum(TAU_REL * sig.amax(dim=-1), TAU_ABS * fro[i : i + ch])
        keep = sig_r > thresh.unsqueeze(-1)  # [c, r]
        W = Y[:, :r] * torch.where(keep, 1.0 / sig_r, 0.0).unsqueeze(-1)  # V^T = diag(1/sigma_r) U_r^T D
        W = _orthonormalize(W, keep)
        # sign canonicalization: the largest-|entry| of each column of V is positive (zero columns untouched).
        big = torch.gather(W, 2, W.abs().argmax(dim=2, keepdim=True))  # [c, r, 1]
        W = W * torch.where(big < 0, -1.0, 1.0)
        if quant == "int":
            quantize_chunk = _quantize_chunk if layout is None else layout.quantize_chunk
            quantize_chunk(out, i, X, D, mu[i : i + ch], W, mh_flat[mh_idx[i : i + ch]])
            continue
        # Reported sigma is sorted descending; V's columns keep eigh's order, which can differ from the sorted order
        # only between numerically tied singular values (where either choice is an equally valid basis).
        sigma[i : i + ch] = torch.sort(sig, dim=-1, descending=True).values
        Cc = D @ W.mT
        # rho = max_i ||D_i - C_i V^T||, evaluated in fp32 (equals the exact residual of the stored fp32 mu, V, C
        # up to ~1e-7 ||D_i||; no extra margin so that rho <= sigma_{r+1} stays testable at 1e-5).
        R = torch.baddbmm(D, Cc, W, alpha=-1.0)
        rho[i : i + ch] = torch.linalg.vector_norm(R, dim=-1).amax(dim=-1)
        V[i : i + ch] = W.mT
        C[i : i + ch] = Cc

    if quant == "int":
        return _quant_result(out, m_h, B, H, P) if layout is None else layout.result(out, m_h, B, H, P)
    return PageSummaries(mu=mu5, v=V.reshape(B, H, P, d, r), c=C.reshape(B, H, P, n, r), rho=rho.reshape(B, H, P),
                         sigma=sigma.reshape(B, H, P, n), head_mean=m_h)


def page_svd(keys: Tensor, page_size: int = 16, rank: int = 8) -> PageSummaries:
    """Batched per-page rank-r SVD of the centered pages via the n x n Gram matrix and batched eigh (spec A6).

    No loop over pages (only over chunks of pages and, in the rare Gram-Schmidt fallback, over the r columns).
    head_mean = mean of mu over the pages (zeros if P == 0).
    """
    return _summarize(keys, page_size, rank, "none", None)


def _dequant_parts(mu_int, mu_scale, m_h, vint_rows, c_int, w):
    """Shared by quantize (for rho^) and dequantize so both see bitwise-identical tensors.

    vint_rows: int8 [..., r, d] (unpacked v_pack). Returns fp32 mu_hat [..., d], v_hat [..., d, r], c_hat [..., n, r].
    """
    mu_hat = m_h + mu_scale.float().unsqueeze(-1) * mu_int.float()
    vr = vint_rows.float()
    nv = torch.linalg.vector_norm(vr, dim=-1)  # [..., r]; exact: sqrt of a small integer
    v_hat = (vr / torch.where(nv > 0, nv, 1.0).unsqueeze(-1)).mT
    c_hat = c_int.float() * (w * nv).unsqueeze(-2)
    return mu_hat, v_hat, c_hat


def _empty_quant(N: int, n: int, r: int, d: int, dev) -> dict:
    return dict(
        mu_int=torch.empty(N, d, dtype=torch.int8, device=dev),
        mu_scale=torch.empty(N, dtype=torch.float16, device=dev),
        v_pack=torch.empty(N, r, d // 2, dtype=torch.uint8, device=dev),
        c_int=torch.empty(N, n, r, dtype=torch.int8, device=dev),
        w=torch.empty(N, r, dtype=torch.float32, device=dev),
        rho=torch.empty(N, dtype=torch.float16, device=dev),
    )


def _quant_result(out: dict, m_h: Tensor, B: int, H: int, P: int) -> QuantizedPageSummaries:
    return QuantizedPageSummaries(head_mean=m_h, **{k: t.reshape(B, H, P, *t.shape[1:]) for k, t in out.items()})


def _quantize_chunk(out: dict, i: int, X: Tensor, D: Tensor, mu: Tensor, W: Tensor, mh: Tensor) -> None:
    """A4 quantization of one chunk of pages, written into out[...][i : i + c].

    X [c,n,d] fp32 keys, D = X - mu, mu [c,d], W [c,r,d] = V^T (orthonormal rows, masked rows zero), mh [c,d]."""
    c, n, d = X.shape
    r = W.shape[1]
    f32 = torch.float32
    u = torch.finfo(f32).eps / 2  # unit roundoff
    sl = slice(i, i + c)
    # mu: a = max|mu - m_h| / 127 rounded UP to fp16, so |mu - m_h| / a <= 127 (clipping never triggers and the
    # round-trip error stays <= a/2 for the stored scale). Zero scale => 1 and zeros.
    # [choice] |mu - m_h| > 127 * 65504 would overflow the fp16 scale; post-RoPE keys are nowhere near that.
    delta = mu - mh
    a = delta.abs().amax(dim=-1) / MU_QMAX
    a16 = torch.where(a > 0, _round_up(a, torch.float16), torch.ones_like(a, dtype=torch.float16))
    mi = torch.round(delta / a16.float().unsqueeze(-1)).clamp_(-MU_QMAX, MU_QMAX).to(torch.int8)

    # V: int4 per column m (scale b_m over the d channels), row-major [c, r, d] = the v_pack layout.
    vrows, b, zero_col = _quant_sym(W, V_QMAX, dim=-1)  # b [c, r, 1]; zero_col: masked columns
    Wq = vrows.float() * b  # V^ transposed

    # C refit against V^: C = D V^ (V^T V^)^-1; a 1 on the diagonal of masked (zero) columns makes their
    # coefficients exactly 0 and keeps the r x r system regular.
    DV = D @ Wq.mT  # [c, n, r]
    Cf = refit_coefficients(Wq, DV, zero_col.squeeze(-1))
    ci, t, _ = _quant_sym(Cf, C_QMAX, dim=-2)  # t [c, 1, r]
    wc = b.squeeze(-1) * t.squeeze(-2)

    # rho^ = max_i ||k_i - k^_i|| on exactly the tensors dequantize() returns. The fp32 evaluation error is bounded
    # (first order) by u||E_i|| + r u sum_m |c^_im| (unit v^ columns) + (d+2) u ||R_i||; twice that is added before
    # rounding up to fp16, so rho^ is an upper bound of the exact residual of the stored summary.
    mu_hat, v_hat, c_hat = _dequant_parts(mi, a16, mh, vrows, ci, wc)
    E = X - mu_hat.unsqueeze(1)
    R = torch.baddbmm(E, c_hat, v_hat.mT, alpha=-1.0)
    rn = torch.linalg.vector_norm(R, dim=-1)
    margin = 2 * u * (torch.linalg.vector_norm(E, dim=-1) + (r + 1) * c_hat.abs().sum(-1) + (d + 2) * rn)

    out["rho"][sl] = _round_up((rn + margin).amax(dim=-1), torch.float16)
    out["mu_int"][sl] = mi
    out["mu_scale"][sl] = a16
    out["v_pack"][sl] = pack_int4(vrows, dim=-1, check=False)
    out["c_int"][sl] = ci
    out["w"][sl] = wc


def quantize(s: PageSummaries, keys: Tensor, head_mean: Tensor) -> QuantizedPageSummaries:
    """Quantize unquantized summaries to the A4 layout.

    mu: int8 delta to head_mean with an fp16 per-page scale; V: int4 per column (scale b_m folded into w);
    C: refit against the dequantized V (C = D V^ (V^T V^)^-1, D = K - 1 mu^T), then int8 per column (scale t_m
    folded into w); rho^: measured on the dequantized reconstruction, rounded up to fp16.
    """
    n, r = s.page_size, s.rank
    flat, (B, H, P, d) = _flat_pages(keys, n)
    if P != s.num_pages or tuple(s.mu.shape[:2]) != (B, H):
        raise ValueError(f"keys hold {B}x{H}x{P} complete pages but the summaries have {tuple(s.mu.shape[:3])}")
    if d % 2:
        raise ValueError(f"head dim must be even for int4 packing (got {d})")
    N = B * H * P
    dev = keys.device
    m_h = head_mean.to(device=dev, dtype=torch.float32).expand(B, H, d).contiguous()
    mu_all = s.mu.reshape(N, d)
    v_all = s.v.reshape(N, d, r)
    mh_idx = torch.arange(B * H, device=dev).repeat_interleave(P)
    mh_flat = m_h.reshape(B * H, d)
    out = _empty_quant(N, n, r, d, dev)
    ch = _chunk(dev)
    for i in range(0, N, ch):
        X = flat[i : i + ch].to(torch.float32)
        mu = mu_all[i : i + ch]
        D = X - mu.unsqueeze(1)
        _quantize_chunk(out, i, X, D, mu, v_all[i : i + ch].mT.contiguous(), mh_flat[mh_idx[i : i + ch]])
    return _quant_result(out, m_h, B, H, P)


def build_summaries(keys: Tensor, page_size: int = 16, rank: int = 8, quant: str = "int",
                    head_mean: Tensor | None = None, layout=None) -> Summaries:
    """Summaries of the complete pages of `keys` [B,H,L,d] (a pure, deterministic function of its inputs).

    head_mean=None -> m_h = mean of mu over the pages given (zeros if P == 0). Decode-time pages must pass the
    prefill head_mean so that they are quantized against the same m_h (and can be concatenated). With
    quant="none" head_mean is only stored. `layout` (a locks.method.layouts.SummaryLayout, quant="int" only): None
    or the default gives QuantizedPageSummaries, any other layout LayoutSummaries.
    """
    if quant not in ("int", "none"):
        raise ValueError(f"quant must be 'int' or 'none' (got {quant!r})")
    if layout is not None and layout.is_default:
        layout = None
    if layout is not None and quant != "int":
        raise ValueError("a summary layout quantizes: it needs quant='int'")
    return _summarize(keys, page_size, rank, quant, head_mean, layout)


def empty_summaries(B: int, H: int, d: int, page_size: int = 16, rank: int = 8, quant: str = "int",
                    device=None, layout=None) -> Summaries:
    """P = 0 summaries of the right type (head_mean zeros)."""
    _check_page_rank(page_size, rank)
    return build_summaries(torch.zeros(B, H, 0, d, device=device), page_size, rank, quant, layout=layout)


def concat_summaries(a: Summaries, b: Summaries) -> Summaries:
    """Pages of b appended after the pages of a (same type). Returns a new object.

    [choice] head_mean: if a has no pages, b's head_mean is used; otherwise a's. For the quantized type the two
    must be equal (mu_int of b would be decoded against the wrong m_h otherwise) or ValueError is raised.
    """
    if type(a) is not type(b):
        raise TypeError(f"cannot concatenate {type(a).__name__} and {type(b).__name__}")
    if a.num_pages == 0:
        head_mean = b.head_mean
    else:
        head_mean = a.head_mean
        if b.num_pages and isinstance(a, QuantizedPageSummaries) and not torch.equal(a.head_mean, b.head_mean):
            raise ValueError("concat_summaries: quantized summaries built with different head means")
    if getattr(a, "layout", None) != getattr(b, "layout", None):
        raise ValueError("concat_summaries: summaries of different layouts")
    out = {}
    for f in fields(a):
        x = getattr(a, f.name)
        if f.name == "head_mean":
            out[f.name] = head_mean
        elif not isinstance(x, Tensor):  # a layout
            out[f.name] = x
        else:
            out[f.name] = torch.cat((x, getattr(b, f.name)), dim=2)
    return type(a)(**out)


def preallocate_summaries(s: Summaries, pages: int) -> Summaries:
    """`s` zero-padded along the page axis to `pages` pages (same type and head_mean): the fixed-size storage of a
    static decode, whose later pages `write_summaries` fills in place."""
    if pages < s.num_pages:
        raise ValueError(f"cannot preallocate {pages} pages for summaries that already hold {s.num_pages}")
    out = {}
    for f in fields(s):
        x = getattr(s, f.name)
        if f.name != "head_mean" and isinstance(x, Tensor):
            buf = x.new_zeros(*x.shape[:2], pages, *x.shape[3:])
            buf[:, :, : x.shape[2]] = x
            x = buf
        out[f.name] = x
    return type(s)(**out)


def write_summaries(dst: Summaries, src: Summaries, start: int) -> None:
    """Copy the pages of `src` into `dst` at pages [start, start + src.num_pages), in place (same head_mean)."""
    if type(dst) is not type(src):
        raise TypeError(f"cannot write {type(src).__name__} into {type(dst).__name__}")
    for f in fields(dst):
        if f.name != "head_mean" and isinstance(getattr(dst, f.name), Tensor):
            getattr(dst, f.name)[:, :, start : start + src.num_pages] = getattr(src, f.name)


def dequantize(s: QuantizedPageSummaries) -> tuple[Tensor, Tensor, Tensor]:
    """(mu_hat [B,H,P,d], v_hat [B,H,P,d,r], c_hat [B,H,P,n,r]) fp32 with k^_i = mu_hat + v_hat @ c_hat_i.

    [choice] Only the product w_m = b_m t_m is stored, so V^ and C^ are known up to a per-column factor. We return
    v_hat with unit-norm columns (Vint_m / ||Vint_m||, i.e. V^ up to its ~1 norm) and put the rest of the scale into
    c_hat = Cint * w * ||Vint_m||. The reconstruction v_hat c_hat equals Vint diag(w) Cint (fp32 rounding).
    """
    return _dequant_parts(s.mu_int, s.mu_scale, s.head_mean.unsqueeze(2), unpack_int4(s.v_pack, dim=-1), s.c_int, s.w)


# ----------------------------------------------------------------------------------------------------------------
# scoring


def page_scores(q: Tensor, s: Summaries, scaling: float) -> Tensor:
    """S [B,Hq,P] fp32: S_{g,j} = logsumexp_i scaling * q_g . k^_i over the n tokens of page j.

    Unquantized: proxy logit q.mu + (V^T q).c_i. Quantized: the folded dequantization of A3.2, u = q . Vint
    (int4 values, no per-element scale), proxy logit q.m_h + a_j (q.mu_int) + sum_m w_m u_m Cint[i,m].
    Pages are processed in slices (bounded temporaries at long context).
    """
    B, Hq, d = q.shape
    if isinstance(s, PageSummaries):
        H, P, n, r = s.mu.shape[1], s.num_pages, s.page_size, s.rank
    elif isinstance(s, QuantizedPageSummaries):
        H, P, n, r = s.mu_int.shape[1], s.num_pages, s.page_size, s.rank
        q_mh = None
    elif hasattr(s, "layout"):  # locks/method/layouts.py LayoutSummaries: scored on its dequantized mu^, V^, C^
        H, P, n, r = s.mu_q.shape[1], s.num_pages, s.page_size, s.rank
    else:
        raise TypeError(f"unknown summaries type {type(s).__name__}")
    qg = group_queries(q, H)  # [B,H,G,d]
    out = torch.empty(B, H, qg.shape[2], P, dtype=torch.float32, device=q.device)
    for sl in page_slices(P, B * H * (r * d + qg.shape[2] * n), q.device):
        if isinstance(s, PageSummaries):
            u = torch.einsum("bhgd,bhpdr->bhgpr", qg, s.v[:, :, sl])
            mu_term = torch.einsum("bhgd,bhpd->bhgp", qg, s.mu[:, :, sl])
            low = torch.einsum("bhgpr,bhpnr->bhgpn", u, s.c[:, :, sl])
        elif not isinstance(s, QuantizedPageSummaries):
            mu_hat, v_hat, c_hat = s.dequantize(sl)
            u = torch.einsum("bhgd,bhpdr->bhgpr", qg, v_hat)
            mu_term = torch.einsum("bhgd,bhpd->bhgp", qg, mu_hat)
            low = torch.einsum("bhgpr,bhpnr->bhgpn", u, c_hat)
        else:
            if q_mh is None:
                q_mh = torch.einsum("bhgd,bhd->bhg", qg, s.head_mean)  # once per head per step
            vint = unpack_int4(s.v_pack[:, :, sl], dim=-1).float()  # [B,H,p,r,d]
            u = torch.einsum("bhgd,bhprd->bhgpr", qg, vint) * s.w[:, :, sl].unsqueeze(2)
            q_mu = torch.einsum("bhgd,bhpd->bhgp", qg, s.mu_int[:, :, sl].float())
            mu_term = q_mh.unsqueeze(-1) + s.mu_scale[:, :, sl].float().unsqueeze(2) * q_mu
            low = torch.einsum("bhgpr,bhpnr->bhgpn", u, s.c_int[:, :, sl].float())
        out[..., sl] = torch.logsumexp((mu_term.unsqueeze(-1) + low) * scaling, dim=-1)
    return out.reshape(B, Hq, P)


def score_bound(q: Tensor, s: Summaries, scaling: float) -> Tensor:
    """eta_bar [B,Hq,P] of A5.1 with |S_{g,j} - l_{g,j}| <= eta_bar_{g,j} (exact arithmetic).

    Unquantized: scaling * ||(I - V V^T) q|| * rho (||(I - V V^T) q||^2 = ||q||^2 - ||V^T q||^2, clamped at 0);
    quantized: scaling * ||q|| * rho^.
    """
    B, Hq, d = q.shape
    if isinstance(s, PageSummaries):
        qg = group_queries(q, s.mu.shape[1])
        B, H, G, _ = qg.shape
        q2 = (qg * qg).sum(-1).unsqueeze(-1)  # [B,H,G,1]
        eta = torch.empty(B, H, G, s.num_pages, dtype=torch.float32, device=q.device)
        for sl in page_slices(s.num_pages, B * H * s.rank * d, q.device):
            u = torch.einsum("bhgd,bhpdr->bhgpr", qg, s.v[:, :, sl])
            res2 = q2 - (u * u).sum(-1)  # [B,H,G,p]
            eta[..., sl] = scaling * res2.clamp(min=0).sqrt() * s.rho[:, :, sl].unsqueeze(2)
    elif isinstance(s, QuantizedPageSummaries) or hasattr(s, "layout"):  # rho^ bounds the stored reconstruction
        qg = group_queries(q, s.rho.shape[1])
        eta = scaling * torch.linalg.vector_norm(qg, dim=-1).unsqueeze(-1) * s.rho.float().unsqueeze(2)
    else:
        raise TypeError(f"unknown summaries type {type(s).__name__}")
    return eta.reshape(B, Hq, -1)


def summary_bytes_per_page(s: Summaries) -> int:
    """Bytes per page per (batch row, KV head): sum over the per-page fields (all but head_mean, amortized, and the
    diagnostic sigma, which scoring never reads) of nbytes / (B * H * P). 804 for the quantized layout at d=128,
    r=8, n=16.

    [choice] computed from the per-page shape (element size x trailing dims), which equals nbytes / (B*H*P) for
    P > 0 and stays defined for P = 0.
    """
    total = 0
    for f in fields(s):
        t = getattr(s, f.name)
        if f.name in ("head_mean", "sigma") or not isinstance(t, Tensor):
            continue
        total += t.element_size() * math.prod(t.shape[3:])
    return int(total)
