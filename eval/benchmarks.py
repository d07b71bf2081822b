"""Benchmarks by name: each turns its config group into samples and scores predictions.

The interface every benchmark implements is described in `eval/API.md`.
"""
from __future__ import annotations

import importlib.metadata

from eval.results import per_task_scores
from locks.selector import ConfigError


class RulerNiah:
    """RULER's eight needle-in-a-haystack tasks, generated locally for the model's tokenizer (`specs/ruler.md`)."""

    name = "ruler_niah"
    row_fields = ()

    def __init__(self, cfg):
        from eval.ruler.tasks import NIAH_TASKS

        self.cfg = cfg
        unknown = [t for t in cfg.tasks if t not in NIAH_TASKS]
        if unknown:
            raise ConfigError(f"benchmark.tasks: unknown task(s) {unknown}; choose from {sorted(NIAH_TASKS)}")
        if int(cfg.num_samples) <= 0:
            raise ConfigError(f"benchmark.num_samples must be >= 1 (got {cfg.num_samples})")

    def samples(self, tokenizer, seed: int) -> list[dict]:
        from eval.ruler.niah import generate_niah_samples

        out = []
        for task in self.cfg.tasks:
            out += generate_niah_samples(task, tokenizer, int(self.cfg.context_length), int(self.cfg.num_samples),
                                         seed=seed, chat_template=bool(self.cfg.chat_template),
                                         essay_path=self.cfg.essay_path)
        return out

    def score(self, prediction: str, sample: dict) -> float:
        from eval.ruler.metrics import sample_score

        return sample_score(prediction, sample["outputs"], sample["metric"])

    def aggregate(self, rows: list[dict]) -> dict:
        return per_task_scores(rows, list(self.cfg.tasks))

    def run_record(self, tokenizer) -> dict:
        from eval.ruler.tasks import GENERATOR_VERSION

        return {
            "tokenizer": getattr(tokenizer, "name_or_path", type(tokenizer).__name__),
            "context_length": int(self.cfg.context_length),
            "truncation": "none (prompts sized to context_length)",
            "chat_template": bool(self.cfg.chat_template),
            "answer_prefix": True,
            "generator_version": GENERATOR_VERSION,
            "wonderwords": importlib.metadata.version("wonderwords"),
        }


BENCHMARKS = {RulerNiah.name: RulerNiah}


def build_benchmark(cfg):
    if cfg.name not in BENCHMARKS:
        raise ConfigError(f"unknown benchmark {cfg.name!r}; choose one of {sorted(BENCHMARKS)}")
    return BENCHMARKS[cfg.name](cfg)
