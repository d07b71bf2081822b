"""RULER (NVIDIA/RULER) benchmark: the eight needle-in-a-haystack tasks and the RULER scorers.

See shared/specs/ruler.md.  Public API:
  tasks.NIAH_TASKS, tasks.SELF_CONTAINED_TASKS, tasks.GENERATOR_VERSION
  niah.generate_niah_samples(task, tokenizer, context_length, num_samples, seed=42,
                             chat_template=True, essay_path=None)
  metrics.postprocess, metrics.string_match_all, metrics.string_match_part, metrics.sample_score
"""

from .metrics import postprocess, sample_score, string_match_all, string_match_part
from .niah import generate_niah_samples
from .tasks import GENERATOR_VERSION, NIAH_TASKS, SELF_CONTAINED_TASKS

__all__ = [
    "GENERATOR_VERSION",
    "NIAH_TASKS",
    "SELF_CONTAINED_TASKS",
    "generate_niah_samples",
    "postprocess",
    "sample_score",
    "string_match_all",
    "string_match_part",
]
