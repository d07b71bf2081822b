"""eval/report/ and paper_figs/: tables and figures from fixture results written in the real metrics.json schema
(tests/fixtures/report/metrics_template.json, a run of the RULER suite, with method, budget and scores varied), checked through the DataFrames,
the written files and the matplotlib objects; and paper_figs/make_all.py on the committed results/."""
from __future__ import annotations

import copy
import itertools
import json
import shutil
import subprocess
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402
import pytest  # noqa: E402

from eval import report  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
TEMPLATE = json.loads((ROOT / "tests" / "fixtures" / "report" / "metrics_template.json").read_text())
TASKS = list(TEMPLATE["scores"])
BUDGETS = [64, 128, 2048]


def metrics(method: str, budget, scores: list[float], *, model: str = "smollm2_135m", context: int = 4096,
            n: int = 10, **method_opts) -> dict:
    """A metrics.json in the schema of the committed results (FullKV: budget null, no LOCKS options)."""
    m = copy.deepcopy(TEMPLATE)
    m["model"] = model
    m["benchmark"]["context_lengths"] = [context]
    if method == "fullkv":
        m["method"] = {"name": "fullkv", "budget": None}
        m["budget"] = m["budget_mode"] = None
        m["diagnostics"] = {}
        m["coverage"], m["bytes_read_ratio"], m["attended_fraction"] = 1.0, 1.0, 1.0
        m["attended_tokens_per_step"] = float(context - 180)
    else:
        m["method"] = {**m["method"], "name": method, "budget": budget, **method_opts}
        m["budget"] = budget
        m["attended_tokens_per_step"] = float(min(budget, context) - 8)
        m["attended_fraction"] = m["attended_tokens_per_step"] / (context - 180)
        m["bytes_read_ratio"] = min(1.0, budget / context + 0.02)
        m["coverage"] = min(0.999, 0.6 + budget / 8192)
    m["full_bytes_per_step"] = 22_000.0 * context
    m["bytes_read_per_step"] = m["full_bytes_per_step"] * m["bytes_read_ratio"]
    m["scores"] = dict(zip(TASKS, scores))
    m["average"] = round(sum(scores) / len(scores), 2)
    m["num_samples"] = {t: n for t in TASKS}
    m["per_length"]["task_scores"] = {str(context): dict(m["scores"])}
    return m


def write(dirpath: Path, name: str, m: dict) -> Path:
    dirpath.mkdir(parents=True, exist_ok=True)
    path = dirpath / name
    path.write_text(json.dumps(m, indent=2))
    return path


def score(method: str, b: int) -> list[float]:
    base = {"oracle": 60.0, "locks": 50.0, "quest": 30.0}[method]
    return [min(100.0, base + b / 64 + k) for k in (0.0, 10.0, 20.0)]


@pytest.fixture
def results(tmp_path) -> Path:
    """A sweep in the layout of outputs/runs (…/<run>/metrics.json) plus a copy-style file (results/<x>.json):
    FullKV, Oracle and LOCKS at 64/128/2048, Quest at 128 only; a second model with FullKV + LOCKS; a non-metrics
    JSON and a wandb folder to be ignored."""
    root = tmp_path / "results"
    write(root / "sweep" / "fullkv_run", "metrics.json", metrics("fullkv", None, [100.0, 10.0, 0.0]))
    for method in ("oracle", "locks"):
        for b in BUDGETS:
            write(root / "sweep" / f"{method}_b{b}_run", "metrics.json", metrics(method, b, score(method, b)))
    write(root / "copies", "quest_b128.json", metrics("quest", 128, score("quest", 128), n=5))
    write(root / "other_model", "fullkv.json", metrics("fullkv", None, [90.0, 80.0, 70.0], model="tiny"))
    write(root / "other_model", "locks_b128.json", metrics("locks", 128, [90.0, 70.0, 70.0], model="tiny"))
    write(root, "bench_summaries.json", {"builds": [1, 2, 3]})
    write(root / "sweep" / "fullkv_run" / "wandb", "wandb-summary.json", metrics("fullkv", None, [0.0, 0.0, 0.0]))
    return root


def unit_of(df: pd.DataFrame, model: str = "smollm2_135m") -> pd.DataFrame:
    (context, unit), = report.units(df[df["model"] == model])
    return unit


def test_collect_one_row_per_run(results):
    df = report.load_runs([results], progress=False)
    assert len(df) == 1 + 2 * len(BUDGETS) + 1 + 2  # the wandb copy and the non-metrics JSON are not runs
    assert df.attrs["ignored_json"] == 1
    assert set(df["benchmark"]) == {"ruler"} and set(df["context"]) == {"4096"}
    assert df.loc[df["method"] == "fullkv", "budget"].isna().all()
    locks = df[(df["method"] == "locks") & (df["model"] == "smollm2_135m")].sort_values("budget")
    assert list(locks["budget"]) == BUDGETS and list(locks["n"]) == [30, 30, 30]
    assert locks[[f"task:{t}" for t in TASKS]].iloc[0].tolist() == score("locks", 64)
    assert {"average", "bytes_read_ratio", "coverage", "attended_tokens_per_step", "context_tokens_per_step",
            "latency_ms_per_step", "budget_mode", "model"} <= set(df.columns)


def test_score_pivot_rows_columns_and_samples(results):
    unit = unit_of(report.load_runs([results], progress=False))
    piv = report.score_pivot(unit)
    assert list(piv.index) == ["FullKV", "Oracle: pages/KV head", "LOCKS", "Quest"]  # FullKV and Oracle first
    assert list(piv.columns) == ["64", "128", "2048", "n"]
    assert piv.loc["FullKV", ["64", "128", "2048"]].tolist() == [36.67] * 3  # one run, every budget column
    assert piv.loc["LOCKS", "2048"] == pytest.approx(sum(score("locks", 2048)) / 3, abs=0.01)
    assert pd.isna(piv.loc["Quest", "64"]) and pd.isna(piv.loc["Quest", "2048"])
    assert piv["n"].tolist() == [30, 30, 30, 15]
    by_budget = report.task_tables(unit)
    assert list(by_budget) == BUDGETS
    assert list(by_budget[128].index) == ["FullKV", "Oracle: pages/KV head", "LOCKS", "Quest"]
    assert list(by_budget[64].index) == ["FullKV", "Oracle: pages/KV head", "LOCKS"]
    assert list(by_budget[128].columns) == TASKS + ["average", "n"]


def test_report_files_tables_and_groups(results, tmp_path, capsys):
    out = tmp_path / "report"
    assert report.main([str(results), "--out", str(out), "--no-progress"]) == 0
    text = capsys.readouterr().out
    assert "latency_vs_context skipped" in text and "bench_decode.py" in text
    assert sorted(p.name for p in out.iterdir()) == ["ruler_smollm2_135m", "ruler_tiny", "runs.csv"]
    d = out / "ruler_smollm2_135m"
    for name in ("runs.csv", "scores.csv", "scores_by_task.csv", "scores.md", "scores.tex", "efficiency.csv",
                 "efficiency.md"):
        assert (d / name).stat().st_size > 0, name
    for fig in ("score_vs_budget", "task_heatmap", "coverage_vs_budget", "bytes_vs_context"):
        assert (d / f"{fig}.png").read_bytes()[:4] == b"\x89PNG" and (d / f"{fig}.pdf").read_bytes()[:4] == b"%PDF"
    assert not (out / "latency_vs_context.png").exists()
    csv = pd.read_csv(d / "scores.csv", index_col="method")
    assert list(csv.index) == ["FullKV", "Oracle: pages/KV head", "LOCKS", "Quest"] and list(csv.columns) == ["64", "128", "2048", "n"]
    md = (d / "scores.md").read_text()
    assert "| method | b=64 | b=128 | b=2048 | n |" in md and "| FullKV† | 36.67 | 36.67 | 36.67 | 30 |" in md
    assert "† FullKV attends every cached token" in md and "### budget 2048: score per task" in md
    tex = (d / "scores.tex").read_text()
    assert r"\toprule" in tex and r"FullKV$^\dagger$ & 36.67 & 36.67 & 36.67 & 30 \\" in tex
    assert r"niah\_single\_1" in tex
    eff = pd.read_csv(d / "efficiency.csv")
    assert eff["method"].tolist()[:4] == ["FullKV", "Oracle: pages/KV head", "Oracle: pages/KV head", "Oracle: pages/KV head"]
    assert eff.loc[eff["method"] == "FullKV", "bytes vs FullKV"].tolist() == [1.0]
    assert len(pd.read_csv(out / "runs.csv")) == 10
    assert pd.read_csv(out / "ruler_tiny" / "scores.csv", index_col="method").index.tolist() == ["FullKV", "LOCKS"]


def test_duplicates_are_an_error(results, tmp_path, capsys):
    dup = write(tmp_path / "elsewhere", "locks_b128.json", metrics("locks", 128, score("locks", 128)))
    with pytest.raises(report.DuplicateRunError) as e:
        report.load_runs([results, dup.parent], progress=False)
    msg = str(e.value)
    assert "LOCKS, b=128" in msg and str(dup) in msg and "locks_b128_run" in msg
    assert report.main([str(results), str(dup.parent), "--out", str(tmp_path / "r")]) == 2
    assert "duplicate runs" in capsys.readouterr().err
    # the same file reached through two paths is one run, not a duplicate
    assert len(report.load_runs([results, results / "sweep"], progress=False)) == 10


def test_runs_differing_in_an_option_get_labels(tmp_path):
    d = tmp_path / "r"
    write(d, "fullkv.json", metrics("fullkv", None, [1.0, 2.0, 3.0]))
    write(d, "locks_norm.json", metrics("locks", 128, [1.0, 2.0, 3.0], aggregation="norm"))
    write(d, "locks_max.json", metrics("locks", 128, [4.0, 5.0, 6.0], aggregation="max"))
    df = report.load_runs([d], progress=False)
    assert sorted(df["label"]) == ["FullKV", "LOCKS (aggregation=max)", "LOCKS (aggregation=norm)"]
    assert report.score_pivot(unit_of(df)).loc["LOCKS (aggregation=max)", "128"] == 5.0


def test_several_context_settings_split_tables(tmp_path):
    d = tmp_path / "r"
    for ctx in (4096, 8192):
        write(d / str(ctx), "fullkv.json", metrics("fullkv", None, [1.0, 2.0, 3.0], context=ctx))
        write(d / str(ctx), "locks_b128.json", metrics("locks", 128, [1.0, 2.0, 3.0], context=ctx))
    res = report.write_report([d], tmp_path / "out", progress=False)
    names = {p.name for p in res["written"]}
    assert {"scores_ctx4096.md", "scores_ctx8192.md", "score_vs_budget_ctx8192.png", "bytes_vs_context.png"} <= names
    fig = report.plot_bytes_vs_context(res["runs"])
    ax = fig.axes[0]
    lines = {ln.get_label(): ln for ln in ax.get_lines()}
    assert set(lines) == {"FullKV", "LOCKS b=128"}
    assert list(lines["FullKV"].get_xdata()) == [4096 - 180, 8192 - 180]
    assert list(lines["FullKV"].get_ydata()) == pytest.approx([22_000 * 4096 / 1e6, 22_000 * 8192 / 1e6])
    assert ax.get_xscale() == "log" and ax.xaxis.get_transform().base == 2
    assert ax.get_ylabel() == "bytes read per decode step (MB)" and "context tokens" in ax.get_xlabel()
    plt.close(fig)


def test_score_vs_budget_figure(results):
    unit = unit_of(report.load_runs([results], progress=False))
    fig = report.plot_score_vs_budget(unit, "t")
    ax = fig.axes[0]
    assert ax.get_xscale() == "log" and ax.xaxis.get_transform().base == 2
    assert ax.get_xlabel() == "token budget (log2 scale)" and ax.get_ylabel() == "average score (0-100)"
    lines = {ln.get_label(): ln for ln in ax.get_lines()}
    assert list(lines) == ["FullKV", "Oracle: pages/KV head", "LOCKS", "Quest"]  # one line per method
    assert list(lines["FullKV"].get_ydata()) == [36.67, 36.67]  # the horizontal FullKV line (axhline)
    assert list(lines["FullKV"].get_xdata()) == [0, 1]
    assert lines["Oracle: pages/KV head"].get_linestyle() == "--" and lines["LOCKS"].get_linestyle() == "-"
    assert list(lines["LOCKS"].get_xdata()) == BUDGETS
    assert list(lines["LOCKS"].get_ydata()) == pytest.approx([sum(score("locks", b)) / 3 for b in BUDGETS], abs=0.01)
    assert [t.get_text() for t in ax.get_xticklabels()] == ["64", "128", "2048"]
    assert [t.get_text() for t in ax.get_legend().get_texts()] == ["FullKV", "Oracle: pages/KV head", "LOCKS", "Quest"]
    plt.close(fig)
    fig = report.plot_coverage_vs_budget(unit)
    ax = fig.axes[0]
    assert ax.get_ylabel() == "attention-mass coverage of the selection" and ax.xaxis.get_transform().base == 2
    lines = {ln.get_label(): ln for ln in ax.get_lines()}
    assert list(lines["FullKV"].get_ydata()) == [1.0, 1.0]
    assert list(lines["LOCKS"].get_ydata()) == pytest.approx([0.6 + b / 8192 for b in BUDGETS])
    plt.close(fig)


def test_task_heatmap_figure(results):
    unit = unit_of(report.load_runs([results], progress=False))
    fig = report.plot_task_heatmap(unit)
    ax = fig.axes[0]
    rows = ["FullKV"] + [f"Oracle: pages/KV head b={b}" for b in BUDGETS] + [f"LOCKS b={b}" for b in BUDGETS] + ["Quest b=128"]
    assert [t.get_text() for t in ax.get_yticklabels()] == rows
    assert [t.get_text() for t in ax.get_xticklabels()] == TASKS
    data = ax.get_images()[0].get_array()
    assert data.shape == (len(rows), len(TASKS)) and data[0].tolist() == [100.0, 10.0, 0.0]
    assert ax.get_xlabel() == "task" and fig.axes[1].get_ylabel() == "score (0-100)"  # the colour bar
    plt.close(fig)


def latency_records(path: Path, timing: str = "cuda_graph") -> Path:
    """JSON lines in scripts/bench_decode.py's format (a run record, measurements, a check, a skip)."""
    recs = [{"kind": "run", "device": "NVIDIA H200", "args": {"dry_run": timing == "cpu_wall"}}]
    for ctx in (131072, 262144, 1048576):
        base = dict(shape="llama", context=ctx, batch=1, Hq=32, Hkv=8, d=128, budget=2048, dtype="bf16",
                    device="cuda", summaries="random")
        full = ctx / 131072 * 0.1
        for method, ms in (("sdpa_flash", full * 1.2), ("triton_full", full), ("locks_fused", 0.02),
                           ("quest_fused", 0.03), ("locks_score", 0.01)):
            recs.append({"kind": "measurement", "method": method, **base, "ms": ms, "timing": timing, "reps": 30,
                         "bytes": (2 * ctx * 8 * 128 * 2 if method in ("sdpa_flash", "triton_full") else 1e6),
                         "gbps": 1.0, **({} if method in ("sdpa_flash", "triton_full", "locks_score") else
                                         {"speedup_vs_fastest_fullkv": full / ms, "fastest_fullkv": "triton_full"})})
        recs.append({"kind": "check", "method": "locks_fused", **base, "ok": True, "max_rel_err": 1e-3})
    recs.append({"kind": "skip", "method": "sdpa_cudnn", "shape": "llama", "context": 131072, "batch": 1,
                 "reason": "no"})
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in recs))
    return path


def test_latency_figure_and_table(results, tmp_path):
    gpu = latency_records(results / "gpu" / "bench_decode.jsonl")
    res = report.write_report([results], tmp_path / "out", progress=False)
    lat = res["latency"]
    assert len(lat) == 15 and not res["skipped"]
    assert (tmp_path / "out" / "latency_vs_context.png").exists() and (tmp_path / "out" / "latency.md").exists()
    fig = report.plot_latency_vs_context(lat)
    ax, = fig.axes
    assert [ln.get_label() for ln in ax.get_lines()] == ["sdpa_flash", "triton_full", "locks_fused", "quest_fused"]
    assert ax.get_xscale() == "log" and ax.xaxis.get_transform().base == 2 and ax.get_yscale() == "log"
    assert [t.get_text() for t in ax.get_xticklabels()] == ["128K", "256K", "1M"]
    assert ax.get_ylabel() == "decode latency per layer (ms)" and "batch 1" in ax.get_title()
    plt.close(fig)
    fig = report.plot_speedup_vs_context(lat)
    lines = {ln.get_label(): ln for ln in fig.axes[0].get_lines()}
    assert list(lines["locks_fused"].get_ydata()) == pytest.approx([5.0, 10.0, 40.0])
    assert "fastest FullKV" in lines
    plt.close(fig)
    table = report.latency_table(lat)
    assert table.loc[("llama", 1, "locks_fused"), "speedup@1M"] == pytest.approx(40.0)
    # a second copy of the same measurements is an error; CPU dry-run timings are ignored
    (gpu.parent / "again.jsonl").write_text(gpu.read_text())
    with pytest.raises(report.DuplicateRunError):
        report.load_latency(sorted(gpu.parent.glob("*.jsonl")), progress=False)
    (gpu.parent / "again.jsonl").unlink()
    gpu.unlink()
    latency_records(results / "gpu" / "dry.jsonl", timing="cpu_wall")
    res = report.write_report([results], tmp_path / "out2", progress=False)
    assert len(res["latency"]) == 0 and "15 CPU dry-run records ignored" in res["skipped"][0]


def e2e_records(path: Path, timing: str = "cuda_graph", batches=(1,)) -> Path:
    """JSON lines in scripts/bench_e2e.py's format (a run record, e2e measurements, checks and a profile); at batch
    B the weights are read once and the K/V B times."""
    recs = [{"kind": "run", "script": "bench_e2e", "device": "NVIDIA H200", "args": {}}]
    for ctx, batch in itertools.product((131072, 262144, 1048576), batches):
        full_bytes = 18.8e9 + batch * ctx * 40 * 2 * 2 * 128 * 2
        full_ms = full_bytes / 4.5e9 * 1.1
        for method, ratio in (("fullkv", 1.0), ("locks", None), ("quest", None)):
            step_bytes = full_bytes if ratio else 18.8e9 + batch * 2e8
            ms = full_ms if ratio else step_bytes / 4.5e9 * 1.2
            r = {"kind": "e2e", "shape": "glm", "context": ctx, "method": method, "budget": 2048, "batch": batch,
                 "summaries": "random" if method == "locks" else None, "ms_graph": ms, "timing": timing,
                 "tokens_per_s": 1e3 / (ms * 1.05), "bytes_per_step": step_bytes, "weights_bytes": 18.8e9}
            if method != "fullkv":
                r.update(speedup_vs_fullkv=full_ms / ms, byte_ceiling=full_bytes / step_bytes)
            recs.append(r)
            recs.append({"kind": "check", "shape": "glm", "context": ctx, "method": method, "ok": True})
    recs.append({"kind": "profile", "shape": "glm", "context": 131072, "method": "locks", "top": []})
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in recs))
    return path


def test_e2e_table_and_figure(tmp_path):
    gpu = e2e_records(tmp_path / "gpu" / "e2e.jsonl")
    df = report.load_e2e([gpu])
    assert len(df) == 9 and set(df["method"]) == {"fullkv", "locks", "quest"}
    table = report.e2e_table(df)
    full_bytes = 18.8e9 + 1048576 * 40 * 2 * 2 * 128 * 2
    ceiling = full_bytes / (18.8e9 + 2e8)
    assert table.loc[("glm", 1, "locks"), "ceiling@1M"] == pytest.approx(ceiling)
    assert table.loc[("glm", 1, "locks"), "speedup@1M"] == pytest.approx(ceiling * 1.1 / 1.2)
    assert table.loc[("glm", 1, "fullkv"), "GB@128K"] == pytest.approx((18.8e9 + 131072 * 40 * 1024) / 1e9)
    assert list(table.columns[:3]) == ["ms@128K", "ms@256K", "ms@1M"]
    fig = report.plot_e2e_speedup(df)
    lines = {ln.get_label(): ln for ln in fig.axes[0].get_lines()}
    assert {"locks", "locks byte ceiling", "quest", "quest byte ceiling", "FullKV"} <= set(lines)
    assert lines["locks byte ceiling"].get_linestyle() == "--"
    assert lines["locks"].get_ydata()[-1] == pytest.approx(ceiling * 1.1 / 1.2)
    plt.close(fig)
    # batch 1 and 4 apart: a row per (shape, batch, method), a line per method and batch
    both = report.load_e2e([e2e_records(tmp_path / "batched" / "e2e.jsonl", batches=(1, 4))])
    table = report.e2e_table(both)
    assert len(table) == 6
    full4 = 18.8e9 + 4 * 1048576 * 40 * 2 * 2 * 128 * 2
    assert table.loc[("glm", 4, "locks"), "ceiling@1M"] == pytest.approx(full4 / (18.8e9 + 4 * 2e8))
    assert table.loc[("glm", 1, "locks"), "ceiling@1M"] == pytest.approx(ceiling)
    fig = report.plot_e2e_speedup(both)
    assert {"locks B=1", "locks B=4", "locks B=4 byte ceiling"} <= {ln.get_label() for ln in fig.axes[0].get_lines()}
    plt.close(fig)
    # CPU dry-run records are ignored; the same measurements twice are an error
    dry = e2e_records(tmp_path / "dry" / "e2e.jsonl", timing="eager_static")
    assert len(report.load_e2e([dry])) == 0 and report.load_e2e([dry]).attrs["cpu_dry_run"] == 9
    with pytest.raises(report.DuplicateRunError):
        report.load_e2e([gpu, gpu])


def test_paper_figs_on_fixture_results(tmp_path, capsys):
    """Each paper script on a results/ tree that has its inputs: outputs written, nothing missing."""
    from paper_figs import make_all

    res = tmp_path / "results"
    for method in ("fullkv", "oracle", "locks"):
        budgets = [None] if method == "fullkv" else [64, 2048]
        for b in budgets:
            for bench, model in (("infinitebench", "glm4_9b_chat_1m"), ("longbench", "llama3_1_8b_instruct")):
                m = metrics(method, b, [50.0, 60.0, 70.0], model=model)
                m["benchmark"] = {"benchmark": bench, "max_length": 7500}
                if bench == "infinitebench":
                    m["benchmark"] = {"template_family": "gpt4", "max_length": 7500, "context_length": 8192}
                    m["method"]["budget"] = m["budget"] = None if b is None else {64: 512, 2048: 2048}[b]
                write(res / f"{bench}_{model}" / f"{method}_{b}", "metrics.json", m)
    for directory in ("ruler_embedded", "ruler_smollm2_8k", "ruler_gemma3_16k"):
        for method in ("fullkv", "locks"):
            write(res / directory, f"{method}.json", metrics(method, None if method == "fullkv" else 128,
                                                             [4.0, 5.0, 6.0] if method == "locks" else [1.0, 2, 3]))
    latency_records(res / "gpu" / "bench_decode.jsonl")
    e2e_records(res / "gpu" / "e2e.jsonl")
    from tests.eval.test_locks_ablation import write as write_ablation

    write_ablation(res)  # results/locks_ablation/: the ablation cells at 2K and 8K
    from tests.eval.test_twilight_topp import write as write_topp

    (res / "twilight_topp").mkdir()
    for base, top_p, kept, correct in [("quest", 0.5, 10, 2), ("quest", 0.9, 50, 6), ("locks", 0.5, 20, 9)]:
        write_topp(res / "twilight_topp", base, top_p, kept, correct)  # results/twilight_topp/: the top-p cells
    shutil.copy(ROOT / "results" / "launches.json", res / "launches.json")  # the launch counter's committed output
    out = tmp_path / "out"
    assert make_all.main(["--results", str(res), "--out", str(out)]) == 0
    text = capsys.readouterr().out
    assert "skipped, missing" not in text
    assert {"locks_ablation.md", "locks_ablation.png", "memory.md", "twilight_topp.md"} <= {p.name for p in out.iterdir()}
    names = {p.name for p in out.iterdir()}
    assert {"infinitebench_scores.md", "infinitebench_scores.tex", "longbench_curve.png", "longbench_curve.pdf",
            "latency_speedup.png", "latency_vs_context.pdf", "latency_table.md", "bytes_per_step.png",
            "bytes_per_step.md", "ruler_embedded_scores.md", "ruler_embedded_score_vs_budget.png",
            "ruler_embedded_statistics.md", "ruler_gemma3_16k_scores.md", "e2e_speedup.png", "e2e_table.md",
            "claims.md", "claims.csv", "byte_ceiling.md", "byte_ceiling.csv", "launches.md", "launches.csv"} <= names
    ib = pd.read_csv(out / "infinitebench_scores.csv", index_col="method")
    assert list(ib.index) == ["FullKV", "Oracle: pages/KV head", "LOCKS"] and list(ib.columns) == ["512", "2048", "n"]
    assert "longbench_curve: no runs at budget(s) [128, 256, 512, 1024]" in text
    ruler = pd.read_csv(out / "ruler_embedded_scores.csv", index_col="method")
    assert ruler.loc["LOCKS", "128"] == 5.0


def test_make_all_on_committed_results(tmp_path):
    """`make figures` on the committed results/: exits 0, writes the RULER outputs, names what is missing."""
    out = tmp_path / "out"
    proc = subprocess.run([sys.executable, str(ROOT / "paper_figs" / "make_all.py"), "--out", str(out)],
                          cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    for name in ("ruler_embedded_scores.md", "ruler_embedded_scores.tex", "ruler_embedded_scores.csv",
                 "ruler_embedded_score_vs_budget.png", "ruler_embedded_score_vs_budget.pdf",
                 "ruler_embedded_coverage_vs_budget.png", "ruler_embedded_task_heatmap.png",
                 "ruler_embedded_efficiency.md", "ruler_embedded_statistics.md", "ruler_embedded_score_vs_bytes.png",
                 "claims.md"):
        assert (out / name).stat().st_size > 0, name
    piv = pd.read_csv(out / "ruler_embedded_scores.csv", index_col="method")
    assert {"FullKV", "Oracle: pages/KV head", "Oracle: tokens/query head", "LOCKS", "Quest", "ShadowKV", "RocketKV",
            "LRQK"} <= set(piv.index) and {"64", "128", "256", "512", "n"} <= set(piv.columns)
    claims = pd.read_csv(out / "claims.csv")
    on_gpu = claims["claim"].str.contains("speedup") | claims["source"].str.contains("no GPU record")
    unmeasured = claims[(claims["verdict"] == "not measured") & ~on_gpu]
    # at 64 (2K and 16K): LRQK's lite tokens and MagicPIG's 68 exact tokens fill that budget, no run
    suites = ("SmolLM2-135M-Instruct, RULER niah_single_2 at 2K tokens",
              "Gemma 3 270M, RULER niah_single_2 at 16K tokens")
    assert sorted(unmeasured["claim"]) == sorted(f"{method} collapses at budget 64 ({suite})"
                                                 for method in ("LRQK", "MagicPIG") for suite in suites)
    ablation = claims[claims["source"].str.contains("locks_ablation")]  # int4, int2, rank 8 at 2K and 8K, Theorem 1
    assert len(ablation) >= 7 and (ablation["verdict"] != "not measured").all()
    [power] = claims[claims["source"].str.contains("locks_int4_power")].itertuples()  # int4 over 4 tasks, n = 400
    assert "n=400" in power.measured and power.verdict != "not measured"
    assert on_gpu.sum() >= 7  # LOCKS at 128K / 256K / 1M and the anchors' four speed and memory claims
    assert (out / "memory.md").read_text().count("\n| ") >= 24  # the device-memory table needs no results
    for script in ("infinitebench_table", "longbench_curve", "latency_speedup", "bytes_per_step", "e2e_decode"):
        line = [ln for ln in proc.stdout.splitlines() if ln.startswith(f"{script}:")]
        if not (ROOT / "results" / {"infinitebench_table": "infinitebench_glm4_9b_chat_1m",
                                    "longbench_curve": "longbench_llama3_1_8b_instruct"}.get(script, "gpu")).exists():
            assert len(line) == 1 and "skipped, missing" in line[0] and "produce it with: python " in line[0]
