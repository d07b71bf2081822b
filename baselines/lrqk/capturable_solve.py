"""LRQK's decode solves without torch.linalg (docs/methods/lrqk.md, "Static decode and kernels"): a CUDA graph may
not capture a factorization or solve that synchronizes the device (MAGMA's batched LU may), so a decode step inverts
its two r x r Gram matrices by a fixed sequence of elementwise ops and matmuls, and solves each iteration's rank-one
update from those inverses; the eager step does the same, so that both select alike (official: torch.linalg.solve
per system). The fused step (baselines/lrqk/kernels.py) does the same math in registers."""
from __future__ import annotations

from torch import Tensor


def spd_inverse(M: Tensor) -> Tensor:
    """M^-1 of symmetric positive definite matrices M [.., r, r], by the sweep operator (Gauss-Jordan elimination
    without pivoting, kept symmetric; stable for SPD M). Sweeping every pivot k turns M into -M^-1; on pivot k, with
    D = M_kk and c = M[:, k]:

        M_ij <- M_ij - c_i c_j / D  (i, j != k),   M_ik, M_ki <- c_i / D,   M_kk <- -1 / D

    r steps of a few fixed-shape ops each: no data-dependent control flow, no host read."""
    M = M.clone()
    for k in range(M.shape[-1]):
        inv_d = M[..., k, k].reciprocal()
        edge = M[..., :, k] * inv_d.unsqueeze(-1)
        M -= M[..., :, k].unsqueeze(-1) * edge.unsqueeze(-2)
        M[..., :, k] = edge
        M[..., k, :] = edge
        M[..., k, k] = -inv_d
    return M.neg_()


def solve_rank_one(M_inv: Tensor, lam: float, u: Tensor, y: Tensor) -> Tensor:
    """x with x (M + lam u^T u) = y for symmetric M, from M^-1 (Sherman-Morrison; the denominator is >= 1 for SPD M
    and lam >= 0). u, y [.., 1, r] rows; with w = u M^-1 and x0 = y M^-1:

        x = x0 - lam w (x0 . u) / (1 + lam u . w)"""
    x0 = y @ M_inv
    w = u @ M_inv
    return x0 - lam * w * (x0 * u).sum(-1, keepdim=True) / (1.0 + lam * (u * w).sum(-1, keepdim=True))
