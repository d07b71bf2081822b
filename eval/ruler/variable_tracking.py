"""RULER variable tracking ("vt"), shared/specs/ruler.md §5.2 (haystack sizing §4).

Written from the specification; where it is silent, NVIDIA/RULER c3f5e3b
``scripts/data/synthetic/variable_tracking.py`` is followed ("upstream" below).  Python's ``random``
stream (names, positions) and numpy's legacy stream (values, ``np.random.randint``) are seeded with
the seed as upstream does, but as private ``random.Random`` / ``np.random.RandomState`` objects (no
global state).  Deliberate differences:
  * names of the ICL example are never "VAR" and the fresh names of its randomized copy are distinct
    from each other and from the names they replace (upstream's blind ``str.replace`` could clobber
    the ``VAR`` keyword or chain replacements);
  * ValueError instead of an endless loop when even one unit does not fit (pitfall 6).
"""

from __future__ import annotations

import random
import string

import numpy as np

from .common import count_tokens, sample_records, search_and_generate, wrap
from .tasks import (
    NOISE_SENTENCE,
    OTHER_TASKS,
    SEARCH_SLACK,
    SMALL_CONTEXT_THRESHOLD,
    VT_FAMILY,
    VT_ICL_BUDGET,
    VT_ICL_NAME_LEN,
    VT_ICL_UNIT,
    VT_ICL_VALUE,
    VT_LINE_UNIT,
    VT_NAME_LEN,
    VT_SMALL_LINE_UNIT,
)


class _VtSampler:
    def __init__(self, cfg: dict, rng: random.Random, nprng: np.random.RandomState):
        self.rng, self.nprng = rng, nprng
        self.num_chains = cfg["num_chains"]
        self.num_hops = cfg["num_hops"]

    def _name(self, k: int) -> str:
        return "".join(self.rng.choices(string.ascii_uppercase, k=k))

    def chains(self, is_icl: bool):
        k = VT_ICL_NAME_LEN if is_icl else VT_NAME_LEN
        hops = min(10, self.num_hops) if is_icl else self.num_hops  # upstream caps ICL hops at 10
        n = (hops + 1) * self.num_chains
        while True:  # §5.2: the pool is re-drawn until all names are unique
            names = [self._name(k) for _ in range(n)]
            if len(set(names)) == n and not (is_icl and "VAR" in names):
                break
        all_vars, all_chains = [], []
        for c in range(self.num_chains):
            vs = names[c * (hops + 1):(c + 1) * (hops + 1)]
            value = VT_ICL_VALUE if is_icl else str(self.nprng.randint(10000, 99999))
            chain = [f"VAR {vs[0]} = {value}"] + [f"VAR {vs[j + 1]} = VAR {vs[j]} " for j in range(hops)]
            all_vars.append(vs)
            all_chains.append(chain)
        return all_vars, all_chains, hops

    def task_text(self, num_noises: int, is_icl: bool = False):
        """(task text, answer prefix, answers) with ``num_noises`` noise lines."""
        all_vars, all_chains, hops = self.chains(is_icl)
        lines = [NOISE_SENTENCE] * num_noises
        for chain in all_chains:
            positions = sorted(self.rng.sample(range(len(lines)), len(chain)))
            for j, pos in enumerate(positions):  # keeps the chain order
                lines.insert(pos + j, chain[j])
        context = "\n".join(lines).replace(". \n", ".\n")
        value = all_chains[0][0].split("=")[-1].strip()
        text = VT_FAMILY["template"].format(context=context, query=value, num_v=hops + 1)
        prefix = VT_FAMILY["answer_prefix"].format(query=value, num_v=hops + 1)
        return text, prefix, all_vars[0]

    def randomize_icl(self, icl: str, icl_answer: list[str]) -> str:
        taken = set(icl_answer) | {"VAR"}
        for old in icl_answer:
            new = self._name(len(old))
            while new in taken:
                new = self._name(len(old))
            taken.add(new)
            icl = icl.replace(old, new)
        return icl.replace(VT_ICL_VALUE, str(self.nprng.randint(10000, 99999)))


def generate_vt_samples(task: str, tokenizer, context_length: int, num_samples: int, seed: int = 42,
                        chat_template: bool = True) -> list[dict]:
    """``num_samples`` VT samples sized to ``context_length`` tokens (same record fields as NIAH;
    ``num_haystack`` = noise lines)."""
    cfg = OTHER_TASKS[task]
    if cfg["family"] != "variable_tracking":
        raise ValueError(f"{task!r} is not a variable_tracking task")
    ttg = cfg["tokens_to_generate"]
    rng, nprng = random.Random(seed), np.random.RandomState(seed)
    sampler = _VtSampler(cfg, rng, nprng)

    # One-shot ICL example: 500-token budget, unit 5, no tokens to generate, no model template.
    def build_icl(n):
        text, prefix, answer = sampler.task_text(n, is_icl=True)
        return text + prefix, answer

    icl_results, _ = search_and_generate(
        task + " (ICL example)", build_icl, lambda b: count_tokens(tokenizer, b[0]), VT_ICL_BUDGET,
        VT_ICL_UNIT, VT_ICL_UNIT, SEARCH_SLACK, 1, kind="noise lines")
    icl_text, icl_answer = icl_results[0][0]
    icl_example = icl_text + " " + " ".join(icl_answer) + "\n"

    def build(n):
        text, prefix, answer = sampler.task_text(n)
        icl = sampler.randomize_icl(icl_example, icl_answer)
        content = icl + "\n" + text  # the ICL block, a blank line, then the task text
        return wrap(tokenizer, content, chat_template, task) + prefix, prefix, answer

    unit = VT_SMALL_LINE_UNIT if context_length < SMALL_CONTEXT_THRESHOLD else VT_LINE_UNIT
    results, _ = search_and_generate(task, build, lambda b: count_tokens(tokenizer, b[0]) + ttg, context_length,
                                     unit, unit, SEARCH_SLACK, num_samples, kind="noise lines")
    return sample_records(task, cfg, results, chat_template)
