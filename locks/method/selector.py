"""LOCKS: per-page local low-rank key summaries scored by log-sum-exp (`docs/methods/locks.md`).

Every complete page of `page_size` post-RoPE keys per KV head gets (mu, V, C) from a rank-`rank` SVD of the centered
keys, quantized to the 804 B/page layout (`quant=int`) or kept in fp32 (`quant=none`). The page score of query head g
is S_{g,j} = logsumexp_i s (q_g . mu_j + (V_j^T q_g) . c_i); `PageSelector` aggregates over the group, adds the
forced set and takes the top pages. Summaries are built in one batch at prefill and one page at a time during
decode, when a page's last token arrives (A2); the partial page is attended densely until then.
"""
import functools
from dataclasses import dataclass

import torch

from locks.core.options import integer, one_of, option
from locks.core.paging import PageOptions, PageSelector, aggregate_heads
from locks.core.registry import register
from locks.errors import ConfigError
from locks.method.layouts import SummaryLayout
from locks.method.summaries import (
    PageSummaries,
    build_summaries,
    concat_summaries,
    page_scores,
    preallocate_summaries,
    score_bound,
    summary_bytes_per_page,
    write_summaries,
)


LOG_Z = ("exact", "previous")  # normalized aggregation: this step's log Z (two passes) or the previous one's (one pass)


@dataclass(frozen=True)
class LocksOptions(PageOptions):
    rank: int = option(8, integer(0))  # r: the summary's rank, 0 <= r < page_size
    quant: str = option("int", one_of("int", "none"))  # int: the quantized layout below | none: fp32 summaries
    # the quantized layout's switches (locks/method/layouts.py); the default is the fused kernels' 804 B/page
    v_bits: int = 4
    v_group: int = 0
    c_bits: int = 8
    mu_format: str = "head_int8"
    w_dtype: str = "fp32"
    log_z: str = option("exact", one_of(*LOG_Z))

    @property
    def layout(self) -> SummaryLayout:
        return SummaryLayout(self.v_bits, self.v_group, self.c_bits, self.mu_format, self.w_dtype)

    def check(self):
        if not self.rank < self.page_size:
            raise ConfigError(f"method.rank must satisfy 0 <= rank < method.page_size={self.page_size} "
                              f"(got {self.rank})")
        layout = self.layout  # checks its switches
        if self.quant == "none" and not layout.is_default:
            raise ConfigError(f"method.quant=none keeps fp32 summaries: the layout switches (v_bits, v_group, c_bits, "
                              f"mu_format, w_dtype) need method.quant=int (got {layout.name})")
        if self.log_z == "previous" and self.aggregation == "raw":
            raise ConfigError("method.log_z=previous applies to aggregation norm or max (raw has no log Z)")


@register
class LocksSelector(PageSelector):
    name = "locks"
    display_name = "LOCKS"
    report_order = 3
    row_state = ("summaries", "static_log_z")  # static_log_z: log_z=previous only
    Options = LocksOptions

    def __init__(self, info, budget, **options):
        super().__init__(info, budget, **options)
        self.layout = self.options.layout
        if self.quant == "int":
            self.layout.check(info.head_dim, self.page_size)
        self.prev_log_z = None  # log_z=previous: [B, Hq] the log Z of the last scoring (prefill: the last prompt query)
        self.summaries = None
        self.pages_built = 0

    def prefill_queries(self) -> int | None:
        return 1 if self.log_z == "previous" else 0  # the last prompt query gives the first step's log Z

    @property
    def fused_scoring(self) -> bool:
        """Whether the fused Triton scorer runs: backend triton and the default quantized layout (the only one the
        kernels read; every other layout, and quant=none, is scored by the PyTorch reference)."""
        return self.info.backend == "triton" and self.quant == "int" and self.layout.is_default

    def extra_metrics(self) -> dict:
        """The summaries' bytes per page (of the layout they are stored in) and whether the fused kernels scored
        them (1) or the PyTorch reference did (0), per layer; metrics.json averages them over layers."""
        return {"summary_bytes_per_page": float(self.bytes_per_page), "fused_scoring": float(self.fused_scoring)}

    @functools.cached_property
    def bytes_per_page(self) -> int:
        """Summary bytes per page and KV head in this selector's layout (summary_bytes_per_page of one built page)."""
        return summary_bytes_per_page(self._layout_of_one_page())

    def use_summaries(self, summaries) -> None:
        """Score these summaries of complete pages instead of building them at prefill (the GPU benchmarks give
        summaries in the exact quantized layout with random values: timing does not depend on the values)."""
        self.summaries = summaries
        self.pages_built = summaries.num_pages

    def prefill(self, ctx):
        n = self.page_size
        self.pages_built = ctx.keys.shape[2] // n
        keys = ctx.keys[:, :, : self.pages_built * n]
        self.summaries = ctx.shared(("locks.summaries", n, self.rank, self.quant, self.layout.name),
                                    lambda: build_summaries(keys, n, self.rank, self.quant, layout=self.layout))
        self.prev_log_z = None
        if self.log_z == "previous":  # the log Z a step at the prompt's length would have had, for its last query
            plan = self.plan(ctx.keys.shape[2])
            B, Hkv = ctx.keys.shape[:2]
            candidates = torch.ones(B, Hkv, plan.num_pages, dtype=torch.bool, device=ctx.keys.device)
            candidates[:, :, sorted(plan.forced)] = False
            query = ctx.queries[:, :, -1]
            self.prev_log_z = self._log_z_of(self._head_scores(query, plan.num_pages), candidates)

    def append(self, keys, values):
        pages = keys.shape[2] // self.page_size
        if pages > self.pages_built:
            self.summaries = concat_summaries(self.summaries, self._summaries_to(keys, keys.shape[2]))
            self.pages_built = pages

    def _summaries_to(self, keys, length):
        """The summaries of the pages complete at `length` tokens that have none yet (A2)."""
        n = self.page_size
        return build_summaries(keys[:, :, self.pages_built * n : length // n * n], n, self.rank, self.quant,
                               head_mean=self.summaries.head_mean, layout=self.layout)

    def start_static(self, capacity):
        super().start_static(capacity)
        self.static_summarize_to = None  # prepare_static_step: the length whose new pages this step summarizes
        self.summaries = preallocate_summaries(self.summaries, self.static_pages)
        if self.log_z == "previous":
            B, dev = self.summaries.head_mean.shape[0], self.summaries.head_mean.device
            self.static_log_z = (torch.full((B, self.info.num_heads), float("-inf"), device=dev)
                                 if self.prev_log_z is None else self.prev_log_z.float().clone())

    def static_state(self):
        return [self.static_log_z] if self.log_z == "previous" else []

    def finish_static(self):
        if self.log_z == "previous":
            self.prev_log_z = self.static_log_z.clone()

    # ----- log_z=previous: normalize each head by the previous scoring's log Z (docs/methods/locks.md) --------------

    def _head_scores(self, query, num_pages):
        """S [B, Hq, num_pages]: the fused scorer's per-head scores when it runs, else the reference's."""
        if self.fused_scoring:
            from locks.method.kernels import locks_page_scores

            return locks_page_scores(query, self.summaries.kernel_tensors(), self.info.scaling)[..., :num_pages]
        return page_scores(query, self.summaries, self.info.scaling)[..., :num_pages]

    def _log_z_of(self, scores, candidates):
        """log Z_g = logsumexp over the candidate pages of S_g -> [B, Hq] (-inf without candidates)."""
        c = candidates.repeat_interleave(self.info.group_size, dim=1)
        return torch.logsumexp(scores.float().masked_fill(~c, float("-inf")), dim=-1)

    def _aggregate_with_previous(self, scores, candidates, previous):
        """A with each head normalized by `previous` log Z (the exact one of these scores where there is none yet);
        -> (A, the exact log Z of these scores, for the next step)."""
        exact = self._log_z_of(scores, candidates)
        used = exact if previous is None else torch.where(torch.isfinite(previous), previous, exact)
        return aggregate_heads(scores, self.info.group_size, self.aggregation, candidates, log_z=used), exact

    def prepare_static_step(self, length):
        # A2: a page is summarized when its last token arrives, before the step that brought it scores (as eager
        # decoding's `append` does); the build is host work (an eigendecomposition), so that step, one in page_size,
        # runs outside the captured graph
        self.static_summarize_to = length if not self.static_fits and length // self.page_size > self.pages_built else None
        return self.static_summarize_to is not None

    def static_host_work(self, keys, values):
        if self.static_summarize_to is not None:
            write_summaries(self.summaries, self._summaries_to(keys, self.static_summarize_to), self.pages_built)
            self.pages_built = self.static_summarize_to // self.page_size
            self.static_summarize_to = None

    def static_candidate_scores(self, query, keys, length):
        if self.log_z == "previous":
            scores = self._head_scores(query, self.static_pages)
            candidates = self._static_candidates(length).expand(query.shape[0], keys.shape[1], self.static_pages)
            agg, exact = self._aggregate_with_previous(scores, candidates, self.static_log_z)
            self.static_log_z.copy_(exact)
            return agg, scores
        if not self.fused_scoring:
            return super().static_candidate_scores(query, keys, length)
        from locks.method.kernels import locks_aggregated_scores

        agg, heads, _ = locks_aggregated_scores(query, self.summaries.kernel_tensors(), self.info.scaling,
                                                self.info.group_size, mode=self.aggregation, lo=self.sink_pages,
                                                hi=self.recent_pages, length=length, return_heads=True)
        return agg, heads

    def scored_pages(self, query, keys, num_pages, forced, forced_log_mass):
        # The fused Triton scorer (backend=triton) reads each quantized summary byte once and aggregates over the
        # candidate range [lo, hi): LOCKS's forced pages are a prefix (sink) and a suffix (recent pages), so lo and
        # hi are found by walking the (few) forced pages, never the page list (this runs every step in every layer).
        if self.log_z == "previous":
            candidates = torch.ones(keys.shape[0], keys.shape[1], num_pages, dtype=torch.bool, device=keys.device)
            candidates[:, :, sorted(forced)] = False
            scores = self._head_scores(query, num_pages)
            agg, self.prev_log_z = self._aggregate_with_previous(scores, candidates, self.prev_log_z)
            return scores, agg
        if not self.fused_scoring or forced_log_mass is not None:
            return super().scored_pages(query, keys, num_pages, forced, forced_log_mass)
        bounds = self.candidate_range(num_pages, forced)
        if bounds is None:  # a forced page inside the candidates: not a range
            return super().scored_pages(query, keys, num_pages, forced, forced_log_mass)
        lo, hi = bounds
        from locks.method.kernels import locks_aggregated_scores

        agg, scores, _ = locks_aggregated_scores(query, self.summaries.kernel_tensors(), self.info.scaling,
                                                 self.info.group_size, mode=self.aggregation, lo=lo, hi=hi,
                                                 return_heads=True)
        return scores[..., :num_pages], agg[..., :num_pages]

    def page_scores(self, query, keys, num_pages):
        return page_scores(query, self.summaries, self.info.scaling)[..., :num_pages]

    def score_bounds(self, query, num_pages):
        return score_bound(query, self.summaries, self.info.scaling)[..., :num_pages]

    def score_bound_radius(self):
        # quantized layouts: eta_bar = scaling * ||q|| * rho^ (locks/method/summaries.py score_bound); unquantized
        # summaries bound by the residual of q outside the page's basis, which the coverage kernel does not compute
        return (False, None) if isinstance(self.summaries, PageSummaries) else (True, self.summaries.rho)

    def memory_bytes(self, length):
        """The whole K/V on the device plus each complete page's summary and the per-head mean (fp32)."""
        info = self.info
        pages = length // self.page_size
        per_page = self.bytes_per_page
        state = info.num_kv_heads * (pages * per_page + 4 * info.head_dim)
        return {**super().memory_bytes(length), "state": float(state)}

    def _layout_of_one_page(self):
        """The summaries of one page of random keys, built by the code that lays out every page."""
        keys = torch.randn(1, 1, self.page_size, self.info.head_dim, generator=torch.Generator().manual_seed(0))
        return build_summaries(keys, self.page_size, self.rank, self.quant, layout=self.layout)

    def scoring_bytes(self, num_candidates):
        # A7: summaries of the candidate pages + the G queries + the aggregated score written and re-read (fp32).
        info = self.info
        return (summary_bytes_per_page(self.summaries) * num_candidates
                + info.group_size * info.head_dim * info.kv_element_bytes + num_candidates * 4 * 2)
