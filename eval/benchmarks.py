"""Benchmarks by name: each turns its config group into samples and scores predictions.

The interface every benchmark implements is described in `eval/API.md`.
"""
from __future__ import annotations

import importlib.metadata

from omegaconf import ListConfig

from eval.decode_cap import capped, read_decode_cap
from locks.errors import ConfigError


class Ruler:
    """RULER's 13 synthetic tasks, generated locally for the model's tokenizer (`docs/benchmarks/ruler.md`), at one or several
    context lengths; generated samples are cached on disk (`cache_dir`)."""

    name = "ruler"
    row_fields = ("context_length",)

    def __init__(self, cfg):
        from eval.ruler.tasks import ALL_TASKS

        self.cfg = cfg
        unknown = [t for t in cfg.tasks if t not in ALL_TASKS]
        if unknown:
            raise ConfigError(f"benchmark.tasks: unknown task(s) {unknown}; choose from {sorted(ALL_TASKS)}")
        if int(cfg.num_samples) <= 0:
            raise ConfigError(f"benchmark.num_samples must be >= 1 (got {cfg.num_samples})")
        lengths = cfg.context_length
        self.lengths = [int(x) for x in (lengths if isinstance(lengths, (list, tuple, ListConfig)) else [lengths])]
        if any(n <= 0 for n in self.lengths):
            raise ConfigError(f"benchmark.context_length must be positive token counts (got {lengths})")
        if cfg.chat_template not in ("auto", True, False):
            raise ConfigError(f"benchmark.chat_template must be auto, true or false (got {cfg.chat_template!r})")
        self.decode_cap = read_decode_cap(cfg)

    def check_inputs(self) -> None:
        """The essay file, data_dir and its files that the tasks read, checked before the model loads."""
        from eval.ruler.common import check_sources

        check_sources(self.cfg.tasks, self.cfg.data_dir, self.cfg.essay_path, self.cfg.cache_dir)

    def check_tokenizer(self, tokenizer) -> None:
        from eval.ruler.common import NO_CHAT_TEMPLATE

        if self.cfg.chat_template is True and not getattr(tokenizer, "chat_template", None):
            raise ConfigError(NO_CHAT_TEMPLATE)

    def uses_chat_template(self, tokenizer) -> bool:
        """benchmark.chat_template: true | false, or auto (the default): the model's chat template when its
        tokenizer has one (an instruct model), else RULER's `base` template, the plain task text (a base model)."""
        if self.cfg.chat_template == "auto":
            return bool(getattr(tokenizer, "chat_template", None))
        return bool(self.cfg.chat_template)

    def samples(self, tokenizer, seed: int) -> list[dict]:
        from eval.ruler.generate import generate_samples

        out = []
        for length in self.lengths:
            for task in self.cfg.tasks:
                for s in generate_samples(task, tokenizer, length, int(self.cfg.num_samples), seed=seed,
                                          chat_template=self.uses_chat_template(tokenizer), data_dir=self.cfg.data_dir,
                                          essay_path=self.cfg.essay_path, cache_dir=self.cfg.cache_dir):
                    out.append(capped({**s, "id": f"{task}/{length}/{s['index']}", "context_length": length},
                                      self.decode_cap))
        return out

    def score(self, prediction: str, sample: dict) -> float:
        from eval.ruler.metrics import sample_score

        return sample_score(prediction, sample["outputs"], sample["metric"])

    def aggregate(self, rows: list[dict]) -> dict:
        """Per task (mean over lengths of the per-length task scores), the average of the tasks, and per length the
        task scores, the NIAH / VT / aggregation / QA category means, Avg and both weighted averages."""
        from eval.ruler.aggregate import category_scores, summarize_lengths, task_scores_from_rows

        by_length = task_scores_from_rows(rows)
        tasks = [t for t in self.cfg.tasks if any(t in ts for ts in by_length.values())]
        scores = {t: round(sum(ts[t] for ts in by_length.values() if t in ts)
                           / sum(t in ts for ts in by_length.values()), 2) for t in tasks}
        lengths = summarize_lengths(by_length)
        return {
            "scores": scores,
            "average": round(sum(scores.values()) / len(scores), 2) if scores else None,
            "num_samples": {t: sum(r["task"] == t for r in rows) for t in tasks},
            "categories": {cat: round(v, 2) for cat, v in category_scores(scores).items()},
            "per_length": {"task_scores": by_length, **lengths},
        }

    def run_record(self, tokenizer) -> dict:
        from eval.ruler.tasks import GENERATOR_VERSIONS

        return {
            "tokenizer": getattr(tokenizer, "name_or_path", type(tokenizer).__name__),
            "context_lengths": self.lengths,
            "truncation": "none (prompts sized to context_length)",
            "chat_template": self.uses_chat_template(tokenizer),
            "chat_template_setting": self.cfg.chat_template,
            "answer_prefix": True,
            "decode_cap": self.decode_cap,
            "generator_versions": GENERATOR_VERSIONS,
            "wonderwords": importlib.metadata.version("wonderwords"),
            "nltk": importlib.metadata.version("nltk"),
            "numpy": importlib.metadata.version("numpy"),
        }


def _registry() -> dict:
    from eval.infinitebench import InfiniteBench
    from eval.longbench import LongBench, LongBenchE

    return {b.name: b for b in (Ruler, LongBench, LongBenchE, InfiniteBench)}


def build_benchmark(cfg):
    benchmarks = _registry()
    if cfg.name not in benchmarks:
        raise ConfigError(f"unknown benchmark {cfg.name!r}; choose one of {sorted(benchmarks)}")
    return benchmarks[cfg.name](cfg)
