"""Token Oracle: every query head attends its own exact top-`budget` tokens by attention weight.

For query head g at a step with keys K, the attention weights are softmax_i(s q_g . k_i), so the `budget` tokens of
largest logit carry the largest attention mass any `budget` tokens can: coverage_g(top-n) >= coverage_g(T) for
every set T of n tokens. This makes it the upper bound, at equal attended tokens per query head, for every selector.
That includes per-query-head token selectors (RocketKV, LRQK, Quest with gqa=per_head), which the page Oracle
(baselines/oracle.py, one page set per KV head) does not bound. It reads every key to choose, which its metadata
bytes say: an accuracy reference, not an efficient method. Nothing is forced, and `fair` and `paper` are the same
(budget tokens per query head). A KV head reads the union of its G heads' sets (docs/methods/oracle.md).
"""
import torch

from locks.core.reference import grouped_logits
from locks.core.registry import register
from locks.core.selector import Selection, Selector, row_length
from locks.core.topk import top_units


@register
class TokenOracleSelector(Selector):
    name = "oracle_token"
    display_name = "Oracle: tokens/query head"
    report_order = 2
    bounds = "every selector at equal attended tokens per query head, incl. per-head token selection (RocketKV, LRQK)"
    plot_style = {"linestyle": ":", "marker": "D"}
    row_state = ()  # no device state of its own: rows stack

    def select(self, query, keys, values) -> Selection:
        L = keys.shape[2]
        if self.budget >= L:
            return Selection.all_tokens()
        logits = grouped_logits(query, keys)  # [B, Hkv, G, L]
        top = top_units(logits, self.budget)  # [B, Hkv, G, budget]
        return Selection(indices=top, valid=torch.ones_like(top, dtype=torch.bool),
                         metadata_bytes=self._metadata_bytes(L))

    def _metadata_bytes(self, length: int) -> float:
        info = self.info
        return float(length * info.head_dim * info.kv_element_bytes * info.num_kv_heads)

    def static_decode_error(self):
        return None

    def start_static(self, capacity):
        self.static_fits = capacity <= self.budget  # the whole generation fits in the budget: attend everything

    def select_static(self, query, keys, values, length):
        """`select` over the preallocated slots, those at or past the length masked: while L <= budget its top
        `budget` holds every valid token (attended: L, as the eager step's all-tokens selection)."""
        if self.static_fits:
            return Selection.all_tokens()
        L = row_length(length, 4)
        valid_slots = torch.arange(keys.shape[2], device=keys.device) < L
        top = top_units(grouped_logits(query, keys).masked_fill(~valid_slots, float("-inf")), self.budget)
        return Selection(indices=top, valid=top < L)

    def static_step_cost(self, length):
        if self.static_fits:
            return 0.0, 0.0, float(length)
        return 0.0, self._metadata_bytes(length) if length > self.budget else 0.0, None
