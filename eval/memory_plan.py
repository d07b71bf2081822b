"""The memory plan of a run, from the model's config alone (no weights loaded), checked before the model loads
(docs/memory.md, "The memory plan").

Terms, in bytes, for the longest sequence S of the benchmark (prompt plus generation) and `batch_size` rows:

    weights        parameters of the model built on the meta device x the run's dtype (bf16 on CUDA, fp32 on CPU)
    K/V            rows x layers x 2 x H_kv x d x S x dtype bytes (every layer keeps its whole K/V in the harness)
    method state   rows x sum over layers of Selector.memory_bytes(S)["state"] (summaries, min/max, factors, ...)
                   and Selector.harness_bytes(S) (what the harness holds beyond: LRQK's hot-cache copy, growth room;
                   with static decoding also Selector.static_bytes(S), start_static's buffers)
    stacked rows   a static step over rows of different lengths stacks them (locks/core/batch.py), layer by layer:
                   one layer's K/V and state twice while it is copied (batch_size > 1 and every selector names its
                   row_state)
    method prefill the largest Selector.prefill_bytes(S): what a selector's prefill holds for a while (LRQK's fp32
                   factorization over every prompt query, ShadowKV's SVD), one layer of one row at a time
    prefill        one forward's activations over n = prefill_chunk_size (or S) positions: hidden states, the q/k/v
                   projections, the MLP's gate, up and product (n x intermediate x 3), the chunk's boolean mask
                   (n x S) and, when chunked, the K/V heads SDPA repeats for GQA under a mask, the last logits
                   (SDPA's kernels never hold the n x S scores)
    group capture  a grouped sweep (group of j runs) keeps one prefill capture per row: the prompt queries its runs'
                   selectors read (all of them for LRQK: layers x H_q x S x d x dtype bytes), and the shared memos
                   (bounded here by one run's method state)
    chunk queries  a single run prefilling in chunks keeps the same prompt queries across its chunks (every
                   full-attention layer's, until the layer's last chunk joins them), plus one layer's joined copy
    host           rows x sum over layers of memory_bytes(S)["host"] (ShadowKV's values, LRQK's cold store),
                   pinned on CUDA

On CUDA the device terms are checked against `torch.cuda.mem_get_info` and the host terms against the host's
available memory; on CPU everything is host memory. A plan that does not fit stops the run with one line naming
the largest term and the setting that shrinks it.
"""
from __future__ import annotations

import os
from dataclasses import dataclass

import torch

from locks.errors import ConfigError

GiB = float(1 << 30)


@dataclass
class Term:
    name: str
    where: str  # "device" or "host"
    bytes: float
    knob: str  # the setting that shrinks it


@dataclass
class MemoryPlan:
    terms: list[Term]
    sequence: int
    rows: int
    device: str
    chunk: int | None = None  # the prefill chunk the plan assumes (None: the whole prompt in one forward)

    def total(self, where: str) -> float:
        return sum(t.bytes for t in self.terms if t.where == where)

    def table(self) -> str:
        prefill = "one forward" if self.chunk is None else f"chunks of {self.chunk} tokens"
        lines = [f"Memory plan: {self.rows} row(s) of {self.sequence} tokens on {self.device}, prefill in {prefill}",
                 "",
                 "| term | where | GiB | shrinks with |", "|---|---|---|---|"]
        lines += [f"| {t.name} | {t.where} | {t.bytes / GiB:.3f} | {t.knob} |" for t in self.terms]
        lines += [f"| total | {w} | {self.total(w) / GiB:.3f} | |" for w in ("device", "host") if self.total(w)]
        return "\n".join(lines)


def model_config(model_cfg):
    """The transformers config of `model_cfg` (conf/model/*.yaml) without loading a weight."""
    from transformers import AutoConfig, LlamaConfig

    if model_cfg.source == "random":
        return LlamaConfig(**model_cfg.config)
    if model_cfg.source == "pretrained":
        return AutoConfig.from_pretrained(os.path.expanduser(str(model_cfg.path)))
    from locks.core.models import _gguf_cache, _gguf_path, default_device_dtype

    cached = _gguf_cache(model_cfg, default_device_dtype()[1])  # the dequantized copy's config.json, when saved
    if cached is not None and (cached / "config.json").exists():
        return AutoConfig.from_pretrained(cached)
    path = _gguf_path(model_cfg)
    return AutoConfig.from_pretrained(str(path.parent), gguf_file=path.name)


def run_plan(config: dict, model_cfg, methods: list, group: int = 1,
             device: torch.device | None = None) -> MemoryPlan:
    """The plan of a run or group of the configured model (`model_cfg`: conf/model/*.yaml; its files checked first
    by the caller, so that a missing checkpoint is its own error) on `device` (default: this machine's)."""
    return plan_memory(config, model_config(model_cfg), methods, group, device)


SLURM_BASE_GIB = 8  # a job's host memory beyond its plan: the interpreter, torch and CUDA, tokenizer, data


def slurm_mem_gb(plan: MemoryPlan) -> int:
    """Host memory to request for a SLURM job (--mem, GiB) from its plan: the host terms, the weights (read through
    host memory on their way to a GPU; on a CPU job they are a host term already) and SLURM_BASE_GIB, rounded up."""
    weights = sum(t.bytes for t in plan.terms if t.name == "weights" and t.where == "device")
    return int(-(-(plan.total("host") + weights) // GiB)) + SLURM_BASE_GIB


def parameter_count(config) -> int:
    """Parameters of the model `config` describes, counted on the meta device (tied embeddings once)."""
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    return sum(p.numel() for p in model.parameters())


def _longest(value) -> int:
    return int(max(value) if isinstance(value, (list, tuple)) else value)


def sequence_length(bench: dict) -> int:
    """The longest prompt plus generation of the benchmark: RULER's context_length includes the generation; the
    others cap the prompt at max_length (or context_length) and generate at most decode_cap (or 512) tokens."""
    if bench.get("name") == "ruler" or "max_length" not in bench:
        return _longest(bench["context_length"])
    return _longest(bench["max_length"]) + int(bench.get("decode_cap") or 512)


AUTO_SMALLEST_CHUNK = 256  # prefill_chunk_size=auto tries no chunk below this many tokens


def plan_memory(config: dict, model_config_, methods: list, group: int = 1,
                device: torch.device | None = None, available=None) -> MemoryPlan:
    """The plan of a run (`config`: the resolved run config, `methods`: its MethodSpec) or of a group of `group`
    runs whose methods are `methods`. With prefill_chunk_size=auto: the plan of the largest prefill chunk that
    fits the free memory (`available(where, device)`, default `available_bytes`): the whole prompt, else the powers
    of two below it down to AUTO_SMALLEST_CHUNK tokens; the smallest when none fits (check_plan then says so)."""
    if config.get("prefill_chunk_size") != "auto":
        return _plan(config, model_config_, methods, group, device)
    S = sequence_length(config["benchmark"])
    chunks = [None] + [1 << k for k in range((S - 1).bit_length() - 1, AUTO_SMALLEST_CHUNK.bit_length() - 2, -1)]
    for chunk in chunks:
        plan = _plan({**config, "prefill_chunk_size": chunk}, model_config_, methods, group, device)
        if fits(plan, available or available_bytes):
            break
    return plan


def _plan(config: dict, model_config_, methods: list, group: int, device) -> MemoryPlan:
    from locks.core.cache import config_windows
    from locks.core.generation import static_by_default
    from locks.core.registry import MethodSpec
    from locks.core.models import default_device_dtype
    from locks.core.prefill import query_positions_needed
    from locks.core.selector import LayerInfo

    default_device, _ = default_device_dtype()
    device = torch.device(device or default_device)
    cuda = device.type == "cuda"
    dtype = torch.bfloat16 if cuda else torch.float32  # what locks.core.models loads the model in there
    element = torch.finfo(dtype).bits // 8
    c = model_config_
    rows = int(config.get("batch_size") or 1)
    S = sequence_length(config["benchmark"])
    chunk = min(S, int(config.get("prefill_chunk_size") or S))
    d = getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads
    Hq, Hkv, layers = c.num_attention_heads, c.num_key_value_heads, c.num_hidden_layers
    h, inter, vocab = c.hidden_size, c.intermediate_size, c.vocab_size
    # a method the budget does not change (FullKV) has none in its run key
    methods = [MethodSpec(m.name, m.budget or S, m.options, m.backend) for m in methods]
    windows = config_windows(c)

    def infos():  # the harness keeps K/V and state in the run's dtype
        return [LayerInfo(i, Hq, Hkv, d, d ** -0.5, element, sliding_window=w, num_layers=layers)
                for i, w in enumerate(windows)]

    static = config.get("static_decode", False)
    static = static_by_default("cuda" if cuda else "cpu", rows) if static == "auto" else bool(static)
    state = host = layer_state = prefill_work = 0.0
    selectors = []
    stackable = True
    for spec in methods:
        built = [spec.build(info) for info in infos() if info.sliding_window is None]
        selectors += built
        stackable &= all(s.row_state is not None for s in built)
        per = [s.memory_bytes(S) for s in built]
        layer_held = [m["state"] + s.harness_bytes(S) + static * s.static_bytes(S) for s, m in zip(built, per)]
        prefill_work = max([prefill_work] + [s.prefill_bytes(S) for s in built])
        held = sum(layer_held)
        state = max(state, held)
        layer_state = max([layer_state] + layer_held)
        host = max(host, sum(m["host"] for m in per))
    where = "device" if cuda else "host"
    kv = rows * layers * 2 * Hkv * d * S * element
    terms = [
        Term("weights", where, parameter_count(c) * element, "a smaller model"),
        Term("K/V", where, kv, "batch_size, benchmark.context_length"),
        Term("method state", where, rows * state, "batch_size, the method's options"),
    ]
    if rows > 1 and stackable and static:
        terms.append(Term("stacked rows (one layer's copy)", where, kv / layers + rows * layer_state, "batch_size"))
    # a chunk after a cached prefix attends with a boolean mask [chunk, S], and transformers' SDPA then repeats the
    # K/V heads for GQA (S x H_q x d, keys and values) instead of enable_gqa
    attention = chunk * S + 2 * S * Hq * d * element if chunk < S else 0  # one forward: causal, no mask
    prefill = chunk * element * (4 * h + (Hq + 2 * Hkv) * d + 3 * inter) + attention + vocab * 4
    terms.append(Term("prefill activations", where, prefill, "prefill_chunk_size"))
    if prefill_work:  # rows prefill one after another, each layer's selector after the last: one at a time
        terms.append(Term("method prefill work (one layer)", where, prefill_work, "the method's options"))
    n_q = query_positions_needed(selectors)
    n_q = S if n_q is None else min(S, n_q)
    full_layers = sum(w is None for w in windows)  # a sliding layer's selector reads no prompt query
    queries = rows * full_layers * Hq * n_q * d * element
    if group > 1:
        terms.append(Term("group capture queries", where, queries, "a smaller group (methods that read fewer "
                                                                   "prompt queries, e.g. without LRQK)"))
        terms.append(Term("group memos", where, rows * state, "a smaller group"))
    elif chunk < S and queries:
        # a chunked prefill keeps every layer's prompt queries until its last chunk, which joins one layer's to them
        terms.append(Term("prompt queries across chunks", where, queries * (full_layers + 1) / full_layers,
                          "methods that read fewer prompt queries (e.g. without LRQK), or no prefill_chunk_size"))
    if host:
        terms.append(Term("offloaded K/V (pinned)" if cuda else "offloaded K/V", "host", rows * host, "batch_size"))
    return MemoryPlan(terms, S, rows, str(device), chunk if chunk < S else None)


def available_bytes(where: str, device: torch.device) -> float:
    if where == "device":
        free, _ = torch.cuda.mem_get_info(device)
        return float(free)
    try:  # what the kernel can give without swapping (free pages and reclaimable caches)
        with open("/proc/meminfo") as f:
            return next(float(line.split()[1]) * 1024 for line in f if line.startswith("MemAvailable:"))
    except (OSError, StopIteration):
        return float(os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"))


def shortfall(plan: MemoryPlan, available=available_bytes) -> tuple[str, float, float] | None:
    """(where, bytes needed, bytes free) of the first memory, device then host, the plan needs more of than is free;
    None when it fits."""
    device = torch.device(plan.device)
    for where in ("device", "host"):
        need = plan.total(where)
        if need and need > (free := available(where, device)):
            return where, need, free
    return None


def fits(plan: MemoryPlan, available=available_bytes) -> bool:
    return shortfall(plan, available) is None


def check_plan(plan: MemoryPlan, available=available_bytes) -> None:
    """Stop with one line when the plan needs more device or host memory than is free."""
    short = shortfall(plan, available)
    if short is None:
        return
    where, need, free = short
    largest = max((t for t in plan.terms if t.where == where), key=lambda t: t.bytes)
    raise ConfigError(f"memory plan: the run needs {need / GiB:.1f} GiB of {where} memory and {free / GiB:.1f} GiB "
                      f"are free; the largest term is {largest.name} ({largest.bytes / GiB:.1f} GiB); it shrinks "
                      f"with {largest.knob} (`+plan=true` prints the plan)")
