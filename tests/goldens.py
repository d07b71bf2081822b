"""Selection goldens: what every method selects, step by step and layer by layer, and what the model then predicts,
recorded before a change to the decode core so that the change can be shown to keep them (docs/testing.md,
"Goldens").

A tiny random-weight Llama (3 layers, GQA group 3 as the embedded model, head dim 64) reads a 301-token prompt and
is fed a fixed 24-token continuation (teacher forcing: a selection never depends on an earlier prediction, so one
difference cannot cascade). At every decode step and layer the Selection the selector returns, eager (`select`) and
static (`select_static`, run eagerly on CPU), is reduced to the set of tokens each (row, KV head, query-head set)
attends, hashed; the step's greedy prediction is kept as a token id. Every registered method runs in its default
configuration at budgets 64 and 128, plus the variants of tests/core/test_static_decode.py.

    python -m tests.goldens --write      # records tests/fixtures/goldens/selections.json (before a core change)
    pytest tests/methods/test_selection_goldens.py   # compares the code of today with the recording
"""
from __future__ import annotations

import argparse
import hashlib
import json
from pathlib import Path

import numpy as np
import torch

PATH = Path(__file__).resolve().parent / "fixtures" / "goldens" / "selections.json"
MODEL = dict(vocab_size=512, hidden_size=192, intermediate_size=128, num_hidden_layers=3, num_attention_heads=6,
             num_key_value_heads=2, head_dim=64, max_position_embeddings=4096)
PROMPT, STEPS = 301, 24
VARIANTS = [("locks", 128, {"quant": "none", "aggregation": "max"}), ("quest", 128, {"gqa": "group"}),
            ("locks", 128, {"v_bits": 8, "c_bits": 4, "mu_format": "page_int8"}), ("locks", 128, {"log_z": "previous"}),
            ("locks", 128, {"sink_pages": 1, "recent_window": 16}), ("quest", 128, {"page_rule": "eval"}),
            ("locks", 128, {"budget_mode": "paper"})]


def cases() -> list[tuple[str, int, dict]]:
    from locks.core.registry import discover
    from tests.helpers import default_method_options

    out = [(name, budget, default_method_options(name) or {}) for name in sorted(discover()) for budget in (64, 128)]
    return [case for case in out if _takes(*case)] + [(name, budget, opts) for name, budget, opts in VARIANTS]


def _takes(name: str, budget: int, options: dict) -> bool:
    """Whether the method runs at this budget (MagicPIG's must exceed its sink and window)."""
    from locks.core.registry import selector_class
    from locks.errors import ConfigError

    try:
        selector_class(name).Options.build(options).check_budget(budget)
    except ConfigError:
        return False
    return True


def case_key(name: str, budget: int, options: dict) -> str:
    return f"{name} b={budget} " + json.dumps(options, sort_keys=True)


def tokens_attended(sel, length: int) -> tuple[bool, np.ndarray | None]:
    """(dense, bool [B, Hkv, S, length] of the tokens each query-head set attends) of a Selection."""
    if sel.dense:
        return True, None
    if sel.pages is not None:
        pages = sel.pages.long()
        tokens = (pages[..., None] * sel.page_size + torch.arange(sel.page_size)).flatten(-2)
        valid = torch.ones_like(pages, dtype=torch.bool) if sel.page_valid is None else sel.page_valid
        valid = valid[..., None].expand(*pages.shape, sel.page_size).flatten(-2) & (tokens < length)
    else:
        tokens, valid = sel.indices.long(), sel.valid
    B, H, S, _ = tokens.shape
    mask = torch.zeros(B, H, S, length + 1, dtype=torch.bool)
    mask.scatter_(3, torch.where(valid, tokens, length).clamp(max=length), True)
    return False, mask[..., :length].numpy()


def digest(dense: bool, mask: np.ndarray | None) -> str:
    if dense:
        return "dense"
    return hashlib.sha1(np.packbits(mask, axis=-1).tobytes() + str(mask.shape).encode()).hexdigest()[:16]


def record_case(model, name: str, budget: int, options: dict, static: bool) -> dict | None:
    """{"predictions": [STEPS ids], "selections": [STEPS x layers digests]}, or None when the method has no static
    path (static=True)."""
    from locks.core.cache import SelectorCache
    from locks.core.registry import MethodSpec
    from locks.core.static_decode import StaticDecodeStep

    gen = torch.Generator().manual_seed(1)
    ids = torch.randint(0, MODEL["vocab_size"], (1, PROMPT), generator=gen)
    continuation = torch.randint(0, MODEL["vocab_size"], (STEPS,), generator=gen)
    cache = SelectorCache(model, MethodSpec(name, budget, options))
    if static and any(layer.selector.static_decode_error() for layer in cache.layers):
        return None
    step_digests: list[str | None] = [None] * len(cache.layers)

    def wrap(layer_idx, selector):
        select, select_static = selector.select, getattr(selector, "select_static", None)

        def eager(query, keys, values):
            sel = select(query, keys, values)
            step_digests[layer_idx] = digest(*tokens_attended(sel, keys.shape[2]))
            return sel

        def static_(query, keys, values, length):
            sel = select_static(query, keys, values, length)
            step_digests[layer_idx] = digest(*tokens_attended(sel, int(length.reshape(()))))
            return sel

        selector.select = eager
        if select_static is not None:
            selector.select_static = static_

    with torch.inference_mode():
        cache.phase = "prefill"
        cache.max_new_tokens = STEPS + 1
        logits = model(input_ids=ids, cache=cache, sparse_cache=cache, use_cache=True).logits[:, -1]
        if static and cache.static_sample_error() is not None:
            return None
        for i, layer in enumerate(cache.layers):
            wrap(i, layer.selector)
        predictions, selections = [int(logits.argmax(-1))], []
        step = StaticDecodeStep(model, cache, 1, PROMPT + STEPS + 1, cuda_graph=False) if static else None
        if not static:
            cache.phase = "decode"
        for i in range(STEPS):
            position = PROMPT + i
            token = continuation[i].view(1)
            step_digests[:] = [None] * len(cache.layers)
            if static:
                logits = step(token, position)
            else:
                logits = model(input_ids=token.view(1, 1), position_ids=torch.tensor([[position]]), cache=cache,
                               sparse_cache=cache, use_cache=True).logits[:, -1]
            predictions.append(int(logits.argmax(-1)))
            selections.append(list(step_digests))
    return {"predictions": predictions, "selections": selections}


def build_model():
    from transformers import LlamaConfig, LlamaForCausalLM

    from locks.core.attention import register_attention

    torch.manual_seed(0)
    return LlamaForCausalLM(LlamaConfig(**MODEL, attn_implementation=register_attention())).eval()


def record_all() -> dict:
    from tqdm import tqdm

    model = build_model()
    out = {}
    for name, budget, options in tqdm(cases(), desc="goldens", unit="case"):
        key = case_key(name, budget, options)
        for mode in ("eager", "static"):
            try:
                result = record_case(model, name, budget, options, mode == "static")
            except Exception as err:  # a configuration the method rejects is recorded as its one-line error
                result = {"error": f"{type(err).__name__}: {str(err).splitlines()[0]}"}
            if result is not None:
                out[f"{key} {mode}"] = result
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--write", action="store_true", help=f"record into {PATH.relative_to(PATH.parents[2])}")
    args = p.parse_args(argv)
    data = record_all()
    if args.write:
        PATH.parent.mkdir(parents=True, exist_ok=True)
        PATH.write_text(json.dumps(data, indent=0, sort_keys=True) + "\n")
        print(f"goldens: {len(data)} cases -> {PATH}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
