"""A rehearsal of the harness at scale on this CPU (docs/memory.md, "A rehearsal at 256K"): every method prefills
and decodes a prompt of --context tokens on a random model with Llama-3.1-8B's attention shape (32 query heads, 8
KV heads, head dim 128; --layers layers and a narrow residual stream), each method in a process of its own, and
the process's peak memory is checked against the method's memory plan (eval/memory_plan.py; plus RUNTIME_GIB, the
process's own growth on first use), which must also let the run start (check_plan).

The prompt's K/V and queries are each layer's own projections of the prompt's embeddings, rotated by the model's
RoPE: a real prefill attends over the whole prefix, about 1e15 FLOPs per layer at 256K, hours on this CPU. So the
rehearsal replays a prefill capture made of them (locks/core/prefill.py: replay_prefill, as a grouped sweep replays
its real one), one layer at a time; everything after the prompt's K/V and queries is the harness's own code: every
selector's prefill on 256K tokens, then --new-tokens eager decode steps with coverage measured.

    python scripts/rehearse_scale.py --out results/rehearsal/cpu_256k.json
    python scripts/rehearse_scale.py --context 4096 --methods fullkv,quest --out /tmp/rehearsal.json   # a quick look

Quest runs with method.dense_layers=1, so that one of the two layers selects (its default keeps the first two
dense). Writes the JSON records and a markdown table next to them (the same name with .md); exits 1 when a method
fails or holds more than its plan.
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

METHODS = "fullkv,locks,quest,shadowkv,rocketkv,lrqk,oracle,oracle_token"
# what a process's resident memory grows by on first use beyond the tensors a plan counts (allocator arenas, the
# OpenMP and oneDNN workspaces of the first products; about 0.2 GiB at 4K tokens): the peak may exceed the plan by it
RUNTIME_GIB = 0.5
PROJECTION_CHUNK = 8192  # prompt positions projected at a time


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--context", type=int, default=1 << 18, help="prompt + generation, tokens")
    p.add_argument("--new-tokens", type=int, default=4, help="tokens generated (the first from the prefill)")
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--hidden", type=int, default=256, help="the residual stream's width")
    p.add_argument("--methods", default=METHODS)
    p.add_argument("--budget", type=int, default=2048)
    p.add_argument("--out", default=str(ROOT / "results" / "rehearsal" / "cpu_256k.json"))
    p.add_argument("--one", default=None, help=argparse.SUPPRESS)  # the child process: one method
    return p.parse_args(argv)


def model_config(args):
    from transformers import LlamaConfig

    from bench.shapes import ATTENTION
    from locks.core.attention import register_attention

    Hq, Hkv, d = ATTENTION["llama"]
    return LlamaConfig(vocab_size=1024, hidden_size=args.hidden, intermediate_size=2 * args.hidden,
                       num_hidden_layers=args.layers, num_attention_heads=Hq, num_key_value_heads=Hkv, head_dim=d,
                       rope_theta=500000.0, max_position_embeddings=args.context,
                       attn_implementation=register_attention())


def projected_layers(model, embedded, new_tokens: int):
    """Each layer's LayerPrefill from its own q/k/v projections of the prompt's embeddings [1, L, hidden] (post-RoPE
    keys and every query, K/V buffers with room for the generation), made one at a time: a layer's queries are
    dropped as soon as its selector has read them."""
    import torch
    from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

    from locks.core.prefill import LayerPrefill

    L = embedded.shape[1]
    positions = torch.arange(L).unsqueeze(0)
    for layer in model.model.layers:
        attn = layer.self_attn
        d = attn.head_dim
        q = embedded.new_empty(1, model.config.num_attention_heads, L, d)
        keys, values = (embedded.new_zeros(1, model.config.num_key_value_heads, L + new_tokens, d) for _ in range(2))
        for s in range(0, L, PROJECTION_CHUNK):  # in chunks: RoPE's temporaries are a few times the queries
            e = min(L, s + PROJECTION_CHUNK)
            x = layer.input_layernorm(embedded[:, s:e])
            cos, sin = model.model.rotary_emb(x, positions[:, s:e])
            q_s = attn.q_proj(x).view(1, e - s, -1, d).transpose(1, 2)
            k_s = attn.k_proj(x).view(1, e - s, -1, d).transpose(1, 2)
            q[:, :, s:e], keys[:, :, s:e] = apply_rotary_pos_emb(q_s, k_s, cos, sin)
            values[:, :, s:e] = attn.v_proj(x).view(1, e - s, -1, d).transpose(1, 2)
        captured = LayerPrefill(keys, values, q, positions, None, attn.scaling)
        del q, keys, values
        yield captured
        captured.queries = captured.queries.new_empty(1, captured.queries.shape[1], 0, d)


def replay_projected(model, spec, ids, new_tokens: int):
    """A SelectorCache of `spec` (coverage measured) holding the prompt `ids` [1, L] as its projected prefill capture
    replayed, room for `new_tokens`; -> (cache, the first token's logits: the last embedding's, any will do)."""
    from locks.core.cache import SelectorCache
    from locks.core.prefill import PrefillCapture, replay_prefill

    cache = SelectorCache(model, spec, measure_coverage=True)
    cache.max_new_tokens = new_tokens
    embedded = model.model.embed_tokens(ids)
    last = model.lm_head(model.model.norm(embedded[:, -1]))
    capture = PrefillCapture(projected_layers(model, embedded, new_tokens), last, ids.shape[1], new_tokens, None)
    return cache, replay_prefill(cache, capture)


def child_record(script: str, passed: list[str], one: str, prefix: str, env: dict | None = None) -> dict | str:
    """`script` run again in a process of its own with the same arguments and `--one one`: the last record it
    printed after `prefix` (JSON), or the last line of its error output."""
    child = subprocess.run([sys.executable, script, *passed, "--one", one], capture_output=True, text=True, env=env)
    lines = [line for line in child.stdout.splitlines() if line.startswith(prefix)]
    if child.returncode or not lines:
        return (child.stderr.strip().splitlines() or ["no output"])[-1]
    return json.loads(lines[-1][len(prefix):])


def write_records(out: str, kind: str, argv: list[str], records: list[dict], markdown: str) -> None:
    """The records as JSON at `out`, their table next to it (the same name with .md), and the table printed."""
    path = Path(out)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"kind": kind, "argv": argv, "records": records}, indent=1) + "\n")
    path.with_suffix(".md").write_text(markdown + "\n")
    print(markdown)


def rehearse(args, name: str) -> dict:
    """One method in this process: its plan (checked), the projected prefill replayed, the decode; peak memory."""
    import torch
    from omegaconf import OmegaConf
    from transformers import LlamaForCausalLM

    from bench.resident import peak_resident_bytes, resident_bytes
    from eval.memory_plan import GiB, check_plan, plan_memory
    from eval.runner import method_spec
    from locks.core.generation import Row, generate_rows
    from run import compose_config

    torch.manual_seed(0)
    overrides = [f"method={name}", f"budget={args.budget}", "logger=none", "static_decode=false",
                 f"benchmark.context_length={args.context}"] + (["method.dense_layers=1"] if name == "quest" else [])
    config = OmegaConf.to_container(compose_config(overrides), resolve=True)
    spec = method_spec(config["method"])
    with torch.inference_mode():
        model = LlamaForCausalLM(model_config(args)).eval()
        plan = plan_memory(config, model.config, [spec], device=torch.device("cpu"))
        check_plan(plan)
        weights = sum(t.bytes for t in plan.terms if t.name == "weights")
        prompt = args.context - args.new_tokens
        ids = torch.randint(0, model.config.vocab_size, (1, prompt), generator=torch.Generator().manual_seed(1))
        base = resident_bytes()
        start = time.perf_counter()
        cache, logits = replay_projected(model, spec, ids, args.new_tokens)
        prefill_s = time.perf_counter() - start
        row = Row(cache, ids, args.new_tokens, prefill_logits=logits)
        generate_rows(model, [row])
    summary = cache.stats.summary()
    held = peak_resident_bytes() - base
    planned = plan.total("host") - weights
    return dict(method=name, context=args.context, layers=args.layers, budget=args.budget,
                tokens=len(row.tokens), decode_steps=summary["decode_steps"],
                attended_tokens_per_step=summary["attended_tokens_per_step"], coverage=summary.get("coverage"),
                prefill_s=round(prefill_s, 1), decode_s=round(cache.decode_seconds, 1),
                peak_gib=round(held / GiB, 2), plan_gib=round(planned / GiB, 2),
                within_plan=held <= planned + RUNTIME_GIB * GiB,
                plan_terms={t.name: round(t.bytes / GiB, 3) for t in plan.terms})


def table(records: list[dict]) -> str:
    lines = ["| method | context | prefill s | decode s | attended / step | coverage | peak GiB | plan GiB | "
             "within plan |", "|---|---|---|---|---|---|---|---|---|"]
    for r in records:
        if "error" in r:
            lines.append(f"| {r['method']} | {r['context']} | | | | | | | {r['error']} |")
            continue
        coverage = "" if r["coverage"] is None else f"{r['coverage']:.3f}"
        lines.append(f"| {r['method']} | {r['context']} | {r['prefill_s']} | {r['decode_s']} | "
                     f"{r['attended_tokens_per_step']:.0f} | {coverage} | {r['peak_gib']} | {r['plan_gib']} | "
                     f"{'yes' if r['within_plan'] else 'no'} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.one:
        from locks.errors import ConfigError

        try:
            record = rehearse(args, args.one)
        except ConfigError as e:  # the plan does not fit (before any of the method's work), or a bad setting
            record = dict(method=args.one, context=args.context, error=str(e))
        print("REHEARSAL " + json.dumps(record), flush=True)
        return 0
    records = []
    passed = list(argv if argv is not None else sys.argv[1:])
    for name in args.methods.split(","):
        record = child_record(__file__, passed, name, "REHEARSAL ")
        records.append(dict(method=name, context=args.context, error=record) if isinstance(record, str) else record)
        print(f"rehearse_scale: {records[-1]}", flush=True)
    write_records(args.out, "rehearsal", passed, records, table(records))
    return 0 if all(r.get("within_plan") for r in records) else 1


if __name__ == "__main__":
    sys.exit(main())
