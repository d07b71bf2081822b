"""paper_figs/locks_ablation.py and the ablation verdicts of paper_figs/claims.py on fixture runs in the real
metrics.json schema: cells found from the runs' method options, paired differences against the default layout,
coverage against the page Oracle, and each verdict's rule (including "not separated at n = ...")."""
from __future__ import annotations

import copy
import json
from pathlib import Path

import pandas as pd
import pytest

from eval.config_schema import method_schema
from eval.stats import detectable_difference
from paper_figs import claims, locks_ablation

ROOT = Path(__file__).resolve().parents[2]
TEMPLATE = json.loads((ROOT / "tests" / "fixtures" / "report" / "metrics_template.json").read_text())
N = 60


def run(method, options, correct, context, coverage=0.8, sound=1.0, bytes_per_page=484.0):
    m = copy.deepcopy(TEMPLATE)
    defaults, _ = method_schema(method)  # as a real run records them: every option of conf/method/<name>.yaml
    m["method"] = {**{k: v for k, v in defaults.items() if v is not None}, "name": method, "budget": 128, **options}
    m["budget"] = 128
    m["benchmark"] = {**m["benchmark"], "context_lengths": [context]}
    m["samples"] = {f"niah_single_2/{context}/{i}": {"task": "niah_single_2", "score": 100.0 if i < correct else 0.0}
                    for i in range(N)}
    m["scores"] = {"niah_single_2": 100.0 * correct / N}
    m["average"] = m["scores"]["niah_single_2"]
    m["num_samples"] = {"niah_single_2": N}
    m["per_length"]["task_scores"] = {str(context): dict(m["scores"])}
    m["coverage"] = coverage
    m["diagnostics"] = {"certificate": 0.3, "plugin_coverage": 0.7, "certificate_sound": sound}
    m["method_metrics"] = {"summary_bytes_per_page": bytes_per_page, "fused_scoring": 0.0}
    return m


def write(root: Path, unquantized_sound=1.0) -> Path:
    d = root / "locks_ablation"
    d.mkdir(parents=True)
    cells = {  # name: (method, options, correct of N, coverage)
        "fullkv": ("fullkv", {}, 57, 1.0), "oracle": ("oracle", {}, 56, 0.9),
        "default": ("locks", {}, 50, 0.72), "unquantized": ("locks", {"quant": "none"}, 54, 0.75),
        "centroid": ("locks", {"rank": 0}, 49, 0.6), "v_bits_2": ("locks", {"v_bits": 2}, 12, 0.4),
    }
    for context in (2048, 8192):
        for name, (method, options, correct, cov) in cells.items():
            m = run(method, options, correct, context, cov, unquantized_sound if name == "unquantized" else 1.0)
            if method == "fullkv":
                m["method"] = {"name": "fullkv", "budget": None}
                m["budget"] = None
            (d / f"{name}_{context}.json").write_text(json.dumps(m))
    return root


def test_the_ablation_table_from_fixture_runs(tmp_path):
    results = write(tmp_path)
    out = tmp_path / "out"
    assert locks_ablation.main(["--results", str(results), "--out", str(out)]) == 0
    table = pd.read_csv(out / "locks_ablation.csv")
    assert set(table["context"]) == {2048, 8192} and len(table) == 12
    row = table[(table["context"] == 8192) & (table["cell"] == "v_bits_2")].iloc[0]
    assert row["score"] == 20.0 and row["vs_default"] == -1 * (50 - 12) * 100 / N and row["vs_default_p"] < 1e-6
    assert abs(row["coverage_vs_oracle"] - 0.4 / 0.9) < 1e-9 and row["bytes_per_page"] == 484
    assert table[table["cell"] == "default"]["vs_default"].isna().all()
    assert (out / "locks_ablation.png").stat().st_size > 0
    md = (out / "locks_ablation.md").read_text()
    assert "### RULER niah_single_2, 8K tokens, budget 128" in md and "| v_bits_2 | 20.0 [" in md
    compact = locks_ablation.compact_markdown(table).splitlines()
    assert compact[0].startswith("| cell | B/page | 8K: score [95% CI] | Δ vs default, p | 2K: score")
    assert len(compact) == 2 + 6 and compact[2].startswith("| fullkv | 484 | 95 [88, 100] | +12, p=")
    assert compact[-1].startswith("| v_bits_2 | 484 | 20 [") and f"| -63, p={row['vs_default_p']:.2g} | 20 [" in compact[-1]
    only_8k = locks_ablation.compact_markdown(table, (8192, 4096)).splitlines()  # a context without runs is left out
    assert only_8k[0].count("score") == 1 and only_8k[-1].endswith(f"| -63, p={row['vs_default_p']:.2g} |")


def test_cells_are_the_conf_files_and_runs_find_theirs():
    cells = locks_ablation.cells()
    assert list(cells)[:5] == ["fullkv", "oracle", "default", "unquantized", "centroid"] and len(cells) >= 17
    assert cells["page_8"][:2] == ("locks", {"page_size": 8, "rank": 7})
    fp = json.dumps({"rank": 7, "page_size": 8, "v_bits": 4})
    assert locks_ablation.cell_of("locks", fp) == "page_8"
    assert locks_ablation.cell_of("locks", json.dumps({"rank": 7})) is None  # rank 7 at page 16: no cell
    assert locks_ablation.cell_of("quest", "{}") is None
    # the harness's forced-set options, each its own cell; both on (the earlier default) is no cell
    assert cells["sink_pages_1"][:2] == ("locks", {"sink_pages": 1})
    assert cells["recent_16"][:2] == ("locks", {"recent_window": 16})
    assert cells["recent_64"][:2] == ("locks", {"recent_window": 64})
    assert locks_ablation.cell_of("locks", json.dumps({"sink_pages": 1, "recent_window": 0})) == "sink_pages_1"
    assert locks_ablation.cell_of("locks", json.dumps({"sink_pages": 0, "recent_window": 0})) == "default"
    assert locks_ablation.cell_of("locks", json.dumps({"sink_pages": 1, "recent_window": 64})) is None


def test_ablation_verdicts(tmp_path):
    rows = {r["claim"]: r for r in claims.ablation_rows(write(tmp_path))}
    int4 = rows["int4 summaries lose a few recall points against unquantized ones (8K tokens)"]
    assert int4["verdict"] == "not separated" and "not separated at n = 60" in int4["measured"]  # 50 vs 54 of 60
    # 4 discordant pairs of 60: even all one way, McNemar cannot reach p < 0.05 with 80% power
    assert "no difference detectable at n = 60 (7% discordant pairs)" in int4["measured"]
    int2 = rows["int2 summaries collapse (2K tokens)"]["measured"]  # 42 discordant pairs of 60
    assert f"smallest detectable difference {100 * detectable_difference(60, 42 / 60):.1f} points at n = 60" in int2
    assert rows["int2 summaries collapse (2K tokens)"]["verdict"] == "holds"  # 12 vs 54: -70 points
    assert rows["the rank-8 term matters (8K tokens)"]["verdict"] == "not separated"  # 50 vs 49
    assert rows["summaries cost about 10% of the page's KV"]["verdict"] == "holds"
    assert "d=128: 804 B / 8192 B = 9.8%" in rows["summaries cost about 10% of the page's KV"]["measured"]
    assert rows["Theorem 1 holds for unquantized summaries"]["verdict"] == "holds"
    broken = {r["claim"]: r for r in claims.ablation_rows(write(tmp_path / "b", unquantized_sound=0.999))}
    assert broken["Theorem 1 holds for unquantized summaries"]["verdict"] == "does not hold"
    missing = {r["claim"]: r for r in claims.ablation_rows(tmp_path / "none")}
    assert missing["int2 summaries collapse"]["verdict"] == "not measured"


def test_the_readme_shows_the_table_the_script_writes():
    """README.md's ablation table is compact_markdown of the committed results/locks_ablation/ at 8K and 2K tokens."""
    df = locks_ablation.runs_in(ROOT / "results" / locks_ablation.RESULTS)
    assert df is not None, "results/locks_ablation/ is committed"
    table = locks_ablation.compact_markdown(locks_ablation.ablation_table(df))
    assert table.count("\n") == 1 + len(locks_ablation.cells()) and table.count("score") == 2  # every cell, both
    assert table in (ROOT / "README.md").read_text()
    assert "paper_figs/out/locks_ablation.png" in (ROOT / "README.md").read_text()


@pytest.mark.parametrize("claim,diff,p,verdict", [
    # int2 collapses: Δ(int2 - unquantized) <= -20 points at p < 0.01
    ("int2 summaries collapse", -20.0, 0.0099, "holds"),
    ("int2 summaries collapse", -20.0, 0.0101, "does not hold"),
    ("int2 summaries collapse", -40.0, 0.049, "does not hold"),
    ("int2 summaries collapse", -19.9, 1e-6, "does not hold"),
    ("int2 summaries collapse", -40.0, 0.05, "not separated"),
    # int4 loses a few points: Δ(int4 - unquantized) in [-10, 0) at p < 0.05
    ("int4 summaries lose a few recall points against unquantized ones", -10.0, 0.049, "holds"),
    ("int4 summaries lose a few recall points against unquantized ones", -0.1, 0.049, "holds"),
    ("int4 summaries lose a few recall points against unquantized ones", -10.1, 0.049, "does not hold"),
    ("int4 summaries lose a few recall points against unquantized ones", 0.0, 0.049, "does not hold"),
    ("int4 summaries lose a few recall points against unquantized ones", -3.0, 0.05, "not separated"),
    # the rank-8 term matters: Δ(rank 8 - centroid only) > 0 at p < 0.05
    ("the rank-8 term matters", 0.1, 0.049, "holds"),
    ("the rank-8 term matters", 0.0, 0.049, "does not hold"),
    ("the rank-8 term matters", 30.0, 0.05, "not separated"),
])
def test_each_ablation_rule_at_its_boundaries(tmp_path, monkeypatch, claim, diff, p, verdict):
    """Each paired rule decided on a paired difference placed just inside or just outside its thresholds."""
    results = write(tmp_path)
    monkeypatch.setattr(locks_ablation, "compare",
                        lambda by_cell, a, b: {"diff": diff, "lo": diff - 5, "hi": diff + 5, "p": p, "n": N})
    rows = {r["claim"]: r for r in claims.ablation_rows(results)}
    for context in ("2K", "8K"):
        assert rows[f"{claim} ({context} tokens)"]["verdict"] == verdict, (context, diff, p)
