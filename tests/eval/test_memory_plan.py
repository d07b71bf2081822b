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
    torch.manual_seed(0)
    config = config_for(name, rows)
    model = LlamaForCausalLM(LlamaConfig(**TINY, attn_implementation=register_attention())).eval()
    plan = plan_memory(config, model.config, [method_spec(config["method"])], device=torch.device("cpu"))
    planned = sum(t.bytes for t in plan.terms if t.name in ("K/V", "method state", "offloaded K/V"))
    spec = MethodSpec(name, config["budget"], {k: v for k, v in config["method"].items()
                                                if k not in ("name", "budget", "backend")})
    new = 8
    rows_ = [Row(SelectorCache(model, spec), torch.randint(0, TINY["vocab_size"], (1, S - new),
                                                            generator=torch.Generator().manual_seed(r)), new)
             for r in range(rows)]
    generate_rows(model, rows_)
    held = tensor_bytes([row.cache for row in rows_]) - tensor_bytes(model.model.rotary_emb)
    assert held == pytest.approx(planned, rel=0.15), (name, rows, held / planned)


def test_a_group_with_lrqk_keeps_every_prompt_query():
    one = plan_memory(config_for("locks"), LlamaConfig(**TINY), [MethodSpec("locks", 128)], device=torch.device("cpu"))
    assert not [t for t in one.terms if t.name.startswith("group")]
    specs = [MethodSpec("locks", 128), MethodSpec("lrqk", 192)]
    group = plan_memory(config_for("locks"), LlamaConfig(**TINY), specs, group=2, device=torch.device("cpu"))
    queries = next(t for t in group.terms if t.name == "group capture queries")
    assert queries.bytes == TINY["num_hidden_layers"] * TINY["num_attention_heads"] * S * 64 * 4


def test_a_plan_that_does_not_fit_names_its_largest_term_and_knob():
    plan = MemoryPlan([Term("weights", "host", 2 * GiB, "a smaller model"),
                       Term("prefill activations", "host", 5 * GiB, "prefill_chunk_size")], S, 1, "cpu")
    with pytest.raises(ConfigError, match=r"needs 7.0 GiB of host memory and 4.0 GiB are free; the largest term is "
                                          r"prefill activations \(5.0 GiB\): reduce prefill_chunk_size"):
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
