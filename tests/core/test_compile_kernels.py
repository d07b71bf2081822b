"""Every Triton kernel configuration compiles for Hopper with CI's triton and with the H200 image's triton 3.6
(scripts/compile_kernels.py, docs/kernels.md), plus the pieces it is built from: the launch recorder, the
occupancy formula and the one-wave split count of the decode kernels.

The two compile tests (slow tier) check the run recorded in results/kernels_compile.json instead of compiling again
when that run was made from the same kernel sources (`sources_sha256`) with the same triton: any change to a kernel,
its layout, the shapes or the script compiles anew (`make kernels` records the new runs)."""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tests.helpers import load_script

ROOT = Path(__file__).resolve().parents[2]
TRITON36 = Path(os.environ.get("LOCKS_TRITON36", ROOT / ".venv" / "triton-3.6"))


def recorded_run(version: str) -> dict | None:
    """The sm_90 run of triton `version` in results/kernels_compile.json when it was compiled from today's kernel
    sources, else None."""
    runs = json.loads((ROOT / "results" / "kernels_compile.json").read_text())["runs"]
    run = runs.get(f"triton {version} sm_90")
    if run is None or run.get("sources_sha256") != load_script("compile_kernels").sources_sha256():
        return None
    return run


def jit_kernels_in_sources() -> set[str]:
    """The names of the `@triton.jit` kernels (`def _..._kernel`) in the repository's kernel modules, read from the
    source text: the script finds them by import, so a kernel it misses, or a recorded run of an older kernel set,
    shows up here."""
    files = [*ROOT.glob("locks/kernels/*.py"), *ROOT.glob("*/**/kernels.py")]
    found = set()
    for f in files:
        found |= set(re.findall(r"@triton\.jit[^\n]*\n(?:@[^\n]*\n)*def (_\w+_kernel)\(", f.read_text()))
    return found


def _compile(tmp_path, pythonpath=None):
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}  # conftest sets it for the other tests
    if pythonpath:
        env["PYTHONPATH"] = str(pythonpath) + os.pathsep + env.get("PYTHONPATH", "")
    out, md = tmp_path / "k.json", tmp_path / "k.md"
    r = subprocess.run([sys.executable, str(ROOT / "scripts/compile_kernels.py"), "--arch", "90", "--quiet",
                        "--out", str(out), "--md", str(md)], env=env, capture_output=True, text=True, timeout=1500)
    assert r.returncode == 0, f"compile_kernels failed (rc {r.returncode}):\n{r.stdout[-6000:]}\n{r.stderr[-3000:]}"
    (run,) = json.loads(out.read_text())["runs"].values()
    return run, md.read_text()


def _check_run(run, version_prefix):
    assert run["triton"].startswith(version_prefix) and run["arch"] == 90 and not run["partial"]
    assert not run["kernels_not_launched"], run["kernels_not_launched"]
    rows = run["configurations"]
    assert {r["kernel"] for r in rows} == set(run["kernels"]) == jit_kernels_in_sources()
    assert all(r["status"] == "compiled" and not r["violations"] for r in rows)
    # the constexpr branches the harness takes are all there
    cx = {}
    for r in rows:
        for k, v in r["constexprs"].items():
            cx.setdefault((r["kernel"], k), set()).add(v)
    assert cx["_decode_split_kernel", "MODE"] == {0, 1, 2}
    assert cx["_decode_split_kernel", "HAS_VALID"] == cx["_decode_split_kernel", "LENGTH_PTR"] == {False, True}
    assert cx["_locks_score_kernel", "AGG"] == {0, 1, 2, 3} and cx["_locks_score_kernel", "BOUNDS"] == {0, 2}
    assert cx["_quest_score_kernel", "REDUCE"] == {0, 1, 2} and cx["_aggregate_kernel", "MODE"] == {2, 3}
    assert cx["_coverage_split_kernel", "CERT"] == cx["_coverage_reduce_kernel", "CERT"] == {False, True}
    assert cx["_coverage_reduce_kernel", "HAS_SINKS"] == {False, True}
    assert cx["_quest_score_kernel", "OPEN_PAGE"] == {0, 16} and cx["_quest_pages_kernel", "COUNT"] == {False, True}
    # at the GPU benchmark's shapes (bf16): no spills, and the split-K decodes run in one wave
    bench_keys = {(b["kernel"], b["site"]) for b in run["benchmark_launches"]}
    assert ("_locks_score_kernel", "bench_decode locks_score") in bench_keys
    for b in run["benchmark_launches"]:
        if b["kernel"] == "_decode_split_kernel":
            assert b["waves"] == 1, b
    bf16 = [r for r in rows if "bf16" in json.dumps(r["signature"])]
    # known, open (docs/results/kernels_compile.md): ShadowKV's gather kernel spills 4 bytes in its per-row
    # configurations without offloading with triton 3.9 on sm_90; nothing else may spill in bf16
    spilling = [r for r in bf16 if (r.get("spill_stores") or 0) > 0]
    assert bf16 and all(r["kernel"] == "_shadow_gather_kernel" and r["spill_stores"] <= 4 and r["constexprs"]["PER_ROW"]
                        for r in spilling), [(r["kernel"], r["spill_stores"]) for r in spilling]


@pytest.mark.slow
def test_every_kernel_compiles_for_sm90_with_ci_triton(tmp_path):
    import triton

    run = recorded_run(triton.__version__)
    if run is None:
        run, md = _compile(tmp_path)
    else:
        md = (ROOT / "results" / "kernels_compile.md").read_text()
    _check_run(run, triton.__version__)
    assert "| _locks_score_kernel |" in md and "At the GPU benchmark's shapes" in md


@pytest.mark.slow
def test_every_kernel_compiles_for_sm90_with_triton_3_6(tmp_path):
    if not (TRITON36 / "triton" / "__init__.py").exists():
        pytest.fail(f"triton 3.6.0 (the H200 image's) is not installed in {TRITON36}: run `make install`, or "
                    f"pip install --no-deps --target {TRITON36} triton==3.6.0")
    version = subprocess.run([sys.executable, "-c", "import triton; print(triton.__version__)"], text=True,
                             capture_output=True, env=dict(os.environ, PYTHONPATH=str(TRITON36)), check=True).stdout
    run = recorded_run(version.strip()) or _compile(tmp_path, TRITON36)[0]
    _check_run(run, "3.6.")


# --------------------------------------------------------------------------------------------------------------
# the pieces


def test_the_sources_hash_covers_every_kernel_module_and_changes_with_them(tmp_path, monkeypatch):
    """A recorded compile stands in for a new one only while sources_sha256 is unchanged: it must cover every module
    with Triton kernels, and any edit to one of them must change it."""
    import importlib

    script = load_script("compile_kernels")
    files = {str(p.relative_to(ROOT)) for p in script.kernel_sources()}
    for module in script.kernel_modules():
        if not any(type(v).__name__ in ("JITFunction", "InterpretedFunction")
                   for v in vars(importlib.import_module(module)).values()):
            continue  # no kernel in it (locks/kernels/interpreter.py: the CPU interpreter's patch)
        path = module.replace(".", "/")
        assert f"{path}.py" in files or f"{path}/__init__.py" in files, module
    before = script.sources_sha256()
    copy = tmp_path / "repo"
    for f in script.kernel_sources():
        (copy / f.relative_to(ROOT)).parent.mkdir(parents=True, exist_ok=True)
        (copy / f.relative_to(ROOT)).write_bytes(f.read_bytes())
    monkeypatch.setattr(script, "ROOT", copy)
    monkeypatch.setattr(script, "__file__", str(copy / "scripts" / "compile_kernels.py"))
    assert script.sources_sha256() == before  # the same sources, elsewhere
    kernel = copy / "locks" / "kernels" / "decode.py"
    kernel.write_text(kernel.read_text() + "\n# an edit\n")
    assert script.sources_sha256() != before


def test_blocks_per_sm_formula():
    from locks.kernels._common import blocks_per_sm

    # 145 registers, 4 warps: ceil(145 * 32 / 256) * 256 = 4864 registers per warp -> 13 warps -> 3 blocks
    assert blocks_per_sm(145, 4, 41472) == (3, "registers")
    # 73,728 B of shared memory: 233,472 // 74,752 = 3 blocks
    assert blocks_per_sm(106, 4, 73728) == (3, "shared memory")
    assert blocks_per_sm(16, 1, 0) == (32, "blocks")
    assert blocks_per_sm(16, 32, 0) == (2, "threads")
    assert blocks_per_sm(200, 4, 300 * 1024)[0] == 0  # does not fit


def test_recording_launches_records_without_running():
    from locks import kernels as K
    from locks.kernels import _common

    q = torch.empty(1, 8, 128, dtype=torch.bfloat16, device="meta")
    k = torch.empty(1, 2, 1 << 20, 128, dtype=torch.bfloat16, device="meta")
    with _common.recording_launches(sms=132, resident=lambda kernel, args, meta: 3) as launches:
        K.full_decode(q, k, k, 0.088)
    names = [getattr(ln.kernel, "__name__", None) or ln.kernel.fn.__name__ for ln in launches]  # JIT or interpreted
    assert names == ["_decode_split_kernel", "_combine_kernel"]
    split = launches[0]
    assert split.grid == (2, 198) and split.meta["MODE"] == 2 and split.meta["BLOCK_N"] == 64  # 132 SMs x 3 / 2
    assert split.meta["num_warps"] == 4 and launches[1].meta["BLOCK_S"] == 32
    assert not _common._RECORDING  # the recorder is gone afterwards


def test_decode_splits_fill_one_wave():
    from locks.kernels.decode import decode_splits

    cpu = torch.device("cpu")  # 4 "SMs" off CUDA
    for rows in (1, 2, 3, 8, 16, 64):
        for resident in (1, 3, 4):
            ns, tps = decode_splits(rows, 1 << 20, 64, cpu, resident=resident)
            assert rows * ns <= max(rows, 4 * resident) and tps % 64 == 0 and ns * tps >= 1 << 20
    assert decode_splits(2, 100, 64, cpu) == (2, 64)  # never more splits than tiles
