"""InfiniteBench as a harness benchmark (eval/API.md; docs/benchmarks/infinitebench.md).

Prompt building, per-task token budgets and middle truncation follow the official code at commit 88b3daa:

* ``template: completion`` -> ``yarn_mistral_templates`` used as a raw completion prompt (answer stems such as
  "The pass key is" included).  The whole formatted prompt is encoded with the tokenizer's default special
  tokens, middle-truncated to ``truncate_len`` tokens (first L//2 + last L//2) and decoded once with
  ``skip_special_tokens=True``; the runner gets that string re-encoded with default special tokens (as the
  official generate path does).
* ``template: chat`` -> ``gpt4_templates`` as the user turn after the system turn "You are a helpful assistant"
  (math_calc: calculator system message + the official one-shot demo, user content = bare context).  As in the
  official GPT-4 path the user content is truncated before the chat messages are built (encoded without special
  tokens, since it sits inside the chat template), then the tokenizer's chat template is applied.  The scorer
  is run with model="gpt4" semantics for math_calc (first predicted number dropped), because this layout makes
  the model echo the first operand, exactly as for GPT-4 upstream.

Truncation length: ``max_length`` tokens.  When ``context_length`` (the model window) is configured, each
task's length is additionally capped by the spec's default ``context_length - max_new_tokens - chat overhead``;
a task whose official budget exceeds half the window (math_calc: 30000) gets
``max_new_tokens = context_length - overhead - max_length`` instead.  Both effective values are in run_record.
Half split: official open-model path uses ``L // 2`` twice (total <= L); the GPT-4 path's ``(-L)//2`` off-by-one
(tiktoken only) is not reproduced.
"""
from __future__ import annotations

import importlib.metadata
import json
import re
from pathlib import Path

from eval.decode_cap import capped, read_decode_cap
from eval.infinitebench import scoring
from eval.infinitebench.data import load_task

TEMPLATE_FAMILIES = {"chat": "gpt4", "completion": "yarn_mistral"}
_TEMPLATES = None


def templates() -> dict:
    global _TEMPLATES
    if _TEMPLATES is None:
        with open(Path(__file__).with_name("templates.json"), encoding="utf-8") as f:
            _TEMPLATES = json.load(f)
    return _TEMPLATES


def family_name(template: str) -> str:
    """cfg.template (chat|completion, or the official family names gpt4|yarn_mistral) -> family name."""
    if template in TEMPLATE_FAMILIES:
        return TEMPLATE_FAMILIES[template]
    if template in TEMPLATE_FAMILIES.values():
        return template
    raise ValueError(f"benchmark.template must be one of {sorted(TEMPLATE_FAMILIES)} (got {template!r})")


def create_prompt(record: dict, task: str, family: str) -> str:
    """The formatted prompt of one record (official create_prompt), before truncation and chat wrapping."""
    if family == "gpt4" and task == "math_calc":
        return record["context"]  # GPT-4 math_calc: the bare expression; instructions live in the messages
    template = templates()[f"{family}_templates"][task]
    ctx, inp, opts = record["context"], record["input"], list(record.get("options") or [])
    if task == "code_run":
        func_call = re.findall(r"func_[0-9]+\(\-?[0-9]+\)", inp)[0]
        return template.format(func=func_call.split("(")[0], func_call=func_call, context=ctx)
    if task in ("code_debug", "longbook_choice_eng"):
        fields = dict(context=ctx, OPTION_A=opts[0], OPTION_B=opts[1], OPTION_C=opts[2], OPTION_D=opts[3])
        if task == "longbook_choice_eng":
            fields["question"] = inp
        return template.format(**fields)
    if task in ("longbook_qa_eng", "longbook_qa_chn"):
        return template.format(question=inp, context=ctx)
    if task in ("longbook_sum_eng", "longdialogue_qa_eng", "math_calc"):
        return template.format(context=ctx)
    if task == "math_find":
        found = re.findall(r"The .+ of", inp)
        if not found:
            raise ValueError(f"math_find: no 'The ... of' phrase in input {inp!r}")
        prefix = f"What is {found[0].lower()[:-3]} in the following list?"
        return template.format(prefix=prefix, context=ctx, input=inp)
    return template.format(context=ctx, input=inp)  # passkey, number_string, kv_retrieval


def chat_messages(user_content: str, task: str) -> list[dict]:
    """Official create_msgs layout (GPT-4): system + user, or the math_calc calculator dialogue."""
    t = templates()
    if task == "math_calc":
        return ([{"role": "system", "content": t["gpt4_math_calc_system_message"]}] + list(t["gpt4_math_calc_demo"])
                + [{"role": "user", "content": user_content}])
    return [{"role": "system", "content": t["gpt4_system_message"]}, {"role": "user", "content": user_content}]


def truncate_middle(tokenizer, prompt: str, max_len: int, add_special_tokens: bool = True) -> tuple[str, int, bool]:
    """Middle truncation of a whole prompt with ONE decode of the joined halves.
    Returns (prompt, token count before truncation, truncated?)."""
    ids = tokenizer.encode(prompt, add_special_tokens=add_special_tokens)
    if len(ids) <= max_len:
        return prompt, len(ids), False
    half = max_len // 2
    return tokenizer.decode(ids[:half] + ids[-half:], skip_special_tokens=True), len(ids), True


NO_CHAT_TEMPLATE = ("benchmark.template=chat needs the model's chat template, and its tokenizer has none (a base "
                    "model?); pass benchmark.template=completion")


def _apply_chat(tokenizer, messages: list[dict]) -> str:
    from locks.errors import ConfigError

    try:
        return tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    except ValueError:  # no chat template on this tokenizer
        raise ConfigError(NO_CHAT_TEMPLATE) from None


class InfiniteBench:
    """The 12 InfiniteBench tasks (docs/benchmarks/infinitebench.md); constructed as InfiniteBench(cfg)."""

    name = "infinitebench"
    row_fields = ("prompt_tokens", "truncated")

    def __init__(self, cfg):
        from locks.errors import ConfigError

        self.cfg = cfg
        self.tasks = list(cfg.tasks) if cfg.get("tasks") else list(scoring.TASKS)
        unknown = [t for t in self.tasks if t not in scoring.TASKS]
        if unknown:
            hint = " (the English split names end in '_eng', e.g. longbook_qa_eng)" if any(
                t.endswith("_en") for t in unknown) else ""
            raise ConfigError(f"benchmark.tasks: unknown task(s) {unknown}{hint}; choose from {list(scoring.TASKS)}")
        self.num_samples = None if cfg.get("num_samples") is None else int(cfg.num_samples)
        if self.num_samples is not None and self.num_samples <= 0:
            raise ConfigError(f"benchmark.num_samples must be >= 1 or null (got {cfg.num_samples})")
        self.max_length = int(cfg.get("max_length") or 7500)
        if self.max_length < 2:
            raise ConfigError(f"benchmark.max_length must be >= 2 (got {self.max_length})")
        self.context_length = None if cfg.get("context_length") is None else int(cfg.context_length)
        try:
            self.template = str(cfg.get("template") or "chat")
            self.family = family_name(self.template)
        except ValueError as e:
            raise ConfigError(str(e)) from None
        self.scorer = str(cfg.get("scorer") or scoring.DEFAULT_VARIANT)
        if self.scorer not in scoring.SCORER_VARIANTS:
            raise ConfigError(f"benchmark.scorer must be one of {list(scoring.SCORER_VARIANTS)} (got {self.scorer!r})")
        self.data_dir = cfg.get("data_dir")
        self.decode_cap = read_decode_cap(cfg)
        self.budgets: dict[str, dict] = {}
        self._records: dict[str, list[dict]] = {}

    def check_inputs(self) -> None:
        """Read every task's records (data_dir's JSONL files or the Hub) before the model loads; a missing source is
        one ConfigError naming benchmark.data_dir."""
        from locks.errors import ConfigError

        if self.data_dir and not Path(self.data_dir).expanduser().is_dir():
            raise ConfigError(f"benchmark.data_dir={self.data_dir}: no such directory; pass the folder that holds "
                              f"the tasks' <task>.jsonl files, or benchmark.data_dir=null for the HF Hub")
        for task in self.tasks:
            self.records(task)

    def check_tokenizer(self, tokenizer) -> None:
        from locks.errors import ConfigError

        if self.family == "gpt4" and not getattr(tokenizer, "chat_template", None):
            raise ConfigError(NO_CHAT_TEMPLATE)

    def records(self, task: str) -> list[dict]:
        """The task's records in dataset order (read once)."""
        from locks.errors import ConfigError

        if task not in self._records:
            try:
                self._records[task] = load_task(task, self.data_dir)
            except FileNotFoundError as err:
                raise ConfigError(str(err)) from None
        return self._records[task]

    # ------------------------------------------------------------------ budgets
    def _overhead(self, tokenizer, task: str) -> int:
        if self.family == "gpt4":
            return len(tokenizer.encode(_apply_chat(tokenizer, chat_messages("", task)), add_special_tokens=False))
        return len(tokenizer.encode("", add_special_tokens=True))

    def task_budget(self, tokenizer, task: str) -> dict:
        """{"truncate_len", "max_new_tokens"} for one task (see the module docstring)."""
        if task in self.budgets:
            return self.budgets[task]
        new_tokens = int(templates()["max_new_tokens"][task])
        truncate_len = self.max_length
        if self.context_length is not None:
            room = self.context_length - self._overhead(tokenizer, task)
            if new_tokens > room // 2:
                new_tokens = max(1, room - self.max_length) if room > self.max_length else max(1, room // 2)
            truncate_len = max(2, min(self.max_length, room - new_tokens))
        self.budgets[task] = {"truncate_len": truncate_len, "max_new_tokens": new_tokens}
        return self.budgets[task]

    # ------------------------------------------------------------------ API
    def build_sample(self, record: dict, task: str, index: int, tokenizer) -> dict:
        budget = self.task_budget(tokenizer, task)
        prompt = create_prompt(record, task, self.family)
        chat = self.family == "gpt4"
        prompt, n_before, truncated = truncate_middle(tokenizer, prompt, budget["truncate_len"],
                                                      add_special_tokens=not chat)
        if chat:
            text = _apply_chat(tokenizer, chat_messages(prompt, task))
            input_ids = tokenizer.encode(text, add_special_tokens=False)
        else:
            text = prompt
            input_ids = tokenizer.encode(text, add_special_tokens=True)
        label = scoring.normalize_label(task, record["answer"], record.get("options") or [])
        return {
            "id": f"infinitebench/{task}/{index}", "task": task, "index": index, "input": text,
            "input_ids": list(input_ids), "outputs": scoring.label_as_list(label),
            "max_new_tokens": budget["max_new_tokens"], "options": list(record.get("options") or []),
            "prompt_tokens": len(input_ids), "tokens_before_truncation": n_before, "truncated": truncated,
        }

    def samples(self, tokenizer, seed: int) -> list[dict]:
        """Deterministic (seed unused): the first num_samples records of each task, in dataset order."""
        out = []
        for task in self.tasks:
            records = self.records(task)
            if self.num_samples is not None:
                records = records[: self.num_samples]
            out += [capped(self.build_sample(rec, task, i, tokenizer), self.decode_cap) for i, rec in enumerate(records)]
        return out

    def label(self, sample: dict):
        """The scorer's label, rebuilt from the JSON-safe "outputs" list (normalize_label is idempotent)."""
        return scoring.normalize_label(sample["task"], list(sample["outputs"]), sample.get("options") or [])

    def score(self, prediction: str, sample: dict) -> float:
        model = "gpt4" if self.family == "gpt4" else None
        return 100.0 * float(scoring.score(sample["task"], prediction, self.label(sample), self.scorer, model=model))

    def aggregate(self, rows: list[dict]) -> dict:
        per_task: dict[str, list[float]] = {}
        for row in rows:
            per_task.setdefault(row["task"], []).append(float(row["score"]))
        order = [t for t in self.tasks if t in per_task] + [t for t in per_task if t not in self.tasks]
        scores = {t: sum(per_task[t]) / len(per_task[t]) for t in order}
        return {
            "scores": scores,
            "average": sum(scores.values()) / len(scores) if scores else 0.0,
            "average_kind": f"plain mean over the {len(scores)} task(s) that were run (no official InfiniteBench "
                            f"cross-task average)",
            "num_samples": {t: len(per_task[t]) for t in order},
            "scorer": self.scorer,
        }

    def run_record(self, tokenizer) -> dict:
        budgets = {t: self.task_budget(tokenizer, t) for t in self.tasks}
        init = getattr(tokenizer, "init_kwargs", {}) or {}
        versions = {}
        for pkg in ("rouge_score", "numpy", "nltk", "datasets", "transformers"):
            try:
                versions[pkg] = importlib.metadata.version(pkg)
            except importlib.metadata.PackageNotFoundError:
                versions[pkg] = None
        return {
            "tokenizer": getattr(tokenizer, "name_or_path", type(tokenizer).__name__),
            "tokenizer_revision": init.get("revision") or init.get("_commit_hash") or init.get("gguf_file"),
            "tokenizer_class": type(tokenizer).__name__,
            "vocab_size": len(tokenizer) if hasattr(tokenizer, "__len__") else None,
            "truncation": "middle, whole formatted prompt, one decode (official open-model rule)",
            "truncate_len": {t: b["truncate_len"] for t, b in budgets.items()},
            "max_length": self.max_length,
            "context_length": self.context_length,
            "max_new_tokens": {t: b["max_new_tokens"] for t, b in budgets.items()},
            "decode_cap": self.decode_cap,
            "template": self.template,
            "template_family": self.family,
            "chat_template": self.family == "gpt4",
            "answer_prefix": self.family == "yarn_mistral",
            "math_calc_drop_first_number": self.family == "gpt4",
            "scorer_variant": self.scorer,
            "ib_scoring": self.scorer,
            "rouge": "rouge_score RougeScorer(['rougeLsum']).score_multi (offline equivalent of evaluate 'rouge')",
            "data": {"data_dir": self.data_dir, "hf_dataset": "xinrongzhang2022/InfiniteBench"},
            "num_samples": self.num_samples,
            "versions": versions,
        }
