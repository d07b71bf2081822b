"""MagicPIG: SimHash sampling of the middle of the context, weighted by the collision probability (selector.py).
docs/methods/magicpig.md."""
from baselines.magicpig.selector import MagicPIGSelector

__all__ = ["MagicPIGSelector"]
