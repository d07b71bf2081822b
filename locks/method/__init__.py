"""The LOCKS method: per-page low-rank key summaries (summaries.py), the page selector that scores them by
log-sum-exp (selector.py) and its fused Triton scoring kernels (kernels.py, imported only when the selector runs
with backend triton). docs/methods/locks.md."""
from locks.method.selector import LocksSelector

__all__ = ["LocksSelector"]
