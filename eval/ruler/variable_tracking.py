"""RULER variable tracking ("vt"), docs/benchmarks/ruler.md (haystack sizing §4).

Reproduces NVIDIA/RULER c3f5e3b ``scripts/data/synthetic/variable_tracking.py`` ("upstream") byte for byte
(checked by tests/eval/test_conformance_ruler.py).  Python's ``random`` stream (names, positions) and numpy's
legacy stream (values, ``np.random.randint``) are seeded with the seed as upstream does, but as private
``random.Random`` / ``np.random.RandomState`` objects (no global state), and are consumed in upstream's
order:
  1. the one-shot ICL example: 3-letter names, the value 12345, no model template, a 500-token budget with
     5-line units and nothing to generate (probe, binary search, one sample);
  2. the task: the probe and every search step build the prompt *without* the ICL example and count
     prompt tokens + the ICL example's tokens (counted once, on its own) + tokens to generate; the probe
     counts the prompt only;
  3. each sample draws its prompt, then a randomized copy of the ICL example (fresh names, fresh value)
     that goes in front of the task text inside the user turn; its length is counted on the joined prompt.
Deliberate differences, reached only where upstream's own output would be wrong (so the random stream is
upstream's whenever upstream's sample is valid):
  * a name pool with a repeated name (or, for the ICL example, the name "VAR") is completed with further
    draws and the first unique names are used (upstream also draws further names, but then builds its
    chains from the list with the repeat, which yields a chain with a repeated variable and an extra chain);
  * a fresh ICL name that would be "VAR", equal another fresh name, or equal a name still to be replaced is
    redrawn (upstream's plain ``str.replace`` would then merge two variables or rewrite the keyword);
  * ValueError instead of an endless loop when even one unit does not fit (pitfall 6).
"""

from __future__ import annotations

import random
import string

import numpy as np

from .common import count_tokens, probe_upper_bound, sample_records, search_and_generate, wrap
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
        drawn = [self._name(k) for _ in range(n)]

        def usable():
            return [v for v in dict.fromkeys(drawn) if not (is_icl and v == "VAR")]

        while len(usable()) < n:  # upstream: one more draw while the pool has a repeat (see the module doc)
            drawn.append(self._name(k))
        names = usable()[:n]
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
        """The ICL example with fresh names (same lengths) and a fresh value, drawn as upstream does."""
        fresh: list[str] = []
        for j, old in enumerate(icl_answer):
            new = self._name(len(old))
            while new == "VAR" or new in fresh or new in icl_answer[j + 1:]:  # see the module doc
                new = self._name(len(old))
            fresh.append(new)
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

    # 1. the one-shot ICL example (upstream: no model template, budget 500, unit 5, nothing to generate)
    def icl_prompt(n: int):
        text, prefix, answer = sampler.task_text(n, is_icl=True)
        return text + prefix, answer

    def icl_sample(i: int, n: int):
        built = icl_prompt(n)
        return built, count_tokens(tokenizer, built[0])

    probe = count_tokens(tokenizer, icl_prompt(VT_ICL_UNIT)[0])
    upper = probe_upper_bound(task, VT_ICL_BUDGET, probe, VT_ICL_UNIT, SEARCH_SLACK, VT_ICL_UNIT)
    icl_results, _ = search_and_generate(task + " (ICL example)", lambda n: count_tokens(tokenizer, icl_prompt(n)[0]),
                                         icl_sample, VT_ICL_BUDGET, VT_ICL_UNIT, upper, 1, kind="noise lines")
    icl_text, icl_answer = icl_results[0][0]
    icl_example = icl_text + " " + " ".join(icl_answer) + "\n"
    example_tokens = count_tokens(tokenizer, icl_example)

    # 2. the task: probe and search without the ICL example, whose tokens are added separately
    def prompt_tokens(n: int) -> int:
        text, prefix, _ = sampler.task_text(n)
        return count_tokens(tokenizer, wrap(tokenizer, text, chat_template, task) + prefix)

    # 3. the samples: a randomized copy of the ICL example, a blank line, then the task text (one user turn)
    def sample(i: int, n: int):
        text, prefix, answer = sampler.task_text(n)
        icl = sampler.randomize_icl(icl_example, icl_answer)
        full = wrap(tokenizer, icl + "\n" + text, chat_template, task) + prefix
        return (full, prefix, answer), count_tokens(tokenizer, full) + ttg

    unit = VT_SMALL_LINE_UNIT if context_length < SMALL_CONTEXT_THRESHOLD else VT_LINE_UNIT
    upper = probe_upper_bound(task, context_length, prompt_tokens(unit), unit, SEARCH_SLACK, unit)
    results, _ = search_and_generate(task, lambda n: prompt_tokens(n) + example_tokens + ttg, sample, context_length,
                                     unit, upper, num_samples, kind="noise lines")
    return sample_records(task, cfg, results, chat_template)
