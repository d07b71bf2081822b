"""LRQK (NeurIPS'25, `docs/methods/lrqk.md`): jointly fitted low-rank Q/K factors per query head, proxy top-k, hybrid cache.

Everything is per QUERY head: K is expanded to the Hq query heads (repeat_kv), so A_K, B_Q, B_K, the hot cache and
the top-k sets exist once per query head (G copies per KV head). Math runs in fp32, state is stored in the keys'
dtype (bf16 on GPU, as the official code does).

Prefill (post-RoPE Q [l, d], K [l, d] of one head, rank r): ALS on
    f = 1/2 ||Q K^T - A_Q A_K^T||^2 + lq/2 ||Q - A_Q B_Q||^2 + lk/2 ||K - A_K B_K||^2
from A_Q, A_K ~ N(0, 1) (a generator seeded from (seed, layer_idx)); each iteration
    B_Q = (A_Q^T A_Q)^-1 A_Q^T Q,  B_K = (A_K^T A_K)^-1 A_K^T K
    A_Q <- Q (K^T A_K + lq B_Q^T)(A_K^T A_K + lq B_Q B_Q^T)^-1
    A_K <- K (Q^T A_Q + lk B_K^T)(A_Q^T A_Q + lk B_K B_K^T)^-1     (new A_Q: Gauss-Seidel)
stopping when max(MSE(A_Q_old, A_Q), MSE(A_K_old, A_K)) < tol_prefill, then B is refitted. Kept: A_K (one row per
token), B_Q, B_K; the last row of A_Q is the low-rank query of the initial selection.

Decode step (new token t, query q, key k, Omega = the k + n resident rows of the head's hot cache):
    k^ = k B_K^T (B_K B_K^T)^-1, then up to max_iter_decode alternating exact solves
    q^ = [q B_Q^T + l2 (q K_O^T) A_O + l1 (q.k) k^] [B_Q B_Q^T + l2 A_O^T A_O + l1 k^T k^]^-1
    k^ = [k B_K^T + l1 (q.k) q^] [B_K B_K^T + l1 q^T q^]^-1
    B_Q <- B_Q - a G,  G = q^T (q^ B_Q - q),  a = ||G||^2 / (||q^ G||^2 + 1e-6)   (Kaczmarz: q^ B_Q,new = q); B_K alike
    A_K gets the row k^;  z = q^ . A_K^T over tokens [0, oldest lite - 1) (no scale, no softmax); top-k, ascending.
The current token sits in the ring (in K_O) before its A_K row exists, so its row of A_O is zero, as in the official
code (equivalent to leaving it out of the l2 term).
The hot cache (per query head, on the keys' device) has k top-k slots and an n-slot ring of the most recent ("lite")
tokens. The cold store [B, Hkv, L, 2d] ([K|V]) holds every token in host memory (pinned when CUDA exists; a
separate CPU buffer otherwise, same code path): the prompt at prefill, decoded tokens in batches of n when the ring
wraps. A slot whose token left the top-k set is overwritten by a new top-k token not yet resident; only those missed
rows are gathered from the cold store and copied host->device. The output is exact attention over the k + n
resident rows, served to the harness through `Selection.keys/values` (sorted by token index).
hit_rate = 1 - (#overwritten slots) / (B * Hq * k) per decode step, averaged over steps (lite excluded).

Budget (`docs/budgets.md`): fair: top_k = budget - lite_tokens, so every query head attends top_k + lite = budget
tokens; paper: top_k = budget and the lite tokens are attended outside it (budget + lite_tokens per query head).
Contexts that fit (L <= top_k + lite) are attended in full from the hot cache; prompts shorter than top_k are
collected (dense attention) and factorized once the length reaches top_k, as the official `collecting` state does.
The harness's attended-token count is the union over a KV head's G query heads (up to G*top_k + lite).

Bytes (spec B9, per step, summed over KV heads, s = kv_element_bytes for every element, s_b = s for scores):
    metadata = Hq [L (r s + 2 s) + (k+n)(r + d) s + 4 r d s]     kv = Hq (k+n) 2 d s     h2d = misses * 2 d s
(while the context fits: no scan, Omega = the L - 1 earlier tokens, kv = Hq L 2 d s.) The fp32 casts are not
counted. extra_metrics: hit_rate (mean over the steps that ran a hit/miss update), h2d_rows_per_step (rows moved
host->device, summed over query heads, batch mean, over all decode steps), effective_rank, gpu_memory_ratio
((A_K + B_Q + B_K + hot cache) / dense KV cache of the layer; A_K alone is G r / (2 d), spec B6).

Deviations from the official code (tenghuilee/LRQK @ f3b843f, `lrqk_attention.py`):
  * rank r is capped at head_dim (r > d makes B_K B_K^T singular) and factorization waits for max(top_k, r) tokens
    (A^T A needs >= r rows); reported as `effective_rank`.
  * scores q^.A_K^T are computed in fp32 (official: bf16 matmul); q^ stays fp32.
  * a prompt of exactly top_k + lite tokens flushes the full ring to the cold store at once (official: indexes one
    slot past the ring).
  * tokens appended without a select() (never the case in `generate`) get k^ = k B_K^T (B_K B_K^T)^-1 and no basis
    update; a select() without a new token selects without updating the factors.
  * the initial top-k rows come from the dense prefill K/V on the device (no H2D), as in the official prefill.
  * no torch.compile / C++ gather kernel; on a CPU device the hooks run with one intra-op thread (restored after
    each call): the per-step tensors are tiny and extra OpenMP threads only add barrier waits on a shared machine.
  * a decode step (eager or static) solves the r x r systems from two inverses (sweep operator, Sherman-Morrison;
    in fp32 registers with backend triton, baselines/lrqk/kernels.py, else baselines/lrqk/capturable_solve.py)
    (official: torch.linalg.solve; the same systems, within fp32 rounding) and attends the hot cache in slot order;
    the decode stop test is per row (the official code has one sequence).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch
import torch.nn.functional as F
from torch import Tensor

from baselines.lrqk.capturable_solve import solve_rank_one, spd_inverse
from locks.core.buffers import grown
from locks.core.host_rows import device_view, gather_missed_rows
from locks.core.options import Options, flag, integer, number, one_of, option, positive_int
from locks.core.reference import take_rows
from locks.core.registry import register
from locks.core.selector import LayerInfo, PrefillContext, Selection, Selector
from locks.errors import ConfigError

INITS = ("randn", "top", "topcol")
PREFILL_ORDERS = ("official", "gauss_seidel")


# ----- the math (any float dtype; the selector calls it in fp32, the tests in float64) ------------------------------

def solve_right(M: Tensor, R: Tensor) -> Tensor:
    """X with X M = R (batched; solve_ex as the official code: no error check, no sync)."""
    return torch.linalg.solve_ex(M, R, left=False)[0]


def init_factors(Q: Tensor, K: Tensor, r: int, method: str = "randn",
                 generator: torch.Generator | None = None) -> tuple[Tensor, Tensor]:
    """A_Q [.., lq, r], A_K [.., lk, r]: randn (A_Q drawn first), or the r columns with the largest sum |.| (top:
    separately for Q and K; topcol: shared columns by sum |Q| + sum |K|)."""
    if method == "randn":
        A_Q = torch.randn(*Q.shape[:-1], r, dtype=Q.dtype, device=Q.device, generator=generator)
        A_K = torch.randn(*K.shape[:-1], r, dtype=K.dtype, device=K.device, generator=generator)
        return A_Q, A_K
    q_sum, k_sum = Q.abs().sum(-2, keepdim=True), K.abs().sum(-2, keepdim=True)
    if method == "top":
        iq, ik = q_sum.topk(r, dim=-1).indices, k_sum.topk(r, dim=-1).indices
    else:
        iq = ik = (q_sum + k_sum).topk(r, dim=-1).indices
    return (Q.gather(-1, iq.expand(*Q.shape[:-1], r)), K.gather(-1, ik.expand(*K.shape[:-1], r)))


def als(Q: Tensor, K: Tensor, A_Q: Tensor, A_K: Tensor, max_iter: int = 2, tol: float = 1e-2,
        lambda_q: float = 1.0, lambda_k: float = 1.0, jacobi: bool = False,
        callback: Callable[[str, Tensor, Tensor, Tensor, Tensor], None] | None = None):
    """Prefill ALS (module docstring); -> (A_Q, B_Q, A_K, B_K). `jacobi` updates A_K from the old A_Q (the official
    lambda != 1 path). `callback(block, A_Q, B_Q, A_K, B_K)` runs after every block update (tests)."""

    def refit(A: Tensor, X: Tensor) -> Tensor:  # B = (A^T A)^-1 A^T X
        return torch.linalg.solve_ex(A.mT @ A, A.mT @ X)[0]

    for _ in range(max_iter):
        B_Q, B_K = refit(A_Q, Q), refit(A_K, K)
        if callback:
            callback("B", A_Q, B_Q, A_K, B_K)
        # dA_Q: -(QK^T - A_Q A_K^T) A_K - lq (Q - A_Q B_Q) B_Q^T = 0 ;  Q (K^T A_K) avoids the l x l matrix QK^T
        new_A_Q = Q @ solve_right(A_K.mT @ A_K + lambda_q * B_Q @ B_Q.mT, K.mT @ A_K + lambda_q * B_Q.mT)
        if callback:
            callback("A_Q", new_A_Q, B_Q, A_K, B_K)
        A_src = A_Q if jacobi else new_A_Q
        new_A_K = K @ solve_right(A_src.mT @ A_src + lambda_k * B_K @ B_K.mT, Q.mT @ A_src + lambda_k * B_K.mT)
        if callback:
            callback("A_K", new_A_Q, B_Q, new_A_K, B_K)
        delta = max(float(F.mse_loss(A_Q, new_A_Q)), float(F.mse_loss(A_K, new_A_K)))
        A_Q, A_K = new_A_Q, new_A_K
        if delta < tol:
            break
    B_Q, B_K = refit(A_Q, Q), refit(A_K, K)
    if callback:
        callback("final", A_Q, B_Q, A_K, B_K)
    return A_Q, B_Q, A_K, B_K


def decode_coordinates(B_Q: Tensor, B_K: Tensor, A_om: Tensor, K_om: Tensor, q: Tensor, k: Tensor,
                       max_iter: int = 2, tol: float = 1e-2, lambda1: float = 1.0, lambda2: float = 1.0,
                       on_device: bool = False):
    """Low-rank coordinates of the new token. B_Q, B_K [.., r, d]; A_om [.., m, r]; K_om [.., m, d]; q, k [.., 1, d].

    -> (q_hat, k_hat, k_hat_used): q_hat solves its normal equation with k_hat_used, k_hat solves its own with q_hat.
    The loop stops after the first iteration whose MSE(k_used, k_hat) < tol, the MSE of each row over its heads
    (as the official code computes it for its one sequence; several rows stop when all have). on_device=True
    (static decode): the stop is decided on the device for each row, every iteration runs and those after the
    stop leave the result as it was (the same values, no host read). Eager and static steps solve alike, without
    torch.linalg: from the inverses of P and M_q (baselines/lrqk/capturable_solve.py, nothing a CUDA graph cannot
    capture), so that both select the same tokens.
    """
    kB = k @ B_K.mT
    P = B_K @ B_K.mT
    rhs_q = q @ B_Q.mT + lambda2 * (q @ K_om.mT) @ A_om
    M_q = B_Q @ B_Q.mT + lambda2 * A_om.mT @ A_om
    c = lambda1 * (q @ k.mT)  # l1 (q . k), [.., 1, 1]
    P_inv, M_inv = spd_inverse(torch.stack([P, M_q]))  # capturable (official: torch.linalg.solve per system)
    k_hat = kB @ P_inv
    stopped = None
    for _ in range(max(max_iter, 1)):
        used = k_hat
        q_new = solve_rank_one(M_inv, lambda1, k_hat, rhs_q + c * k_hat)
        k_new = solve_rank_one(P_inv, lambda1, q_new, kB + c * q_new)
        change = (used - k_new).square().mean(tuple(range(1, used.dim())), keepdim=True) < tol  # MSE per row
        if not on_device:
            q_hat, k_hat, k_used = q_new, k_new, used
            if bool(change.all()):
                break
            continue
        if stopped is None:
            q_hat, k_hat, k_used, stopped = q_new, k_new, used, change
            continue
        q_hat, k_hat, k_used = (torch.where(stopped, old, new) for old, new in
                                ((q_hat, q_new), (k_hat, k_new), (k_used, used)))
        stopped = stopped | change
    return q_hat, k_hat, k_used


def kaczmarz(B: Tensor, hat: Tensor, x: Tensor, eps: float = 1e-6) -> Tensor:
    """One gradient step with exact line search on 1/2 ||hat B - x||^2 (hat [.., 1, r]): a rank-1 projection."""
    G = hat.mT @ (hat @ B - x)
    alpha = G.square().sum((-2, -1), keepdim=True) / ((hat @ G).square().sum((-2, -1), keepdim=True) + eps)
    return B - alpha * G


def replace_slots(old: Tensor, new: Tensor, length: int) -> tuple[Tensor, Tensor]:
    """Hit/miss slot replacement. old [.., k] resident indices (slot order), new [.., k] top-k (ascending).

    A slot whose index is not in `new` is overwritten (mask True) by a new index not yet resident; the j-th
    overwritten slot (slot order) takes the j-th such index (ascending), as the official boolean assignment does.
    -> (updated slots, mask); the updated set equals the new set.
    """
    shape = (*old.shape[:-1], length)
    in_new = torch.zeros(shape, dtype=torch.bool, device=old.device).scatter_(-1, new, True)
    resident = torch.zeros(shape, dtype=torch.bool, device=old.device).scatter_(-1, old, True)
    miss = ~in_new.gather(-1, old)
    fresh = ~resident.gather(-1, new)
    slot_order = torch.sort((~miss).to(torch.uint8), dim=-1, stable=True).indices  # missed slots first
    new_order = torch.sort((~fresh).to(torch.uint8), dim=-1, stable=True).indices  # fresh indices first
    j = torch.arange(old.shape[-1], device=old.device)
    vals = torch.where(j < miss.sum(-1, keepdim=True), new.gather(-1, new_order), old.gather(-1, slot_order))
    return old.scatter(-1, slot_order, vals), miss


def _single_threaded_on_cpu(method):
    """Run a hook with one intra-op thread when its tensors live on the CPU (restored afterwards).

    The per-step tensors are tiny (r x r solves, k + n rows); on a shared CPU every extra OpenMP thread only adds a
    barrier wait per BLAS call (measured: 0.5 ms vs 130 ms per decode solve on a loaded 2-core machine).
    """

    def wrapper(self, *args, **kwargs):
        tensor = next((a for a in args if isinstance(a, Tensor)), None)
        if tensor is None:
            tensor = getattr(args[0], "keys", None)
        if tensor is None or tensor.device.type != "cpu":
            return method(self, *args, **kwargs)
        threads = torch.get_num_threads()
        torch.set_num_threads(1)
        try:
            return method(self, *args, **kwargs)
        finally:
            torch.set_num_threads(threads)

    return wrapper


# ----- the selector --------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class LRQKOptions(Options):
    rank: int = option(32, positive_int)  # r of the query/key factors (at most head_dim)
    lite_tokens: int = option(64, positive_int, attr="n")  # the newest tokens, always attended
    max_iter_prefill: int = option(2, integer(0))
    max_iter_decode: int = option(2, positive_int)
    tol_prefill: float = option(1e-2, number(0))
    tol_decode: float = option(1e-2, number(0))
    lambda_q: float = option(1.0, number(0))
    lambda_k: float = option(1.0, number(0))
    lambda_1: float = option(1.0, number(0))
    lambda_2: float = option(1.0, number(0))
    init: str = option("randn", one_of(*INITS))
    prefill_order: str = option("official", one_of(*PREFILL_ORDERS))
    candidate_off_by_one: bool = option(True, flag, attr="off_by_one")
    seed: int = option(42, integer())


@register
class LRQKSelector(Selector):
    name = "lrqk"
    display_name = "LRQK"
    report_order = 7
    Options = LRQKOptions

    def __init__(self, info: LayerInfo, budget: int, **options):
        super().__init__(info, budget, **options)
        self.r = min(self.rank, info.head_dim)
        if self.budget_mode == "fair":
            if self.budget <= self.n:
                raise ConfigError(f"budget={self.budget} must exceed method.lite_tokens={self.n} in budget_mode=fair "
                                  f"(top_k = budget - lite_tokens)")
            if self.budget < self.r:
                raise ConfigError(f"budget={self.budget} must be >= min(method.rank, head_dim)={self.r} in "
                                  f"budget_mode=fair (the factors need r tokens)")
            self.k = self.budget - self.n
        else:
            self.k = self.budget
        self.G = info.group_size
        self.state = "empty"  # empty -> collecting (fewer than max(k, r) tokens) -> factorized
        self.length = 0  # tokens absorbed (appended)
        self.pending: list[int] = []  # appended tokens whose A_K row is not written yet
        self.steps = 0
        self.h2d_rows = 0.0
        self.hit_sum: Tensor | float = 0.0
        self.hit_steps = 0

    # ----- state helpers ---------------------------------------------------------------------------------------------

    def _rep(self, x: Tensor) -> Tensor:
        """[B, Hkv, ...] -> [B, Hq, ...] (repeat_kv: query head j reads KV head j // G)."""
        return x.repeat_interleave(self.G, dim=1)

    def _gather_heads(self, x: Tensor, idx: Tensor) -> Tensor:
        """x [B, Hkv, L, d], idx [B, Hq, m] -> [B, Hq, m, d] (query head j reads KV head j // G) without repeating x."""
        B, H, L, d = x.shape
        m = idx.shape[-1]
        return take_rows(x, idx.view(B, H, self.G * m)).view(B, H * self.G, m, d)

    def _store_append(self, k: Tensor, v: Tensor) -> None:
        """Append rows [B, Hkv, m, d] of K and V to the host cold store [B, Hkv, cap, 2d] (grows x1.5)."""
        B, H, m, d = k.shape
        need = self.store_len + m
        self.store = grown(self.store, self.store_len, need, factor=1.5, minimum=256, pin=True)
        self.store[:, :, self.store_len : need, :d].copy_(k)
        self.store[:, :, self.store_len : need, d:].copy_(v)
        self.store_len = need

    def _ak_append(self, rows: Tensor, at: int) -> None:
        """Write A_K rows [B, Hq, m, r] at token `at` (A_K on the device, grows x1.5)."""
        need = at + rows.shape[2]
        self.A_K = grown(self.A_K, self.ak_len, need, factor=1.5, zero=True)
        self.A_K[:, :, at:need] = rows.to(self.A_K.dtype)
        self.ak_len = need

    def _ring_write(self, keys: Tensor, values: Tensor, t: int) -> None:
        """Token t into the lite ring of every query head; a full ring goes to the cold store (one copy per KV head)."""
        slot = self.k + self.lite_len
        self.Kh[:, :, slot] = self._rep(keys[:, :, t])
        self.Vh[:, :, slot] = self._rep(values[:, :, t])
        self.lite[self.lite_len] = t
        self.lite_t[self.lite_len] = t
        self.lite_len += 1
        if self.lite_len == self.n:
            self._store_append(self.Kh[:, :: self.G, self.k :], self.Vh[:, :: self.G, self.k :])
            self.lite_len = 0

    def _step_bytes(self, L: int, omega_rows: int | None = None) -> tuple[float, float, float]:
        """(forced tokens, metadata bytes, K/V bytes) of the step at L tokens, summed over query heads (module
        docstring). While the context fits (L <= k + n): Omega = the `omega_rows` (default L - 1) earlier tokens,
        no scan, every token attended; else the A_K scan, Omega = k + n rows, the lite ring forced."""
        k, n, r, s, Hq, d = self.k, self.n, self.r, self.info.kv_element_bytes, self.info.num_heads, self.info.head_dim
        if L <= k + n:
            m = L - 1 if omega_rows is None else omega_rows
            return float(L - k), float(Hq * (m * (r + d) * s + 4 * r * d * s)), 2.0 * d * s * Hq * L
        metadata = Hq * (L * (r * s + 2 * s) + (k + n) * (r + d) * s + 4 * r * d * s)
        return float(n), float(metadata), 2.0 * d * s * Hq * (k + n)

    # ----- prefill ---------------------------------------------------------------------------------------------------

    def memory_bytes(self, length: int) -> dict[str, float]:
        """LRQK's design after a prompt of `length` tokens: on the device each query head's hot cache (k selected +
        n lite tokens, exact K/V) and, as state, A_K [Hq, L, r] with B_Q, B_K [Hq, r, d]; every token's K/V in the
        host's cold store."""
        info = self.info
        s, d, Hq = info.kv_element_bytes, info.head_dim, info.num_heads
        hot = min(self.k + self.n, length)
        cold = length if length > self.k + self.n else min(self.k, length)  # a short prompt: its first k tokens
        state = Hq * (length * self.r + 2 * self.r * d) * s
        return {"kv": float(Hq * hot * 2 * d * s), "state": float(state), "host": float(cold * info.token_kv_bytes)}

    def harness_bytes(self, length: int) -> float:
        """The hot cache's K/V (the design's device "kv": a copy of rows the harness's whole cache also holds) and
        A_K's room for decode tokens."""
        info = self.info
        room = self._ak_rows(length) - length
        return self.memory_bytes(length)["kv"] + float(info.num_heads * room * self.r * info.kv_element_bytes)

    def prefill_bytes(self, length: int) -> float:
        """The factorization's fp32 work: the keys repeated to the query heads (and the queries, when the cache is
        not fp32), and A_Q, A_K and their updates, [H_q, length, r] each (tests/eval/test_memory_plan.py measures
        it)."""
        info, fp32 = self.info, 4
        copies = (1 + (info.kv_element_bytes != fp32)) * info.num_heads * length * info.head_dim * fp32
        return float(copies + 4 * info.num_heads * length * self.r * fp32)

    @staticmethod
    def _ak_rows(length: int) -> int:
        """Rows A_K is allocated for after a prompt of `length` tokens (it grows from there)."""
        return max(int(1.5 * length), length + 1)

    def prefill_queries(self) -> int | None:
        return None  # the ALS factorization of Q K^T uses every prompt query

    @_single_threaded_on_cpu
    def prefill(self, ctx: PrefillContext) -> None:
        keys = ctx.keys
        self.device, self.dtype = keys.device, keys.dtype
        self.length = keys.shape[2]
        self.pending = []
        self.steps, self.h2d_rows, self.hit_sum, self.hit_steps = 0, 0.0, 0.0, 0
        self.q_buf = ctx.queries
        self.state = "collecting"
        if self.length >= max(self.k, self.r):
            self._factorize(ctx.keys, ctx.values, ctx)

    def _factorize(self, keys: Tensor, values: Tensor, ctx: PrefillContext | None = None) -> None:
        """ALS on the collected queries and all l0 = keys.shape[2] keys; hot cache, ring and cold store. At prefill
        the factorization does not depend on the budget: the runs of a group that prefills once share it
        (`ctx.shared`)."""
        B, Hkv, l0, d = keys.shape
        k, n, dt = self.k, self.n, keys.dtype
        Hq = Hkv * self.G
        jacobi = self.prefill_order == "official" and (self.lambda_q != 1.0 or self.lambda_k != 1.0)

        def factorize():
            Q = self.q_buf.float()
            K = self._rep(keys).float()
            gen = torch.Generator(device=keys.device).manual_seed((self.seed * 1_000_003 + self.info.layer_idx) % 2**63)
            A_Q, A_K = init_factors(Q, K, self.r, self.init, gen)
            return als(Q, K, A_Q, A_K, self.max_iter_prefill, self.tol_prefill, self.lambda_q, self.lambda_k, jacobi)

        key = ("lrqk.als", self.r, self.init, self.seed, self.max_iter_prefill, self.tol_prefill, self.lambda_q,
               self.lambda_k, jacobi)
        A_Q, B_Q, A_K, B_K = factorize() if ctx is None else ctx.shared(key, factorize)
        self.q_buf = None
        self.B_Q, self.B_K = B_Q.to(dt), B_K.to(dt)
        self.A_K = torch.zeros(B, Hq, self._ak_rows(l0), self.r, dtype=dt, device=keys.device)
        self.ak_len = 0
        self._ak_append(A_K, 0)
        self.Kh = keys.new_zeros(B, Hq, k + n, d)
        self.Vh = values.new_zeros(B, Hq, k + n, d)
        self.store, self.store_len = keys.new_empty(B, keys.shape[1], 0, 2 * d, device="cpu"), 0
        self.lite_t = torch.full((n,), -1, dtype=torch.long, device=keys.device)
        if l0 > k + n:
            self._store_append(keys, values)
            z = self.A_K[:, :, : l0 - n].float() @ A_Q[:, :, -1:].mT  # initial selection: last row of A_Q
            self.slots = z.squeeze(-1).topk(k, dim=-1).indices.sort(dim=-1).values
            self.Kh[:, :, :k] = self._gather_heads(keys, self.slots)
            self.Vh[:, :, :k] = self._gather_heads(values, self.slots)
            self.Kh[:, :, k:] = self._rep(keys[:, :, l0 - n :])
            self.Vh[:, :, k:] = self._rep(values[:, :, l0 - n :])
            self.lite, self.lite_len = list(range(l0 - n, l0)), 0
            self.lite_t.copy_(torch.arange(l0 - n, l0))
            self.ring_base = l0 - n  # token t sits in ring position (t - ring_base) mod n
        else:  # k <= l0 <= k + n: every token resident, slots = [0, k), ring = [k, l0)
            self._store_append(keys[:, :, :k], values[:, :, :k])
            self.slots = torch.arange(k, device=keys.device).expand(B, Hq, k).contiguous()
            self.Kh[:, :, :l0] = self._rep(keys)
            self.Vh[:, :, :l0] = self._rep(values)
            self.lite, self.lite_len = [-1] * n, 0
            self.ring_base = k
            for t in range(k, l0):
                self.lite[self.lite_len] = t
                self.lite_t[self.lite_len] = t
                self.lite_len += 1
            if self.lite_len == n:
                self._store_append(self.Kh[:, :: self.G, k:], self.Vh[:, :: self.G, k:])
                self.lite_len = 0
        self.state = "factorized"

    # ----- decode ----------------------------------------------------------------------------------------------------

    @_single_threaded_on_cpu
    def append(self, keys: Tensor, values: Tensor) -> None:
        L = keys.shape[2]
        for t in range(self.length, L):
            if self.state == "factorized":
                self._ring_write(keys, values, t)
            self.pending.append(t)
        self.length = max(self.length, L)

    def _absorb_without_query(self, keys: Tensor) -> None:
        """Tokens appended without a select(): k^ = k B_K^T (B_K B_K^T)^-1, no basis update (not used by generate)."""
        while len(self.pending) > 1:
            t = self.pending.pop(0)
            B_K = self.B_K.float()
            k = self._rep(keys[:, :, t : t + 1]).float()
            self._ak_append(solve_right(B_K @ B_K.mT, k @ B_K.mT), t)

    @_single_threaded_on_cpu
    def select(self, query: Tensor, keys: Tensor, values: Tensor) -> Selection:
        B, Hkv, L, d = keys.shape
        self.steps += 1
        if self.state == "collecting":
            if self.pending:
                self.q_buf = torch.cat([self.q_buf, query.unsqueeze(2).to(self.q_buf.dtype)], dim=2)
            self.pending = []
            if L >= max(self.k, self.r):
                self._factorize(keys, values)
            return Selection.all_tokens()

        self._absorb_without_query(keys)
        update = bool(self.pending)
        self.pending = []
        k, n, s, Hq = self.k, self.n, self.info.kv_element_bytes, query.shape[1]
        resident = L <= k + n  # the whole context fits the hot cache: Omega = every earlier token, no selection
        if resident:
            m = min(self.ak_len, L - 1)
            A_om, K_om = self.A_K[:, :, :m].float(), self.Kh[:, :, :m].float()
        else:
            omega = torch.cat([self.slots, self.lite_t.expand(B, Hq, n)], dim=-1)
            ok = (omega >= 0) & (omega < self.ak_len)  # the current token's row does not exist yet: zeros
            A_om = take_rows(self.A_K, omega * ok).float() * ok[..., None]
            K_om = self.Kh.float()
        q = query.float().unsqueeze(2)
        k_t = self._rep(keys[:, :, L - 1 : L]).float()
        B_Q, B_K = self.B_Q.float(), self.B_K.float()
        q_hat, k_hat, _ = decode_coordinates(B_Q, B_K, A_om, K_om, q, k_t, self.max_iter_decode, self.tol_decode,
                                             self.lambda_1, self.lambda_2)
        if update:
            self.B_Q = kaczmarz(B_Q, q_hat, q).to(self.dtype)
            self.B_K = kaczmarz(B_K, k_hat, k_t).to(self.dtype)
            self._ak_append(k_hat, L - 1)

        forced, metadata, kv = self._step_bytes(L, m if resident else None)
        if resident:
            idx = torch.arange(L, device=keys.device).expand(B, Hkv, self.G, L)
            return Selection(
                indices=idx, valid=torch.ones_like(idx, dtype=torch.bool),
                keys=self.Kh[:, :, :L].view(B, Hkv, self.G, L, d), values=self.Vh[:, :, :L].view(B, Hkv, self.G, L, d),
                forced_tokens=forced, kv_bytes=kv, metadata_bytes=metadata)

        ncand = L - n - (1 if self.off_by_one else 0)  # the ring holds the last n tokens: oldest = L - n
        z = (self.A_K[:, :, :ncand].float() @ q_hat.mT).squeeze(-1)
        top = z.topk(k, dim=-1).indices.sort(dim=-1).values
        self.slots, miss = replace_slots(self.slots, top, L)
        self.hit_sum = self.hit_sum + (1.0 - miss.float().mean())
        self.hit_steps += 1
        bi, hi, si = miss.nonzero(as_tuple=True)  # D2H sync, as in the official code
        rows = 0
        if len(bi):
            tok = self.slots[bi, hi, si]
            lin = ((bi * Hkv + hi // self.G) * self.store.shape[2] + tok).cpu()
            fetched = self.store.view(-1, 2 * d).index_select(0, lin).to(keys.device, non_blocking=True)
            self.Kh[bi, hi, si] = fetched[:, :d]
            self.Vh[bi, hi, si] = fetched[:, d:]
            rows = len(bi)
        self.h2d_rows += rows / B

        idx = torch.cat([self.slots, self.lite_t.expand(B, Hq, n)], dim=-1)
        idx, order = idx.sort(dim=-1)
        shape = (B, Hkv, self.G, k + n, d)
        idx = idx.view(B, Hkv, self.G, k + n)
        return Selection(
            indices=idx, valid=torch.ones_like(idx, dtype=torch.bool),
            keys=take_rows(self.Kh, order).view(shape), values=take_rows(self.Vh, order).view(shape),
            forced_tokens=forced, metadata_bytes=metadata, kv_bytes=kv, h2d_bytes=2.0 * d * s * rows / B)

    # ----- static decode: every shape fixed by (top_k, lite_tokens, capacity), the length only on the device -------
    # Each row's ring position is device state (s_ring_base), its lite ring s_lite [B, n], its counters [B]: rows of
    # different lengths stack in one step. backend triton runs baselines/lrqk/kernels.py (three launches around
    # torch.topk and a sort; the r x r solves in registers); this PyTorch step is their oracle, and solves without
    # torch.linalg too (baselines/lrqk/capturable_solve.py).

    row_state = ("B_Q", "B_K", "A_K", "slots", "s_sorted", "Kh", "Vh", "s_lite", "s_ring_base", "store", "s_missed",
                 "s_step_bytes", "s_attended", "s_count")

    def static_decode_error(self):
        return None

    def static_sample_error(self) -> str | None:
        if self.state != "factorized":
            return (f"lrqk: static decode needs a prompt of at least max(top_k, rank) = {max(self.k, self.r)} tokens "
                    f"(the factors are fitted at prefill; this prompt has {self.length})")
        return None

    def start_static(self, capacity):
        """A_K and the cold store for `capacity` tokens (the store pinned on a CUDA machine, read in place by the
        step); the ring's position, the sorted top-k set and the row's counters on the device."""
        if self.static_sample_error():
            raise ConfigError(self.static_sample_error())
        B, Hq = self.slots.shape[:2]
        self.A_K = grown(self.A_K, self.ak_len, capacity, factor=1.0, zero=True)
        # preallocated: a flush between steps never reallocates it
        self.store = grown(self.store, self.store_len, capacity, factor=1.0, pin=True)
        self.fused = self.info.backend == "triton"
        if self.fused:  # the kernels index the state as contiguous tensors (the ALS leaves B_Q, B_K in column order;
            # the PyTorch step keeps that layout, so its products round as the eager step's do)
            for name in ("B_Q", "B_K", "A_K", "slots", "Kh", "Vh"):
                setattr(self, name, getattr(self, name).contiguous())
        self.s_lite = self.lite_t.view(1, -1).repeat(B, 1)
        self.s_ring_base = torch.full((B,), self.ring_base, dtype=torch.long, device=self.device)
        self.s_sorted = self.slots.sort(dim=-1).values
        self.s_missed = torch.zeros(B, dtype=torch.float64, device=self.device)
        self.s_step_bytes = torch.zeros(B, 3, dtype=torch.float64, device=self.device)
        self.s_attended = torch.zeros(B, self.info.num_kv_heads, dtype=torch.float64, device=self.device)
        self.s_count = torch.zeros(B, dtype=torch.int32, device=self.device)
        self.s_hit_steps = self.s_steps = 0
        self._store_view = self._store_of = None

    def _step_store(self) -> Tensor:
        """The cold store as the step reads it (`device_view`), made again when the store is replaced (stacked)."""
        if self._store_of is not self.store:
            self._store_view, self._store_of = device_view(self.store, self.device), self.store
        return self._store_view

    def select_static(self, query, keys, values, length):
        """`append` + `select` of the new token in fixed shapes: its ring slot, the Omega rows (tokens without an
        A_K row zeroed), every decode iteration (each row's stop decided on the device), the Kaczmarz updates in
        place, the top-k over A_K with candidates at or past L - n (- 1) masked, the slot replacement and a masked
        fetch of the missed rows from the cold store. While a row's context fits the hot cache (L <= top_k + lite)
        its slots stay and every resident token is attended, as eager; the union over a KV head's query heads is
        counted on the device."""
        if self.fused:
            return self._select_static_fused(query, keys, values, length)
        B, Hkv, cap, d = keys.shape
        k, n, s, G = self.k, self.n, self.info.kv_element_bytes, self.G
        Hq = Hkv * G
        L = length.view(-1, 1, 1)
        position = (length.view(-1) - 1).expand(B)
        rows = torch.arange(B, device=keys.device)
        ring = torch.remainder(position - self.s_ring_base, n)
        key, value = keys[rows, :, position].unsqueeze(2), values[rows, :, position].unsqueeze(2)  # [B, Hkv, 1, d]
        self.Kh[rows, :, k + ring] = self._rep(key)[:, :, 0]
        self.Vh[rows, :, k + ring] = self._rep(value)[:, :, 0]
        self.s_lite[rows, ring] = position

        omega = torch.cat([self.slots, self.s_lite.unsqueeze(1).expand(B, Hq, n)], dim=-1)
        ok = (omega >= 0) & (omega < position.view(B, 1, 1))  # the current token's A_K row does not exist yet: zeros
        A_om = take_rows(self.A_K, omega * ok).float() * ok[..., None]
        q = query.float().unsqueeze(2)
        k_t = self._rep(key).float()
        B_Q, B_K = self.B_Q.float(), self.B_K.float()
        q_hat, k_hat, _ = decode_coordinates(B_Q, B_K, A_om, self.Kh.float(), q, k_t, self.max_iter_decode,
                                             self.tol_decode, self.lambda_1, self.lambda_2, on_device=True)
        self.B_Q.copy_(kaczmarz(B_Q, q_hat, q))
        self.B_K.copy_(kaczmarz(B_K, k_hat, k_t))
        self.A_K[rows, :, position] = k_hat[:, :, 0].to(self.A_K.dtype)

        resident = L <= k + n
        ncand = L - n - (1 if self.off_by_one else 0)
        z = (self.A_K[:, :, :cap].float() @ q_hat.mT).squeeze(-1)
        z = z.masked_fill(torch.arange(cap, device=keys.device) >= ncand, float("-inf"))
        top = z.topk(k, dim=-1).indices.sort(dim=-1).values
        slots, missed = replace_slots(self.slots, top, cap)
        missed = missed & ~resident
        slots = torch.where(resident, self.slots, slots)
        fetched = gather_missed_rows(self._step_store(), slots.view(B, Hkv, G * k),
                                     missed.view(B, Hkv, G * k)).view(B, Hq, k, 2 * d).to(self.Kh.device)
        self.Kh[:, :, :k] = torch.where(missed[..., None], fetched[..., :d], self.Kh[:, :, :k])
        self.Vh[:, :, :k] = torch.where(missed[..., None], fetched[..., d:], self.Vh[:, :, :k])
        self.slots.copy_(slots)
        self.s_sorted.copy_(torch.where(resident, self.s_sorted, top))
        count = missed.sum((1, 2)).to(torch.float64)  # [B]
        self.s_missed.add_(count)
        self.s_step_bytes.copy_(torch.stack([torch.zeros_like(count), torch.zeros_like(count), 2.0 * d * s * count],
                                            dim=-1))

        idx = torch.cat([self.slots, self.s_lite.unsqueeze(1).expand(B, Hq, n)], dim=-1)
        idx, order = torch.where(idx >= 0, idx, cap).sort(dim=-1)  # slot order while resident; unwritten last
        valid = idx < L
        shape = (B, Hkv, G, k + n, d)
        return Selection(
            indices=idx.masked_fill(~valid, 0).view(B, Hkv, G, k + n), valid=valid.view(B, Hkv, G, k + n),
            keys=take_rows(self.Kh, order).view(shape), values=take_rows(self.Vh, order).view(shape),
            kv_bytes=0.0, device_bytes=self.s_step_bytes)

    def _select_static_fused(self, query, keys, values, length):
        """`select_static` in three Triton launches around torch.topk and a sort (baselines/lrqk/kernels.py): the
        hot cache is attended in slot order, each query head's first min(L, k + n) slots (`Selection.key_count`)."""
        from baselines.lrqk.kernels import lrqk_replace, lrqk_scores, lrqk_solve

        B, Hq, S, d = self.Kh.shape
        workspaces = lrqk_solve(query, keys, values, length, self.s_ring_base, self.Kh, self.Vh, self.s_lite,
                                self.slots, self.A_K, self.B_Q, self.B_K, self.s_count, self.s_step_bytes,
                                self.s_attended, max_iter=self.max_iter_decode, lambda1=self.lambda_1,
                                lambda2=self.lambda_2)
        z = lrqk_scores(query, keys, length, self.A_K, self.B_Q, self.B_K, workspaces, lite_tokens=self.n,
                        off_by_one=self.off_by_one, tol=self.tol_decode)
        top = torch.topk(z, self.k, dim=-1, sorted=False).indices.sort(dim=-1).values
        lrqk_replace(top, self.slots, self.s_sorted, length, self.Kh, self.Vh, self._step_store(), self.s_missed,
                     self.s_step_bytes, self.s_attended, workspaces, group=self.G,
                     elem_bytes=self.info.kv_element_bytes)
        shape = (B, Hq // self.G, self.G, S, d)
        return Selection(keys=self.Kh.view(shape), values=self.Vh.view(shape), key_count=self.s_count,
                         attended_rows=self.s_attended, kv_bytes=0.0, device_bytes=self.s_step_bytes)

    def static_state(self):
        return [self.B_Q, self.B_K, self.slots, self.s_sorted, self.Kh, self.Vh, self.s_lite, self.s_missed]

    def finish_static(self):
        """hit_rate: each step's 1 - missed / (Hq top_k), summed as (steps - missed rows / (Hq top_k)); the rows'
        mean (the batch mean of a cache of several rows)."""
        missed = float(self.s_missed.mean())
        self.hit_sum = float(self.hit_sum) + self.s_hit_steps - missed / (self.slots.shape[1] * self.k)
        self.hit_steps += self.s_hit_steps
        self.h2d_rows += missed
        self.steps += self.s_steps
        self.s_missed.zero_()
        self.s_hit_steps = self.s_steps = 0

    def after_static_step(self, keys, values, length):
        """Host upkeep: the token's place in the ring, and a full ring flushed to the cold store (device to host,
        outside the graph; no later step of this block reads it: candidates end n tokens before the length)."""
        t = length - 1
        ring = (t - self.ring_base) % self.n
        self.lite[ring] = t
        self.lite_len = (ring + 1) % self.n
        self.length = self.ak_len = length
        self.s_steps += 1
        if length > self.k + self.n:
            self.s_hit_steps += 1
        if ring == self.n - 1:  # the ring holds tokens t + 1 - n .. t, the store every token before them
            self._store_append(self.Kh[:, :: self.G, self.k :], self.Vh[:, :: self.G, self.k :])

    def static_step_cost(self, length):
        forced, metadata, kv = self._step_bytes(length)
        return forced, metadata, None, kv

    def extra_metrics(self) -> dict:
        if self.state == "empty":
            return {}
        metrics = {
            "hit_rate": float(self.hit_sum) / self.hit_steps if self.hit_steps else None,
            "h2d_rows_per_step": self.h2d_rows / self.steps if self.steps else None,
            "effective_rank": float(self.r),
        }
        if self.state == "factorized":  # device-resident state / dense KV cache (A_K alone: G r / (2 d), spec B6)
            Hq, d = self.Kh.shape[1], self.Kh.shape[-1]
            state = Hq * (self.ak_len * self.r + 2 * self.r * d + (self.k + self.n) * 2 * d)
            metrics["gpu_memory_ratio"] = state / (self.info.num_kv_heads * self.length * 2 * d)
        return metrics
