"""Helpers shared by the tests (one module; test modules import from here, never from each other): tiny models and
greedy decoding through the harness, a whitespace tokenizer stub, synthetic K/V and dense references for selector
tests, and tolerances for the kernel tests."""

import os
from pathlib import Path
from typing import NamedTuple

import torch

from locks.core.attention import register_attention
from locks.core.cache import SelectorCache
from locks.core.reference import sparse_decode
from locks.core.reference import sparse_decode as ref_sparse_decode
from locks.core.registry import MethodSpec
from locks.core.selector import LayerInfo, PrefillContext, Selection
from locks.method.summaries import build_summaries

TINY_LLAMA = dict(
    vocab_size=512,
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,
    max_position_embeddings=4096,
)


def greedy(model, ids, n, method="fullkv", budget=4096, **options):
    """Greedy decoding of `n` tokens through the sparse_kv attention with a fresh SelectorCache for `method`
    -> (generated ids, cache)."""
    from locks.core.attention import register_attention
    from locks.core.cache import SelectorCache
    from locks.core.generation import generate
    from locks.core.registry import MethodSpec

    model.set_attn_implementation(register_attention())
    cache = SelectorCache(model, MethodSpec(method, budget, options))
    return generate(model, cache, ids, n), cache


class WhitespaceTokenizer:
    """eval_fixtures.md §1.2 stub: text_to_tokens = str.split; a toy chat template."""

    name_or_path = "whitespace-stub"

    def tokenize(self, text):
        return text.split()

    def apply_chat_template(self, messages, add_generation_prompt=False, tokenize=False):
        assert not tokenize and add_generation_prompt
        return "<user>\n" + messages[0]["content"] + "\n<assistant>\n"


D = 32

SCALE = D**-0.5


def make_kv(B, Hkv, L, d=D, clustered=False, seed=0):
    g = torch.Generator().manual_seed(seed)
    if not clustered:
        return torch.randn(B, Hkv, L, d, generator=g), torch.randn(B, Hkv, L, d, generator=g)
    # clustered keys: a few centroids with small per-token noise and a few strong "needle" pages
    centers = torch.randn(B, Hkv, 8, d, generator=g) * 2
    assign = torch.randint(0, 8, (L,), generator=g)
    keys = centers[:, :, assign] + 0.3 * torch.randn(B, Hkv, L, d, generator=g)
    return keys, torch.randn(B, Hkv, L, d, generator=g)


def random_rankings(layers: int, heads: int, head_dim: int, seed: int = 0,
                    kinds=("q_proj", "k_proj", "qk_proj")) -> dict:
    """DoubleSparsity channel rankings in the official JSON format: a seeded random permutation per head, layer and
    kind."""
    g = torch.Generator().manual_seed(seed)
    return {f"model.layers.{layer}.self_attn.{kind}": [torch.randperm(head_dim, generator=g).tolist()
                                                        for _ in range(heads)]
            for layer in range(layers) for kind in kinds}


def channel_config_for(heads: int, head_dim: int, layers: int = 8, seed: int = 0) -> str:
    """A DoubleSparsity channel-ranking file for a selector built alone, without a model to calibrate:
    `random_rankings` of every kind, `layers` layers (written once per shape)."""
    import json
    import tempfile

    path = Path(tempfile.gettempdir()) / "locks-tests" / f"channels-{heads}-{head_dim}-{layers}-{seed}.json"
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps(random_rankings(layers, heads, head_dim, seed)))
        os.replace(tmp, path)
    return str(path)


def alone(name: str, options: dict, heads: int, head_dim: int) -> dict:
    """A method's options for a selector built alone (no model, so no calibration): DoubleSparsity (or Twilight over
    it) gets a channel file of the layer's shape unless one is given."""
    calibrated = name == "doublesparsity" or (name == "twilight" and options.get("base") == "doublesparsity")
    if calibrated and options.get("channel_config", "auto") == "auto":
        return {**options, "channel_config": channel_config_for(heads, head_dim)}
    return options


# options under which a method that prunes its candidates itself (Twilight's top-p: a budget above the context still
# prunes) keeps every candidate, for the tests that compare a budget >= the context with FullKV
KEEP_ALL = {"twilight": {"top_p": 1.0, "top_p_mode": "exact"}}


def build(name, budget, Hq, Hkv, **options):
    info = LayerInfo(layer_idx=0, num_heads=Hq, num_kv_heads=Hkv, head_dim=D, scaling=SCALE)
    return MethodSpec(name, budget, alone(name, options, Hq, D)).build(info)


def prefill(selector, keys, values, Hq, prompt_len):
    B, Hkv, L, d = keys.shape
    q = torch.randn(B, Hq, prompt_len, d)
    pos = torch.arange(prompt_len).expand(B, -1)
    selector.prefill(
        PrefillContext(keys[:, :, :prompt_len], values[:, :, :prompt_len], q, pos, lambda: keys[:, :, :prompt_len])
    )


def dense_reference(q, keys, values):
    """float64 softmax attention over all tokens, GQA by explicit head mapping."""
    B, Hq, d = q.shape
    G = Hq // keys.shape[1]
    k = keys.double().repeat_interleave(G, dim=1)
    v = values.double().repeat_interleave(G, dim=1)
    logits = torch.einsum("bhd,bhld->bhl", q.double(), k) * SCALE
    return torch.einsum("bhl,bhld->bhd", torch.softmax(logits, -1), v), torch.logsumexp(logits, -1)


def decode_output(selector, q, keys, values):
    sel = selector.select(q, keys, values)
    if sel.dense:
        return dense_reference(q, keys, values)[0].float(), sel
    return sparse_decode(q, keys, values, sel, SCALE)[0], sel


def coverage(sel: Selection, q, keys):
    """Mean over query heads of the exact attention mass on the selected tokens."""
    B, Hq, d = q.shape
    Hkv, L = keys.shape[1], keys.shape[2]
    G = Hq // Hkv
    logits = torch.einsum("bhgd,bhld->bhgl", q.view(B, Hkv, G, d).double(), keys.double()) * SCALE
    p = torch.softmax(logits, -1)
    return float((p * attended_mask(sel, L).expand(B, Hkv, G, L)).sum(-1).mean())


def stacked_step_inputs(keys: torch.Tensor, values: torch.Tensor, prompt_lengths, step: int, gen: torch.Generator,
                        query_heads: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Decode step `step` of rows stacked from prompts of `prompt_lengths` tokens: each row's new token's K/V
    (random, from `gen`) written in place at its own position -> (lengths [B], queries [B, query_heads, d])."""
    length = torch.tensor([L + step + 1 for L in prompt_lengths])
    H, d = keys.shape[1], keys.shape[3]
    for r in range(len(prompt_lengths)):
        keys[r, :, int(length[r]) - 1] = torch.randn(H, d, generator=gen)
        values[r, :, int(length[r]) - 1] = torch.randn(H, d, generator=gen)
    return length, torch.randn(len(prompt_lengths), query_heads, d, generator=gen)


def attended_mask(sel: Selection, length: int) -> torch.Tensor:
    """[B, Hkv, Gs, length] bool: the tokens a Selection attends. amax, not a plain scatter: masked padding may
    name a selected token (token 0), and a scatter writes duplicates in no set order."""
    B, Hkv, Gs, _ = sel.indices.shape
    mask = torch.zeros(B, Hkv, Gs, length, dtype=torch.int8)
    mask.scatter_reduce_(3, sel.indices, sel.valid.to(torch.int8), reduce="amax")
    return mask.bool()


HYBRID = dict(vocab_size=256, hidden_size=64, intermediate_size=96, num_attention_heads=4, num_key_value_heads=2,
              head_dim=16, max_position_embeddings=4096)
WINDOW = 16


def hybrid_model(name: str):
    """A tiny random-weight model with sliding-window layers (window WINDOW), one per family the harness supports:
    Gemma 3 (5:1 local/global pattern shortened, two RoPE thetas, QK-norm), GPT-OSS (alternating windows, attention
    sinks, set large so that they matter), Mistral (every layer sliding) and Qwen2 (use_sliding_window with
    max_window_layers)."""
    import transformers as tf

    torch.manual_seed(0)
    if name == "gemma3":
        config = tf.Gemma3TextConfig(**HYBRID, num_hidden_layers=4, sliding_window=WINDOW, query_pre_attn_scalar=16,
                                     layer_types=["sliding_attention", "sliding_attention", "full_attention",
                                                  "sliding_attention"],
                                     rope_parameters={"full_attention": {"rope_type": "default", "rope_theta": 1e6},
                                                      "sliding_attention": {"rope_type": "default", "rope_theta": 1e4}})
        model = tf.Gemma3ForCausalLM(config)
    elif name == "gpt_oss":
        model = tf.GptOssForCausalLM(tf.GptOssConfig(**HYBRID, num_hidden_layers=2, sliding_window=WINDOW,
                                                     num_local_experts=4, num_experts_per_tok=2))
        for layer in model.model.layers:
            torch.nn.init.normal_(layer.self_attn.sinks, 0.0, 2.0)
    elif name == "mistral":
        model = tf.MistralForCausalLM(tf.MistralConfig(**HYBRID, num_hidden_layers=2, sliding_window=WINDOW))
    elif name == "qwen2":
        model = tf.Qwen2ForCausalLM(tf.Qwen2Config(**HYBRID, num_hidden_layers=4, use_sliding_window=True,
                                                   sliding_window=WINDOW, max_window_layers=2))
    else:
        raise ValueError(name)
    return model.eval()


HYBRIDS = ("gemma3", "gpt_oss", "mistral", "qwen2")


def stock_logits(model, ids, n):
    """(greedy continuation [1, n], the logits of each of its tokens [1, n, vocab]) from stock transformers (eager
    attention, its own DynamicCache with sliding-window layers)."""
    model.set_attn_implementation("eager")
    out = model.generate(ids, max_new_tokens=n, min_new_tokens=n, do_sample=False, pad_token_id=0,
                         output_logits=True, return_dict_in_generate=True)
    return out.sequences[:, ids.shape[1]:], torch.stack(out.logits, 1)


def hybrid_case(name: str, prompt: int, steps: int):
    """(name, hybrid_model(name), random prompt ids [1, prompt], stock transformers' greedy continuation [1, steps]
    and its logits [1, steps, vocab]): the reference every hybrid-model test decodes against."""
    model = hybrid_model(name)
    ids = torch.randint(0, model.config.vocab_size, (1, prompt), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        continuation, reference = stock_logits(model, ids, steps)
    return name, model, ids, continuation, reference


def stock_greedy(model, ids, n):
    model.set_attn_implementation("sdpa")
    out = model.generate(ids, max_new_tokens=n, min_new_tokens=n, do_sample=False, pad_token_id=0)
    return out[:, ids.shape[1] :]


def teacher_forced_logits(model, ids, continuation, method, budget, static=False, cache_out=None, **options):
    """Logits of every decode step when the continuation is fed token by token through the SelectorCache (eager
    steps, or the static step run eagerly with static=True); cache_out: a list that receives the cache."""
    from locks.core.static_decode import StaticDecodeStep

    model.set_attn_implementation(register_attention())
    cache = SelectorCache(model, MethodSpec(method, budget, options), measure_coverage=True)
    cache.phase = "prefill"
    cache.max_new_tokens = continuation.shape[1]
    logits = [model(input_ids=ids, cache=cache, sparse_cache=cache).logits[:, -1]]
    step = StaticDecodeStep(model, cache, 1, ids.shape[1] + continuation.shape[1], cuda_graph=False) if static else None
    cache.phase = "decode_static" if static else "decode"
    for i, token in enumerate(continuation[0, :-1]):
        position = ids.shape[1] + i
        if static:
            logits.append(step(token.view(1), position))
            continue
        pos = torch.tensor([[position]])
        logits.append(
            model(input_ids=token.view(1, 1), position_ids=pos, cache=cache, sparse_cache=cache).logits[:, -1]
        )
        cache.stats.steps += 1
    if static:
        cache.finish_static()
    if cache_out is not None:
        cache_out.append(cache)
    return torch.stack(logits, 1)


DEV = torch.device("cuda" if torch.cuda.is_available() else "cpu")

TOL = {torch.float32: 1e-3, torch.bfloat16: 1e-2}


def rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    """max |out - ref| / max |ref| over the reference's finite entries; the -inf / +inf / NaN patterns must agree."""
    out, ref = out.float().cpu(), ref.float().cpu()
    fin = torch.isfinite(ref)
    assert torch.equal(fin, torch.isfinite(out)), "finite-entry patterns differ (unwritten NaN or wrong mask)"
    assert torch.equal(out[~fin], ref[~fin]), "non-finite entries differ"
    if not fin.any():
        return 0.0
    scale = ref[fin].abs().max().clamp(min=1e-30)
    return float((out[fin] - ref[fin]).abs().max() / scale)


def gen(*shape, dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=g).to(dtype).to(DEV)


def locks_inputs(B, Hkv, G, d, P, dtype, seed=0, extra=5):
    keys = gen(B, Hkv, P * 16 + extra, d, dtype=dtype, seed=seed)  # a partial page too (ignored by summaries)
    keys = keys * (1 + torch.linspace(0, 3, d, device=DEV))  # uneven channel scales, like real keys
    q = gen(B, Hkv * G, d, dtype=dtype, seed=seed + 1) * 2
    return q, build_summaries(keys.to(dtype))


def topk_equal_except_ties(out: torch.Tensor, ref: torch.Tensor, k: int, tol: float) -> None:
    """top-k index sets agree, except pages whose reference score ties (within tol) the k-th largest."""
    a = torch.topk(out, k, dim=-1).indices.sort(-1).values.cpu()
    b = torch.topk(ref, k, dim=-1).indices.sort(-1).values.cpu()
    kth = torch.topk(ref, k, dim=-1).values[..., -1:].cpu()
    refc = ref.cpu()
    for row in range(a.reshape(-1, k).shape[0]):
        sa, sb = set(a.reshape(-1, k)[row].tolist()), set(b.reshape(-1, k)[row].tolist())
        for page in sa ^ sb:
            v, t = refc.reshape(-1, ref.shape[-1])[row, page], kth.reshape(-1)[row]
            assert abs(float(v - t)) <= tol * max(1.0, abs(float(t))), f"row {row}: page {page} differs (no tie)"


def kv_inputs(B, Hkv, G, d, L, dtype, seed):
    return (gen(B, Hkv * G, d, dtype=dtype, seed=seed), gen(B, Hkv, L, d, dtype=dtype, seed=seed + 1),
            gen(B, Hkv, L, d, dtype=dtype, seed=seed + 2))


def ref_decode_fp32(q, k, v, sel, scaling):
    """The reference on fp32 copies of the inputs (fp32 output), so that bf16 runs measure the kernel's error and not
    the reference's own rounding of its output to bf16."""
    f = torch.float32
    sel32 = Selection(indices=sel.indices, valid=sel.valid)
    return ref_sparse_decode(q.to(f), k.to(f), v.to(f), sel32, scaling)



def default_method_options(name: str) -> dict | None:
    """conf/method/<name>.yaml resolved against conf/config.yaml's top-level values (e.g. `seed: ${seed}`), without
    name / budget / backend; None when the method has no such file."""
    from pathlib import Path

    from omegaconf import OmegaConf

    conf = Path(__file__).resolve().parents[1] / "conf"
    path = conf / "method" / f"{name}.yaml"
    if not path.exists():
        return None
    top = OmegaConf.load(conf / "config.yaml")
    top = OmegaConf.create({k: v for k, v in top.items() if k not in ("defaults", "hydra", "paths", "method")})
    cfg = OmegaConf.to_container(OmegaConf.merge(top, {"method": OmegaConf.load(path)}), resolve=True)["method"]
    return {k: v for k, v in cfg.items() if k not in ("name", "budget", "backend")}


# methods whose selections a last-bit difference in q or k can change, so two decode paths (eager and static, batch 1
# and a batch) that round the model's matrix products differently may select differently at a step: LRQK's float32
# near-ties in its proxy scores, and DoubleSparsity's low-bit labels, where a value at a rounding boundary of its
# 2-bit code flips it and with it a tied token
ROUNDING_SENSITIVE = ("lrqk", "doublesparsity")

# how a row was decoded, not what it decoded: on the CPU batch 1 decodes eagerly and a batch of rows in the stacked
# static step (static_decode=auto), so a batched record differs from batch 1's in these fields only
HOW_DECODED = ("decode_mode", "decode_instrumented")


def decoded_as(records: list[dict]) -> set:
    """The records' decode modes, with HOW_DECODED removed from each (to compare what they decoded)."""
    modes = set()
    for r in records:
        modes.add(r["decode_mode"])
        for field in HOW_DECODED:
            r.pop(field)
    return modes


def assert_records_close(got, want, where="", rel=1e-6, loose=None) -> None:
    """Two predictions rows or metrics.json records (timings removed) equal in every field, floats to `rel`: what a
    batch of rows records against batch 1, whose batched matrix products round differently. `loose`: {field name:
    rel} for fields allowed a larger relative difference."""
    import pytest

    loose = loose or {}
    if isinstance(want, dict):
        assert isinstance(got, dict) and got.keys() == want.keys(), (where, sorted(set(got) ^ set(want)))
        for key in want:
            assert_records_close(got[key], want[key], f"{where}.{key}", loose.get(key, rel), loose)
    elif isinstance(want, (list, tuple)):
        assert isinstance(got, (list, tuple)) and len(got) == len(want), where
        for i, (a, b) in enumerate(zip(got, want)):
            assert_records_close(a, b, f"{where}[{i}]", rel, loose)
    elif isinstance(want, float) and not isinstance(got, bool):
        assert got == pytest.approx(want, rel=rel, abs=1e-12), (where, got, want)
    else:
        assert got == want, (where, got, want)


def default_suite(runs_dir, num_samples: int, budget: int = 128):
    """The default suite (`conf/config.yaml`: the embedded model, RULER niah_single_2 at 2K) with `num_samples`
    samples -> (config dict, loaded model, samples, one prefill capture per sample), and `method(name)`, the
    MethodSpec of conf/method/<name>.yaml at `budget`."""
    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf

    from eval.benchmarks import build_benchmark
    from eval.runner import load_checked, method_spec, prompt_ids
    from locks.core.prefill import capture_prefill

    conf = str(Path(__file__).resolve().parents[1] / "conf")
    with initialize_config_dir(config_dir=conf, version_base="1.3"):
        cfg = compose("config", overrides=[f"benchmark.num_samples={num_samples}", "logger=none", f"budget={budget}",
                                           f"paths.runs_dir={runs_dir}"])
    config = OmegaConf.to_container(cfg, resolve=True)
    benchmark = build_benchmark(cfg.benchmark)
    loaded = load_checked(cfg.model, benchmark)
    samples = benchmark.samples(loaded.tokenizer, int(config["seed"]))
    assert len(samples) == num_samples
    captures = [capture_prefill(loaded.model, prompt_ids(loaded, s), int(s["max_new_tokens"]), None) for s in samples]

    def method(name: str):
        with initialize_config_dir(config_dir=conf, version_base="1.3"):
            options = OmegaConf.to_container(compose("config", overrides=[f"method={name}", f"budget={budget}"]),
                                             resolve=True)["method"]
        return method_spec(options)

    return config, loaded, samples, captures, method


def load_script(name: str):
    """scripts/<name>.py as a module (registered in sys.modules under `name`, as its dataclasses need), loaded once."""
    import importlib.util
    import sys

    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, Path(__file__).resolve().parents[1] / "scripts" / f"{name}.py")
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return sys.modules[name]


class JobResult(NamedTuple):
    """What a run.py job leaves: its exit code and what it printed (CompletedProcess's field names)."""

    returncode: int
    stdout: str
    stderr: str


def run_inprocess(args: list[str], runs_dir, capsys) -> JobResult:
    """`python run.py paths.runs_dir=<runs_dir> <args>` in this process (run.run on run.compose_config): the same
    job, exit code and printed lines, without the interpreter start and the imports. Use it with the
    `shared_models` fixture so that the models load once per session."""
    from run import compose_config, run

    capsys.readouterr()
    rc = run(compose_config([f"paths.runs_dir={runs_dir}", *args]))
    out = capsys.readouterr()
    return JobResult(rc, out.out, out.err)
