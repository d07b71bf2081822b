"""The peak memory of one selector's prefill, measured in a process of its own (tests/eval/test_memory_plan.py):
Llama-3.1-8B's attention shape, random post-RoPE K/V and queries of `length` tokens, the selector's prefill with the
model's RoPE; prints the process's resident growth at its peak, and the plan's bytes for the selector (what it keeps
and its prefill work), as JSON.

    python -m tests.eval.prefill_peak lrqk 65536
"""
import functools
import json
import sys

import torch
from transformers import LlamaConfig, LlamaForCausalLM

from bench.resident import peak_resident_bytes, resident_bytes
from locks.core.cache import KeyRotation
from locks.core.registry import MethodSpec
from locks.core.selector import LayerInfo, PrefillContext


def main(name: str, length: int) -> dict:
    torch.manual_seed(0)
    Hq, Hkv, d = 32, 8, 128
    selector = MethodSpec(name, 2048, {}).build(LayerInfo(2, Hq, Hkv, d, d ** -0.5, 4))
    keys, values, queries = torch.randn(1, Hkv, length, d), torch.randn(1, Hkv, length, d), torch.randn(1, Hq, length, d)
    positions = torch.arange(length).unsqueeze(0)
    model = LlamaForCausalLM(LlamaConfig(vocab_size=64, hidden_size=64, intermediate_size=64, num_hidden_layers=3,
                                         num_attention_heads=Hq, num_key_value_heads=Hkv, head_dim=d,
                                         max_position_embeddings=length + 8))
    rotation = KeyRotation(model)
    torch.mm(torch.randn(512, 512), torch.randn(512, 512))  # the process's growth on first use, before the baseline
    base = resident_bytes()
    with torch.inference_mode():
        selector.prefill(PrefillContext(
            keys=keys, values=values, queries=queries, positions=positions,
            pre_rope_keys=lambda: rotation.unrotate(keys, positions, 2), max_new_tokens=4, max_length=length + 8,
            rotate=functools.partial(rotation.rotate, layer_idx=2), rotation=rotation))
    peak = peak_resident_bytes() - base
    planned = selector.memory_bytes(length)
    kept = planned["state"] + selector.harness_bytes(length) + planned["host"]
    return dict(method=name, length=length, peak=peak, planned=kept + selector.prefill_bytes(length))


if __name__ == "__main__":
    print(json.dumps(main(sys.argv[1], int(sys.argv[2]))))
