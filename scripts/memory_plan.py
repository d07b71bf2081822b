"""The memory plan (eval/memory_plan.py) of the seed models on a GPU, from their configs alone (nothing is loaded,
no GPU is needed): one run, or a grouped sweep of several methods, at a context length, batch size and prefill
chunk size. `python run.py ... +plan=true` prints the same table for a configured run on this machine's device.

    python scripts/memory_plan.py --shape glm --context 131072 --methods fullkv,locks,quest,shadowkv,rocketkv,lrqk
    python scripts/memory_plan.py --shape llama --context 1048576 --methods locks --chunk 8192 --batch 4
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch
from omegaconf import OmegaConf

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def main(argv=None) -> int:
    from bench.shapes import MODELS
    from eval.memory_plan import plan_memory
    from eval.runner import method_spec
    from run import compose_config
    from transformers import AutoConfig

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--shape", choices=sorted(MODELS), default="glm", help="glm: GLM-4-9B, llama: Llama-3.1-8B")
    p.add_argument("--context", type=int, default=131072, help="prompt + generation, tokens")
    p.add_argument("--methods", default="locks", help="one method, or several: a grouped sweep of them")
    p.add_argument("--budget", type=int, default=2048)
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--chunk", type=int, default=None, help="prefill_chunk_size (default: the whole prompt)")
    p.add_argument("--device", default="cuda", help="the device the plan is for (bf16 on cuda, fp32 on cpu)")
    args = p.parse_args(argv)

    kind, overrides = MODELS[args.shape]
    config = AutoConfig.for_model(kind, **overrides)
    names = args.methods.split(",")
    specs = []
    for name in names:
        cfg = compose_config([f"method={name}", f"budget={args.budget}", f"batch_size={args.batch}", "logger=none",
                              f"benchmark.context_length={args.context}", "static_decode=auto",
                              f"prefill_chunk_size={args.chunk if args.chunk else 'null'}"])
        run_config = OmegaConf.to_container(cfg, resolve=True)
        specs.append(method_spec(run_config["method"]))
    plan = plan_memory(run_config, config, specs, group=len(names), device=torch.device(args.device))
    print(f"{args.shape}, {'group of ' if len(names) > 1 else ''}{args.methods}, budget {args.budget}, "
          f"prefill_chunk_size {args.chunk}")
    print(plan.table())
    return 0


if __name__ == "__main__":
    sys.exit(main())
