"""InfiniteBench (OpenBMB, 12 tasks) as the official code prompts, truncates and scores it.

See docs/benchmarks/infinitebench.md.  ``InfiniteBench(cfg)`` implements eval/API.md; ``scoring`` holds both scorer
variants ("2024-08" default, "2024-06" snapshot); ``templates.json`` the verbatim template families and the
per-task max-new-token table; ``data`` the HF / local-JSONL loader.
"""
from eval.infinitebench.benchmark import InfiniteBench

__all__ = ["InfiniteBench"]
