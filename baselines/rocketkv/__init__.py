"""RocketKV: the selector (selector.py) and its fused Triton static-step kernels (kernels.py, imported only when the
selector runs with backend triton). docs/methods/rocketkv.md."""
from baselines.rocketkv.selector import RocketKVSelector, approx_scores, rocket_params, snapkv_scores

__all__ = ["RocketKVSelector", "approx_scores", "rocket_params", "snapkv_scores"]
