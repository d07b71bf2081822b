"""ShadowKV: the selector (selector.py) and its fused Triton static-step kernels (kernels.py, imported only when the
selector runs with backend triton). docs/methods/shadowkv.md."""
from baselines.shadowkv.selector import ShadowKVSelector, chunk_outlier_scores

__all__ = ["ShadowKVSelector", "chunk_outlier_scores"]
