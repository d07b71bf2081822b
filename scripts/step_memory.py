"""What one decode step holds for a while, per method (docs/memory.md, "A decode step"): the memory a step allocates
and frees again beyond the cache and the selectors' state (scores, gathered K/V, the coverage pass), which the
memory plan does not count yet.

Each method runs in a process of its own on a random model with Llama-3.1-8B's attention shape (32 query heads, 8
KV heads, head dim 128; 3 layers, so that a method that keeps its first layers dense still selects in one) and a
prompt of --context tokens replayed as a prefill capture (scripts/rehearse_scale.py: projected_layers), in fp32 on
this CPU with the reference backend and coverage measured, as the runs here decode. After two warm-up steps the
next two are measured, eager and in the static step: the most tensor memory they hold at once, counted op by op
(bench/live_tensors.py), and the process's resident growth (VmHWM reset before the step; the child runs with
MALLOC_MMAP_THRESHOLD_ low, so that freed blocks go back to the system).

    python scripts/step_memory.py --out results/step_memory/cpu_64k.json
    python scripts/step_memory.py --context 4096 --methods fullkv,locks --out /tmp/step_memory.json   # a quick look

Writes the JSON records and a markdown table next to them (the same name with .md).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

MiB = float(1 << 20)
WARM_UP, MEASURED = 2, 2  # decode steps before the measured ones, and measured


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--context", type=int, default=1 << 16, help="prompt + generation, tokens")
    p.add_argument("--budget", type=int, default=2048)
    p.add_argument("--methods", default=None, help="comma-separated (default: every registered method)")
    p.add_argument("--modes", default="eager,static")
    p.add_argument("--out", default=str(ROOT / "results" / "step_memory" / "cpu_64k.json"))
    p.add_argument("--one", default=None, help=argparse.SUPPRESS)  # the child process: method,mode
    return p.parse_args(argv)


def measure(args, name: str, mode: str) -> dict:
    """One method's decode steps in this process: the largest tracked and resident peak of the measured steps."""
    import torch
    from omegaconf import OmegaConf
    from transformers import LlamaForCausalLM

    from bench.live_tensors import LiveTensors
    from bench.resident import peak_since_reset, reset_peak, resident_bytes
    from eval.runner import method_spec
    from locks.core.static_decode import StaticDecodeStep
    from run import compose_config
    from scripts.rehearse_scale import model_config, replay_projected

    torch.manual_seed(0)
    torch.set_num_threads(1)
    steps = WARM_UP + MEASURED
    shape = argparse.Namespace(context=args.context, layers=3, hidden=256)
    config = OmegaConf.to_container(compose_config(
        [f"method={name}", f"budget={args.budget}", "logger=none", f"benchmark.context_length={args.context}"]),
        resolve=True)
    spec = method_spec(config["method"])
    prompt = args.context - steps
    with torch.inference_mode():
        model = LlamaForCausalLM(model_config(shape)).eval()
        ids = torch.randint(0, model.config.vocab_size, (1, prompt), generator=torch.Generator().manual_seed(1))
        cache, logits = replay_projected(model, spec, ids, steps)
        cache.phase = "decode"
        step = StaticDecodeStep(model, cache, 1, args.context, cuda_graph=False) if mode == "static" else None
        token, tracked, resident, at_peak = logits.argmax(-1), 0, 0, []
        for i in range(steps):
            position = prompt + i
            before = resident_bytes()
            reset_peak()
            with LiveTensors() as live:
                if step is not None:
                    logits = step(token, position)
                else:
                    logits = model(input_ids=token.view(1, 1), position_ids=torch.tensor([[position]]), cache=cache,
                                   sparse_cache=cache, use_cache=True).logits[:, -1]
            token = logits.argmax(-1)
            if i >= WARM_UP:
                resident = max(resident, peak_since_reset() - before)
                if live.peak > tracked:
                    tracked, at_peak = live.peak, live.at_peak
    return dict(method=name, mode=mode, context=args.context, budget=args.budget,
                tracked_mib=round(tracked / MiB, 1), resident_mib=round(resident / MiB, 1),
                at_peak=[f"{b / MiB:.1f} MiB {op} {list(dims)} {line}" for b, op, dims, line in at_peak[:4]])


def table(records: list[dict]) -> str:
    lines = ["| method | mode | context | tracked MiB | resident MiB | largest at the peak |",
             "|---|---|---|---|---|---|"]
    for r in records:
        if "error" in r:
            lines.append(f"| {r['method']} | {r['mode']} | {r['context']} | | | {r['error']} |")
            continue
        lines.append(f"| {r['method']} | {r['mode']} | {r['context']} | {r['tracked_mib']} | {r['resident_mib']} | "
                     f"{r['at_peak'][0] if r['at_peak'] else ''} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.one:
        name, mode = args.one.split(",")
        print("STEP " + json.dumps(measure(args, name, mode)), flush=True)
        return 0
    from locks.core.registry import discover
    from scripts.rehearse_scale import child_record, write_records

    methods = args.methods.split(",") if args.methods else sorted(discover())
    passed = list(argv if argv is not None else sys.argv[1:])
    env = {**os.environ, "MALLOC_MMAP_THRESHOLD_": "65536"}
    records = []
    for name in methods:
        for mode in args.modes.split(","):
            record = child_record(__file__, passed, f"{name},{mode}", "STEP ", env)
            records.append(dict(method=name, mode=mode, context=args.context, error=record)
                           if isinstance(record, str) else record)
            print(f"step_memory: {records[-1]}", flush=True)
    write_records(args.out, "step_memory", passed, records, table(records))
    return 0 if all("error" not in r for r in records) else 1


if __name__ == "__main__":
    sys.exit(main())
