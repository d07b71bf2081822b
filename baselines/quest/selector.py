"""Quest (ICML'24): query-aware page selection by per-page key min/max bounds (`docs/methods/quest.md`: the rules,
GQA modes, bytes model and deviations from the official code).

Per page of `page_size` post-RoPE keys and per KV head the selector keeps the channel-wise max M and min m (the open
page included). A query head bounds a page's largest logit by

    U_p(q) = sum_i max(q_i M_{p,i}, q_i m_{p,i}) = q+ . M_p + q- . m_p  >=  max_{j in p} q . k_j      (fp32)

page_rule=kernel (the official FlashInfer path): the top budget // P - 1 pages but the last, plus the last (forced);
eval (the official mask simulation): the top max(3, budget // P) pages of all. The prefill is dense, and so are the
first `dense_layers` layers (the core runs them: locks/core/dense.py).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch
from torch import Tensor

from locks.core.options import Options, integer, one_of, option, positive_int
from locks.core.page_bounds import bounds_bytes, extend_bounds, fold_static_key, open_page, reserve_bounds
from locks.core.reference import paged_attended, paged_tokens
from locks.core.registry import register
from locks.core.selector import LayerInfo, Selection, Selector
from locks.core.topk import head_sets, top_of_keys, top_units, top_units_lowest_first


@dataclass(frozen=True)
class QuestOptions(Options):
    page_size: int = option(16, positive_int)  # P tokens per page
    dense_layers: int = option(2, integer(0))  # the first layers attend densely (locks/core/dense.py)
    page_rule: str = option("kernel", one_of("kernel", "eval"))
    gqa: str = option("per_head", one_of("per_head", "group"))  # a page set per query head, or per KV head
    group_reduce: str = option("max", one_of("max", "sum"))  # gqa=group: how the G heads' bounds combine
    budget_unit: ClassVar[str] = "page_size"


@register
class QuestSelector(Selector):
    name = "quest"
    display_name = "Quest"
    report_order = 4
    row_state = ("_max", "_min")
    Options = QuestOptions

    def __init__(self, info: LayerInfo, budget: int, **options):
        super().__init__(info, budget, **options)
        self.fused = info.backend == "triton"  # baselines/quest/kernels.py, imported only then
        self.page_budget = self.budget // self.page_size  # the kernel rule's pages, the last one included
        self.sets = info.group_size if self.gqa == "per_head" else 1  # page sets per KV head
        self.length = 0  # tokens folded into the bounds
        self._max = self._min = None  # [B, Hkv, capacity pages, d], the keys' dtype
        self._union_ratio, self._union_steps = 0.0, 0

    def prefill(self, ctx) -> None:
        self.append(ctx.keys, ctx.values)

    def append(self, keys: Tensor, values: Tensor) -> None:
        self._max, self._min = extend_bounds(self._max, self._min, keys, self.length, self.page_size)
        self.length = max(self.length, keys.shape[2])

    def memory_bytes(self, length: int) -> dict[str, float]:
        return {**super().memory_bytes(length), "state": bounds_bytes(self.info, length, self.page_size)}

    def page_bounds(self, query: Tensor, num_pages: int, length: Tensor | None = None) -> Tensor:
        """U [B, Hkv, G, num_pages] of the first pages; with a device `length`, -inf from the open page on."""
        B, Hq, d = query.shape
        Hkv = self._max.shape[1]
        M, m = self._max[:, :, :num_pages], self._min[:, :, :num_pages]
        if self.fused:  # min/max read once for the G heads
            from baselines.quest.kernels import quest_page_scores

            U = quest_page_scores(query, M, m, length=length, page_size=self.page_size)
            return U.view(B, Hkv, Hq // Hkv, num_pages)
        q = query.view(B, Hkv, Hq // Hkv, d).float()
        U = q.clamp(min=0) @ M.float().transpose(-1, -2) + q.clamp(max=0) @ m.float().transpose(-1, -2)
        if length is None:
            return U
        return U.masked_fill(torch.arange(num_pages, device=U.device) >= open_page(length, self.page_size), -torch.inf)

    def set_bounds(self, query: Tensor, num_pages: int, length: Tensor | None = None) -> Tensor:
        """`page_bounds` as one row per page set (`head_sets`: per query head, or the G heads' per KV head)."""
        return head_sets(self.page_bounds(query, num_pages, length), self.gqa == "per_head", self.group_reduce)

    def kernel_pages(self, query: Tensor, num_pages: int, length: Tensor, stable: bool) -> Tensor:
        """The kernel rule's page list of each set: the top page_budget - 1 before the open page, in page order, then
        the open page; pages 0 .. page_budget - 1 while the open page is below page_budget."""
        top = top_units(self.set_bounds(query, num_pages, length), self.page_budget - 1, stable)
        last = open_page(length, self.page_size)
        pages = torch.cat([top, last.expand(*top.shape[:3], 1)], dim=-1)
        return torch.where(last < self.page_budget, torch.arange(self.page_budget, device=top.device), pages)

    def eval_pages(self) -> int:
        """The eval rule's pages: max(3, budget // P) (max(1, ...) in fair mode when 3 pages exceed the budget)."""
        return max(3 if (self.budget_mode == "paper" or 3 * self.page_size <= self.budget) else 1, self.page_budget)

    def cost(self, L: int) -> tuple[int, int, float] | None:
        """(pages chosen, forced tokens, metadata bytes) of a sparse step at L cached tokens; None: a dense step.
        Metadata per KV head: min+max of each scored page (one pass for the G queries), an s-byte score per set and
        scored page, a 4-byte index per set and chosen page."""
        P, n, s, info = self.page_size, -(-L // self.page_size), self.info.kv_element_bytes, self.info
        if self.page_rule == "kernel":
            k, scored, forced = self.page_budget - 1, n - 1, L - (n - 1) * P
            if n <= self.page_budget:
                return None
        else:  # deviation: at budget >= L the official code takes L // P pages (one short if L mod P != 0)
            k, scored, forced = min(self.eval_pages(), n), n, 0
            if self.budget >= L or k >= n:
                return None
        return k, forced, float(info.num_kv_heads * (2 * info.head_dim * s * scored + (s * scored + 4 * k) * self.sets))

    def select(self, query: Tensor, keys: Tensor, values: Tensor) -> Selection:
        L = keys.shape[2]
        self.append(keys, values)  # a no-op after the harness's append; direct calls may skip it
        cost = self.cost(L)
        if cost is None:
            return Selection.all_tokens()
        length, n = keys.new_full((1,), L, dtype=torch.long), -(-L // self.page_size)
        if self.page_rule == "kernel":
            pages = self.kernel_pages(query, n, length, stable=True)
        else:
            pages = top_units(self.set_bounds(query, n), cost[0], stable=True)
        sel = Selection(pages=pages, page_size=self.page_size)
        indices, valid = paged_tokens(sel, length, L)
        self._union_ratio += paged_attended(sel, length, L).mean() / valid.sum(-1).float().mean()
        self._union_steps += 1
        return Selection(indices=indices, valid=valid, forced_tokens=float(cost[1]), metadata_bytes=cost[2])

    def extra_metrics(self) -> dict:
        """quest_union_ratio: a KV head's union of its sets over the mean set, over the eager sparse steps."""
        return {"quest_union_ratio": float(self._union_ratio) / self._union_steps} if self._union_steps else {}

    # ----- static decode (the kernel rule): fixed shapes, the length on the device ----------------------------------

    def static_decode_error(self):
        if self.page_rule == "eval" and self.budget % self.page_size:  # else budget >= L and k < n would disagree
            return (f"quest: static decode of page_rule=eval needs a budget that is a multiple of method.page_size="
                    f"{self.page_size} (got {self.budget})")

    def start_static(self, capacity):
        pages = -(-capacity // self.page_size)
        self.static_fits = pages <= (self.page_budget if self.page_rule == "kernel" else self.eval_pages())
        self._max, self._min = reserve_bounds(self._max, self._min, -(-self.length // self.page_size), pages)

    def select_static(self, query, keys, values, length):
        if self.fused:
            from baselines.quest.kernels import quest_append, quest_eval_keys, quest_static_pages
        (quest_append if self.fused else fold_static_key)(keys, self._max, self._min, length, self.page_size)
        if self.static_fits:
            return Selection.all_tokens()
        cap = self._max.shape[2]
        if self.page_rule == "eval":  # the top k of every page up to the open one, as the eager rule (ties lower)
            # a page past the open one holds only slots >= the length, which every reader of a page list masks
            if self.fused and (self.gqa == "per_head" or self.group_reduce == "max"):
                ranking = quest_eval_keys(query, self._max, self._min, length, self.page_size,
                                          None if self.gqa == "per_head" else "max")
                top = top_of_keys(ranking.view(*self._max.shape[:2], -1, cap), self.eval_pages())
            else:
                past = torch.arange(cap, device=query.device) > open_page(length, self.page_size)
                top = top_units_lowest_first(self.set_bounds(query, cap).masked_fill(past, -torch.inf),
                                             self.eval_pages())
            return Selection(pages=top, page_size=self.page_size)
        if not self.fused:  # torch.topk, not a full sort: exact ties break as in the official select-k
            return Selection(pages=self.kernel_pages(query, cap, length, False), page_size=self.page_size,
                             attended_on_host=self.sets == 1)
        top = torch.topk(self.set_bounds(query, cap, length), self.page_budget - 1, dim=-1).indices
        pages, attended = quest_static_pages(top, length, self.page_size, self.page_budget, count=self.sets > 1)
        return Selection(pages=pages, page_size=self.page_size, attended_on_host=self.sets == 1, attended_rows=attended)

    def after_static_step(self, keys, values, length):
        self.length = length

    def static_step_cost(self, length):
        cost, host = self.cost(length), self.static_fits or (self.sets == 1 and self.page_rule == "kernel")
        if cost is None:  # host: as the Selection's attended_on_host
            return 0.0, 0.0, float(length) if host else None
        return float(cost[1]), cost[2], float(cost[0] * self.page_size + cost[1]) if host else None
