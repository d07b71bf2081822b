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

    def static_decode_error(self):
        return "oracle: an accuracy reference with no static (CUDA-graph) decode path (it reads all keys anyway)"

    def scoring_bytes(self, num_candidates):
        info = self.info
        return num_candidates * self.page_size * info.head_dim * info.kv_element_bytes
