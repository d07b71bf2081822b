"""Twilight: top-p pruning of a base selector's candidates (selector.py). docs/methods/twilight.md."""
from baselines.twilight.selector import TwilightSelector

__all__ = ["TwilightSelector"]
