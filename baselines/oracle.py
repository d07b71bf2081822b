"""Oracle: top-k pages by exact attention mass, with LOCKS's forced set and GQA aggregation.

It scores pages by the exact page log-mass l_{g,j} = logsumexp_{i in page j} s q_g.k_i read from the full keys, and
normalizes each head by its exact total mass (candidates + forced set), so with `aggregation=norm` it picks the k
pages that maximize sum_g Cov_g: the accuracy upper bound for every page selector at the same budget. It reads all
keys to do so, which its bytes report says: it is an accuracy reference, not an efficient method.
"""
import torch

from locks.core.paging import PageSelector, exact_page_lse
from locks.core.reference import grouped_logits
from locks.core.registry import register
from locks.core.selector import row_length


@register
class OracleSelector(PageSelector):
    name = "oracle"
    display_name = "Oracle: pages/KV head"
    report_order = 1
    bounds = "page selectors that share one page set per KV head across its query heads (e.g. LOCKS)"
    plot_style = {"linestyle": "--", "marker": "s"}

    def page_scores(self, query, keys, num_pages):
        return exact_page_lse(query, keys[:, :, : num_pages * self.page_size], self.page_size, self.info.scaling)

    def forced_log_mass(self, query, keys, forced_tokens):
        B, Hq, _ = query.shape
        logits = grouped_logits(query, keys[:, :, forced_tokens]) * self.info.scaling
        return torch.logsumexp(logits, dim=-1).reshape(B, Hq)

    def static_forced_log_mass(self, query, keys, length):
        B, Hq, _ = query.shape
        slots = torch.arange(keys.shape[2], device=keys.device)
        # a partial page past the preallocated complete pages is never a candidate
        candidate = torch.nn.functional.pad(self._static_candidates(length), (0, 1))[..., slots // self.page_size]
        forced = (slots < row_length(length, 3)) & ~candidate  # [1 or B, 1, capacity]
        logits = (grouped_logits(query, keys) * self.info.scaling).masked_fill(~forced[:, :, None], float("-inf"))
        return torch.logsumexp(logits, dim=-1).reshape(B, Hq)  # -inf when nothing is forced: no term

    def scoring_bytes(self, num_candidates):
        info = self.info
        return num_candidates * self.page_size * info.head_dim * info.kv_element_bytes
