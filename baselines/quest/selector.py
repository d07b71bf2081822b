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
from locks.core.page_bounds import extend_bounds, fold_static_key, reserve_bounds
from locks.core.reference import paged_attended, paged_tokens
from locks.core.registry import register
from locks.core.selector import LayerInfo, Selection, Selector, row_length
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
        self.length = 0  # tokens folded into the bounds
        self._max = self._min = None  # [B, Hkv, capacity pages, d], the keys' dtype
        self._union_ratio, self._union_steps = 0.0, 0

    def prefill(self, ctx) -> None:
        self.append(ctx.keys, ctx.values)

    def append(self, keys: Tensor, values: Tensor) -> None:
        self._max, self._min = extend_bounds(self._max, self._min, keys, self.length, self.page_size)
        self.length = max(self.length, keys.shape[2])

    def memory_bytes(self, length: int) -> dict[str, float]:
        info, pages = self.info, -(-length // self.page_size)
        return {**super().memory_bytes(length),
                "state": float(2 * pages * info.head_dim * info.kv_element_bytes * info.num_kv_heads)}

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
        return U.masked_fill(torch.arange(num_pages, device=U.device) >= self._open_page(length), float("-inf"))

    def _set_bounds(self, query: Tensor, num_pages: int, length: Tensor | None) -> Tensor:
        """`page_bounds` as one row of scores per page set (`head_sets`: per query head, or per KV head)."""
        return head_sets(self.page_bounds(query, num_pages, length), self.gqa == "per_head", self.group_reduce)

    def _open_page(self, length: Tensor) -> Tensor:
        return torch.div(row_length(length, 4) - 1, self.page_size, rounding_mode="floor")

    def _plan(self, L: int) -> tuple[int, int, int] | None:
        """(pages chosen by top-k, pages scored, forced tokens) at L cached tokens; None: a dense step."""
        P, n = self.page_size, -(-L // self.page_size)
        if self.page_rule == "kernel":
            return None if n <= self.page_budget else (self.page_budget - 1, n - 1, L - (n - 1) * P)
        if self.budget >= L:  # deviation: the official code takes L // P pages here (one short if L mod P != 0)
            return None
        k = min(self._eval_pages(), n)
        return None if k >= n else (k, n, 0)

    def _eval_pages(self) -> int:
        return max(3 if (self.budget_mode == "paper" or 3 * self.page_size <= self.budget) else 1, self.page_budget)

    def _pages(self, query: Tensor, num_pages: int, k: int, length: Tensor | None, stable: bool) -> Tensor:
        """Each set's top-k pages in page order; with `length` the kernel rule's list: those k plus the open page,
        or pages 0 .. page_budget - 1 while the open page is below page_budget."""
        U = self._set_bounds(query, num_pages, length)
        top = top_units(U, k, stable)
        if length is None:
            return top
        last = self._open_page(length)
        pages = torch.cat([top, last.expand(*top.shape[:3], 1)], dim=-1)
        return torch.where(last < self.page_budget, torch.arange(self.page_budget, device=U.device), pages)

    def _metadata_bytes(self, plan: tuple[int, int, int], sets: int) -> float:
        """Per KV head: min+max of each scored page (one pass for the G queries), an s-byte score per set and scored
        page, a 4-byte index per set and chosen page."""
        (k, scored, _), s = plan, self.info.kv_element_bytes
        return float(self.info.num_kv_heads * (2 * self.info.head_dim * s * scored + s * scored * sets + 4 * k * sets))

    def select(self, query: Tensor, keys: Tensor, values: Tensor) -> Selection:
        L = keys.shape[2]
        self.append(keys, values)  # a no-op after the harness's append; direct calls may skip it
        plan = self._plan(L)
        if plan is None:
            return Selection.all_tokens()
        length = keys.new_full((1,), L, dtype=torch.long)
        rule = length if self.page_rule == "kernel" else None
        pages = self._pages(query, -(-L // self.page_size), plan[0], rule, stable=True)
        sel = Selection(pages=pages, page_size=self.page_size)
        indices, valid = paged_tokens(sel, length, L)
        self._union_ratio += paged_attended(sel, length, L).mean() / valid.sum(-1).float().mean()
        self._union_steps += 1
        return Selection(indices=indices, valid=valid, forced_tokens=float(plan[2]),
                         metadata_bytes=self._metadata_bytes(plan, self._sets()))

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
        self.static_k = self.page_budget if self.page_rule == "kernel" else self._eval_pages()
        self.static_fits = pages <= self.static_k
        self._max, self._min = reserve_bounds(self._max, self._min, -(-self.length // self.page_size), pages)

    def select_static(self, query, keys, values, length):
        if self.fused:
            from baselines.quest.kernels import quest_append, quest_eval_keys, quest_static_pages
        (quest_append if self.fused else fold_static_key)(keys, self._max, self._min, length, self.page_size)
        if self.static_fits:
            return Selection.all_tokens()
        if self.page_rule == "eval":  # the top k of every page up to the open one, as the eager rule (ties lower)
            # a page past the open one holds only slots >= the length, which every reader of a page list masks
            if self.fused and (self.gqa == "per_head" or self.group_reduce == "max"):
                ranking = quest_eval_keys(query, self._max, self._min, length, self.page_size,
                                          None if self.gqa == "per_head" else "max")
                top = top_of_keys(ranking.view(*self._max.shape[:2], -1, ranking.shape[-1]), self.static_k)
            else:
                U = self._set_bounds(query, self._max.shape[2], None)
                last = self._open_page(length)
                top = top_units_lowest_first(U.masked_fill(torch.arange(U.shape[-1], device=U.device) > last,
                                                           float("-inf")), self.static_k)
            return Selection(pages=top, page_size=self.page_size)
        k, cap, sets = self.page_budget - 1, self._max.shape[2], self._sets()
        if not self.fused:  # torch.topk, not a full sort: exact ties break as in the official select-k
            return Selection(pages=self._pages(query, cap, k, length, False), page_size=self.page_size,
                             attended_on_host=sets == 1)
        U = self._set_bounds(query, cap, length)
        pages, attended = quest_static_pages(torch.topk(U, k, dim=-1).indices, length, self.page_size,
                                             self.page_budget, count=sets > 1)
        return Selection(pages=pages, page_size=self.page_size, attended_on_host=sets == 1, attended_rows=attended)

    def after_static_step(self, keys, values, length):
        self.length = length

    def static_step_cost(self, length):
        plan, sets = self._plan(length), self._sets()
        host = self.static_fits or (sets == 1 and self.page_rule == "kernel")  # as the Selection's attended_on_host
        if plan is None:
            return 0.0, 0.0, float(length) if host else None
        attended = float(plan[0] * self.page_size + plan[2]) if host else None
        return float(plan[2]), self._metadata_bytes(plan, sets), attended

    def _sets(self) -> int:
        return self.info.group_size if self.gqa == "per_head" else 1
