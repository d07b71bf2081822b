"""The memory plan (eval/memory_plan.py, docs/memory.md): computed from the model's config alone, it counts the
weights exactly, the K/V, method state and host store of every method within 15 % of the tensors a real prefill
and decode leave (batch 1 and 3), adds a grouped sweep's capture, and a run that does not fit stops with one line
naming the largest term and its knob, before the model loads; `+plan=true` prints the table and runs nothing."""
import pytest
import torch
from omegaconf import OmegaConf
from transformers import LlamaConfig, LlamaForCausalLM

from eval.memory_plan import GiB, MemoryPlan, Term, check_plan, parameter_count, plan_memory
from locks.core.attention import register_attention
from locks.core.cache import SelectorCache
from locks.core.generation import Row, generate_rows
from locks.core.prefill import tensor_bytes
from locks.core.registry import MethodSpec, discover
from locks.errors import ConfigError
from eval.runner import method_spec
from run import compose_config, run
from tests.helpers import TINY_LLAMA, default_method_options, hybrid_model

TINY = {**TINY_LLAMA, "hidden_size": 192, "num_attention_heads": 6, "num_key_value_heads": 2, "head_dim": 64,
        "num_hidden_layers": 3}
S = 400  # prompt + generation


def config_for(name: str, rows: int = 1, **extra) -> dict:
    overrides = [f"method={name}", f"batch_size={rows}", f"benchmark.context_length={S}", "logger=none",
                 "model=tiny_random_llama", *[f"{k}={v}" for k, v in extra.items()]]
    if name == "lrqk":
        overrides.append("budget=192")
    if name == "quest":
        overrides.append("method.dense_layers=1")
    return OmegaConf.to_container(compose_config(overrides), resolve=True)


def test_weights_are_counted_exactly_from_the_config():
    for model in (LlamaForCausalLM(LlamaConfig(**TINY)), hybrid_model("gemma3"), hybrid_model("qwen2")):
        assert parameter_count(model.config) == sum(p.numel() for p in model.parameters())


@pytest.mark.parametrize("rows", [1, 3])
@pytest.mark.parametrize("name", sorted(discover()))
def test_the_plan_holds_what_a_sample_holds(name, rows):
    """K/V + method state + host store of the plan against every tensor the rows' caches hold after their prefill
    and decode (S tokens each), within 15 %."""
    held, planned = held_and_planned(name, rows, static=False)
    assert held == pytest.approx(planned, rel=0.15), (name, rows, held / planned)


@pytest.mark.parametrize("name", [n for n in sorted(discover()) if not n.startswith("oracle")])  # (no static path)
def test_the_plan_holds_what_a_static_decode_holds(name):
    """static_decode=true: the plan adds each selector's static_bytes (start_static's buffers, e.g. ShadowKV's two
    slots of fetched values); against every tensor the cache holds when its last static step ends, within 15 %."""
    held, planned = held_and_planned(name, 1, static=True)
    assert held == pytest.approx(planned, rel=0.15), (name, held / planned)


def held_and_planned(name: str, rows: int, static: bool) -> tuple[int, float]:
    """(bytes of every tensor the rows' caches hold after decoding -- with `static`, as the last static step ends --,
    the plan's K/V + method state + host store)."""
    torch.manual_seed(0)
    config = config_for(name, rows, static_decode=static)
    model = LlamaForCausalLM(LlamaConfig(**TINY, attn_implementation=register_attention())).eval()
    plan = plan_memory(config, model.config, [method_spec(config["method"])], device=torch.device("cpu"))
    planned = sum(t.bytes for t in plan.terms if t.name in ("K/V", "method state", "offloaded K/V"))
    spec = MethodSpec(name, config["budget"], {k: v for k, v in config["method"].items()
                                                if k not in ("name", "budget", "backend")})
    new = 8
    rows_ = [Row(SelectorCache(model, spec), torch.randint(0, TINY["vocab_size"], (1, S - new),
                                                            generator=torch.Generator().manual_seed(r)), new)
             for r in range(rows)]
    at_finish = []
    finish = SelectorCache.finish_static

    def measured_finish(cache):
        at_finish.append(tensor_bytes([row.cache for row in rows_]))
        finish(cache)

    with pytest.MonkeyPatch.context() as m:
        m.setattr(SelectorCache, "finish_static", measured_finish)
        generate_rows(model, rows_, static_decode=static)
    assert bool(at_finish) == static, name
    held = max(at_finish) if static else tensor_bytes([row.cache for row in rows_])
    return held - tensor_bytes(model.model.rotary_emb), planned


def test_a_group_with_lrqk_keeps_every_prompt_query():
    one = plan_memory(config_for("locks"), LlamaConfig(**TINY), [MethodSpec("locks", 128)], device=torch.device("cpu"))
    assert not [t for t in one.terms if t.name.startswith("group")]
    specs = [MethodSpec("locks", 128), MethodSpec("lrqk", 192)]
    group = plan_memory(config_for("locks"), LlamaConfig(**TINY), specs, group=2, device=torch.device("cpu"))
    queries = next(t for t in group.terms if t.name == "group capture queries")
    assert queries.bytes == TINY["num_hidden_layers"] * TINY["num_attention_heads"] * S * 64 * 4


def test_a_chunked_prefill_plans_the_prompt_queries_it_keeps():
    """A single run prefilling in chunks keeps every layer's prompt queries until the layer's last chunk (all of
    them for LRQK; LOCKS reads none): the plan's term against the most the cache holds at once (what it keeps, and
    the joined copy the last chunk of a layer makes), within 15 %."""
    from locks.core.chunked_prefill import prefill_prompt

    chunk, new = 64, 8
    model = LlamaForCausalLM(LlamaConfig(**TINY, attn_implementation=register_attention())).eval()
    for name in ("lrqk", "locks"):
        config = config_for(name, prefill_chunk_size=chunk)
        plan = plan_memory(config, model.config, [method_spec(config["method"])], device=torch.device("cpu"))
        planned = sum(t.bytes for t in plan.terms if t.name == "prompt queries across chunks")
        cache = SelectorCache(model, MethodSpec(name, config["budget"]))
        cache.max_new_tokens = new
        peak = [0]
        keep = SelectorCache.prompt_queries

        def measured(self, layer_idx, queries):  # what is kept, and the joined copy made while it is alive
            kept = sum(layer.prompt_queries.nbytes for layer in self.layers if layer.prompt_queries is not None)
            out = keep(self, layer_idx, queries)
            peak[0] = max(peak[0], kept + (out.nbytes if self.prefill_last else queries.nbytes))
            return out

        with pytest.MonkeyPatch.context() as m:
            m.setattr(SelectorCache, "prompt_queries", measured)
            with torch.inference_mode():
                prefill_prompt(model, cache, torch.randint(0, TINY["vocab_size"], (1, S - new)), chunk)
        if name == "locks":
            assert planned == 0 and peak[0] <= TINY["num_hidden_layers"] * 6 * 64 * 64 * 4 * 2
        else:
            assert planned > 0 and peak[0] == pytest.approx(planned, rel=0.15), peak[0] / planned


@pytest.mark.parametrize("name", ["lrqk", "shadowkv"])
def test_a_selectors_prefill_peak_is_planned(name):
    """The prefill of a selector that factorizes (LRQK's fp32 ALS over every prompt query, ShadowKV's SVD of the
    pre-RoPE keys) holds more for a while than it keeps: what it keeps plus its Selector.prefill_bytes against the
    peak resident growth of that prefill, alone in a process (tests/eval/prefill_peak.py: Llama-3.1-8B's attention
    shape, 64K tokens), within 15 %."""
    import json
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    done = subprocess.run([sys.executable, "-m", "tests.eval.prefill_peak", name, "65536"], cwd=root,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    measured = json.loads(done.stdout.strip().splitlines()[-1])
    assert measured["peak"] == pytest.approx(measured["planned"], rel=0.15), measured["peak"] / measured["planned"]


def test_a_plan_that_does_not_fit_names_its_largest_term_and_knob():
    plan = MemoryPlan([Term("weights", "host", 2 * GiB, "a smaller model"),
                       Term("prefill activations", "host", 5 * GiB, "prefill_chunk_size")], S, 1, "cpu")
    with pytest.raises(ConfigError, match=r"needs 7.0 GiB of host memory and 4.0 GiB are free; the largest term is "
                                          r"prefill activations \(5.0 GiB\); it shrinks with prefill_chunk_size"):
        check_plan(plan, available=lambda where, device: 4 * GiB)
    check_plan(plan, available=lambda where, device: 8 * GiB)


def test_chunked_prefill_shrinks_the_prefill_term():
    """GLM-4-9B at 1M on a GPU: 121 GiB of one-forward activations, 25 GiB in chunks of 8K (their mask and the
    K/V repeated for GQA included)."""
    from transformers import AutoConfig

    from bench.shapes import MODELS

    glm = AutoConfig.for_model(MODELS["glm"][0], **MODELS["glm"][1])
    term = lambda **kw: next(t.bytes for t in plan_memory(  # noqa: E731
        {**config_for("locks", **kw), "benchmark": {"name": "ruler", "context_length": 1 << 20}}, glm,
        [MethodSpec("locks", 2048)], device=torch.device("cuda")).terms if t.name == "prefill activations") / GiB
    assert term() == pytest.approx(121.25, abs=0.01)
    assert term(prefill_chunk_size=8192) == pytest.approx(24.95, abs=0.01)


def test_auto_chunk_is_the_largest_whose_plan_fits():
    """prefill_chunk_size=auto (GLM-4-9B at 128K on a GPU): the whole prompt when its plan fits, else the largest
    power of two below the sequence whose plan fits (the largest chunk is not always the largest plan), 256 tokens
    when none does (check_plan then stops the run)."""
    from transformers import AutoConfig

    from bench.shapes import MODELS

    glm = AutoConfig.for_model(MODELS["glm"][0], **MODELS["glm"][1])
    config = {**config_for("locks", prefill_chunk_size="auto"), "benchmark": {"name": "ruler", "context_length": 1 << 17}}
    spec, cuda = [MethodSpec("locks", 2048)], torch.device("cuda")

    def planned(chunk):
        return plan_memory({**config, "prefill_chunk_size": chunk}, glm, spec, device=cuda)

    def auto(free):
        return plan_memory(config, glm, spec, device=cuda, available=lambda where, device: free)

    whole = planned(None).total("device")
    assert planned(None).chunk is None and auto(whole).chunk is None
    # a chunk below the prompt adds the chunk's mask and GQA's repeated K/V: 64K plans more than one forward
    assert planned(1 << 16).total("device") > whole > planned(1 << 15).total("device")
    between = (planned(8192).total("device") + planned(4096).total("device")) / 2
    for free in (whole - 1, between):
        largest = max(c for c in (1 << k for k in range(8, 17)) if planned(c).total("device") <= free)
        assert auto(free).chunk == largest
    assert largest == 4096 and "prefill in chunks of 4096 tokens" in auto(between).table()
    smallest = auto(1.0)
    assert smallest.chunk == 256
    with pytest.raises(ConfigError, match="memory plan: the run needs 25.1 GiB of device memory"):
        check_plan(smallest, available=lambda where, device: 1.0)


def test_plan_true_prints_the_table_and_loads_no_model(tmp_path, monkeypatch, capsys):
    def no_model(*args, **kwargs):
        raise AssertionError("the model was loaded")

    monkeypatch.setattr("locks.core.models.load_model", no_model)
    monkeypatch.setattr("eval.runner.load_checked", no_model)
    rc = run(compose_config(["model=tiny_random_llama", "logger=none", "+plan=true", "method=lrqk",
                             f"paths.runs_dir={tmp_path}"]))
    out = capsys.readouterr().out
    assert rc == 0 and "| weights | host |" in out and "| offloaded K/V | host |" in out
    assert not list(tmp_path.glob("*/predictions.jsonl"))


def test_slurm_mem_gb_comes_from_the_plan():
    """grouped_slurm without mem_gb: --mem is the largest group's host terms, plus the weights on a GPU job (read
    through host memory on their way), plus 8 GiB, in whole GiB; each group planned for the node's device."""
    from hydra_plugins.locks_grouped_launcher.grouped_launcher import planned_mem_gb

    from eval.memory_plan import slurm_mem_gb

    gpu = MemoryPlan([Term("weights", "device", 10 * GiB, ""), Term("K/V", "device", 30 * GiB, ""),
                      Term("offloaded K/V (pinned)", "host", 5.5 * GiB, "")], S, 1, "cuda")
    cpu = MemoryPlan([Term("weights", "host", 3 * GiB, ""), Term("K/V", "host", 1 * GiB, "")], S, 1, "cpu")
    assert slurm_mem_gb(gpu) == 16 + 8 and slurm_mem_gb(cpu) == 4 + 8
    jobs = []
    for name in ("fullkv", "lrqk"):
        config = config_for(name, prefill_chunk_size="auto")
        jobs.append((config, OmegaConf.create(config), {}))
    for gpus, device in ((1, "cuda"), (None, "cpu")):
        plans = [plan_memory({**c, "prefill_chunk_size": None}, LlamaConfig(**c["model"]["config"]),
                             [method_spec(c["method"])], 1, torch.device(device)) for c, _, _ in jobs]
        assert planned_mem_gb(jobs, [[0], [1]], gpus) == max(slurm_mem_gb(p) for p in plans)
