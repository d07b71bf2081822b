"""RULER frequent words extraction ("fwe"), docs/benchmarks/ruler.md (linear length search §4).

Written from the specification; where it is silent, NVIDIA/RULER c3f5e3b
``scripts/data/synthetic/freq_words_extraction.py`` is followed ("upstream"): one ``random.Random(seed)``
stream draws a fresh coded vocabulary for the length search and then for every sample, each word list
is shuffled with a fresh ``Random(seed)``, and the counts are computed in numpy float64 as upstream
does.  ``zeta(2.0)`` is pi**2/6 (bit-identical to ``scipy.special.zeta(2.0)``); scipy is only imported
for other alphas.  Deliberate difference: ValueError instead of an endless/negative loop when not even
a few words fit.
"""

from __future__ import annotations

import math
import random
import string

import numpy as np

from .common import count_tokens, wrap
from .tasks import FWE_CODED_WORDLEN, FWE_FAMILY, FWE_STEP_DIVISOR, FWE_VOCAB_DIVISOR, OTHER_TASKS


def zeta(alpha: float) -> float:
    if alpha == 2.0:
        return math.pi ** 2 / 6
    try:
        from scipy.special import zeta as _zeta
    except ImportError as e:  # pragma: no cover - only for non-default alphas
        raise ImportError(f"fwe with alpha={alpha} needs scipy (`pip install scipy`)") from e
    return float(_zeta(alpha))


def generate_fwe_samples(task: str, tokenizer, context_length: int, num_samples: int, seed: int = 42,
                         chat_template: bool = True) -> list[dict]:
    """``num_samples`` FWE samples sized to ``context_length`` tokens (same record fields as NIAH;
    ``num_haystack`` = coded words before rounding the per-rank counts down)."""
    cfg = OTHER_TASKS[task]
    if cfg["family"] != "freq_words_extraction":
        raise ValueError(f"{task!r} is not a freq_words_extraction task")
    ttg = cfg["tokens_to_generate"]
    alpha = cfg["alpha"]
    budget = context_length - ttg  # B: prompt tokens (answer prefix included) must stay <= B
    vocab_size = budget // FWE_VOCAB_DIVISOR
    step = budget // FWE_STEP_DIVISOR
    if vocab_size < 5 or step < 1:
        raise ValueError(f"RULER {task}: context_length={context_length} is too small (vocabulary of "
                         f"{vocab_size} coded words); use a larger context_length.")
    rng = random.Random(seed)
    z = zeta(alpha)
    prefix = FWE_FAMILY["answer_prefix"]

    def draw_vocab() -> list[str]:
        vocab = ["".join(rng.choices(string.ascii_lowercase, k=FWE_CODED_WORDLEN)) for _ in range(vocab_size)]
        while len(set(vocab)) < vocab_size:
            vocab.append("".join(rng.choices(string.ascii_lowercase, k=FWE_CODED_WORDLEN)))
        vocab = sorted(set(vocab))
        random.Random(seed).shuffle(vocab)
        vocab[0] = "..."  # the top-ranked word is the noise word
        return vocab

    def gen_text(vocab: list[str], num_words: int):
        k = np.arange(1, len(vocab) + 1)
        counts = (num_words * (k ** -alpha) / z).astype(int)
        words = [w for w, c in zip(vocab, counts) for _ in range(int(c))]
        random.Random(seed).shuffle(words)
        task_text = FWE_FAMILY["template"].format(context=" ".join(words))
        full = wrap(tokenizer, task_text, chat_template, task) + prefix
        return full, vocab[1:4], count_tokens(tokenizer, full)

    def too_small(n):
        return ValueError(f"RULER {task}: context_length={context_length} is too small: the prompt does not "
                          f"fit even with {n} coded words. Use a larger context_length.")

    # linear search (once): grow while the prompt is shorter than B, then step back one increment
    vocab = draw_vocab()
    num_words = budget // FWE_CODED_WORDLEN
    _, _, n_tok = gen_text(vocab, num_words)
    while n_tok < budget:
        num_words += step
        _, _, n_tok = gen_text(vocab, num_words)
    num_words -= step

    samples = []
    for i in range(num_samples):
        vocab = draw_vocab()
        used = num_words
        if used <= 0:
            raise too_small(used)
        full, answer, n_tok = gen_text(vocab, used)
        while n_tok > budget:  # shrink by one increment while the sample is too long
            used -= step
            if used <= 0:
                raise too_small(used + step)
            full, answer, n_tok = gen_text(vocab, used)
        samples.append({
            "index": i,
            "task": task,
            "input": full,
            "outputs": list(answer),
            "answer_prefix": prefix,
            "length": n_tok + ttg,
            "max_new_tokens": ttg,
            "metric": cfg["metric"],
            "chat_template": bool(chat_template),
            "num_haystack": used,
        })
    return samples
