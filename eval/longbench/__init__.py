"""LongBench v1 (21 tasks) and LongBench-E (13 tasks), as the official THUDM/LongBench v1 code prompts, truncates
and scores them (docs/benchmarks/longbench.md). Public API:
  benchmark.LongBench(cfg), benchmark.LongBenchE(cfg)   -- the eval/API.md benchmark (name longbench / longbench_e)
  benchmark.build_prompt, benchmark.middle_truncate
  data.load_task(task, e=False, data_dir=None)
  metrics.<nine metric functions>, metrics.scorer, metrics.scorer_e, metrics.metric_versions
"""
from .benchmark import LongBench, LongBenchE, build_prompt, middle_truncate
from .data import load_task
from .metrics import scorer, scorer_e

__all__ = ["LongBench", "LongBenchE", "build_prompt", "load_task", "middle_truncate", "scorer", "scorer_e"]
