"""Sweep options: cells a method rejects are skipped with their reason (hydra.launcher.skip_invalid), and
decode_cap shortens generation without touching the prompt, on every benchmark."""
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from locks.errors import ConfigError

ROOT = Path(__file__).resolve().parents[2]


def job(tmp_path, *overrides):
    from hydra_plugins.locks_grouped_launcher.grouped_launcher import _job_config

    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        cfg = compose("config", overrides=["model=tiny_random_llama", "logger=none", f"paths.runs_dir={tmp_path}",
                                           *overrides], return_hydra_config=True)
    return _job_config(cfg)


def test_skip_invalid_skips_the_cells_a_method_rejects_and_keeps_the_rest(tmp_path):
    from hydra_plugins.locks_grouped_launcher.grouped_launcher import check_jobs

    # LRQK attends lite_tokens = 64 recent tokens inside the budget: budget 64 leaves no top-k (docs/budgets.md)
    jobs = [job(tmp_path, "method=lrqk", "budget=64"), job(tmp_path, "method=lrqk", "budget=128"),
            job(tmp_path, "method=locks", "budget=64")]
    valid, results = check_jobs(jobs, skip_invalid=True)
    assert valid == [1, 2]
    assert results[1] is None and results[2] is None
    assert results[0]["method"]["name"] == "lrqk" and "lite_tokens" in results[0]["skipped"]
    with pytest.raises(ConfigError, match="lite_tokens"):
        check_jobs(jobs, skip_invalid=False)


def test_a_method_whose_first_layer_is_dense_still_has_its_cells_checked(tmp_path):
    from hydra_plugins.locks_grouped_launcher.grouped_launcher import check_jobs

    # MagicPIG keeps layer 0 dense, and always attends sink 4 + local 64 tokens: budget 64 is rejected, not run
    jobs = [job(tmp_path, "method=magicpig", "budget=64"), job(tmp_path, "method=magicpig", "budget=128")]
    valid, results = check_jobs(jobs, skip_invalid=True)
    assert valid == [1] and "68 tokens" in results[0]["skipped"]
    with pytest.raises(ConfigError, match="68 tokens"):
        check_jobs(jobs, skip_invalid=False)


def test_decode_cap_caps_generation_and_leaves_the_prompt(tmp_path):
    from eval.benchmarks import Ruler

    base = dict(name="ruler", tasks=["niah_single_1"], context_length=1024, num_samples=2, chat_template=True,
                data_dir=None, essay_path=None, cache_dir=str(tmp_path))
    from locks.core.models import _embedded_tokenizer

    tokenizer = _embedded_tokenizer()
    plain = Ruler(OmegaConf.create({**base, "decode_cap": None})).samples(tokenizer, seed=42)
    capped_bench = Ruler(OmegaConf.create({**base, "decode_cap": 5}))
    capped = capped_bench.samples(tokenizer, seed=42)
    assert [s["input"] for s in capped] == [s["input"] for s in plain]
    assert all(s["max_new_tokens"] == 5 for s in capped) and all(s["max_new_tokens"] == 128 for s in plain)
    assert capped_bench.run_record(tokenizer)["decode_cap"] == 5
    for bad in (0, -3, 2.5):
        with pytest.raises(ConfigError, match="decode_cap"):
            Ruler(OmegaConf.create({**base, "decode_cap": bad}))


def test_collect_runs_copies_finished_runs_by_method_and_budget(tmp_path, capsys):
    import json

    from tests.helpers import load_script

    collect_runs = load_script("collect_runs")

    def run(name, method, budget, n_pred, n_expected=2):
        d = tmp_path / "runs" / name
        d.mkdir(parents=True)
        (d / "predictions.jsonl").write_text("".join(json.dumps({"id": f"t/{i}", "task": "t"}) + "\n"
                                                     for i in range(n_pred)))
        m = {"method": {"name": method, "budget": budget}, "num_samples": {"t": n_expected}}
        (d / "metrics.json").write_text(json.dumps(m))

    run("a", "locks", 128, 2)
    run("b", "fullkv", None, 2)
    run("c", "quest", 64, 1)  # killed mid-run: metrics.json of an earlier, shorter run is not enough
    assert collect_runs.main([str(tmp_path / "runs"), str(tmp_path / "out")]) == 1
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["fullkv.json", "locks_b128.json"]
    assert "not finished, not copied: c" in capsys.readouterr().err
    # --distinct: runs of one method and budget apart by context length and by the options set away from defaults
    for name, ctx, options in (("d", 8192, {}), ("e", 2048, {}), ("f", 8192, {"v_bits": 2, "rank": 8}),
                               ("g", 8192, {"page_size": 8, "rank": 7})):
        run(name, "locks", 128, 2)
        m = json.loads((tmp_path / "runs" / name / "metrics.json").read_text())
        m["method"].update({"page_size": 16, "rank": 8, "v_bits": 4, **options})
        m["benchmark"] = {"context_lengths": [ctx]}
        (tmp_path / "runs" / name / "metrics.json").write_text(json.dumps(m))
    (tmp_path / "runs" / "a").rename(tmp_path / "a")  # no context recorded: kept apart as "ctx"
    (tmp_path / "runs" / "c").rename(tmp_path / "c")
    assert collect_runs.main(["--distinct", str(tmp_path / "runs"), str(tmp_path / "dist")]) == 0
    assert sorted(p.name for p in (tmp_path / "dist").iterdir()) == [
        "fullkv_ctx.json", "locks_b128_2048.json", "locks_b128_8192.json", "locks_b128_8192_page_size-8_rank-7.json",
        "locks_b128_8192_v_bits-2.json"]


@pytest.mark.parametrize("name,data,tasks", [
    ("longbench", "longbench", ["trec", "samsum"]),
    ("longbench_e", "longbench", ["passage_retrieval_en"]),
    ("infinitebench", "infinitebench", ["passkey", "code_debug"]),
])
def test_decode_cap_applies_to_every_benchmark(name, data, tasks, tok):
    """The same rule on LongBench and InfiniteBench: max_new_tokens = min(the task's own, the cap), the prompt and
    every other field unchanged, the cap in the run record, bad caps refused in one line."""
    from eval.benchmarks import build_benchmark

    conf = OmegaConf.load(ROOT / "conf" / "benchmark" / f"{name}.yaml")
    assert conf.decode_cap is None  # the official budgets by default
    base = {**OmegaConf.to_container(conf), "tasks": tasks, "num_samples": 1, "max_length": 512,
            "data_dir": str(ROOT / "tests" / "fixtures" / data)}
    plain = build_benchmark(OmegaConf.create(base)).samples(tok, seed=42)
    capped_bench = build_benchmark(OmegaConf.create({**base, "decode_cap": 3}))
    capped = capped_bench.samples(tok, seed=42)
    assert len(capped) == len(plain) == len(tasks)
    for a, b in zip(capped, plain):
        assert b["max_new_tokens"] > 3 and a["max_new_tokens"] == 3
        assert {k: v for k, v in a.items() if k != "max_new_tokens"} == {k: v for k, v in b.items()
                                                                          if k != "max_new_tokens"}
    assert capped_bench.run_record(tok)["decode_cap"] == 3
    for bad in (0, -3, 2.5, True):
        with pytest.raises(ConfigError, match="decode_cap"):
            build_benchmark(OmegaConf.create({**base, "decode_cap": bad}))
