"""Static (CUDA-graph capturable) decode: the same tokens and accounting as the eager path, and a step that a graph
captured at one length replays correctly at any other: the same aten ops and Triton launches with the same shapes
and scalar arguments at every step, and no device-to-host read inside it.

On CPU the static step runs eagerly (kernels under TRITON_INTERPRET=1) and these tests check the properties capture
relies on; with CUDA the same tests run on the GPU, where `generate(static_decode=True)` really captures and replays
a CUDA graph (decode_mode "cuda_graph") and the Triton kernels are compiled.
"""
from pathlib import Path

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from transformers import LlamaConfig, LlamaForCausalLM

from locks.core.attention import register_attention
from locks.core.cache import SelectorCache
from locks.core.generation import generate, static_after_prefill, use_static_decode
from locks.core.registry import MethodSpec, discover
from locks.core.selector import LayerInfo
from locks.core.static_decode import StaticDecodeStep
from locks.errors import ConfigError
from tests.helpers import TINY_LLAMA, default_method_options

DEV = torch.device("cuda" if torch.cuda.is_available() else "cpu")
ROOT = Path(__file__).resolve().parents[2]
STATIC_MODE = "cuda_graph" if DEV.type == "cuda" else "static"
pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")  # numpy's log(0) in the Triton interpreter

# head_dim 64, G = 3 (as the embedded model)
TINY = {**TINY_LLAMA, "hidden_size": 192, "num_attention_heads": 6, "num_key_value_heads": 2, "head_dim": 64,
        "num_hidden_layers": 3}  # quest keeps its first 2 layers dense
VARIANTS = [("locks", 128, {"quant": "none", "aggregation": "max"}), ("quest", 128, {"gqa": "group"}),
            ("locks", 128, {"v_bits": 8, "c_bits": 4, "mu_format": "page_int8"}),  # a layout the kernels do not read
            ("locks", 128, {"log_z": "previous"})]  # state carried from step to step on the device


def _static_error(name: str, options: dict) -> str | None:
    info = LayerInfo(layer_idx=2, num_heads=TINY["num_attention_heads"], num_kv_heads=TINY["num_key_value_heads"],
                     head_dim=TINY["head_dim"], scaling=TINY["head_dim"] ** -0.5)
    return MethodSpec(name, 128, options).build(info).static_decode_error()


# every registered method in its default configuration that has a static path, and a few variants
DEFAULTS = [(name, default_method_options(name)) for name in sorted(discover())]
# (methods whose static paths came after the variants, in the order they came: the earlier cases keep their ids)
LATER = ("oracle", "oracle_token", "doublesparsity", "twilight", "magicpig")
CASES = ([(name, 128, opts) for name, opts in DEFAULTS if name not in LATER] + VARIANTS
         + [(name, 128, dict(DEFAULTS)[name]) for name in LATER[:3]] + [("quest", 128, {"page_rule": "eval"})]
         + [(name, 128, dict(DEFAULTS)[name]) for name in LATER[3:4]]
         + [("twilight", 128, {"base": "locks", "top_p_mode": "exact"}), ("twilight", 128, {"base": "doublesparsity"})]
         + [(name, 128, dict(DEFAULTS)[name]) for name in LATER[4:]])
# host reads of device values (.item(), bool(t), data-dependent output shapes): forbidden inside a captured graph
SYNC_OPS = ("aten._local_scalar_dense", "aten.nonzero", "aten.masked_select", "aten.unique", "aten._unique",
            "aten.item", "aten.equal")
# factorizations and solves: on CUDA they may run in MAGMA or cuSOLVER paths that synchronize the device, which a
# capture forbids (and a CPU trace cannot see inside them)
LINALG_OPS = ("aten.linalg_solve", "aten._linalg_solve", "aten.linalg_lu", "aten.linalg_cholesky",
              "aten.linalg_inv", "aten.linalg_eig", "aten._linalg_eig", "aten.linalg_qr", "aten._linalg_svd",
              "aten.linalg_ldl", "aten.cholesky", "aten.lu_", "aten.triangular_solve", "aten.linalg_solve_triangular")


@pytest.fixture(scope="module")
def tiny():
    torch.manual_seed(0)
    return LlamaForCausalLM(LlamaConfig(**TINY, attn_implementation=register_attention())).eval().to(DEV)


def prompt(n=301, seed=1):
    return torch.randint(0, TINY["vocab_size"], (1, n), generator=torch.Generator().manual_seed(seed)).to(DEV)


def run(model, method, budget, options, static, backend="torch", n=40):
    cache = SelectorCache(model, MethodSpec(method, budget, options, backend=backend), measure_coverage=True)
    out = generate(model, cache, prompt(), n, static_decode=static)
    return out, cache


@pytest.mark.parametrize("method,budget,options", CASES)
def test_static_decode_matches_eager(tiny, method, budget, options):
    eager_out, eager = run(tiny, method, budget, options, False)
    static_out, static = run(tiny, method, budget, options, True)
    assert static.decode_mode == STATIC_MODE and eager.decode_mode == "eager"
    assert torch.equal(static_out, eager_out)
    a, b = eager.stats.summary(), static.stats.summary()
    for key in ("decode_steps", "bytes_read_per_step", "full_bytes_per_step", "metadata_bytes_per_step",
                "h2d_bytes_per_step", "attended_tokens_per_step", "forced_tokens_per_step", "context_tokens_per_step"):
        assert b[key] == pytest.approx(a[key], rel=1e-12), key
    assert b["by_layer_type"].keys() == a["by_layer_type"].keys()
    for kind, numbers in a["by_layer_type"].items():
        assert b["by_layer_type"][kind] == pytest.approx(numbers, rel=1e-12), kind
    # the method's own numbers (hit rates, rows moved, ...), counted on the device by the static step
    # (float32 vs float64 sums; Quest's union ratio is only computed by eager steps, docs/methods/quest.md)
    expected = {k: v for k, v in eager.extra_metrics().items() if k != "quest_union_ratio"}
    assert static.extra_metrics() == pytest.approx(expected, rel=1e-6)
    if method in ("shadowkv", "lrqk"):  # offloading: misses really cross from the host store
        assert a["h2d_bytes_per_step"] > 0
    assert (b["coverage"] is None) if a["coverage"] is None else b["coverage"] == pytest.approx(a["coverage"], rel=1e-5)
    # the method's diagnostics (a page selector's: the per-step coverage certificate, and each certificate checked
    # against the measured coverage, certificate_sound) by name, eager = static
    names = set(MethodSpec(method, budget).selector_class().diagnostic_names)
    assert set(b["diagnostics"]) == names and set(a["diagnostics"]) == names
    if method == "locks":
        assert a["diagnostics"]["certificate_sound"] == 1.0 and b["diagnostics"]["certificate_sound"] == 1.0
    for name, value in a["diagnostics"].items():
        assert b["diagnostics"][name] == pytest.approx(value, rel=1e-5), name
    if method != "fullkv":  # the budget is really selecting here
        assert a["attended_tokens_per_step"] < a["context_tokens_per_step"] and a["coverage"] < 1


# configurations without a static path (every registered method has one in its default configuration)
WITHOUT_STATIC = [("oracle", {"budget_mode": "paper"}), ("locks", {"budget_mode": "paper"}),
                  ("quest", {"page_rule": "eval", "page_size": 24})]


def test_every_method_has_a_static_path_by_default():
    assert [name for name, options in DEFAULTS if _static_error(name, options) is not None] == []


@pytest.mark.parametrize("name,options", WITHOUT_STATIC)
def test_methods_without_a_static_path_say_why(tiny, name, options):
    """A configuration without a static path names its method and why, and generate(static_decode=True) refuses it
    with that reason as one line (auto falls back to eager decoding)."""
    reason = _static_error(name, options)
    assert name in reason and "\n" not in reason
    cache = SelectorCache(tiny, MethodSpec(name, 128, options))
    with pytest.raises(ConfigError, match="static"):
        generate(tiny, cache, prompt(), 2, static_decode=True)


# The interpreter runs LRQK's r x r sweeps op by op: rank 8 keeps its fused-step tests short (the default rank 32 is
# compiled by scripts/compile_kernels.py and run by the GPU session)
INTERPRETED_OPTIONS = {"lrqk": {"rank": 8}, "magicpig": {"tables": 8}}  # (MagicPIG: 8 tables interpret faster)


@pytest.mark.parametrize("method,variant", [pytest.param(m, None, id=m) for m in (
    "locks", "quest", "rocketkv", "shadowkv", "lrqk", "doublesparsity", "twilight", "magicpig")] + [
    pytest.param("twilight", {"base": "doublesparsity"}, id="twilight-base=doublesparsity")])
def test_static_decode_triton_matches_torch(tiny, method, variant):
    """The fused kernels in the static step (interpreter on CPU) select and attend as the reference does, and
    measure the same coverage and certificate (locks/kernels/coverage.py against the reference ops). Twilight over
    Quest prunes a page list; over DoubleSparsity, a token list per query head."""
    options = variant or INTERPRETED_OPTIONS.get(method, {})
    ref, ref_cache = run(tiny, method, 128, options, True, "torch", n=12)
    out, cache = run(tiny, method, 128, options, True, "triton", n=12)
    assert cache.backend == "triton" and torch.equal(out, ref)
    a, b = ref_cache.stats.summary(), cache.stats.summary()
    for key in ("attended_tokens_per_step", "forced_tokens_per_step", "bytes_read_per_step"):
        assert b[key] == pytest.approx(a[key], rel=1e-12), key  # Quest: its kernel counts each head's union
    # (MagicPIG's coverage is its estimate of the softmax denominator over the exact one, which may exceed 1)
    assert (a["coverage"] < 1 or method == "magicpig") and b["coverage"] == pytest.approx(a["coverage"], rel=1e-5)
    assert b["diagnostics"].keys() == a["diagnostics"].keys()
    for name, value in a["diagnostics"].items():
        assert b["diagnostics"][name] == pytest.approx(value, rel=1e-5, abs=1e-6), name


def test_static_decode_whole_generation_within_budget(tiny):
    """A budget above the final length attends everything, exactly as FullKV does."""
    full, _ = run(tiny, "fullkv", 128, {}, False)
    for method in ("locks", "quest"):
        out, cache = run(tiny, method, 512, {}, True)
        assert torch.equal(out, full) and cache.stats.summary()["coverage"] == pytest.approx(1.0)


class StepTrace(TorchDispatchMode):
    """Every aten op of a region with its arguments' shapes/dtypes and scalar values (not data or addresses)."""

    def __init__(self):
        super().__init__()
        self.ops = []

    @staticmethod
    def sig(x):
        if isinstance(x, torch.Tensor):
            return ("T", tuple(x.shape), str(x.dtype), x.device.type)
        if isinstance(x, (list, tuple)):
            return tuple(StepTrace.sig(y) for y in x)
        if isinstance(x, dict):
            return tuple(sorted((k, StepTrace.sig(v)) for k, v in x.items()))
        if isinstance(x, torch.UntypedStorage):  # the Triton interpreter copies tensors through their storage
            return ("storage", x.nbytes())
        return repr(x)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        self.ops.append((str(func), self.sig(args), self.sig(kwargs)))
        if func is torch.ops.aten.index.Tensor and any(
                isinstance(i, torch.Tensor) and i.dtype == torch.bool for i in args[1]):
            self.ops.append(("boolean-mask indexing (a host sync)", (), ()))
        return func(*args, **kwargs)


@pytest.fixture
def triton_launches(monkeypatch):
    """Grid and non-tensor arguments of every Triton launch (interpreted or compiled), recorded like StepTrace."""
    from triton.runtime.interpreter import InterpretedFunction
    from triton.runtime.jit import JITFunction

    launches = []
    kernel_class = JITFunction if DEV.type == "cuda" else InterpretedFunction
    run = kernel_class.run

    def recording_run(self, *args, grid, warmup, **kwargs):
        if not warmup:
            launches.append((self.fn.__name__, repr(grid), StepTrace.sig(args), StepTrace.sig(kwargs)))
        return run(self, *args, grid=grid, warmup=warmup, **kwargs)

    monkeypatch.setattr(kernel_class, "run", recording_run)
    return launches


def traced_steps(model, method, budget, options, backend, positions, launches=None, prompt_tokens=301):
    """Prefill, then static steps up to max(positions); the captured region (`StaticDecodeStep.forward`) of the
    steps at `positions` is traced -> {position: (aten ops, Triton launches, whether the step runs outside the
    graph)}."""
    ids = prompt(prompt_tokens)
    cache = SelectorCache(model, MethodSpec(method, budget, options, backend=backend), measure_coverage=True)
    with torch.inference_mode():
        cache.phase = "prefill"
        token = model(input_ids=ids, cache=cache, sparse_cache=cache).logits[:, -1].argmax(-1)
        step = StaticDecodeStep(model, cache, 1, ids.shape[1] + max(positions) + 1 - ids.shape[1] + 8)
        traces = {}
        for position in range(ids.shape[1], max(positions) + 1):
            step.input_ids.copy_(token.view(1, 1))
            step.position_ids.fill_(position)
            cache.set_static_position(position)
            if position in positions:
                if launches is not None:
                    launches.clear()
                with StepTrace() as trace:
                    logits = step.forward()
                traces[position] = (trace.ops, list(launches or []), cache.static_host_step)
            else:
                logits = step.forward()
            cache.finish_static_step()
            token = logits.argmax(-1)
    return traces


def check_replayable(traces, method: str = "", backend: str = "torch"):
    """The steps a graph replays (all but those that run outside it) launch the same ops, with no host sync and no
    factorization or solve (LRQK's r x r solves: baselines/lrqk/capturable_solve.py, or registers when fused)."""
    (p0, (ops0, launches0, _)), *rest = sorted((p, t) for p, t in traces.items() if not t[2])
    assert rest, "fewer than two graph steps traced"
    assert not [op for op in ops0 if op[0].startswith(SYNC_OPS) or op[0].startswith("boolean")], "host sync in step"
    assert not [op for op in ops0 if op[0].startswith(LINALG_OPS)], f"{method} ({backend}): a solve in the step"
    for p, (ops, launches, _) in rest:
        assert len(ops) == len(ops0), (p0, p)
        for i, (a, b) in enumerate(zip(ops0, ops)):
            assert a == b, f"op {i} differs between the steps at {p0} and {p}: {a} vs {b}"
        assert launches == launches0


# 301-token prompt: 18 complete pages + 13 tokens. Traced steps: tail 13 (first step), page completed at 320
# (tail 0: one more top-k page fits; LOCKS summarizes that page inside the step, which so runs outside the graph),
# a later tail, and the first step after the 20th page was summarized.
POSITIONS = (301, 319, 325, 336)


@pytest.mark.parametrize("method,budget,options", CASES)
def test_only_a_step_that_completes_a_summarized_page_runs_outside_the_graph(tiny, method, budget, options):
    """LOCKS summarizes a page when its last token arrives, before that step scores (A2, as eager decoding): that
    step, one in page_size, runs outside the graph; every other step, and every step of the other methods, is a
    replay (Twilight over LOCKS: LOCKS's)."""
    traces = traced_steps(tiny, method, budget, options, "torch", tuple(range(301, 340)))
    host = sorted(p for p, (_, _, outside) in traces.items() if outside)
    summarizes = method == "locks" or options.get("base") == "locks"
    assert host == ([p for p in range(301, 340) if (p + 1) % 16 == 0] if summarizes else [])


@pytest.mark.parametrize("method,budget,options", CASES)
def test_static_step_is_replayable_torch(tiny, method, budget, options):
    check_replayable(traced_steps(tiny, method, budget, options, "torch", POSITIONS), method)


@pytest.mark.parametrize("method", ["fullkv", "locks", "quest", "rocketkv", "lrqk", "doublesparsity", "twilight",
                                    "magicpig"])
def test_static_step_is_replayable_triton(tiny, method, triton_launches):
    """Steps at a page boundary and past it (LRQK, whose step has no pages and whose ring turns every 64 tokens:
    three consecutive steps). A 317-token prompt (19 pages + 13 tokens: the tail of POSITIONS' first step) keeps
    the interpreted steps before the boundary few."""
    positions = (301, 302, 303) if method == "lrqk" else (317, 319, 320, 321)
    traces = traced_steps(tiny, method, 128, INTERPRETED_OPTIONS.get(method, {}), "triton", positions,
                          triton_launches, prompt_tokens=positions[0])
    assert all(launches for _, launches, _ in traces.values())  # the fused kernels ran inside the step
    check_replayable(traces, method, "triton")


def test_static_decode_choice_and_errors(tiny):
    cache = SelectorCache(tiny, MethodSpec("locks", 128))
    assert use_static_decode("auto", cache, "cpu") is False  # auto: only on CUDA
    assert use_static_decode("auto", cache, "cuda") is True
    assert use_static_decode(True, cache, "cpu") is True
    with pytest.raises(ConfigError, match="static_decode"):
        use_static_decode("yes", cache, "cpu")
    oracle = SelectorCache(tiny, MethodSpec("oracle", 128, {"budget_mode": "paper"}))
    assert use_static_decode("auto", oracle, "cuda") is False  # falls back to eager
    for method, budget, options, match in [("oracle", 128, {"budget_mode": "paper"}, "oracle"), ("locks", 16, {}, "page_size = 32 .got 16"),
                                           ("locks", 128, {"budget_mode": "paper"}, "budget_mode=fair"),
                                           ("quest", 128, {"page_rule": "eval", "page_size": 24}, "multiple of"),
                                           ("lrqk", 512, {}, "this sample: lrqk: .* max.top_k, rank. = 448")]:
        with pytest.raises(ConfigError, match=match):
            run(tiny, method, budget, options, True, n=3)


def test_a_sample_that_cannot_decode_statically_falls_back_under_auto(tiny):
    """LRQK fits its factors at prefill only on a prompt of >= top_k tokens: for a shorter one static_decode=auto
    decodes eagerly (what a CUDA run does), true refuses it in one line, and the eager tokens are LRQK's own."""
    cache = SelectorCache(tiny, MethodSpec("lrqk", 512))
    with torch.inference_mode():
        cache.phase = "prefill"
        tiny(input_ids=prompt(), cache=cache, sparse_cache=cache)
    assert "448" in cache.selector(0).static_sample_error()
    assert static_after_prefill("auto", True, [cache]) is False
    assert static_after_prefill(False, False, [cache]) is False
    with pytest.raises(ConfigError, match="not available for this sample"):
        static_after_prefill(True, True, [cache])
    long_enough = SelectorCache(tiny, MethodSpec("lrqk", 128))
    with torch.inference_mode():
        long_enough.phase = "prefill"
        tiny(input_ids=prompt(), cache=long_enough, sparse_cache=long_enough)
    assert static_after_prefill("auto", True, [long_enough, long_enough]) is True
    assert static_after_prefill("auto", True, [long_enough, cache]) is False  # a batch decodes one way


def test_pages_completed_during_static_decode_are_summarized_like_eager(tiny):
    """The summaries of the pages completed while decoding (built after each step, all layers in one batched call)
    equal a per-layer build of the same keys, and unbuilt pages are still zero."""
    from dataclasses import fields

    from locks.method.summaries import build_summaries

    _, cache = run(tiny, "locks", 128, {}, True)  # 301 + 39 tokens: pages 18 .. 20 completed while decoding
    L = cache.get_seq_length()
    for layer in cache.layers:
        s = layer.selector
        assert s.pages_built == L // 16 == 21
        ref = build_summaries(layer._k[:, :, 18 * 16 : 21 * 16], 16, s.rank, s.quant, head_mean=s.summaries.head_mean)
        for f in fields(ref):
            if f.name != "head_mean":
                assert torch.equal(getattr(s.summaries, f.name)[:, :, 18:21], getattr(ref, f.name)), f.name
                assert not getattr(s.summaries, f.name)[:, :, 21:].any(), f.name


def _static_cache_at(model, method, budget, options, ids, position):
    """A prefilled cache and its static step, advanced by plain static steps to `position` (the next token's slot)."""
    cache = SelectorCache(model, MethodSpec(method, budget, options), measure_coverage=True)
    cache.phase = "prefill"
    token = model(input_ids=ids, cache=cache, sparse_cache=cache).logits[:, -1].argmax(-1)
    step = StaticDecodeStep(model, cache, 1, ids.shape[1] + 16, cuda_graph=False)
    for p in range(ids.shape[1], position):
        token = step(token, p).argmax(-1)
    return cache, step, token


@pytest.mark.parametrize("method,budget,options", CASES)
def test_static_step_compiles_as_one_graph(tiny, method, budget, options):
    """The CPU proxy of CUDA-graph capture: torch.compile(fullgraph=True) traces the whole static step (every layer's
    select_static, attention and accounting) as one graph -- a host read (.item(), bool(tensor)) or a
    data-dependent shape would break it -- at two positions, with the uncompiled step's logits. (That one capture
    replays at every position is test_static_step_is_replayable_*: transformers' own mask code reads the host
    length, so dynamo retraces per position, while the step ignores that mask.)"""
    if DEV.type == "cuda":
        pytest.skip("the CUDA tests capture real graphs")
    ids = prompt()
    start = ids.shape[1] + 4  # steps at 306 and 307 cached tokens: graph steps (a LOCKS step at 304 runs outside)
    with torch.inference_mode():
        compiled_cache, compiled_step, token = _static_cache_at(tiny, method, budget, options, ids, start)
        plain_cache, plain_step, plain_token = _static_cache_at(tiny, method, budget, options, ids, start)
        assert torch.equal(token, plain_token)
        torch._dynamo.reset()
        forward = torch.compile(compiled_step.forward, fullgraph=True, backend="eager")
        for position in (start, start + 1):
            for step, cache in ((compiled_step, compiled_cache), (plain_step, plain_cache)):
                step.input_ids.copy_(token.view(1, 1))
                step.position_ids.fill_(position)
                cache.set_static_position(position)
                assert not cache.static_host_step
            compiled = forward()
            plain = plain_step.forward()
            compiled_cache.finish_static_step()
            plain_cache.finish_static_step()
            assert torch.equal(compiled, plain), position
            token = plain.argmax(-1)
    torch._dynamo.reset()


@pytest.mark.parametrize("method,budget,options", CASES)
def test_warm_up_runs_of_a_step_change_nothing(tiny, method, budget, options, monkeypatch):
    """A CUDA-graph capture runs the step twice before capturing it, at the same position, inside
    static_counters_kept (as the benchmarks' timing repetitions do): a step that updates state from its own previous
    value (LRQK's factors, ShadowKV's buffer, counters) must come out as if it ran once. Here every step is repeated
    that way; the generation and its accounting are the plain static decode's."""
    plain_out, plain = run(tiny, method, budget, options, True)
    forward = StaticDecodeStep.forward

    def with_warm_ups(self):
        with self.cache.static_counters_kept():
            forward(self)
            forward(self)
        return forward(self)

    monkeypatch.setattr(StaticDecodeStep, "forward", with_warm_ups)
    out, cache = run(tiny, method, budget, options, True)
    assert torch.equal(out, plain_out)
    assert cache.stats.summary() == plain.stats.summary()
    assert cache.extra_metrics() == pytest.approx(plain.extra_metrics(), rel=1e-12)


def test_the_graph_replays_every_step_but_those_that_run_outside_it(tiny):
    """What StaticDecodeStep does on CUDA, with a stand-in for the captured graph: LOCKS's steps that complete a page
    (one in 16) call the step, every other step replays the graph (captured once, at a step that needs no host
    work); capturing a step that needs host work is refused."""
    import types

    ids = prompt()
    cache = SelectorCache(tiny, MethodSpec("locks", 128))
    ran = []
    with torch.inference_mode():
        cache.phase = "prefill"
        token = tiny(input_ids=ids, cache=cache, sparse_cache=cache).logits[:, -1].argmax(-1)
        step = StaticDecodeStep(tiny, cache, 1, ids.shape[1] + 40)
        step.cuda_graph = True
        forward = step.forward

        def called():
            ran.append(("call", cache.layers[0].length + 1))
            return forward()

        def capture():
            assert not cache.static_host_step
            step.logits = forward()
            step.graph = types.SimpleNamespace(replay=lambda: ran.append(("replay", cache.layers[0].length + 1)))

        step.forward, step._capture = called, capture
        for position in range(ids.shape[1], ids.shape[1] + 35):
            token = step(token, position).argmax(-1)
        assert ran == [("call" if length % 16 == 0 else "replay", length) for length in range(302, 337)]
        cache.set_static_position(ids.shape[1] + 35)  # 336 + 1 = 337: a graph step
        assert not cache.static_host_step
        cache.layers[0].selector.pages_built -= 1  # as if a page were still to summarize
        cache.set_static_position(ids.shape[1] + 35)
        assert cache.static_host_step
        with pytest.raises(RuntimeError, match="cannot be captured"):
            StaticDecodeStep._capture(step)


def test_the_capture_is_timed_apart_from_the_decode(tiny, monkeypatch):
    """A CUDA graph's warm-ups and capture (here a stand-in that takes 1000 s of a clock that only it advances) are
    `capture_seconds`, not part of `decode_seconds`: a batch-1 decode and a batch of rows (each row's share) alike."""
    import time
    import types

    from locks.core.generation import Row, generate_rows

    clock = [0.0]
    monkeypatch.setattr(time, "perf_counter", lambda: clock[0])

    def slow_capture(step):
        clock[0] += 1000.0
        step.logits = step.forward()
        step.graph = types.SimpleNamespace(replay=lambda: None)  # replays return the captured logits: fine here

    original = StaticDecodeStep.__init__

    def on_cuda(step, *args, **kwargs):
        original(step, *args, **kwargs)
        step.cuda_graph = True

    monkeypatch.setattr(StaticDecodeStep, "__init__", on_cuda)
    monkeypatch.setattr(StaticDecodeStep, "_capture", slow_capture)
    cache = SelectorCache(tiny, MethodSpec("fullkv", 128))
    generate(tiny, cache, prompt(), 4, static_decode=True)
    assert (cache.capture_seconds, cache.decode_seconds) == (1000.0, 0.0)
    rows = [Row(SelectorCache(tiny, MethodSpec("fullkv", 128)), prompt(n, seed=n), 4) for n in (301, 320)]
    generate_rows(tiny, rows, static_decode=True)
    for row in rows:
        assert (row.cache.capture_seconds, row.cache.decode_seconds) == (1000.0, 0.0)


def test_instrumentation_is_timed_apart_from_an_eager_decode(tiny, monkeypatch):
    """An eager step's coverage pass (here a stand-in that takes 100 s of a clock that only it advances) is
    `instrumentation_seconds`, not part of `decode_seconds`, at batch 1 and for a batch of rows; on the CPU the
    eager timing is then clean, and a static step, which runs its coverage inside, says it is instrumented."""
    import time

    import locks.core.attention as attention
    from locks.core.generation import Row, generate_rows

    clock = [0.0]
    monkeypatch.setattr(time, "perf_counter", lambda: clock[0])
    real = attention.dense_lse

    def slow_dense_lse(*args, **kwargs):
        clock[0] += 100.0
        return real(*args, **kwargs)

    monkeypatch.setattr(attention, "dense_lse", slow_dense_lse)
    cache = SelectorCache(tiny, MethodSpec("locks", 64), measure_coverage=True)
    generate(tiny, cache, prompt(), 4)
    passes = 3 * TINY["num_hidden_layers"]  # 3 decode steps, every layer measures its coverage
    assert (cache.decode_seconds, cache.instrumentation_seconds) == (0.0, 100.0 * passes)
    assert cache.decode_instrumented is False
    rows = [Row(SelectorCache(tiny, MethodSpec("locks", 64), measure_coverage=True), prompt(n, seed=n), 4)
            for n in (301, 320)]
    generate_rows(tiny, rows)
    for row in rows:
        assert (row.cache.decode_seconds, row.cache.instrumentation_seconds) == (0.0, 100.0 * passes)
    static = SelectorCache(tiny, MethodSpec("locks", 64), measure_coverage=True)
    generate(tiny, static, prompt(), 4, static_decode=True)
    assert static.decode_instrumented is True and static.instrumentation_seconds == 0.0


@pytest.mark.parametrize("backend", ["torch", "triton"])
def test_quest_per_head_on_mha_counts_its_attended_tokens(backend):
    """gqa=per_head on a layer without GQA (one query head per KV head, so one page set per KV head): the static
    step counts the attended tokens its cost says it counts, as the eager step does (they were counted nowhere)."""
    torch.manual_seed(0)
    config = {**TINY, "num_attention_heads": 2, "num_key_value_heads": 2}
    mha = LlamaForCausalLM(LlamaConfig(**config, attn_implementation=register_attention())).eval().to(DEV)
    spec = MethodSpec("quest", 64, {"gqa": "per_head", "dense_layers": 1}, backend=backend)
    eager, static = SelectorCache(mha, spec), SelectorCache(mha, spec)
    out_e = generate(mha, eager, prompt(), 6, static_decode=False)
    out_s = generate(mha, static, prompt(), 6, static_decode=True)
    assert torch.equal(out_e, out_s)
    a, b = eager.stats.summary(), static.stats.summary()
    assert a["attended_tokens_per_step"] < 301  # the selecting layer attends its pages, not the whole prompt
    assert b["attended_tokens_per_step"] == pytest.approx(a["attended_tokens_per_step"], rel=1e-12)
