"""Quest (ICML'24, `docs/methods/quest.md`): query-aware page selection with per-page key min/max bounds.

For every page of `page_size` consecutive post-RoPE keys and every KV head the selector keeps the channel-wise
maximum M and minimum m of the keys (the partial last page included), built at prefill and updated on every decode
append. At a decode step each query head scores each page by the upper bound of its largest logit

    U_p(q) = sum_i max(q_i M_{p,i}, q_i m_{p,i})  >=  max_{j in p} q . k_j      (fp32, no 1/sqrt(d), no softmax)

and attends exactly (softmax over the selected tokens only, renormalized) to the tokens of its top pages. The
first `dense_layers` layers (by `LayerInfo.layer_idx`) attend densely and keep no metadata; prefill is always dense.

Budget -> pages, `page_rule`:
  kernel (default; the official FlashInfer path): page_budget = budget // P INCLUDING the current (last, possibly
      partial) page. If #pages <= page_budget: dense. Else the top (page_budget - 1) pages among all pages but the
      last, plus the last page; attended = (page_budget - 1) * P + len(last page) <= budget, so `fair` and `paper`
      coincide. The current page's tokens are reported as forced tokens.
  eval (the official mask-simulation path behind every accuracy number): B_eff = min(L, B); k = min(max(3,
      B_eff // P), ceil(L/P)) pages by top-k over ALL pages including the last; nothing forced.
      `paper`: exactly that (3 pages may exceed a budget < 3P). `fair`: the min-3-pages floor is dropped when 3
      pages (3P tokens) would exceed the budget, so every query head attends <= budget tokens.
GQA, `gqa`:
  per_head (default; the eval path's semantics through repeat_kv): each query head selects its own pages
      (Selection with Gs = G); the KV head's K/V read is the union of its G heads' pages.
  group: one score per KV head, max or sum (`group_reduce`) of the G heads' bounds (Selection with Gs = 1).

Accounting (spec 1.5): metadata_bytes per KV head = 2*d*s per scored page (the G queries score in one pass) + s per
score (one per scored page and set) + 4 per top-k page index (per set); K/V bytes come from the union of the sets.
Dense steps read no metadata and report no forced tokens. extra_metrics `quest_union_ratio` = mean union size per KV
head / mean per-query-head set size, averaged over the decode steps that scored pages (1 for gqa=group).

Deviations from the official code:
  - eval rule, "one page short" (Quest#22, spec 1.6.5): with L mod P != 0 and B >= L the official code takes
    L // P pages and drops one; here B >= L attends densely.
  - Ties between equal page scores go to the lower page index (stable sort) instead of RAFT select-k / torch.topk's
    unspecified order, so a larger budget always selects a superset.
  - Page scores are ranked in fp32; the official kernel path stores them in fp16 before select-k, so pages whose
    bounds round to the same fp16 value tie there (and may rank differently) while they are distinct here.
  - The kernel path is MHA with batch 1 only; here it runs on any batch and GQA through `gqa` (per_head reads the
    union of the group's pages, group scores once per KV head).
  - Metadata keeps the keys' dtype and a new page starts from its first key instead of from -/+65504 (same values);
    the eval path recomputes the bound from all keys every step, which gives the same bound.
  - The dense fallback of either rule (and the eval rule's k >= #pages) runs SDPA over every token with no metadata
    read, as the kernel path's `need_estimate() == False` does.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from locks.core.buffers import grown
from locks.core.options import Options, integer, one_of, option, positive_int
from locks.core.page_bounds import fold_into_page
from locks.core.paging import pages_to_tokens
from locks.core.registry import register
from locks.core.selector import LayerInfo, Selection, Selector, row_length
from locks.errors import ConfigError

PAGE_RULES = ("kernel", "eval")
GQA_MODES = ("per_head", "group")
GROUP_REDUCE = ("max", "sum")


@dataclass(frozen=True)
class QuestOptions(Options):
    page_size: int = option(16, positive_int)  # P tokens per page
    dense_layers: int = option(2, integer(0))  # the first layers attend densely and keep no metadata
    page_rule: str = option("kernel", one_of(*PAGE_RULES))
    gqa: str = option("per_head", one_of(*GQA_MODES))
    group_reduce: str = option("max", one_of(*GROUP_REDUCE))  # gqa=group: how the G heads' bounds combine

    def check_budget(self, budget):
        if budget < self.page_size:
            raise ConfigError(f"budget must be >= method.page_size={self.page_size} tokens for quest (got {budget})")


@register
class QuestSelector(Selector):
    name = "quest"
    display_name = "Quest"
    report_order = 4
    row_state = ("_max", "_min")
    Options = QuestOptions

    def __init__(self, info: LayerInfo, budget: int, **options):
        super().__init__(info, budget, **options)
        self.dense = info.layer_idx < self.dense_layers
        self.length = 0  # tokens folded into the metadata
        self._max: Tensor | None = None  # [B, Hkv, capacity pages, d], keys' dtype
        self._min: Tensor | None = None
        self._ratio_sum: Tensor | float = 0.0
        self._ratio_steps = 0

    # ----- metadata -------------------------------------------------------------------------------------------------

    @property
    def num_pages(self) -> int:
        return -(-self.length // self.page_size)

    @property
    def page_max(self) -> Tensor:
        """[B, Hkv, num_pages, d] channel-wise key maximum per page (partial last page included)."""
        return self._max[:, :, : self.num_pages]

    @property
    def page_min(self) -> Tensor:
        return self._min[:, :, : self.num_pages]

    def _reserve(self, keys: Tensor, pages: int) -> None:
        if self._max is None:
            self._max = self._min = keys.new_empty(*keys.shape[:2], 0, keys.shape[3])
        self._max, self._min = (grown(buf, self.num_pages, pages, minimum=16) for buf in (self._max, self._min))

    def _extend(self, keys: Tensor) -> None:
        """Fold keys[:, :, self.length:] (any number of new rows) into the per-page max/min."""
        L = keys.shape[2]
        start = self.length
        if L <= start:
            return
        P = self.page_size
        self._reserve(keys, -(-L // P))
        new = keys[:, :, start:]
        if start % P:  # the open page: merge with the rows that complete (or extend) it
            r = min(P - start % P, L - start)
            fold_into_page(self._max, self._min, new[:, :, :r], start // P, opens=False)
            new, start = new[:, :, r:], start + r
        n = new.shape[2]
        if n:  # whole new pages, then a new partial page that starts from its first key
            B, H, _, d = new.shape
            full, tail = divmod(n, P)
            p = start // P
            if full:
                x = new[:, :, : full * P].reshape(B, H, full, P, d)
                self._max[:, :, p : p + full] = x.amax(3)
                self._min[:, :, p : p + full] = x.amin(3)
            if tail:
                fold_into_page(self._max, self._min, new[:, :, full * P :], p + full, opens=True)
        self.length = L

    def prefill(self, ctx) -> None:
        if not self.dense:
            self._extend(ctx.keys)

    def append(self, keys: Tensor, values: Tensor) -> None:
        if not self.dense:
            self._extend(keys)

    def memory_bytes(self, length: int) -> dict[str, float]:
        """The whole K/V on the device plus every page's channel-wise key max and min (the keys' dtype); the first
        `dense_layers` layers keep none."""
        info = self.info
        pages = 0 if self.dense else -(-length // self.page_size)
        state = 2 * pages * info.head_dim * info.kv_element_bytes * info.num_kv_heads
        return {**super().memory_bytes(length), "state": float(state)}

    @property
    def page_budget(self) -> int:
        """Pages per step under the kernel rule, the current (last) page included: budget // page_size."""
        return self.budget // self.page_size

    # ----- selection ------------------------------------------------------------------------------------------------

    def page_bounds(self, query: Tensor, num_pages: int) -> Tensor:
        """U [B, Hkv, G, num_pages] fp32 for the first `num_pages` pages.

        max(q_i M_i, q_i m_i) = max(q_i, 0) M_i + min(q_i, 0) m_i because M_i >= m_i, so
        U = q+ . M + q- . m: two matmuls instead of a [.., pages, d] element-wise max.
        """
        B, Hq, d = query.shape
        Hkv = self._max.shape[1]
        if self.info.backend == "triton":  # fused kernel: min/max read once for the G heads (locks/kernels/)
            from baselines.quest.kernels import quest_page_scores

            return quest_page_scores(query, self._max[:, :, :num_pages], self._min[:, :, :num_pages]).view(
                B, Hkv, Hq // Hkv, num_pages)
        q = query.view(B, Hkv, Hq // Hkv, d).float()
        M = self._max[:, :, :num_pages].float()
        m = self._min[:, :, :num_pages].float()
        return q.clamp(min=0) @ M.transpose(-1, -2) + q.clamp(max=0) @ m.transpose(-1, -2)

    def select(self, query: Tensor, keys: Tensor, values: Tensor) -> Selection:
        if self.dense:
            return Selection.all_tokens()
        B, Hkv, L, d = keys.shape
        if self.length < L:  # the harness appends first; this only covers direct calls without append
            self._extend(keys)
        P = self.page_size
        num_pages = -(-L // P)
        if self.page_rule == "kernel":
            page_budget = self.page_budget
            if num_pages <= page_budget:
                return Selection.all_tokens()
            k, scored = page_budget - 1, num_pages - 1  # the last page is not scored: it is always attended
            forced = L - (num_pages - 1) * P
        else:
            if self.budget >= L:  # deviation: the official B_eff = L takes L // P pages (one short if L mod P != 0)
                return Selection.all_tokens()
            floor = 3 if (self.budget_mode == "paper" or 3 * P <= self.budget) else 1
            k = min(max(floor, min(L, self.budget) // P), num_pages)
            if k >= num_pages:
                return Selection.all_tokens()
            scored, forced = num_pages, 0

        scores = self.page_bounds(query, scored)  # [B, Hkv, G, scored]
        if self.gqa == "group":
            if self.group_reduce == "max":
                scores = scores.amax(2, keepdim=True)
            else:  # sorted over the group first, so the sum does not depend on the heads' order
                scores = scores.sort(dim=2).values.sum(2, keepdim=True)
        sets = scores.shape[2]
        # top-k with ties to the lower page index (stable), then page order
        top = torch.sort(scores, dim=-1, descending=True, stable=True).indices[..., :k]
        pages = top.sort(dim=-1).values
        if self.page_rule == "kernel":
            pages = torch.cat([pages, pages.new_full((B, Hkv, sets, 1), num_pages - 1)], dim=-1)
        tokens = pages_to_tokens(pages, P)  # the only partial page is the last: its missing tokens are at the end
        valid = tokens < L
        tokens = tokens.masked_fill(~valid, 0)

        if sets > 1:
            self._record_union(pages, valid, num_pages, L)
        else:
            self._ratio_sum = self._ratio_sum + 1.0
            self._ratio_steps += 1
        metadata_bytes = self._metadata_bytes(scored, k, sets)
        return Selection(indices=tokens, valid=valid, forced_tokens=float(forced), metadata_bytes=float(metadata_bytes))

    def _metadata_bytes(self, scored: int, k: int, sets: int) -> float:
        # spec 1.5, per KV head: min+max of every scored page (one pass for the G queries), one s-byte score per
        # (set, scored page), one 4-byte index per top-k page of each set
        info = self.info
        s = info.kv_element_bytes
        return float(info.num_kv_heads * (2 * info.head_dim * s * scored + s * scored * sets + 4 * k * sets))

    # ----- static decode (kernel page rule): fixed shapes, the length only on the device --------------------------

    def static_decode_error(self):
        if self.page_rule != "kernel":
            return "quest: static decode implements page_rule=kernel (the eval rule scores the open page too)"
        return None

    def start_static(self, capacity):
        pages = -(-capacity // self.page_size)
        self.static_fits = pages <= self.page_budget
        if not self.dense:
            self._reserve(self._max, pages)
            self._max[:, :, self.num_pages :] = 0  # never-written pages hold finite values (their scores are masked)
            self._min[:, :, self.num_pages :] = 0

    def _append_static_reference(self, keys: Tensor, length: Tensor) -> None:
        """Fold the key at slot length - 1 into its page's max/min on the device (a new page starts from it)."""
        position = length.reshape(-1) - 1  # [1], or [B]: each row's own slot (stacked rows)
        page = torch.div(position, self.page_size, rounding_mode="floor")
        key = (keys.index_select(2, position) if position.numel() == 1 else
               keys[torch.arange(keys.shape[0], device=keys.device), :, position].unsqueeze(2))
        fold_into_page(self._max, self._min, key, page, opens=position % self.page_size == 0)

    def select_static(self, query, keys, values, length):
        """The kernel rule at the device length L, as a page list: the top (budget // P - 1) pages among the
        complete pages before the last one, plus the last (open) page; pages 0 .. budget // P - 1 while
        ceil(L / P) <= budget // P (tokens at or past L are masked by the decode). The union-ratio metric is not
        kept here; with gqa=per_head the union of the group's pages is counted on the device."""
        if self.dense:
            return Selection.all_tokens()
        if self.info.backend == "triton":
            return self._select_static_fused(query, keys, length)
        self._append_static_reference(keys, length)
        if self.static_fits:
            return Selection.all_tokens()
        B, Hkv = keys.shape[:2]
        P = self.page_size
        page_budget = self.page_budget
        dev = keys.device
        last = torch.div(row_length(length, 4) + P - 1, P, rounding_mode="floor") - 1  # each row's open page
        capacity_pages = self._max.shape[2]
        scores = self.page_bounds(query, capacity_pages)
        scores = scores.masked_fill(torch.arange(capacity_pages, device=dev) >= last, float("-inf"))
        scores = self._static_sets(scores)
        sets = scores.shape[2]
        # torch.topk, not the eager path's stable sort of every page: a full sort per step would dominate the
        # step at long context (ties between exactly equal bounds then go either way, as in the official select-k)
        top = torch.topk(scores, page_budget - 1, dim=-1).indices.sort(dim=-1).values
        pages = torch.cat([top, last.expand(B, Hkv, sets, 1)], dim=-1)
        pages = torch.where(last < page_budget, torch.arange(page_budget, device=dev), pages)
        return Selection(pages=pages, page_size=P, attended_on_host=sets == 1)

    def _static_sets(self, scores):
        """[B, Hkv, G, pages] bounds -> one set per query head (gqa=per_head) or one per KV head (gqa=group)."""
        if self.gqa != "group":
            return scores
        if self.group_reduce == "max":
            return scores.amax(2, keepdim=True)
        return scores.sort(dim=2).values.sum(2, keepdim=True)

    def _select_static_fused(self, query, keys, length):
        """`select_static` in four launches (baselines/quest/kernels.py): the min/max update, the bounds with the open
        page and later ones masked, torch.topk, and the page list with each KV head's union of its sets counted."""
        from baselines.quest.kernels import quest_append, quest_page_scores, quest_static_pages

        quest_append(keys, self._max, self._min, length, self.page_size)
        if self.static_fits:
            return Selection.all_tokens()
        B, Hq, _ = query.shape
        Hkv = keys.shape[1]
        cap = self._max.shape[2]
        scores = quest_page_scores(query, self._max, self._min, length=length, page_size=self.page_size).view(
            B, Hkv, Hq // Hkv, cap)
        scores = self._static_sets(scores)
        top = torch.topk(scores, self.page_budget - 1, dim=-1).indices
        per_head = scores.shape[2] > 1
        pages, attended = quest_static_pages(top, length, self.page_size, self.page_budget, count=per_head)
        return Selection(pages=pages, page_size=self.page_size, attended_on_host=not per_head,
                         attended_rows=attended)

    def after_static_step(self, keys, values, length):
        if not self.dense:
            self.length = length

    def static_step_cost(self, length):
        P = self.page_size
        num_pages = -(-length // P)
        page_budget = self.page_budget
        host = self.dense or self.static_fits or self.gqa == "group"  # as the Selection's attended_on_host
        if self.dense or num_pages <= page_budget:
            return 0.0, 0.0, float(length) if host else None
        sets = self.info.group_size if self.gqa == "per_head" else 1
        forced = length - (num_pages - 1) * P
        attended = float((page_budget - 1) * P + forced) if host else None
        return float(forced), self._metadata_bytes(num_pages - 1, page_budget - 1, sets), attended

    def _record_union(self, pages: Tensor, valid: Tensor, num_pages: int, L: int) -> None:
        """Mean union size per KV head / mean per-head set size, accumulated on the device (no sync per step)."""
        B, Hkv, G, _ = pages.shape
        read = torch.zeros(B, Hkv, num_pages, dtype=torch.bool, device=pages.device)
        read.scatter_(2, pages.reshape(B, Hkv, -1), True)
        page_len = torch.full((num_pages,), float(self.page_size), device=pages.device)
        page_len[-1] = L - (num_pages - 1) * self.page_size
        union = (read.float() * page_len).sum(-1).mean()
        self._ratio_sum = self._ratio_sum + union / valid.sum(-1).float().mean()
        self._ratio_steps += 1

    def extra_metrics(self) -> dict:
        if self.dense or not self._ratio_steps:
            return {}
        return {"quest_union_ratio": float(self._ratio_sum) / self._ratio_steps}
