"""The documentation stays true: every command in README.md and docs/ is checked (scripts/check_docs.py: composed
through Hydra with the schema check, or parsed by its script's argparse), the checker itself catches a planted bad
command with its file and line, the README stays within 250 lines with its headline table equal to what
`make figures` writes, every relative link resolves, and `run.py --help` / `make help` list what exists."""
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import load_script

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def check_docs():
    return load_script("check_docs")


def failures(check_docs, paths):
    out = []
    for path in check_docs.markdown_files(paths):
        for cmd in check_docs.commands_in(path):
            reason = check_docs.check(cmd)
            if reason is not None:
                out.append(f"{cmd.path}:{cmd.line}: {cmd.text}: {reason}")
    return out


def test_every_documented_command_is_valid(check_docs):
    found = [c for p in check_docs.markdown_files(check_docs.DEFAULT_FILES) for c in check_docs.commands_in(p)]
    kinds = {c.argv[1] if c.argv[0] == "python" else c.argv[0] for c in found}
    assert len(found) > 80 and {"run.py", "-m", "make", "bash"} <= kinds  # the extraction sees the docs' commands
    bad = failures(check_docs, check_docs.DEFAULT_FILES)
    assert not bad, "\n".join(bad)


BAD = [
    ("python run.py method.bogus=1", "method.bogus"),
    ("python run.py method=nosuch", "nosuch"),
    ("python run.py method=locks method.page_size=12", "method.page_size"),
    ("python run.py budget=abc", "budget"),
    ("python run.py benchmark.tasks=[niah_nothing]", "benchmark.tasks"),
    ("python run.py -m method=locks,lrqk budget=64,128", "lrqk budget=64"),  # a rejected cell, no skip_invalid
    ("python run.py -m hydra/launcher=grouped hydra.launcher.bogus=1 method=locks,quest", "bogus"),
    ("python run.py method=locks,quest", "needs -m"),
    ("python scripts/collect_runs.py a b --nosuch", "--nosuch"),
    ("python scripts/bench_sweep.py --num-samples four", "four"),
    ("python scripts/nosuch.py", "no file"),
    ("python -m eval.nosuch", "no module"),
    ("make nosuch", "no Makefile target"),
    ("bash scripts/nosuch.sh", "no file"),
    ("pytest -m 'not sloow'", "sloow"),
]
GOOD = [
    "python run.py -m hydra/launcher=grouped hydra.launcher.skip_invalid=true method=locks,lrqk budget=64,128",
    "CUDA_VISIBLE_DEVICES=1 python run.py method=quest budget=512 method.gqa=group   # a comment",
    "python scripts/collect_runs.py outputs/a results/a",
    "make test",
]


def test_the_checker_names_the_file_and_line_of_each_bad_command(check_docs, tmp_path):
    lines = ["# a page", "", "```bash"] + [c for c, _ in BAD] + [r"OLD=\"budget=512 method=quest\"",
                                                                    "python run.py $OLD \\", "    method.gqa=nosuch"]
    lines += GOOD + ["```", "", "Inline: `python run.py model=nosuch_model` and `make figures`."]
    page = tmp_path / "page.md"
    page.write_text("\n".join(lines) + "\n")
    found = failures(check_docs, [str(page)])
    for i, (cmd, needle) in enumerate(BAD):
        line = f"{page}:{4 + i}: {cmd}: "
        hit = [f for f in found if f.startswith(line)]
        assert hit and needle in hit[0], (cmd, found)
    variable_line = 4 + len(BAD) + 1  # the $OLD command, continued on the next line
    assert any(f.startswith(f"{page}:{variable_line}: ") and "method.gqa" in f for f in found), found
    inline = len(lines)
    assert any(f.startswith(f"{page}:{inline}: python run.py model=nosuch_model") for f in found), found
    assert len(found) == len(BAD) + 2, found  # the GOOD lines and `make figures` pass


@pytest.mark.parametrize("results", ["ruler_embedded", "ruler_gemma3_16k"])
def test_readme_fits_and_its_tables_are_what_make_figures_writes(results):
    """The headline table (SmolLM2, 2K tokens) and the paper-ratio table (Gemma 3 270M, 16K tokens)."""
    from eval import report
    from eval.report.tables import score_bytes_markdown
    from paper_figs.common import runs_in

    readme = (ROOT / "README.md").read_text()
    assert len(readme.splitlines()) <= 250
    df = runs_in(ROOT / "results" / results)
    [(_, group)] = list(report.groups(df))
    [(_, unit)] = list(report.units(group))
    table = [ln for ln in score_bytes_markdown(unit, "t").splitlines() if ln.startswith("|")]
    assert len(table) == 2 + unit["label"].nunique()
    assert "\n".join(table) in readme, f"a README table differs from paper_figs/out/{results}_score_bytes.md"
    assert f"paper_figs/out/{results}_score_vs_bytes.png" in readme


LINK = re.compile(r"\]\(([^)#\s]+)(#[^)]*)?\)")


def test_every_relative_link_of_the_docs_resolves():
    pages = [ROOT / "README.md", ROOT / "paper_figs" / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
    broken = []
    for page in pages:
        for target, _ in LINK.findall(page.read_text()):
            if "://" not in target and not (page.parent / target).exists():
                broken.append(f"{page.relative_to(ROOT)}: {target}")
    assert not broken, broken


def test_every_results_page_starts_with_its_command():
    for page in sorted((ROOT / "docs" / "results").glob("*.md")):
        lines = page.read_text().splitlines()
        assert lines[0].startswith("# ") and lines[2].startswith("```"), page.name


def test_run_help_lists_every_config_group_and_launcher():
    from hydra import compose, initialize_config_dir

    out = subprocess.run([sys.executable, "run.py", "--help"], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    listed = dict(re.findall(r"^([a-z_/]+): (.+)$", out.stdout, flags=re.M))
    for group in sorted(p for p in (ROOT / "conf").iterdir() if p.is_dir() and p.name != "hydra"):
        assert sorted(listed[group.name].split(", ")) == sorted(p.stem for p in group.glob("*.yaml")), group.name
    launchers = [name.split(" ")[0] for name in listed["hydra/launcher"].split(", ")]
    assert {p.stem for p in (ROOT / "conf" / "hydra" / "launcher").glob("*.yaml")} <= set(launchers)
    with initialize_config_dir(version_base="1.3", config_dir=str(ROOT / "conf")):
        for name in launchers:
            compose(config_name="config", overrides=[f"hydra/launcher={name}"], return_hydra_config=True)


def test_make_help_lists_every_target():
    out = subprocess.run(["make", "-s", "help"], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    phony = re.search(r"^\.PHONY: (.+)$", (ROOT / "Makefile").read_text(), flags=re.M).group(1).split()
    assert sorted(re.findall(r"^  make (\S+)", out.stdout, flags=re.M)) == sorted(phony)


def test_budgets_page_shows_the_forced_tokens_that_make_figures_writes():
    """docs/budgets.md's forced + scored table is forced_scored_markdown of the committed default suite, and under the
    default configuration LOCKS and the page Oracle force only the partial page (under 16 tokens per step)."""
    from eval import report
    from eval.report.tables import forced_scored_markdown
    from paper_figs.common import runs_in

    df = runs_in(ROOT / "results" / "ruler_embedded")
    [(_, group)] = list(report.groups(df))
    [(_, unit)] = list(report.units(group))
    table = [ln for ln in forced_scored_markdown(unit, "t").splitlines() if ln.startswith("|")]
    assert len(table) == 2 + unit["label"].nunique()
    assert "\n".join(table) in (ROOT / "docs" / "budgets.md").read_text()
    pages = unit[unit["method"].isin(["locks", "oracle"])]
    assert len(pages) == 8 and (pages["forced_tokens_per_step"] < 16).all()
