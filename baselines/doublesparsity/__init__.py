"""DoubleSparsity: the selector (selector.py) and its offline channel calibration (calibration.py).
docs/methods/doublesparsity.md."""
from baselines.doublesparsity.selector import DoubleSparsitySelector

__all__ = ["DoubleSparsitySelector"]
