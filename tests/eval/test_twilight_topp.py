"""paper_figs/twilight_topp.py: the cells of the top-p-over-bases study and the matched comparison, on synthetic
metrics files; and on the committed ones (results/twilight_topp/), the tables of docs/results/twilight_topp.md."""
import json
from pathlib import Path

import pytest

from paper_figs import twilight_topp


def write(directory, base, top_p, kept, correct):
    samples = {f"niah_single_2/2048/{i}": {"score": 100.0 if i < correct else 0.0, "task": "niah_single_2"}
               for i in range(10)}
    metrics = {"method": {"name": "twilight", "base": base, "top_p": top_p, "top_p_mode": "exact"}, "budget": 512,
               "samples": samples, "attended_tokens_per_step": 2 * kept, "bytes_read_per_step": 1e6 * kept,
               "method_metrics": {"twilight_tokens": kept, "twilight_tokens_max": 3 * kept}}
    (directory / f"twilight_b512_{base}_{top_p}.json").write_text(json.dumps(metrics))


def test_cells_and_the_nearest_quest_cell(tmp_path):
    d = tmp_path / "twilight_topp"
    d.mkdir()
    for base, top_p, kept, correct in [("quest", 0.5, 10, 2), ("quest", 0.9, 50, 6), ("locks", 0.5, 20, 9),
                                       ("locks", 0.9, 80, 10)]:
        write(d, base, top_p, kept, correct)
    table = twilight_topp.cells(tmp_path)
    assert list(zip(table["base"], table["top_p"])) == [("locks", 0.5), ("locks", 0.9), ("quest", 0.5), ("quest", 0.9)]
    assert table.set_index(["base", "top_p"]).loc[("quest", 0.9), "score"] == 60.0
    pairs = twilight_topp.matched(table)
    assert list(pairs["quest_top_p"]) == [0.5, 0.9]  # kept 20 is nearest 10; 80 nearest 50
    assert pairs["quest_interpolated"].iloc[0] == pytest.approx(20 + (20 - 10) / 40 * 40)  # 30.0 at 20 tokens
    assert pairs["quest_interpolated"].isna().iloc[1]  # 80 tokens: past Quest's range
    assert pairs["diff"].iloc[0] == pytest.approx(70.0)
    out = tmp_path / "out"
    assert twilight_topp.main(["--results", str(tmp_path), "--out", str(out)]) == 0
    assert "outside Quest's range" in (out / "twilight_topp.md").read_text()


def test_missing_results_is_one_line(tmp_path, capsys):
    assert twilight_topp.main(["--results", str(tmp_path), "--out", str(tmp_path / "out")]) == 0
    assert "skipped, missing" in capsys.readouterr().out


def test_the_docs_tables_are_the_committed_runs(tmp_path):
    """docs/results/twilight_topp.md shows what paper_figs/twilight_topp.py makes of results/twilight_topp/."""
    root = Path(__file__).resolve().parents[2]
    assert twilight_topp.main(["--results", str(root / "results"), "--out", str(tmp_path)]) == 0
    doc = (root / "docs" / "results" / "twilight_topp.md").read_text()
    tables = (tmp_path / "twilight_topp.md").read_text().strip().split("\n\n")
    assert len(tables) == 2 and all(t in doc for t in tables)
    assert all(f"| {base} | {p} |" in doc for base in ("locks", "quest") for p in ("0.5", "0.85", "1"))
