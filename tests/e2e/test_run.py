"""run.py end to end: results files, resume after SIGKILL, W&B offline files, bad input. The jobs run in-process
(run.run on run.compose_config, models shared by the session); subprocesses only where the process itself is the
subject: the command line's exit code and stderr, and a SIGKILL."""
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from eval import memory_plan, runner
from eval.results import KILL_AFTER_ROWS, without_timings
from tests.helpers import run_inprocess

ROOT = Path(__file__).resolve().parents[2]
TINY = ["model=tiny_random_llama", "benchmark.context_length=1024", "logger=none"]


def subprocess_run(args, tmp_path, timeout=600, env=None):
    """`python run.py` as a user types it, in its own process."""
    env = dict(os.environ, HF_HUB_OFFLINE="1", WANDB_SILENT="true", **(env or {}))
    cmd = [sys.executable, str(ROOT / "run.py"), f"paths.runs_dir={tmp_path}", f"hydra.run.dir={tmp_path}/hydra", *args]
    return subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)


@pytest.fixture
def run(shared_models, capsys):
    """run(args, runs_dir) -> JobResult: one run.py job in this process."""
    return lambda args, runs_dir: run_inprocess(args, runs_dir, capsys)


def assert_one_line_error(result, expected):
    """Nothing but a one-line failure: the expected text on stderr, no traceback, at most one `error: ` line (the
    harness's), holding the expected text."""
    assert expected in result.stderr
    assert "Traceback" not in result.stderr
    ours = [line for line in result.stderr.splitlines() if line.startswith("error: ")]
    assert len(ours) <= 1 and (not ours or expected in ours[0]), result.stderr


def the_run_dir(tmp_path):
    dirs = [p for p in tmp_path.iterdir() if (p / "config.yaml").exists()]
    assert len(dirs) == 1, dirs
    return dirs[0]


def read_rows(run_dir):
    return [json.loads(line) for line in (run_dir / "predictions.jsonl").read_text().splitlines()]


@pytest.mark.parametrize("batch", [1, 3])
def test_tiny_run_writes_results_and_resumes_after_sigkill(tmp_path, run, batch):
    """The run is killed (SIGKILL, by $LOCKS_KILL_AFTER_ROWS: no timing) right after its second row; at batch 3 a row
    is written when its sample finishes. The rerun resumes from the samples that have no line and duplicates none."""
    args = TINY + ["method=locks", "budget=128", "benchmark.num_samples=3", "benchmark.tasks=[niah_single_1,niah_multikey_3]",
                   f"batch_size={batch}"]
    killed = subprocess_run(args, tmp_path, env={KILL_AFTER_ROWS: "2"})
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-3000:]
    (pred,) = tmp_path.glob("*/predictions.jsonl")
    assert len(read_rows_safe(pred)) == 2  # fsynced before the kill: exactly the rows written
    with open(pred, "a") as f:
        f.write('{"task": "niah_single_1", "ind')  # a torn line, as if killed mid-write

    result = run(args, tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "(2 samples done, 4 to go)" in result.stdout
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
    """In a process of its own: read in-process right after the run's `finish`, the offline run log once held only
    its header; the exit of the process is what guarantees that W&B's service has written it."""
    args = ["model=tiny_random_llama", "benchmark.context_length=512", "benchmark.num_samples=1",
            "benchmark.tasks=[niah_single_1]", "method=oracle", "budget=64", "logger=wandb", "logger.mode=offline"]
    result = subprocess_run(args, tmp_path)
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
    again = subprocess_run(args, tmp_path)
    assert again.returncode == 0 and "skipped: results exist" in again.stdout, again.stderr[-3000:]
    assert len(list(run_dir.glob("wandb/offline-run-*"))) == 2
    assert all(metrics["run_key"][:16] in p.name for p in run_dir.glob("wandb/offline-run-*"))


@pytest.mark.parametrize("args,expected", [
    (["method=nosuch"], "Available options"),  # Hydra's own error, before the harness runs
    (["budget=0"], "budget must be a positive"),
])
def test_the_command_line_gives_one_line_errors_and_a_nonzero_exit(tmp_path, args, expected):
    """The command-line contract, in a process of its own: a nonzero exit, no traceback, at most one `error: ` line."""
    result = subprocess_run(TINY + args, tmp_path)
    assert result.returncode != 0
    assert_one_line_error(result, expected)


@pytest.mark.parametrize("args,expected", [
    (["batch_size=0"], "batch_size must be a positive"),
    (["prefill_chunk_size=0"], "prefill_chunk_size must be null"),
    (["method.rank=16"], "method.rank"),
    (["method.page_size=12"], "method.page_size"),
    (["benchmark.tasks=[niah_nothing]"], "benchmark.tasks"),
    (["benchmark.context_length=100000"], "benchmark.context_length=100000 exceeds"),
    (["benchmark.tasks=[niah_single_2]", "benchmark.essay_path=/nonexistent/essays.json"],
     "benchmark.essay_path=/nonexistent/essays.json: no such file"),
    (["model=llama3_1_8b_instruct", "model.path=/nonexistent/llama"], "model.path=/nonexistent/llama: no such folder"),
    # the data are checked before the checkpoint, the checkpoint before the model: the first error is the data's
    (["model=llama3_1_8b_instruct", "model.path=/nonexistent/llama", "benchmark.essay_path=/nonexistent/e.txt"],
     "benchmark.essay_path=/nonexistent/e.txt: no such file"),
    (["benchmark.data_dir=/nonexistent/ruler"], "benchmark.data_dir=/nonexistent/ruler: no such directory"),
    (["benchmark.tasks=[qa_1]"], "RULER task qa_1 needs squad.json"),
    (["benchmark=longbench", "benchmark.tasks=[trec]", f"benchmark.data_dir={ROOT}/tests/fixtures/infinitebench"],
     "benchmark.data_dir="),
    (["benchmark=infinitebench", "benchmark.tasks=[passkey]", f"benchmark.data_dir={ROOT}/tests/fixtures/longbench"],
     "benchmark.data_dir="),
])
def test_bad_input_gives_one_line_error_and_nonzero_exit(tmp_path, run, args, expected):
    base = [a for a in TINY if not any(b.startswith(a.split("=")[0].split(".")[0] + "=") for b in args)]
    result = run(base + args, tmp_path)
    assert result.returncode == 2
    assert_one_line_error(result, expected)


@pytest.fixture(scope="module")
def base_checkpoint(tmp_path_factory):
    """A checkpoint folder whose tokenizer has no chat template (a base model) and that has no weights at all, so
    that anything past the tokenizer check would fail differently."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import LlamaConfig, PreTrainedTokenizerFast

    folder = tmp_path_factory.mktemp("base_model")
    words = ["<unk>", "<s>", "</s>"] + [f"w{i}" for i in range(200)]
    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", bos_token="<s>", eos_token="</s>")
    assert not fast.chat_template
    fast.save_pretrained(folder)
    LlamaConfig(vocab_size=len(words), hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                num_attention_heads=2, num_key_value_heads=1).save_pretrained(folder)
    return folder


@pytest.mark.parametrize("args,expected", [
    (["benchmark.chat_template=true"], "benchmark.chat_template=true, but the model's tokenizer has no chat template"),
    (["benchmark=longbench", "benchmark.tasks=[qasper]", f"benchmark.data_dir={ROOT}/tests/fixtures/longbench"],
     "benchmark.chat_template=true, but the model's tokenizer has no chat template"),
    (["benchmark=infinitebench", "benchmark.tasks=[passkey]", f"benchmark.data_dir={ROOT}/tests/fixtures/infinitebench"],
     "benchmark.template=chat needs the model's chat template"),
])
def test_a_base_model_with_a_chat_template_setting_stops_before_the_model_loads(tmp_path, run, base_checkpoint, args,
                                                                                 expected):
    result = run(["model=qwen2_5_7b_instruct", f"model.path={base_checkpoint}", "model.name=base", "logger=none",
                  *args], tmp_path)
    assert result.returncode == 2 and expected in result.stderr, result.stderr[-2000:]
    ours = [line for line in result.stderr.splitlines() if line.startswith("error: ")]
    assert "Traceback" not in result.stderr and len(ours) == 1 and expected in ours[0], result.stderr


def test_a_base_model_runs_ruler_with_its_base_template(tmp_path, run, base_checkpoint):
    """benchmark.chat_template=auto (the default): a tokenizer without a chat template gets RULER's base prompt,
    and the run records which template it used."""
    import shutil

    from transformers import AutoConfig, AutoModelForCausalLM

    folder = tmp_path / "ckpt"
    shutil.copytree(base_checkpoint, folder)
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(folder)).save_pretrained(folder)
    result = run(["model=qwen2_5_7b_instruct", f"model.path={folder}", "model.name=base", "logger=none",
                  "benchmark.tasks=[niah_single_1]", "benchmark.context_length=512", "benchmark.num_samples=1",
                  "method=locks", "budget=64"], tmp_path / "runs")
    assert result.returncode == 0, result.stderr[-3000:]
    metrics = json.loads((the_run_dir(tmp_path / "runs") / "metrics.json").read_text())
    assert metrics["benchmark"]["chat_template"] is False and metrics["benchmark"]["chat_template_setting"] == "auto"


def test_a_finished_run_missing_its_last_line_reruns_that_sample(tmp_path, run):
    """skip-if-done accepts only a complete run: with the last predictions line gone, the rerun resumes with
    "1 to go" and writes that sample again, the same as before."""
    args = TINY + ["method=locks", "budget=128", "benchmark.num_samples=2", "benchmark.tasks=[niah_single_1]"]
    assert run(args, tmp_path).returncode == 0
    run_dir = the_run_dir(tmp_path)
    before = read_rows(run_dir)
    lines = (run_dir / "predictions.jsonl").read_text().splitlines(keepends=True)
    assert len(lines) == 2 and (run_dir / "metrics.json").exists()
    (run_dir / "predictions.jsonl").write_text(lines[0])
    again = run(args, tmp_path)
    assert again.returncode == 0, again.stderr[-3000:]
    assert "(1 samples done, 1 to go)" in again.stdout and "skipped" not in again.stdout
    after = read_rows(run_dir)
    assert [without_timings(r) for r in after] == [without_timings(r) for r in before]


def test_embedded_model_end_to_end(tmp_path, run):
    args = ["method=locks", "budget=256", "benchmark.context_length=1024", "benchmark.num_samples=1", "logger=none",
            "benchmark.decode_cap=4"]
    result = run(args, tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    metrics = json.loads((the_run_dir(tmp_path) / "metrics.json").read_text())
    assert set(metrics["scores"]) == {"niah_single_2"}  # the default suite, offline essay haystack
    assert metrics["model"] == "smollm2_135m" and metrics["attended_tokens_per_step"] <= 256
    assert "average" in result.stdout


@pytest.mark.parametrize("benchmark,tasks", [
    ("longbench", "[trec,passage_count,samsum]"),
    ("longbench_e", "[passage_retrieval_en]"),
    ("infinitebench", "[passkey,kv_retrieval,code_debug]"),
])
def test_embedded_model_end_to_end_on_fixtures(tmp_path, run, benchmark, tasks):
    """The plumbing of every benchmark on the embedded model: tasks present, scores in range, table printed, records
    written (decode_cap 4: a few tokens prove that much)."""
    data = "longbench" if benchmark.startswith("longbench") else benchmark
    args = [f"benchmark={benchmark}", f"benchmark.data_dir={ROOT}/tests/fixtures/{data}", f"benchmark.tasks={tasks}",
            "benchmark.num_samples=1", "benchmark.max_length=1024", "method=locks", "budget=256", "logger=none",
            "benchmark.decode_cap=4"]
    result = run(args, tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    metrics = json.loads((the_run_dir(tmp_path) / "metrics.json").read_text())
    assert set(metrics["scores"]) == set(tasks.strip("[]").split(","))
    assert all(0 <= s <= 100 for s in metrics["scores"].values())
    assert metrics["model"] == "smollm2_135m" and "average" in result.stdout
    assert metrics["benchmark"]["decode_cap"] == 4
    assert all(r["generated_tokens"] <= 4 for r in read_rows(the_run_dir(tmp_path)))


def test_fullkv_runs_once_for_every_budget_of_a_sweep(tmp_path, run):
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


def test_static_decode_run_matches_eager_run(tmp_path, run):
    """static_decode=true (the CUDA-graph step, run eagerly on CPU) predicts what the eager run predicts, records its
    decode mode and whether its decode time includes instrumentation, and shares the eager run's key (a finished
    eager run is not redone)."""
    args = TINY + ["method=locks", "budget=128", "benchmark.num_samples=1", "benchmark.tasks=[niah_multikey_3]"]
    results = {}
    for mode in ("false", "true"):
        out = run(args + [f"static_decode={mode}"], tmp_path / mode)
        assert out.returncode == 0, out.stderr[-3000:]
        run_dir = the_run_dir(tmp_path / mode)
        results[mode] = (run_dir.name, read_rows(run_dir), json.loads((run_dir / "metrics.json").read_text()))
    (name_e, rows_e, metrics_e), (name_s, rows_s, metrics_s) = results["false"], results["true"]
    assert name_e == name_s and metrics_e["decode_mode"] == "eager" and metrics_s["decode_mode"] == "static"
    # coverage is measured (the default): timed apart by eager steps on the CPU, inside the static step
    assert metrics_e["decode_instrumented"] is False and metrics_s["decode_instrumented"] is True
    # (how much an eager step's instrumentation takes, it times apart: tests/core/test_static_decode.py, on a clock)
    assert all(r["instrumentation_seconds"] >= 0 for r in rows_e)
    assert all(r["instrumentation_seconds"] == 0 for r in rows_s)
    assert [r["prediction"] for r in rows_s] == [r["prediction"] for r in rows_e]
    assert metrics_s["bytes_read_per_step"] == pytest.approx(metrics_e["bytes_read_per_step"], rel=1e-12)
    again = run(args + ["static_decode=true"], tmp_path / "false")
    assert again.returncode == 0 and "0 to go" in again.stdout
    bad = run(TINY + ["method=oracle", "method.budget_mode=paper", "static_decode=true", "benchmark.num_samples=1"],
              tmp_path / "oracle")
    assert bad.returncode != 0 and "static decode implements budget_mode=fair" in bad.stderr
    assert "Traceback" not in bad.stderr


def test_auto_prefill_chunk_is_the_plans(tmp_path, run, monkeypatch):
    """prefill_chunk_size=auto: the run prefills in the chunk its memory plan chose (here the plan fits only with
    chunks of at most 512 tokens: 512 of the 1024), and a bad value stops it in one line."""
    chunks = []
    generate_rows = runner.generate_rows
    monkeypatch.setattr(memory_plan, "fits", lambda plan, available=None: (plan.chunk or 1 << 30) <= 512)
    monkeypatch.setattr(runner, "generate_rows", lambda *a, **k: chunks.append(k["prefill_chunk_size"]) or
                        generate_rows(*a, **k))
    args = TINY + ["method=locks", "budget=128", "benchmark.num_samples=1", "benchmark.tasks=[niah_single_1]"]
    out = run(args + ["prefill_chunk_size=auto"], tmp_path)
    assert out.returncode == 0, out.stderr[-3000:]
    assert chunks == [512]
    bad = run(args + ["prefill_chunk_size=big"], tmp_path)
    assert bad.returncode != 0 and "prefill_chunk_size must be null (one forward), auto" in bad.stderr


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
