"""A 2 x 2 sweep through hydra/launcher=slurm on a real single-node SLURM cluster (scripts/slurm_local.sh).

The fixture starts munged/slurmctld/slurmd (installing the Debian packages if missing; root only) unless this
script's daemons are already up, and stops only what it started. The test submits the sweep, checks the four result
directories, resubmits it (every job must report "skipped" and nothing may be duplicated) and builds the table with
scripts/results_table.py.
"""
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from eval.memory_plan import SLURM_BASE_GIB
from eval.results import without_timings
from tests.helpers import assert_records_close, decoded_as

pytestmark = [pytest.mark.slow, pytest.mark.slurm]

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "slurm_local.sh"
JOB_NAME = f"locks_slurm_test_{os.getpid()}"
SWEEP = ["model=tiny_random_llama", "benchmark.context_length=1024", "benchmark.num_samples=1",
         "benchmark.tasks=[niah_single_1]", "logger=none", "method=locks,oracle", "budget=64,128"]
# small resources on the local cluster (no GPU there); both jobs of a 2-CPU machine run at once; --mem from the plan
RESOURCES = ["hydra/launcher=slurm", "hydra.launcher.gpus_per_node=null", "hydra.launcher.cpus_per_task=1",
             "hydra.launcher.timeout_min=10", "hydra.launcher.array_parallelism=4",
             f"hydra.launcher.name={JOB_NAME}"]
SUBMIT_TIMEOUT_S = 240


@pytest.fixture(scope="module")
def slurm_cluster():
    if os.geteuid() != 0:
        pytest.skip("needs root: scripts/slurm_local.sh installs and starts munged, slurmctld and slurmd")
    if shutil.which("slurmctld") is None and shutil.which("apt-get") is None:
        pytest.skip("SLURM is not installed and apt-get is unavailable to install it")
    already_up = subprocess.run(["bash", str(SCRIPT), "status"], capture_output=True, text=True).returncode == 0
    started = subprocess.run(["bash", str(SCRIPT), "start"], capture_output=True, text=True, timeout=900)
    assert started.returncode == 0, started.stdout + started.stderr
    yield
    subprocess.run(["scancel", f"--name={JOB_NAME}"], capture_output=True)  # leftovers of a failed/timed-out test
    if not already_up:  # stop only the daemons this test started
        subprocess.run(["bash", str(SCRIPT), "stop"], capture_output=True, timeout=120)


def submit(tmp_path):
    cmd = [sys.executable, str(ROOT / "run.py"), "-m", *SWEEP, *RESOURCES, f"paths.runs_dir={tmp_path / 'runs'}",
           f"hydra.sweep.dir={tmp_path / 'sweep'}", "hydra.job.config.override_dirname.exclude_keys=[paths.runs_dir]"]
    env = dict(os.environ, HF_HUB_OFFLINE="1", WANDB_SILENT="true")
    try:
        # the launcher blocks until the whole array has finished
        return subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=SUBMIT_TIMEOUT_S)
    except subprocess.TimeoutExpired as err:
        pytest.fail(f"sweep did not finish in {SUBMIT_TIMEOUT_S}s\n{job_logs(tmp_path)}\n{err.stdout}\n{err.stderr}")


def job_logs(tmp_path) -> str:
    logs = sorted((tmp_path / "sweep" / ".submitit").glob("*/*_log.*"))
    return "\n".join(f"== {p}\n{p.read_text()[-2000:]}" for p in logs)


def stdout_logs(tmp_path) -> dict:
    """{array task id "<jobid>_<i>": its stdout} of every job submitted so far."""
    return {p.parent.name: p.read_text() for p in (tmp_path / "sweep" / ".submitit").glob("*/*_0_log.out")}


def test_sweep_on_slurm_runs_each_job_once_and_skips_finished_ones(slurm_cluster, tmp_path):
    start = time.time()
    first = submit(tmp_path)
    assert first.returncode == 0, f"{first.stdout[-3000:]}\n{first.stderr[-3000:]}\n{job_logs(tmp_path)}"
    logs = stdout_logs(tmp_path)
    assert len(logs) == 4, sorted(logs)  # one SLURM array task per sweep job
    assert all("skipped" not in text for text in logs.values())
    sbatch = next((tmp_path / "sweep" / ".submitit").glob("*/*_submission.sh")).read_text()
    assert "export WANDB_MODE=offline" in sbatch and "#SBATCH --array=0-3%4" in sbatch
    # mem_gb null: the largest job's memory plan, under 1 GiB for the tiny model, rounded up, plus the base
    assert f"#SBATCH --mem={SLURM_BASE_GIB + 1}GB" in sbatch and "the largest job's memory plan" in first.stdout + first.stderr
    assert sys.executable in sbatch  # the jobs run this interpreter (the venv's python)

    runs = sorted(p for p in (tmp_path / "runs").iterdir() if p.is_dir())
    assert [p.name.rsplit("_", 1)[0] for p in runs] == [
        "ruler_tiny_random_llama_locks_b128", "ruler_tiny_random_llama_locks_b64",
        "ruler_tiny_random_llama_oracle_b128", "ruler_tiny_random_llama_oracle_b64"]
    before = {}
    for run in runs:
        metrics = json.loads((run / "metrics.json").read_text())
        assert metrics["num_samples"] == {"niah_single_1": 1}
        assert metrics["attended_tokens_per_step"] <= metrics["budget"]
        before[run.name] = ((run / "predictions.jsonl").read_text(), (run / "metrics.json").stat().st_mtime_ns)
        assert len(before[run.name][0].splitlines()) == 1
    # Hydra's per-job sweep subdirs encode the overrides
    subdirs = {p.name for p in (tmp_path / "sweep").iterdir() if not p.name.startswith(".")} - {"multirun.yaml"}
    assert len(subdirs) == 4 and all("method=" in d and "budget=" in d for d in subdirs), subdirs

    # the same sweep again: every job finds its results and skips, nothing is rewritten or duplicated
    second = submit(tmp_path)
    assert second.returncode == 0, f"{second.stdout[-3000:]}\n{second.stderr[-3000:]}\n{job_logs(tmp_path)}"
    new_logs = {k: v for k, v in stdout_logs(tmp_path).items() if k not in logs}
    assert len(new_logs) == 4, sorted(new_logs)
    for text in new_logs.values():
        assert "skipped: results exist in" in text, text[-2000:]
    assert sorted(p for p in (tmp_path / "runs").iterdir() if p.is_dir()) == runs
    for run in runs:
        assert ((run / "predictions.jsonl").read_text(), (run / "metrics.json").stat().st_mtime_ns) == before[run.name]

    table = subprocess.run([sys.executable, str(ROOT / "scripts" / "results_table.py"),
                            *[str(r / "metrics.json") for r in runs]], capture_output=True, text=True, timeout=60)
    assert table.returncode == 0, table.stderr
    lines = table.stdout.strip().splitlines()
    assert lines[0].startswith("| method | niah_single_1 | average |") and len(lines) == 2 + 4
    assert sorted(line.split(" | ")[0] for line in lines[2:]) == [
        "| locks b=128", "| locks b=64", "| oracle b=128", "| oracle b=64"]
    print(f"\nSLURM sweep + resubmission: {time.time() - start:.0f} s\n{table.stdout}")


def test_grouped_sweep_on_slurm_is_one_job_and_writes_what_the_per_job_sweep_writes(slurm_cluster, tmp_path):
    """hydra/launcher=grouped_slurm: the 2 x 2 sweep is one group (same model and benchmark), so one SLURM job,
    one model load and one prefill per sample; its run directories hold what the per-job launcher writes, here with
    the group's two samples decoded as one batch (batch_size=2) against one at a time."""
    env = dict(os.environ, HF_HUB_OFFLINE="1", WANDB_SILENT="true")
    grouped = ["hydra/launcher=grouped_slurm", "hydra.launcher.gpus_per_node=null", "hydra.launcher.cpus_per_task=2",
               "hydra.launcher.mem_gb=4", "hydra.launcher.timeout_min=10", f"hydra.launcher.name={JOB_NAME}"]
    sweep = [a for a in SWEEP if not a.startswith("benchmark.num_samples=")] + ["benchmark.num_samples=2"]
    cmd = [sys.executable, str(ROOT / "run.py"), "-m", *sweep, *grouped, "batch_size=2",
           f"paths.runs_dir={tmp_path / 'grouped'}", f"hydra.sweep.dir={tmp_path / 'sweep'}"]
    done = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=SUBMIT_TIMEOUT_S)
    assert done.returncode == 0, f"{done.stdout[-3000:]}\n{done.stderr[-3000:]}\n{job_logs(tmp_path)}"
    logs = list((tmp_path / "sweep" / ".submitit").glob("*/*_log.out"))
    assert len(logs) == 1, logs  # one SLURM job for the whole group
    assert "group: 4 runs, 2 prefills" in logs[0].read_text()
    local = [sys.executable, str(ROOT / "run.py"), "-m", *sweep, f"paths.runs_dir={tmp_path / 'basic'}",
             f"hydra.sweep.dir={tmp_path / 'basic_sweep'}"]
    basic = subprocess.run(local, cwd=ROOT, env=env, capture_output=True, text=True, timeout=SUBMIT_TIMEOUT_S)
    assert basic.returncode == 0, basic.stderr[-3000:]

    def predictions(root):
        return {p.name: {row["id"]: without_timings(row) for row in map(json.loads,
                                                                        (p / "predictions.jsonl").read_text().splitlines())}
                for p in root.iterdir() if p.is_dir()}

    want, got = predictions(tmp_path / "basic"), predictions(tmp_path / "grouped")
    assert len(want) == 4 and all(len(rows) == 2 for rows in want.values())
    # batch 1 decodes eagerly on this CPU, a batch of rows in the stacked static step (tests/helpers.py)
    assert {m for run in want.values() for m in decoded_as(list(run.values()))} == {"eager"}
    assert {m for run in got.values() for m in decoded_as(list(run.values()))} == {"static"}
    assert_records_close(got, want)
