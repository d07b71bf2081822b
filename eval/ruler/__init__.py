"""RULER (NVIDIA/RULER) benchmark: all 13 tasks (8 NIAH, vt, cwe, fwe, qa_1, qa_2) and the scorers.

See docs/benchmarks/ruler.md.  Public API:
  tasks.ALL_TASKS, tasks.NIAH_TASKS, tasks.SELF_CONTAINED_TASKS, tasks.NIAH_SELF_CONTAINED_TASKS,
  tasks.CATEGORIES, tasks.GENERATOR_VERSION (NIAH), tasks.GENERATOR_VERSIONS (per family)
  generate.generate_samples(task, tokenizer, context_length, num_samples, seed=42, chat_template=True,
                            data_dir=None, essay_path=None, cache_dir=None)
  niah.generate_niah_samples(task, tokenizer, context_length, num_samples, seed=42,
                             chat_template=True, essay_path=None)
  metrics.postprocess, metrics.string_match_all, metrics.string_match_part, metrics.sample_score,
  metrics.task_score, metrics.length_score, metrics.aggregate_lengths
  aggregate.category_scores, aggregate.summarize_lengths, aggregate.task_scores_from_rows
"""

from .aggregate import category_scores, summarize_lengths, task_scores_from_rows
from .generate import generate_samples
from .metrics import aggregate_lengths, length_score, postprocess, sample_score, string_match_all, string_match_part
from .niah import generate_niah_samples
from .tasks import (
    ALL_TASKS,
    CATEGORIES,
    GENERATOR_VERSION,
    GENERATOR_VERSIONS,
    NIAH_SELF_CONTAINED_TASKS,
    NIAH_TASKS,
    SELF_CONTAINED_TASKS,
)

__all__ = [
    "ALL_TASKS",
    "CATEGORIES",
    "GENERATOR_VERSION",
    "GENERATOR_VERSIONS",
    "NIAH_SELF_CONTAINED_TASKS",
    "NIAH_TASKS",
    "SELF_CONTAINED_TASKS",
    "aggregate_lengths",
    "category_scores",
    "generate_niah_samples",
    "generate_samples",
    "length_score",
    "postprocess",
    "sample_score",
    "string_match_all",
    "string_match_part",
    "summarize_lengths",
    "task_scores_from_rows",
]
