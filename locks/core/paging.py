"""Page selection shared by LOCKS and the Oracle: forced set, GQA aggregation of per-head page scores, top-k pages.

Pages are `page_size` consecutive tokens; only complete pages are candidates. A subclass supplies per-query-head
page scores S [B, Hq, P] (LOCKS: log-sum-exp of reconstructed logits; Oracle: exact page log-mass).

Forced set F (`docs/methods/locks.md`, "Forced set"): the partial page, which has no summary (A2 attends it densely);
nothing else by default, as in the write-up. Two harness options, off by default, add the first `sink_pages` pages
and the complete pages of the last `recent_window` tokens (ablations). In `fair` mode the budget counts F: the
partial page first, then sink pages, then recent pages newest first, each only while it fits, and the remaining
(budget - |F|) // page_size pages are chosen by score (so the attended tokens never exceed `budget`). In `paper` mode
budget // page_size pages are chosen by score among all complete pages and only the partial page is forced, so
attended tokens may exceed the budget by at most page_size - 1.

GQA aggregation of S_g over the G query heads of a KV head (A3.3), with log Z_g = logsumexp_j S_{g,j} over the
candidate pages (plus the forced set's exact log-mass when the subclass knows it):
    norm: A_j = logsumexp_g (S_{g,j} - log Z_g)     (default)
    raw:  A_j = logsumexp_g S_{g,j}
    max:  A_j = max_g (S_{g,j} - log Z_g)
"""
from __future__ import annotations

from abc import abstractmethod
from dataclasses import dataclass
from typing import ClassVar

import torch
from torch import Tensor

from locks.core.options import Options, integer, one_of, option, power_of_two
from locks.core.selector import Selection, Selector, row_length
from locks.errors import ConfigError

AGGREGATIONS = ("norm", "raw", "max")


def aggregate_heads(scores: Tensor, group: int, mode: str, candidates: Tensor, forced_log_mass: Tensor | None = None,
                    log_z: Tensor | None = None) -> Tensor:
    """scores [B, Hq, P] per query head -> [B, Hkv, P] per KV head; non-candidate pages get -inf.

    candidates [B, Hkv, P] bool; forced_log_mass [B, Hq] or None; log_z [B, Hq]: use it for norm / max instead of the
    exact log Z of these scores (the one-pass variant: the previous step's log Z).
    """
    B, Hq, P = scores.shape
    s = scores.float().view(B, Hq // group, group, P).masked_fill(~candidates[:, :, None, :], float("-inf"))
    if mode == "raw":
        return torch.logsumexp(s, dim=2)
    if log_z is not None:
        log_z = log_z.float().view(B, Hq // group, group, 1)
    else:
        log_z = torch.logsumexp(s, dim=-1, keepdim=True)  # [B, Hkv, G, 1]
    if forced_log_mass is not None:
        log_z = torch.logaddexp(log_z, forced_log_mass.float().view(B, Hq // group, group, 1))
    normalized = s - log_z
    if mode == "norm":
        out = torch.logsumexp(normalized, dim=2)
    elif mode == "max":
        out = normalized.max(dim=2).values
    else:
        raise ConfigError(f"method.aggregation must be one of {AGGREGATIONS} (got {mode!r})")
    return out.masked_fill(~candidates, float("-inf"))


def pages_to_tokens(pages: Tensor, page_size: int) -> Tensor:
    """pages [..., k] -> token indices [..., k * page_size]."""
    offsets = torch.arange(page_size, device=pages.device)
    return (pages.unsqueeze(-1) * page_size + offsets).flatten(-2)


def group_queries(q: Tensor, H: int) -> Tensor:
    """q [B,Hq,d] -> [B,H,G,d] fp32 (query head g -> KV head g // G, as HF repeat_kv)."""
    B, Hq, d = q.shape
    if Hq % H:
        raise ValueError(f"number of query heads {Hq} is not a multiple of the number of KV heads {H}")
    return q.to(torch.float32).reshape(B, H, Hq // H, d)


def page_slices(P: int, elems_per_page: int, device: torch.device):
    """Slices over the page axis so that scoring temporaries stay around 16 MB (CPU) / 256 MB (GPU) of fp32."""
    budget = (1 << 22) if device.type == "cpu" else (1 << 26)
    step = max(1, budget // max(1, elems_per_page))
    return [slice(j, min(P, j + step)) for j in range(0, P, step)]


def exact_page_lse(q: Tensor, keys: Tensor, page_size: int, scaling: float) -> Tensor:
    """Exact page log-mass l_{g,j} = logsumexp_{i in page j} scaling * q_g . k_i, [B,Hq,P] fp32 (complete pages).

    Keys are upcast to fp32 a slice of pages at a time (bounded temporaries at long context)."""
    if keys.dim() != 4:
        raise ValueError(f"keys must be [B, H, L, d] (got shape {tuple(keys.shape)})")
    B, H, L, d = keys.shape
    P = L // page_size
    qg = group_queries(q, H)
    out = torch.empty(B, H, qg.shape[2], P, dtype=torch.float32, device=q.device)
    for sl in page_slices(P, B * H * page_size * (d + qg.shape[2]), q.device):
        X = keys[:, :, sl.start * page_size : sl.stop * page_size].to(torch.float32)
        X = X.reshape(B, H, sl.stop - sl.start, page_size, d)
        logits = torch.einsum("bhgd,bhpnd->bhgpn", qg, X) * scaling
        out[..., sl] = torch.logsumexp(logits, dim=-1)
    return out.reshape(B, qg.shape[1] * qg.shape[2], P)


def static_page_list(top: Tensor, length: Tensor, budget: int, page_size: int, sink_pages: int,
                     recent_pages: int) -> tuple[Tensor, Tensor]:
    """The fair-mode page list of a static decode step at the device length L (oracle of the fused
    `locks.kernels.static_pages`): top [B, Hkv, Kt] best candidate pages -> (pages [B, Hkv, Kt + S + R + 1] int32,
    valid bool). Slots: the top pages (slot j valid iff j < (budget - L mod n) // n - S - R), the sink pages, the
    recent pages L // n - 1, L // n - 2, ..., the partial page L // n; while L <= budget: pages 0 .. Kt + S + R."""
    B, H, Kt = top.shape
    n, S, R = page_size, sink_pages, recent_pages
    dev = top.device
    L = row_length(length, 3)  # [1 or B, 1, 1]: each row's own length
    full = torch.div(L, n, rounding_mode="floor")
    k = torch.div(budget - (L - full * n), n, rounding_mode="floor") - S - R
    fixed = torch.cat([torch.arange(S, device=dev).expand(L.shape[0], 1, S),
                       full - 1 - torch.arange(R, device=dev), full], dim=-1)
    pages = torch.cat([top, fixed.expand(B, H, S + R + 1)], dim=-1)
    slots = torch.arange(pages.shape[-1], device=dev)
    valid = (slots >= Kt) | (slots < k)
    fits = L <= budget
    return torch.where(fits, slots, pages).to(torch.int32), (valid | fits).expand(B, H, -1)


@dataclass
class PagePlan:
    """A page selector's plan for one step at context length L (`PageSelector.plan`)."""

    num_pages: int  # complete pages, L // page_size
    tail: int  # tokens of the partial page, L % page_size (always attended)
    forced: list[int]  # complete pages always attended (fair mode: sink pages, recent pages newest first)
    k_pages: int  # pages chosen by score among the others
    max_tokens: int  # the fixed length of the step's token list

    def forced_tokens(self, page_size: int) -> int:
        return len(self.forced) * page_size + self.tail


SOUNDNESS_TOL = 1e-5
CERTIFICATE_NAMES = ("certificate", "plugin_coverage", "certificate_sound")  # the last with measured coverage


class CoverageCertificate:
    """A page selector's Selection.diagnostics: called with the attended set's lse [B, Hq] it returns the summed
    per-head bounds {name: (sum, count)}; `per_head(lse)` gives the bounds themselves ({name: [B, Hq]})."""

    def __init__(self, per_head, weight: Tensor | None = None, kernel_inputs: dict | None = None):
        self._per_head = per_head
        self._last: tuple | None = None  # (lse_sel, its bounds): a step's sums and soundness share one computation
        self.weight = weight  # a static step's 0-d device 0/1: 0 while no page is scored (L <= budget), counts nothing
        # a static step's certificate as the fused coverage kernel reads it (locks/kernels/coverage.py), or None
        self.kernel_inputs = kernel_inputs

    def _weighted(self, sums: dict) -> dict:
        if self.weight is None:
            return sums
        return {name: (total * self.weight, count * self.weight) for name, (total, count) in sums.items()}

    @staticmethod
    def _sums(per_head: dict[str, Tensor], per_row: bool) -> dict[str, tuple[Tensor, Tensor]]:
        """{name: [B, Hq]} -> {name: (sum, count)}, over everything or per row ([B] each)."""
        if not per_row:
            return {name: (b.sum(), b.new_full((), float(b.numel()))) for name, b in per_head.items()}
        return {name: (b.sum(-1), b.new_full(b.shape[:1], float(b.shape[-1]))) for name, b in per_head.items()}

    def per_head(self, lse_sel: Tensor) -> dict[str, Tensor]:
        if self._last is None or self._last[0] is not lse_sel:
            self._last = (lse_sel, self._per_head(lse_sel))
        return self._last[1]

    def __call__(self, lse_sel: Tensor, per_row: bool = False) -> dict[str, tuple[Tensor, Tensor]]:
        # counts made on the bounds' device by a fill (no host copy: a static step may be captured in a CUDA graph)
        return self._weighted(self._sums(self.per_head(lse_sel), per_row))

    def soundness(self, lse_sel: Tensor, coverage: Tensor, per_row: bool = False) -> dict[str, tuple[Tensor, Tensor]]:
        """`certificate_sound`: how many query heads' certificates are <= their measured coverage [B, Hq] (within
        SOUNDNESS_TOL, the fp32 rounding of both sides), out of how many: its mean is the soundness rate. On the
        bounds' device (the eager step passes the coverage on the host, the static step on the device)."""
        cert = self.per_head(lse_sel)["certificate"].detach().double()
        ok = cert <= coverage.to(cert.device).double() + SOUNDNESS_TOL
        return self._weighted(self._sums({"certificate_sound": ok.double()}, per_row))


@dataclass(frozen=True)
class PageOptions(Options):
    page_size: int = option(16, power_of_two)  # n tokens per page
    recent_window: int = option(0, integer(0))  # fair mode: the newest pages covering this many tokens are forced
    sink_pages: int = option(0, integer(0))  # fair mode: the first pages are forced
    aggregation: str = option("norm", one_of(*AGGREGATIONS))  # how the G query heads' page scores combine
    budget_unit: ClassVar[str] = "page_size"


class PageSelector(Selector):
    """Forced set + per-KV-head top-k pages by aggregated score. Subclasses implement `page_scores`.

    Diagnostics (Selection.diagnostics): `certificate`, a rigorous lower bound on each query head's attention-mass
    coverage from the score error bounds `score_bounds`, and `plugin_coverage`, the same estimate with the bounds
    set to zero (docs/methods/locks.md)."""

    diagnostic_names = CERTIFICATE_NAMES
    row_state = ()
    Options = PageOptions

    @abstractmethod
    def page_scores(self, query: Tensor, keys: Tensor, num_pages: int) -> Tensor:
        """-> S [B, Hq, num_pages]: per-query-head score of every complete page."""

    @abstractmethod
    def scoring_bytes(self, num_candidates: int) -> float:
        """Bytes read per KV head to score `num_candidates` pages (summaries, queries, score round trips)."""

    def score_bounds(self, query: Tensor, num_pages: int) -> Tensor:
        """eta_bar [B, Hq, num_pages] with |S_{g,j} - l_{g,j}| <= eta_bar_{g,j} (exact scores: zeros)."""
        return torch.zeros(query.shape[0], query.shape[1], num_pages, device=query.device)

    def score_bound_radius(self) -> tuple[bool, Tensor | None]:
        """The form of `score_bounds`, for the fused coverage kernel: (True, None) for exact scores (zero bounds, the
        default); (True, rho [B, Hkv, >= pages]) when eta_bar_{g,j} = scaling * ||q_g|| * rho_j; (False, None) for any
        other form (the static step's coverage then runs the reference ops)."""
        return True, None

    def forced_log_mass(self, query: Tensor, keys: Tensor, forced_tokens: Tensor) -> Tensor | None:
        """Exact log-mass of the forced tokens per query head, if the method can know it (Oracle). Default: None."""
        return None

    def static_forced_log_mass(self, query: Tensor, keys: Tensor, length: Tensor) -> Tensor | None:
        """`forced_log_mass` in a static step, whose forced tokens are the valid slots outside the candidate pages
        (`_static_candidates`: sink pages, recent pages, the partial page). Default: None."""
        return None

    def forced_pages(self, num_pages: int, room: int) -> list[int]:
        """Complete pages always attended (fair mode): sink pages, then recent pages newest first, at most `room`."""
        if self.budget_mode == "paper":
            return []
        order = list(range(min(self.sink_pages, num_pages)))
        recent = -(-self.recent_window // self.page_size)
        order += [p for p in range(num_pages - 1, max(num_pages - 1 - recent, -1), -1) if p not in order]
        return order[:room]

    def plan(self, L: int) -> PagePlan:
        """What a step at context length L attends: the forced pages, how many pages it chooses by score, at most how
        many tokens (the benchmarks and the static path use this, never a copy of the rule)."""
        n = self.page_size
        num_pages, tail = divmod(L, n)
        if self.budget_mode == "fair":
            room = (self.budget - tail) // n  # the partial page always fits: budget >= page_size > tail
            forced = self.forced_pages(num_pages, room)
            return PagePlan(num_pages, tail, forced, room - len(forced), self.budget)
        k_pages = self.budget // n
        return PagePlan(num_pages, tail, [], k_pages, k_pages * n + n - 1)

    @staticmethod
    def candidate_range(num_pages: int, forced) -> tuple[int, int] | None:
        """(lo, hi) when the candidate pages (all complete pages but the forced ones) are the range [lo, hi) -- the
        forced pages a prefix (sink) and a suffix (recent pages) --, else None."""
        forced = set(forced)
        lo, hi = 0, num_pages
        while lo in forced:
            lo += 1
        while hi > lo and hi - 1 in forced:
            hi -= 1
        return (lo, hi) if lo + (num_pages - hi) == len(forced) else None

    def select(self, query: Tensor, keys: Tensor, values: Tensor) -> Selection:
        B, Hkv, L, _ = keys.shape
        n = self.page_size
        device = keys.device
        plan = self.plan(L)
        num_pages, tail, forced, k_pages = plan.num_pages, plan.tail, plan.forced, plan.k_pages
        max_tokens = plan.max_tokens
        num_candidates = num_pages - len(forced)
        forced_tokens = len(forced) * n + tail
        tail_idx = torch.arange(num_pages * n, L, device=device).expand(B, Hkv, tail)
        forced_idx = torch.tensor(sorted(forced), device=device, dtype=torch.long)

        metadata_bytes = 0.0
        diagnostics = None
        if k_pages >= num_candidates:  # everything fits: no scoring needed, attend all tokens
            chosen = torch.arange(num_pages, device=device).expand(B, Hkv, num_pages)
            max_tokens = L
        else:
            log_mass = None
            if forced_tokens:
                forced_token_idx = torch.cat([pages_to_tokens(forced_idx, n), tail_idx[0, 0]])
                log_mass = self.forced_log_mass(query, keys, forced_token_idx)
            scores, agg = self.scored_pages(query, keys, num_pages, set(forced), log_mass)
            top = torch.topk(agg, k_pages, dim=-1).indices
            chosen = torch.cat([top, forced_idx.expand(B, Hkv, len(forced))], -1).sort(dim=-1).values
            metadata_bytes = self.scoring_bytes(num_candidates) * Hkv
            diagnostics = self._certificate(query, scores, chosen, num_pages)
        tokens = torch.cat([pages_to_tokens(chosen, n), tail_idx], dim=-1)  # sorted, unique
        valid = torch.ones_like(tokens, dtype=torch.bool)
        pad = max_tokens - tokens.shape[-1]  # fixed size per step: pad with token 0, masked out
        if pad > 0:
            tokens = torch.cat([tokens, tokens.new_zeros(B, Hkv, pad)], -1)
            valid = torch.cat([valid, valid.new_zeros(B, Hkv, pad)], -1)
        return Selection(indices=tokens.unsqueeze(2), valid=valid.unsqueeze(2), forced_tokens=float(forced_tokens),
                         metadata_bytes=float(metadata_bytes), diagnostics=diagnostics)

    # ----- static decode: the same selection with fixed shapes, the length only on the device --------------------

    @property
    def recent_pages(self) -> int:
        return -(-self.recent_window // self.page_size)

    def static_decode_error(self) -> str | None:
        n, S, R = self.page_size, self.sink_pages, self.recent_pages
        if self.budget_mode != "fair":
            return f"{self.name}: static decode implements budget_mode=fair"
        if self.budget < (S + R + 2) * n:
            return (f"{self.name}: static decode needs budget >= (sink_pages + ceil(recent_window / page_size) + 2) "
                    f"* page_size = {(S + R + 2) * n} (got {self.budget})")
        return None

    def start_static(self, capacity: int) -> None:
        self.static_pages = capacity // self.page_size  # complete pages the preallocated cache can hold
        self.static_fits = capacity <= self.budget  # the whole generation fits in the budget: attend everything

    def select_static(self, query: Tensor, keys: Tensor, values: Tensor, length: Tensor) -> Selection:
        """`select` at the device length L with fixed shapes, as a page list (`static_page_list`): the Kt = budget
        // n - S - R best candidate pages of [S, L // n - R), the S sink and R recent pages, the partial page.
        Backend triton: fused scoring over the range read from the length, torch.topk, the list in one launch."""
        if self.static_fits:
            return Selection.all_tokens()
        n, S, R = self.page_size, self.sink_pages, self.recent_pages
        Kt = self.budget // n - S - R
        agg, scores = self.static_candidate_scores(query, keys, length)
        top = torch.topk(agg, Kt, dim=-1).indices
        if self.info.backend == "triton":
            from locks.kernels.static_pages import static_pages

            pages, valid = static_pages(top, length, self.budget, n, S, R)
        else:
            pages, valid = static_page_list(top, length, self.budget, n, S, R)
        return Selection(pages=pages.unsqueeze(2), page_valid=valid.unsqueeze(2), page_size=n, attended_on_host=True,
                         diagnostics=self._static_certificate(query, scores, pages, valid, length))

    def static_candidate_scores(self, query: Tensor, keys: Tensor, length: Tensor) -> tuple[Tensor, Tensor]:
        """(A [B, Hkv, P] over all preallocated pages, -inf outside the candidates [S, L // n - R); the per-head
        scores S [B, Hq, P], meaningful on the candidates)."""
        P = self.static_pages
        scores = self.page_scores(query, keys, P)
        candidates = self._static_candidates(length).expand(query.shape[0], keys.shape[1], P)
        return aggregate_heads(scores, self.info.group_size, self.aggregation, candidates,
                               self.static_forced_log_mass(query, keys, length)), scores

    def _static_candidates(self, length: Tensor) -> Tensor:
        """[1 or B, 1, P] bool: each row's candidate pages [S, L // n - R)."""
        pages = torch.arange(self.static_pages, device=length.device)
        hi = torch.div(row_length(length, 3), self.page_size, rounding_mode="floor") - self.recent_pages
        return (pages >= self.sink_pages) & (pages < hi)

    def _static_certificate(self, query: Tensor, scores: Tensor, pages: Tensor, valid: Tensor, length: Tensor):
        """`_certificate` for a static step (lazy: computed only when the step measures coverage): the candidate
        pages outside the page list bound the missing mass. A CoverageCertificate whose sums and counts are zero while
        L <= budget (no page was scored then, as in eager decoding)."""
        def bounds(lse_sel: Tensor) -> dict[str, Tensor]:
            B, Hq, P = scores.shape
            chosen = torch.zeros(B, pages.shape[1], P + 1, dtype=torch.int32, device=scores.device)
            chosen.scatter_reduce_(2, pages.long().clamp(0, P), valid.to(torch.int32), reduce="amax")
            outside = self._static_candidates(length) & (chosen[..., :P] == 0)
            return self._coverage_bounds(lse_sel, *self._outside_mass(query, scores, outside))

        exact_or_norm, rho = self.score_bound_radius()
        kernel_inputs = None if not exact_or_norm else dict(
            scores=scores, rho=rho, pages=pages, valid=valid, sink_pages=self.sink_pages,
            recent_pages=self.recent_pages, page_size=self.page_size, budget=self.budget, tol=SOUNDNESS_TOL)
        # one weight per row ([1] or [B]): a row counts nothing while it fits its budget
        return CoverageCertificate(bounds, weight=(length > self.budget).to(torch.float64),
                                   kernel_inputs=kernel_inputs)

    def static_step_cost(self, length: int) -> tuple[float, float, float]:
        plan = self.plan(length)
        num_pages, tail, forced, k_pages = plan.num_pages, plan.tail, plan.forced, plan.k_pages
        num_candidates = num_pages - len(forced)
        if k_pages >= num_candidates:  # everything fits
            return float(len(forced) * self.page_size + tail), 0.0, float(length)
        metadata = self.scoring_bytes(num_candidates) * self.info.num_kv_heads
        return (float(len(forced) * self.page_size + tail), float(metadata),
                float((k_pages + len(forced)) * self.page_size + tail))

    def scored_pages(self, query: Tensor, keys: Tensor, num_pages: int, forced: set[int],
                     forced_log_mass: Tensor | None) -> tuple[Tensor, Tensor]:
        """(S [B, Hq, P] per-head scores, A [B, Hkv, P] aggregated scores, -inf on the forced pages)."""
        B, Hkv = keys.shape[:2]
        candidates = torch.ones(B, Hkv, num_pages, dtype=torch.bool, device=keys.device)
        candidates[:, :, sorted(forced)] = False
        scores = self.page_scores(query, keys, num_pages)
        return scores, aggregate_heads(scores, self.info.group_size, self.aggregation, candidates, forced_log_mass)

    def _certificate(self, query: Tensor, scores: Tensor, chosen: Tensor, num_pages: int):
        """Per-step coverage certificate (docs/methods/locks.md), given the selected set's exact lse_sel per head:

            log Cov_g >= lse_sel,g - logaddexp(lse_sel,g, logsumexp_{j not in T} (S_{g,j} + eta_bar_{g,j}))

        (rigorous: l_j <= S_j + eta_bar_j), and the plug-in estimate with eta_bar = 0 (no guarantee).
        """
        outside = torch.ones(scores.shape[0], chosen.shape[1], num_pages, dtype=torch.bool, device=scores.device)
        outside.scatter_(2, chosen, False)
        rest_bound, rest_plugin = self._outside_mass(query, scores, outside)
        return CoverageCertificate(lambda lse_sel: self._coverage_bounds(lse_sel, rest_bound, rest_plugin))

    def _outside_mass(self, query: Tensor, scores: Tensor, outside: Tensor) -> tuple[Tensor, Tensor]:
        """(logsumexp over the pages outside the set of S + eta_bar, the same with eta_bar = 0) per query head, for
        outside [B, Hkv, P] (bool, shared by the group) and scores S [B, Hq, P]."""
        outside = outside.repeat_interleave(self.info.group_size, dim=1)  # [B, Hq, P]
        eta = self.score_bounds(query, scores.shape[-1])
        return (torch.logsumexp((scores + eta).masked_fill(~outside, float("-inf")), dim=-1),
                torch.logsumexp(scores.masked_fill(~outside, float("-inf")), dim=-1))

    @staticmethod
    def _coverage_bounds(lse_sel: Tensor, rest_bound: Tensor, rest_plugin: Tensor) -> dict[str, Tensor]:
        return {"certificate": torch.exp(lse_sel - torch.logaddexp(lse_sel, rest_bound)),
                "plugin_coverage": torch.exp(lse_sel - torch.logaddexp(lse_sel, rest_plugin))}
