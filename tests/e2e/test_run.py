"""run.py end to end: results files, resume after SIGKILL, W&B offline files, bad input."""
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
TINY = ["model=tiny_random_llama", "benchmark.context_length=1024", "logger=none"]


def run(args, tmp_path, timeout=600, **kw):
    env = dict(os.environ, HF_HUB_OFFLINE="1", WANDB_SILENT="true")
    cmd = [sys.executable, str(ROOT / "run.py"), f"paths.runs_dir={tmp_path}", f"hydra.run.dir={tmp_path}/hydra", *args]
    return subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout, **kw)


def the_run_dir(tmp_path):
    dirs = [p for p in tmp_path.iterdir() if (p / "config.yaml").exists()]
    assert len(dirs) == 1, dirs
    return dirs[0]


def read_rows(run_dir):
    return [json.loads(line) for line in (run_dir / "predictions.jsonl").read_text().splitlines()]


def test_tiny_run_writes_results_and_resumes_after_sigkill(tmp_path):
    args = TINY + ["method=locks", "budget=128", "benchmark.num_samples=3", "benchmark.tasks=[niah_single_1,niah_multikey_3]"]
    env = dict(os.environ, HF_HUB_OFFLINE="1")
    cmd = [sys.executable, str(ROOT / "run.py"), f"paths.runs_dir={tmp_path}", f"hydra.run.dir={tmp_path}/hydra", *args]
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 300
    pred = None
    while time.time() < deadline:
        found = list(tmp_path.glob("*/predictions.jsonl"))
        if found and len(found[0].read_text().splitlines()) >= 2:
            pred = found[0]
            break
        time.sleep(0.2)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert pred is not None, "no sample finished before the deadline"
    with open(pred, "a") as f:
        f.write('{"task": "niah_single_1", "ind')  # a torn line, as if killed mid-write
    before = len(read_rows_safe(pred))
    assert 2 <= before < 6

    result = run(args, tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    run_dir = the_run_dir(tmp_path)
    rows = read_rows(run_dir)
    keys = [(r["task"], r["index"]) for r in rows]
    assert len(keys) == 6 and len(set(keys)) == 6
    metrics = json.loads((run_dir / "metrics.json").read_text())
    assert set(metrics["scores"]) == {"niah_single_1", "niah_multikey_3"}
    for field in ("average", "attended_fraction", "bytes_read_ratio", "versions", "device", "dtype", "seed"):
        assert field in metrics
    assert metrics["attended_tokens_per_step"] <= 128 and metrics["bytes_read_ratio"] < 1
    for r in rows:
        for field in ("prompt_tokens", "prediction", "references", "score", "attended_tokens_per_step",
                      "bytes_read_per_step", "full_bytes_per_step"):
            assert field in r
        assert 800 < r["prompt_tokens"] <= 1024 - 128  # prompt + tokens to generate fit the context
    assert "average" in result.stdout

    # a rerun of a finished config does no new work and duplicates nothing
    again = run(args, tmp_path)
    assert again.returncode == 0 and "0 to go" in again.stdout
    assert read_rows(run_dir) == rows


def read_rows_safe(path):
    return [json.loads(l) for l in path.read_text().splitlines() if l.endswith("}")]


def test_wandb_offline_run_holds_the_summary(tmp_path):
    args = ["model=tiny_random_llama", "benchmark.context_length=512", "benchmark.num_samples=1",
            "benchmark.tasks=[niah_single_1]", "method=oracle", "budget=64", "logger=wandb", "logger.mode=offline"]
    result = run(args, tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    run_dir = the_run_dir(tmp_path)
    metrics = json.loads((run_dir / "metrics.json").read_text())
    offline = list(run_dir.glob("wandb/offline-run-*"))
    assert len(offline) == 1
    # the per-task table as logged, and the per-sample rows
    table = json.loads(next(offline[0].glob("files/media/table/per_task_*.table.json")).read_text())
    assert table["data"] == [["niah_single_1", metrics["scores"]["niah_single_1"], 1]]
    assert list(offline[0].glob("files/media/table/predictions_*.table.json"))
    # the summary and config records in the offline run log (protobuf; keys are stored as plain strings)
    log = next(offline[0].glob("run-*.wandb")).read_bytes()
    for key in (b"score/niah_single_1", b"bytes_read_ratio", b"attended_fraction", b"budget_mode"):
        assert key in log
    assert b"results-" + metrics["run_key"][:16].encode() in log  # the result files as an artifact
    # a second submission of the same job skips the run but logs its stored results to the same W&B run id
    again = run(args, tmp_path)
    assert again.returncode == 0 and "skipped: results exist" in again.stdout, again.stderr[-3000:]
    assert len(list(run_dir.glob("wandb/offline-run-*"))) == 2
    assert all(metrics["run_key"][:16] in p.name for p in run_dir.glob("wandb/offline-run-*"))


@pytest.mark.parametrize("args,expected", [
    (["method=nosuch"], "Available options"),
    (["budget=0"], "budget must be a positive"),
    (["method.rank=16"], "method.rank"),
    (["method.page_size=12"], "method.page_size"),
    (["benchmark.tasks=[niah_nothing]"], "benchmark.tasks"),
    (["benchmark.context_length=100000"], "benchmark.context_length=100000 exceeds"),
    (["benchmark.tasks=[niah_single_2]", "benchmark.essay_path=/nonexistent/essays.json"], "needs PaulGrahamEssays.json"),
    (["model=llama3_1_8b_instruct", "model.path=/nonexistent/llama"], "model.path=/path/to/checkpoint"),
])
def test_bad_input_gives_one_line_error_and_nonzero_exit(tmp_path, args, expected):
    base = [a for a in TINY if not (a.startswith("model=") and any(b.startswith("model=") for b in args))]
    result = run(base + args, tmp_path)
    assert result.returncode != 0
    assert expected in result.stderr
    assert "Traceback" not in result.stderr


@pytest.mark.slow
def test_embedded_model_end_to_end(tmp_path):
    args = ["method=locks", "budget=256", "benchmark.context_length=1024", "benchmark.num_samples=1", "logger=none"]
    result = run(args, tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    metrics = json.loads((the_run_dir(tmp_path) / "metrics.json").read_text())
    assert set(metrics["scores"]) == {"niah_single_2"}  # the default suite, offline essay haystack
    assert metrics["model"] == "smollm2_135m" and metrics["attended_tokens_per_step"] <= 256
    assert "average" in result.stdout


@pytest.mark.slow
@pytest.mark.parametrize("benchmark,tasks", [
    ("longbench", "[trec,passage_count,samsum]"),
    ("longbench_e", "[passage_retrieval_en]"),
    ("infinitebench", "[passkey,kv_retrieval,code_debug]"),
])
def test_embedded_model_end_to_end_on_fixtures(tmp_path, benchmark, tasks):
    data = "longbench" if benchmark.startswith("longbench") else benchmark
    args = [f"benchmark={benchmark}", f"benchmark.data_dir={ROOT}/tests/fixtures/{data}", f"benchmark.tasks={tasks}",
            "benchmark.num_samples=1", "benchmark.max_length=1024", "method=locks", "budget=256", "logger=none"]
    result = run(args, tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    metrics = json.loads((the_run_dir(tmp_path) / "metrics.json").read_text())
    assert set(metrics["scores"]) == set(tasks.strip("[]").split(","))
    assert all(0 <= s <= 100 for s in metrics["scores"].values())
    assert metrics["model"] == "smollm2_135m" and "average" in result.stdout


def test_fullkv_runs_once_for_every_budget_of_a_sweep(tmp_path):
    """The budget changes nothing for FullKV, so a second budget reuses the first run's results."""
    args = TINY + ["method=fullkv", "benchmark.num_samples=1", "benchmark.tasks=[niah_single_1]"]
    first = run(args + ["budget=64"], tmp_path)
    assert first.returncode == 0, first.stderr
    second = run(args + ["budget=512"], tmp_path)
    assert second.returncode == 0, second.stderr
    assert "(1 samples done, 0 to go)" in second.stdout
    runs = [p for p in tmp_path.iterdir() if (p / "config.yaml").exists()]
    assert len(runs) == 1 and "_fullkv_full_" in runs[0].name
    assert json.loads((runs[0] / "metrics.json").read_text())["budget"] is None


def test_static_decode_run_matches_eager_run(tmp_path):
    """static_decode=true (the CUDA-graph step, run eagerly on CPU) predicts what the eager run predicts, records its
    decode mode, and shares the eager run's key (a finished eager run is not redone)."""
    args = TINY + ["method=locks", "budget=128", "benchmark.num_samples=1", "benchmark.tasks=[niah_multikey_3]"]
    results = {}
    for mode in ("false", "true"):
        out = run(args + [f"static_decode={mode}"], tmp_path / mode)
        assert out.returncode == 0, out.stderr[-3000:]
        run_dir = the_run_dir(tmp_path / mode)
        results[mode] = (run_dir.name, read_rows(run_dir), json.loads((run_dir / "metrics.json").read_text()))
    (name_e, rows_e, metrics_e), (name_s, rows_s, metrics_s) = results["false"], results["true"]
    assert name_e == name_s and metrics_e["decode_mode"] == "eager" and metrics_s["decode_mode"] == "static"
    assert [r["prediction"] for r in rows_s] == [r["prediction"] for r in rows_e]
    assert metrics_s["bytes_read_per_step"] == pytest.approx(metrics_e["bytes_read_per_step"], rel=1e-12)
    again = run(args + ["static_decode=true"], tmp_path / "false")
    assert again.returncode == 0 and "0 to go" in again.stdout
    bad = run(TINY + ["method=oracle", "static_decode=true", "benchmark.num_samples=1"], tmp_path / "oracle")
    assert bad.returncode != 0 and "no static (CUDA-graph) decode path" in bad.stderr
    assert "Traceback" not in bad.stderr


@pytest.mark.parametrize("name,expected", [
    ("paper_infinitebench", {"model": "glm4_9b_chat_1m", "benchmark": "infinitebench"}),
    ("paper_longbench", {"model": "llama3_1_8b_instruct", "benchmark": "longbench"}),
    ("paper_ruler_lrqk", {"model": "llama3_1_8b_instruct", "benchmark": "ruler"}),
    ("paper_latency", {"job": "profile"}),
])
def test_experiment_presets_compose(name, expected):
    """conf/experiment/*.yaml reproduce the paper settings: each composes, picks its model/benchmark, and sweeps
    only methods and budgets that exist."""
    from hydra import compose, initialize_config_dir

    with initialize_config_dir(version_base="1.3", config_dir=str(ROOT / "conf")):
        cfg = compose(config_name="config", overrides=[f"+experiment={name}"], return_hydra_config=True)
    if "model" in expected:
        assert cfg.model.name == expected["model"] and cfg.benchmark.name == expected["benchmark"]
        params = cfg.hydra.sweeper.params
        methods = params["method"].split(",")
        assert "fullkv" in methods and all((ROOT / "conf" / "method" / f"{m}.yaml").exists() for m in methods)
    else:
        assert cfg.job == "profile" and list(cfg.profile.contexts) == [131072, 262144, 1048576]
