"""The test inventory (docs/testing_inventory.md): every test of today with its tier and what it asserts (its
docstring's first sentence, else its name), and where each test id of an earlier collection went.

    python scripts/test_inventory.py                       # writes docs/testing_inventory.md
    python scripts/test_inventory.py --check               # exit 1 when an earlier id has no place today

An earlier id is kept when today's collection has it; otherwise it moved, and MOVED names the test (file::function)
that holds its assertions now, with its parameters matched by their label (pytest's `argsN-` prefixes, which shift
when a parameter list is split, are not part of the label). Exit status 1 when an earlier id has no place.
"""
from __future__ import annotations

import argparse
import ast
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BEFORE = ROOT / "docs" / "testing_ids_before.txt"
OUT = ROOT / "docs" / "testing_inventory.md"

# file::function of an earlier collection -> the tests of today that hold its assertions
MOVED = {
    # the whole-model benchmark's dry run, in a file of its own (pytest-xdist spreads the two dry runs over workers)
    "tests/e2e/test_bench_decode.py::test_bench_e2e_dry_run": ["tests/e2e/test_bench_e2e.py::test_bench_e2e_dry_run"],
    "tests/eval/test_memory_table.py::test_the_readme_shows_the_table_the_script_writes": [
        "tests/eval/test_memory_table.py::test_docs_memory_shows_the_table_the_script_writes"],  # the table moved
    # issue 41: LOCKS / the page Oracle by default (no forced sink or recent window) and with both, as parameters
    "tests/methods/test_contract.py::test_oracle_is_optimal_by_brute_force": [
        "tests/methods/test_contract.py::test_oracle_is_optimal_by_brute_force"],
    "tests/methods/test_contract.py::test_selection_shape_forced_set_and_budget": [
        "tests/methods/test_contract.py::test_selection_shape_forced_set_and_budget"],
    "tests/e2e/test_run.py::test_bad_input_gives_one_line_error_and_nonzero_exit": [
        # the command-line contract (Hydra's own error and one of the harness's) in a subprocess, the rest in-process
        "tests/e2e/test_run.py::test_the_command_line_gives_one_line_errors_and_a_nonzero_exit",
        "tests/e2e/test_run.py::test_bad_input_gives_one_line_error_and_nonzero_exit",
    ],
    # issue 42, one decode loop: several samples are rows of their own caches (test_batch.py compares each row with
    # its sample alone); one cache with two prompts is refused
    "tests/core/test_attention.py::test_batch_of_equal_length_prompts_matches_single_rows": [
        "tests/core/test_batch.py::test_every_method_decodes_a_batch_of_different_lengths_as_each_row_alone",
        "tests/core/test_attention.py::test_generate_decodes_one_sample_per_cache"],
}

# earlier id -> the test id of today that holds its assertion, where the assertion itself changed
MOVED_IDS = {
    # issue 42: the token Oracle has a static path now (a batch of rows decodes in one step)
    "tests/core/test_static_decode.py::test_methods_without_a_static_path_say_why[oracle_token-options1]":
        "tests/core/test_static_decode.py::test_every_method_has_a_static_path_by_default",
}


def collect(marker: str | None = None) -> list[str]:
    cmd = [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider"]
    out = subprocess.run(cmd + (["-m", marker] if marker else []), cwd=ROOT, capture_output=True, text=True)
    return [line for line in out.stdout.splitlines() if "::" in line]


def function_of(test_id: str) -> str:
    return test_id.split("[", 1)[0]


def label(test_id: str) -> str:
    """The parameter label of an id, without pytest's positional `argsN-` prefixes."""
    params = test_id.split("[", 1)[1][:-1] if "[" in test_id else ""
    return re.sub(r"(^|-)args\d+(?=-|$)", r"\1", params).strip("-")


def first_sentence(text: str | None) -> str:
    if not text:
        return ""
    text = " ".join(text.split())
    m = re.search(r"\.(\s|$)", text)
    return text[: m.start() + 1] if m else text


def docstrings(path: Path) -> tuple[str, dict[str, str]]:
    tree = ast.parse(path.read_text())
    funcs = {n.name: first_sentence(ast.get_docstring(n)) for n in tree.body
             if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and n.name.startswith("test")}
    return first_sentence(ast.get_docstring(tree)), funcs


def places(before: list[str], now: list[str]) -> dict[str, str]:
    """{earlier id: the id of today that holds its assertions}; ids without a place are left out. Earlier ids that
    share a label are paired in collection order with today's ids of that label."""
    now_set, out, pending = set(now), {}, {}
    for old in before:
        if old in now_set:
            out[old] = old
            continue
        if MOVED_IDS.get(old) in now_set:
            out[old] = MOVED_IDS[old]
            continue
        targets = tuple(MOVED.get(function_of(old), [function_of(old)]))
        pending.setdefault((targets, label(old)), []).append(old)
    for (targets, lab), olds in pending.items():
        news = [n for n in now if function_of(n) in targets and label(n) == lab]
        if not news:  # a parameter list that grew: today's labels extend the earlier one ("locks" -> "locks-...")
            news = [n for n in now if function_of(n) in targets and (not lab or label(n).startswith(lab + "-"))][:1]
        out.update(zip(olds, news))
    return out


def inventory(now: list[str], slow: set[str], before: list[str]) -> tuple[str, list[str]]:
    by_file: dict[str, dict[str, list[str]]] = {}
    for t in now:
        path, func = function_of(t).split("::", 1)
        by_file.setdefault(path, {}).setdefault(func, []).append(t)
    lines = [
        "# Test inventory",
        "",
        "Generated by `python scripts/test_inventory.py` from `pytest --collect-only` and the tests' docstrings "
        "([testing.md](testing.md) has the tiers and how to run them). `slow`: the slow tier (`make test-slow`).",
        "",
        f"Today: {len(now)} test ids ({len(now) - len(slow)} in `make test`, {len(slow)} in `make test-slow`).",
        "",
    ]
    moved, missing = [], []
    where = places(before, now)
    for old in before:
        new = where.get(old)
        if new is None:
            missing.append(old)
        elif new != old:
            moved.append((old, new))
    lines += [
        "## Where the earlier ids went",
        "",
        f"The {len(before)} ids of [testing_ids_before.txt](testing_ids_before.txt): {len(before) - len(moved) - len(missing)}"
        f" kept as they were, {len(moved)} moved (below), {len(missing)} without a place.",
        "",
    ]
    if moved:
        lines += ["| earlier id | its assertions now |", "|---|---|"]
        lines += [f"| `{o}` | `{n}` |" for o, n in moved]
        lines.append("")
    if missing:
        lines += ["Without a place:", ""] + [f"- `{m}`" for m in missing] + [""]
    lines += ["## Every test of today", ""]
    for path in sorted(by_file):
        module_doc, funcs = docstrings(ROOT / path)
        lines += [f"### {path}", "", module_doc, "", "| test | ids | tier | asserts |", "|---|---|---|---|"]
        for func, ids in by_file[path].items():
            name = func.split("::")[-1]
            tier = "slow" if all(i in slow for i in ids) else "default"
            what = funcs.get(name) or name.removeprefix("test_").replace("_", " ")
            lines.append(f"| `{func}` | {len(ids)} | {tier} | {what.replace('|', '/')} |")
        lines.append("")
    return "\n".join(lines), missing


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--before", default=str(BEFORE), help="an earlier `pytest --collect-only -q` (one id a line)")
    p.add_argument("--out", default=str(OUT), help="the Markdown inventory")
    p.add_argument("--check", action="store_true", help="only check that every earlier id has a place")
    args = p.parse_args(argv)
    before = [line for line in Path(args.before).read_text().splitlines() if "::" in line]
    now = collect()
    text, missing = inventory(now, set(collect("slow")), before)
    if not args.check:
        Path(args.out).write_text(text + "\n")
        print(f"test_inventory: wrote {args.out} ({len(now)} ids)")
    for m in missing:
        print(f"test_inventory: no place for {m}", file=sys.stderr)
    return 1 if missing else 0


if __name__ == "__main__":
    sys.exit(main())
