"""LOCKS summary layouts: every quantization choice of the summaries as a switch (docs/methods/locks.md, "Layouts").

The default layout is the one of `QuantizedPageSummaries` (A4, 804 B/page at d = 128, r = 8, n = 16): mu int8
around the head mean with an fp16 page scale, V int4 with one scale per column (folded into w), C int8 per column
refit against the quantized V, w fp32, rho fp16. `SummaryLayout` varies one choice at a time:

    v_bits     8 | 4 | 2    V's integer width, symmetric: q = round(x / scale) in [-(2^(b-1) - 1), 2^(b-1) - 1]
    v_group    0 | 32       0: one scale per column of V over its d channels (folded into w); 32: one fp16 scale per
                            column and group of 32 channels (stored, d / 32 per column)
    c_bits     8 | 4        C's integer width (per column over the page's n tokens), 4-bit packed along n
    mu_format  head_int8 | page_int8 | fp16
                            int8 around the head mean m_h (fp16 page scale); int8 around 0 (m_h = 0); fp16 values
    w_dtype    fp32 | fp16  the per-column factor w_m (V scale x C scale, or the C scale alone with v_group = 32)

A non-default layout builds `LayoutSummaries` with the same construction (`build_summaries(..., layout=...)`: the
same SVD, the same C refit against the quantized V, rho measured on the dequantized reconstruction and rounded up)
and is scored by the PyTorch reference (`page_scores` on the dequantized mu^, V^, C^; the fused kernels read the
default layout only). Its bytes per page are those of the tensors it stores (`summary_bytes_per_page`).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, fields

import torch
from torch import Tensor

from locks.errors import ConfigError
from locks.method.summaries import _quant_sym, _round_up, pack_int4, refit_coefficients, unpack_int4

V_BITS = (8, 4, 2)
V_GROUPS = (0, 32)
C_BITS = (8, 4)
MU_FORMATS = ("head_int8", "page_int8", "fp16")
W_DTYPES = ("fp32", "fp16")


@dataclass(frozen=True)
class SummaryLayout:
    v_bits: int = 4
    v_group: int = 0
    c_bits: int = 8
    mu_format: str = "head_int8"
    w_dtype: str = "fp32"

    def __post_init__(self):
        for key, value, allowed in (("v_bits", self.v_bits, V_BITS), ("v_group", self.v_group, V_GROUPS),
                                    ("c_bits", self.c_bits, C_BITS), ("mu_format", self.mu_format, MU_FORMATS),
                                    ("w_dtype", self.w_dtype, W_DTYPES)):
            if isinstance(value, bool) or value not in allowed:
                raise ConfigError(f"method.{key} must be one of {allowed} (got {value!r})")

    @property
    def is_default(self) -> bool:
        return self == SummaryLayout()

    @property
    def name(self) -> str:
        """e.g. 'v4c8-head_int8-w32' (per-column V) or 'v2g32c4-fp16-w16'."""
        group = f"g{self.v_group}" if self.v_group else ""
        return f"v{self.v_bits}{group}c{self.c_bits}-{self.mu_format}-w{self.w_dtype[2:]}"

    def check(self, head_dim: int, page_size: int) -> None:
        """A one-line error for a layout this head dim / page size cannot hold."""
        per_byte = 8 // self.v_bits
        if head_dim % per_byte:
            raise ConfigError(f"method.v_bits={self.v_bits} packs {per_byte} channels per byte: head_dim {head_dim} "
                              f"is not a multiple of {per_byte}")
        if self.v_group and head_dim % self.v_group:
            raise ConfigError(f"method.v_group={self.v_group} needs a head_dim divisible by it (got {head_dim})")
        if self.c_bits == 4 and page_size % 2:
            raise ConfigError(f"method.c_bits=4 packs two tokens per byte: page_size {page_size} must be even")

    # ----- what the construction of `locks.method.summaries` calls for a non-default layout ----------------------

    def empty(self, N: int, n: int, r: int, d: int, device) -> dict:
        """Storage of N pages (flattened), per field."""
        groups = d // self.v_group if self.v_group else 0
        mu_dtype = torch.float16 if self.mu_format == "fp16" else torch.int8
        return dict(
            mu_q=torch.empty(N, d, dtype=mu_dtype, device=device),
            mu_scale=torch.empty(N, 0 if self.mu_format == "fp16" else 1, dtype=torch.float16, device=device),
            v_pack=torch.empty(N, r, d * self.v_bits // 8, dtype=torch.uint8, device=device),
            v_scale=torch.empty(N, r, groups, dtype=torch.float16, device=device),
            c_q=torch.empty(N, n * self.c_bits // 8, r, dtype=torch.uint8, device=device),
            w=torch.empty(N, r, dtype=_dtype(self.w_dtype), device=device),
            rho=torch.empty(N, dtype=torch.float16, device=device),
        )

    def quantize_chunk(self, out: dict, i: int, X: Tensor, D: Tensor, mu: Tensor, W: Tensor, mh: Tensor) -> None:
        """Quantize one chunk of pages into out[...][i : i + c] (X [c,n,d] fp32 keys, D = X - mu, W [c,r,d] = V^T
        with orthonormal rows, mh [c,d] the head mean; the same steps as the default layout's A4)."""
        c, n, d = X.shape
        r = W.shape[1]
        sl = slice(i, i + c)
        if self.mu_format == "fp16":
            mq, a16 = mu.to(torch.float16), None
        else:
            delta = mu - mh if self.mu_format == "head_int8" else mu
            a = delta.abs().amax(dim=-1) / 127
            a16 = torch.where(a > 0, _round_up(a, torch.float16), torch.ones_like(a, dtype=torch.float16))
            mq = torch.round(delta / a16.float().unsqueeze(-1)).clamp_(-127, 127).to(torch.int8)
        vmax = 2 ** (self.v_bits - 1) - 1
        if self.v_group:  # one fp16 scale per (column, group of v_group channels)
            Wg = W.view(c, r, d // self.v_group, self.v_group)
            scale = Wg.abs().amax(-1, keepdim=True) / vmax
            s16 = torch.where(scale > 0, _round_up(scale, torch.float16), torch.ones_like(scale, dtype=torch.float16))
            vrows = torch.round(Wg / s16.float()).clamp_(-vmax, vmax).to(torch.int8).view(c, r, d)
            vs = s16.squeeze(-1)
            b = None
        else:
            vrows, b, _ = _quant_sym(W, vmax, dim=-1)  # b [c, r, 1], folded into w
            vs = W.new_empty(c, r, 0, dtype=torch.float16)
        Wq = _v_rows(vrows, vs, self.v_group) * (1.0 if b is None else b)  # V^ transposed [c, r, d]
        DV = D @ Wq.mT
        Cf = refit_coefficients(Wq, DV, Wq.abs().amax(-1) == 0)  # zero: masked or quantized-to-zero columns
        cmax = 2 ** (self.c_bits - 1) - 1
        ci, t, _ = _quant_sym(Cf, cmax, dim=-2)  # t [c, 1, r]
        wc = (t.squeeze(-2) if b is None else b.squeeze(-1) * t.squeeze(-2)).to(_dtype(self.w_dtype))
        out["mu_q"][sl] = mq
        if a16 is not None:
            out["mu_scale"][sl] = a16.unsqueeze(-1)
        out["v_pack"][sl] = _pack(vrows, self.v_bits, dim=-1)
        out["v_scale"][sl] = vs
        out["c_q"][sl] = ci.view(torch.uint8) if self.c_bits == 8 else pack_int4(ci, dim=-2, check=False)
        out["w"][sl] = wc
        # rho^ on the stored tensors, with the default layout's fp32 evaluation margin, rounded up to fp16
        mu_hat, v_hat, c_hat = dequantize_parts(self, out["mu_q"][sl], out["mu_scale"][sl], mh, out["v_pack"][sl],
                                                out["v_scale"][sl], out["c_q"][sl], out["w"][sl], n)
        u = torch.finfo(torch.float32).eps / 2
        E = X - mu_hat.unsqueeze(1)
        R = torch.baddbmm(E, c_hat, v_hat.mT, alpha=-1.0)
        rn = torch.linalg.vector_norm(R, dim=-1)
        margin = 2 * u * (torch.linalg.vector_norm(E, dim=-1) + (r + 1) * c_hat.abs().sum(-1) + (d + 2) * rn)
        out["rho"][sl] = _round_up((rn + margin).amax(dim=-1), torch.float16)

    def result(self, out: dict, m_h: Tensor, B: int, H: int, P: int) -> "LayoutSummaries":
        head_mean = m_h if self.mu_format == "head_int8" else torch.zeros_like(m_h)
        return LayoutSummaries(layout=self, head_mean=head_mean,
                               **{k: t.reshape(B, H, P, *t.shape[1:]) for k, t in out.items()})


DEFAULT_LAYOUT = SummaryLayout()


@dataclass
class LayoutSummaries:
    """Quantized summaries in a non-default `SummaryLayout` ([B, H, P, ...] per field, uint8 packings)."""

    layout: SummaryLayout
    mu_q: Tensor  # int8 [B,H,P,d] (int8 formats) or fp16 [B,H,P,d] (fp16)
    mu_scale: Tensor  # fp16 [B,H,P,1] (int8 formats) or [B,H,P,0]
    head_mean: Tensor  # fp32 [B,H,d] (zeros unless mu = head_int8)
    v_pack: Tensor  # uint8 [B,H,P,r,d*v_bits/8], rows = columns of V, element k at bits (k mod per_byte) * v_bits
    v_scale: Tensor  # fp16 [B,H,P,r,d/v_group] or [B,H,P,r,0]
    c_q: Tensor  # uint8 [B,H,P,n*c_bits/8,r] (int8 viewed as uint8, or int4 packed along n)
    w: Tensor  # fp32 / fp16 [B,H,P,r]
    rho: Tensor  # fp16 [B,H,P]

    @property
    def num_pages(self) -> int:
        return self.mu_q.shape[2]

    @property
    def page_size(self) -> int:
        return self.c_q.shape[3] * 8 // self.layout.c_bits

    @property
    def rank(self) -> int:
        return self.w.shape[3]

    def dequantize(self, pages: slice = slice(None)) -> tuple[Tensor, Tensor, Tensor]:
        """(mu^ [B,H,p,d], V^ [B,H,p,d,r] unit columns, C^ [B,H,p,n,r]) fp32 with k^_i = mu^ + V^ C^_i."""
        return dequantize_parts(self.layout, self.mu_q[:, :, pages], self.mu_scale[:, :, pages],
                                self.head_mean.unsqueeze(2), self.v_pack[:, :, pages], self.v_scale[:, :, pages],
                                self.c_q[:, :, pages], self.w[:, :, pages], self.page_size)


def dequantize_parts(layout: SummaryLayout, mu_q, mu_scale, m_h, v_pack, v_scale, c_q, w, n: int):
    """The stored fields of one layout -> fp32 (mu^, V^ with unit columns [..., d, r], C^ [..., n, r]); V^ C^ =
    Vq^T diag(w) Cq, Vq the quantized V rows times their group scales."""
    if layout.mu_format == "fp16":
        mu_hat = mu_q.float()
    else:
        base = m_h if layout.mu_format == "head_int8" else 0.0
        mu_hat = base + mu_scale.float() * mu_q.float()
    rows = _v_rows(_unpack(v_pack, layout.v_bits, dim=-1), v_scale, layout.v_group)  # [..., r, d]
    nv = torch.linalg.vector_norm(rows, dim=-1)
    v_hat = (rows / torch.where(nv > 0, nv, 1.0).unsqueeze(-1)).mT
    ci = c_q.view(torch.int8) if layout.c_bits == 8 else unpack_int4(c_q, dim=-2)
    c_hat = ci.float() * (w.float() * nv).unsqueeze(-2)
    return mu_hat, v_hat, c_hat


def _dtype(name: str) -> torch.dtype:
    return torch.float32 if name == "fp32" else torch.float16


def _v_rows(vint: Tensor, v_scale: Tensor, group: int) -> Tensor:
    """Quantized V rows [..., r, d] in fp32, times their group scales when grouped."""
    rows = vint.float()
    if group:
        shape = rows.shape
        rows = (rows.view(*shape[:-1], shape[-1] // group, group) * v_scale.float().unsqueeze(-1)).view(shape)
    return rows


def _pack(x: Tensor, bits: int, dim: int) -> Tensor:
    """int8 values of `bits` bits (two's complement) packed 8 / bits per byte along `dim`, element k of a byte's
    group in bits [k * bits, (k + 1) * bits)."""
    if bits == 8:
        return x.view(torch.uint8)
    if bits == 4:
        return pack_int4(x, dim=dim, check=False)
    x = x.movedim(dim, -1)
    per = 8 // bits
    v = (x.to(torch.int16) & (2 ** bits - 1)).view(*x.shape[:-1], x.shape[-1] // per, per)
    packed = sum(v[..., k] << (k * bits) for k in range(per)).to(torch.uint8)
    return packed.movedim(-1, dim)


def _unpack(p: Tensor, bits: int, dim: int) -> Tensor:
    """Inverse of `_pack`: uint8 -> int8 values, sign-extended."""
    if bits == 8:
        return p.view(torch.int8)
    if bits == 4:
        return unpack_int4(p, dim=dim)
    x = p.movedim(dim, -1).to(torch.int16)
    per = 8 // bits
    parts = [(x >> (k * bits)) & (2 ** bits - 1) for k in range(per)]
    vals = torch.stack(parts, dim=-1).flatten(-2)
    vals = torch.where(vals >= 2 ** (bits - 1), vals - 2 ** bits, vals).to(torch.int8)
    return vals.movedim(-1, dim)


def layout_bytes_per_page(s: LayoutSummaries) -> int:
    """Bytes per page per (batch row, KV head) of the stored per-page fields (head_mean amortized, not counted)."""
    return int(sum(t.element_size() * math.prod(t.shape[3:]) for f in fields(s)
                   if f.name not in ("layout", "head_mean") for t in [getattr(s, f.name)]))
