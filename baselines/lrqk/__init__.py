"""LRQK: the selector and its math (selector.py) and its fused Triton static-step kernels (kernels.py, imported
only when the selector runs with backend triton). docs/methods/lrqk.md."""
from baselines.lrqk.selector import LRQKSelector, als, decode_coordinates, init_factors, kaczmarz, replace_slots, solve_right

__all__ = ["LRQKSelector", "als", "decode_coordinates", "init_factors", "kaczmarz", "replace_slots", "solve_right"]
