"""LongBench v1 (21 tasks) and LongBench-E (13 tasks) behind the benchmark interface of eval/API.md.

Prompting, truncation and scoring follow docs/benchmarks/longbench.md, i.e. the official THUDM/LongBench v1 code
(`LongBench/pred.py`, `eval.py`, `metrics.py`, main@2e00731), re-written here:
  1. prompt = template.format(**record)                                        (config/dataset2prompt.json)
  2. tokenize with the tokenizer's default special tokens, no truncation
  3. if longer than max_length: decode(first int(max_length/2)) + decode(last int(max_length/2)), each decoded
     separately with skip_special_tokens=True (middle truncation, "middle_two_decodes")
  4. chat template (with generation prompt) AFTER truncation, except trec, triviaqa, samsum, lsht, lcc, repobench-p
  5. greedy, per-task max_new_tokens (config/dataset2maxlen.json); samsum also stops on the newline token.
"""
from __future__ import annotations

import hashlib
import importlib.metadata
import math
from pathlib import Path

from eval.decode_cap import capped, read_decode_cap
from eval.longbench import metrics
from eval.longbench.data import HF_DATASET_ID, config_name, load_task

_DATA = metrics.BENCHMARK_DATA
TASKS = tuple(_DATA["tasks"])
TASKS_E = tuple(_DATA["tasks_e"])
DATASET2PROMPT = dict(_DATA["dataset2prompt"])
DATASET2MAXLEN = dict(_DATA["dataset2maxlen"])
DATASET2CATEGORY = dict(_DATA["dataset2category"])
CATEGORIES = tuple(_DATA["categories"])
NO_CHAT_TASKS = tuple(_DATA["no_chat_template_tasks"])
BUCKETS = tuple(b[0] for b in _DATA["length_buckets"])
NO_CHAT_TEMPLATE = ("benchmark.chat_template=true, but the model's tokenizer has no chat template (a base model?); "
                    "pass benchmark.chat_template=false (the raw prompt)")


def _config_error(msg: str) -> Exception:
    try:
        from locks.errors import ConfigError
    except Exception:  # pragma: no cover - the harness always has it
        return ValueError(msg)
    return ConfigError(msg)


def build_prompt(task: str, record: dict) -> str:
    """The official prompt: template.format(**record) (only {context} and {input} occur)."""
    return DATASET2PROMPT[task].format(**record)


def middle_truncate(prompt: str, tokenizer, max_length: int) -> tuple[str, int, bool]:
    """Official pred.py middle truncation. Returns (prompt, token count before truncation, truncated?).

    Tokenized with the tokenizer's default special tokens (a BOS counts towards max_length and is dropped by the
    skip_special_tokens decode, as in the official code); the two halves are decoded separately and concatenated
    as strings, so re-tokenization need not give exactly max_length tokens.
    """
    ids = tokenizer(prompt, truncation=False)["input_ids"]
    if len(ids) <= max_length:
        return prompt, len(ids), False
    half = int(max_length / 2)
    head = tokenizer.decode(ids[:half], skip_special_tokens=True)
    tail = tokenizer.decode(ids[-half:], skip_special_tokens=True)
    return head + tail, len(ids), True


def newline_token_id(tokenizer) -> int:
    # Official pred.py (samsum): eos_token_id=[eos, tokenizer.encode("\n", add_special_tokens=False)[-1]]
    return tokenizer.encode("\n", add_special_tokens=False)[-1]


class LongBench:
    """LongBench v1 (`cfg.name == "longbench"`) or LongBench-E (`cfg.name == "longbench_e"`)."""

    name = "longbench"
    row_fields = ("length", "_id")

    def __init__(self, cfg):
        self.cfg = cfg
        self.e = str(cfg.name) == "longbench_e"
        allowed = TASKS_E if self.e else TASKS
        self.tasks = list(cfg.tasks) if cfg.get("tasks") is not None else list(allowed)
        unknown = [t for t in self.tasks if t not in allowed]
        if unknown:
            raise _config_error(f"benchmark.tasks: unknown {cfg.name} task(s) {unknown}; choose from {list(allowed)}")
        if not self.tasks:
            raise _config_error("benchmark.tasks is empty")
        n = cfg.get("num_samples")
        if n is not None and int(n) <= 0:
            raise _config_error(f"benchmark.num_samples must be >= 1 or null for all (got {n})")
        self.num_samples = None if n is None else int(n)
        max_length = cfg.get("max_length")
        if max_length is None or int(max_length) < 2:
            raise _config_error(f"benchmark.max_length must be an integer >= 2 (got {max_length}); official: "
                                f"context window - 500, e.g. 7500 for 8K models, 127500 for 128K models")
        self.max_length = int(max_length)
        if cfg.get("chat_template", True) not in (True, False):
            raise _config_error(f"benchmark.chat_template must be true or false for LongBench "
                                f"(got {cfg.get('chat_template')!r})")
        self.chat_template = bool(cfg.get("chat_template", True))
        self.data_dir = cfg.get("data_dir")
        self.decode_cap = read_decode_cap(cfg)
        self._records: dict[str, list[dict]] = {}

    def check_inputs(self) -> None:
        """Read every task's records (data_dir's JSONL files or the Hub) before the model loads; a missing source is
        one ConfigError naming benchmark.data_dir."""
        if self.data_dir and not Path(self.data_dir).expanduser().is_dir():
            raise _config_error(f"benchmark.data_dir={self.data_dir}: no such directory; pass the folder of the "
                                f"official data.zip's data/*.jsonl, or benchmark.data_dir=null for the HF Hub")
        for task in self.tasks:
            self.records(task)

    def check_tokenizer(self, tokenizer) -> None:
        if (self.chat_template and any(t not in NO_CHAT_TASKS for t in self.tasks)
                and not getattr(tokenizer, "chat_template", None)):
            raise _config_error(NO_CHAT_TEMPLATE)

    def records(self, task: str) -> list[dict]:
        """The task's test records in dataset order (read once)."""
        if task not in self._records:
            try:
                self._records[task] = load_task(task, e=self.e, data_dir=self.data_dir)
            except FileNotFoundError as err:
                raise _config_error(str(err)) from None
        return self._records[task]

    # ------------------------------------------------------------------ samples

    def _wrap(self, task: str, prompt: str, tokenizer) -> tuple[str, bool]:
        if not self.chat_template or task in NO_CHAT_TASKS:
            return prompt, False
        if not getattr(tokenizer, "chat_template", None):
            raise _config_error(NO_CHAT_TEMPLATE)
        text = tokenizer.apply_chat_template([{"role": "user", "content": prompt}], tokenize=False,
                                             add_generation_prompt=True)
        return text, True

    def build_sample(self, task: str, index: int, record: dict, tokenizer) -> dict:
        prompt = build_prompt(task, record)
        prompt, n_tokens, truncated = middle_truncate(prompt, tokenizer, self.max_length)
        text, chat = self._wrap(task, prompt, tokenizer)
        if chat:
            # The rendered chat template carries its own special tokens (e.g. BOS); adding them again would double
            # them (this is what apply_chat_template(tokenize=True) does).
            input_ids = tokenizer(text, add_special_tokens=False)["input_ids"]
        else:
            # Official pred.py tokenizes the final prompt with the tokenizer's default special tokens.
            input_ids = tokenizer(text)["input_ids"]
        sample = {
            "id": f"{config_name(task, self.e)}/{index}",
            "task": task,
            "index": index,
            "input": text,
            "input_ids": list(input_ids),
            "outputs": list(record["answers"]),
            "max_new_tokens": DATASET2MAXLEN[task],
            "all_classes": record["all_classes"],
            "length": record["length"],
            "language": record["language"],
            "_id": record["_id"],
            "chat_template": chat,
            "truncated": truncated,
            "prompt_tokens_before_truncation": n_tokens,
        }
        if task == "samsum":
            # Official: stop on "\n" too and min_length=context_length+1 (at least one new token).
            sample["stop_token_ids"] = [newline_token_id(tokenizer)]
            sample["min_new_tokens"] = 1
        return sample

    def samples(self, tokenizer, seed: int) -> list[dict]:
        # `seed` is unused: LongBench samples are the dataset records in order (first num_samples per task).
        out = []
        for task in self.tasks:
            records = self.records(task)
            if self.num_samples is not None:
                records = records[: self.num_samples]
            out += [capped(self.build_sample(task, i, rec, tokenizer), self.decode_cap) for i, rec in enumerate(records)]
        return out

    # ------------------------------------------------------------------ scoring

    def score(self, prediction: str, sample: dict) -> float:
        """100 x max over the references of the task metric, after the first-line rule (trec/triviaqa/samsum/lsht)."""
        return 100 * metrics.example_score(sample["task"], prediction, sample["outputs"], sample.get("all_classes"))

    def aggregate(self, rows: list[dict]) -> dict:
        by_task: dict[str, list[dict]] = {}
        for r in rows:
            by_task.setdefault(r["task"], []).append(r)
        order = [t for t in self.tasks if t in by_task] + sorted(t for t in by_task if t not in self.tasks)

        def task_score(rs):  # official: round(100 * sum(example scores in [0, 1]) / n, 2)
            return round(100 * sum(float(r["score"]) / 100 for r in rs) / len(rs), 2)

        scores = {t: task_score(by_task[t]) for t in order}
        out = {
            "benchmark": self.name if not self.e else "longbench_e",
            "scores": scores,
            "average": round(sum(scores.values()) / len(scores), 2) if scores else None,
            "num_samples": {t: len(by_task[t]) for t in order},
        }
        # Leaderboard aggregation (README tables): category = mean of its tasks; "Avg" = mean of the categories.
        cats: dict[str, list[float]] = {}
        for t, s in scores.items():
            if t in DATASET2CATEGORY:
                cats.setdefault(DATASET2CATEGORY[t], []).append(s)
        out["category_scores"] = {c: round(sum(cats[c]) / len(cats[c]), 2) for c in CATEGORIES if c in cats}
        out["leaderboard_avg"] = (round(sum(out["category_scores"].values()) / len(out["category_scores"]), 2)
                                  if out["category_scores"] else None)
        if self.e:
            by_len, n_len = {}, {}
            for t in order:
                groups = {b: [] for b in BUCKETS}
                for r in by_task[t]:
                    groups[metrics.length_bucket(int(r["length"]))].append(r)
                # official scorer_e gives NaN for an empty bucket; null here so metrics.json stays valid JSON
                by_len[t] = {b: (task_score(g) if g else None) for b, g in groups.items()}
                n_len[t] = {b: len(g) for b, g in groups.items()}
            out["scores_by_length"] = by_len
            out["num_samples_by_length"] = n_len
            avg_len = {}
            for b in BUCKETS:
                vals = [by_len[t][b] for t in order if by_len[t][b] is not None and not math.isnan(by_len[t][b])]
                avg_len[b] = round(sum(vals) / len(vals), 2) if vals else None
            out["average_by_length"] = avg_len
        return out

    # ------------------------------------------------------------------ run record

    def run_record(self, tokenizer) -> dict:
        template = getattr(tokenizer, "chat_template", None)
        init_kwargs = getattr(tokenizer, "init_kwargs", {}) or {}
        try:
            datasets_version = importlib.metadata.version("datasets")
        except importlib.metadata.PackageNotFoundError:
            datasets_version = None
        return {
            "benchmark": "longbench_e" if self.e else "longbench",
            "e": self.e,
            "tasks": list(self.tasks),
            "num_samples": self.num_samples,
            "data_source": (f"local JSONL {self.data_dir}" if self.data_dir
                            else f"HF {HF_DATASET_ID} ({'<task>_e' if self.e else '<task>'} configs, split test)"),
            "tokenizer": getattr(tokenizer, "name_or_path", type(tokenizer).__name__),
            "tokenizer_revision": init_kwargs.get("revision") or init_kwargs.get("gguf_file"),
            "max_length": self.max_length,
            "truncation": "middle_two_decodes (official pred.py: tokens with default special tokens, "
                          "decode(first half) + decode(last half), skip_special_tokens)",
            "chat_template": self.chat_template,
            "chat_template_sha256": (hashlib.sha256(template.encode("utf-8")).hexdigest()[:16]
                                     if (self.chat_template and template) else None),
            "chat_template_excluded_tasks": list(NO_CHAT_TASKS),
            "answer_prefix": "n/a",
            "decoding": "greedy; per-task max_new_tokens (dataset2maxlen); samsum stops on newline",
            "decode_cap": self.decode_cap,
            "scorer_variant": "official LongBench eval.py: classification_score loop-mutation quirk kept; "
                              "ROUGE-L f via pltrdy rouge (not rouge_score); first-line rule for "
                              + ", ".join(metrics.FIRST_LINE_TASKS),
            "metric_versions": metrics.metric_versions(),
            "datasets": datasets_version,
        }


class LongBenchE(LongBench):
    """LongBench-E (the same class; `name` for the benchmark registry)."""

    name = "longbench_e"
