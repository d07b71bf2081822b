"""How much of each method's selector file is its method and how much is framework duty (docs/adding_a_method.md,
"What a method file holds").

A function of the file is framework when it is one of the core's bookkeeping hooks (FRAMEWORK_HOOKS: construction,
memory terms, the static-decode lifecycle, accounting, metrics, errors) or a helper that only such functions call;
every other function (the selection hooks prefill, append, select, select_static, ... and the helpers they
call, directly or through others) is the method. Lines outside functions (the docstring, imports, the options
dataclass, class attributes) are counted in the total only. A file whose framework share exceeds --limit fails the
check.

    python scripts/method_lines.py            # the table
    python scripts/method_lines.py --check    # exit 1 when a file's framework share exceeds 25 %
"""
from __future__ import annotations

import argparse
import ast
import inspect
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

FRAMEWORK_HOOKS = frozenset({
    "__init__", "memory_bytes", "harness_bytes", "prefill_bytes", "static_bytes", "static_decode_error",
    "static_sample_error", "start_static", "static_state", "finish_static", "static_step_cost", "prepare_static_step",
    "extra_metrics", "prepare_options", "check_model_config", "for_model",
})


def functions(tree: ast.Module) -> dict[str, ast.FunctionDef]:
    """Every function of the module and of its classes, by name (a method and a module function of one name are
    one node: the file's own namespace)."""
    found = {}
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            found.setdefault(node.name, node)
    return found


def calls(node: ast.AST, names: set[str]) -> set[str]:
    """The file's functions that `node` names: self.f(...), f(...), or f passed along as a value."""
    out = set()
    for sub in ast.walk(node):
        if isinstance(sub, ast.Attribute) and sub.attr in names:
            out.add(sub.attr)
        elif isinstance(sub, ast.Name) and sub.id in names:
            out.add(sub.id)
    return out


def split(path: Path) -> dict:
    """{file, lines, framework, method, share}: line counts of one selector file, and framework / lines."""
    source = path.read_text()
    funcs = functions(ast.parse(source))
    names = set(funcs)
    graph = {name: calls(node, names) - {name} for name, node in funcs.items()}
    callers = {name: {c for c in names if name in graph[c]} for name in names}
    framework = FRAMEWORK_HOOKS & names
    while True:  # helpers that only framework functions call are framework too
        more = {n for n in names - framework if callers[n] and callers[n] <= framework}
        if not more:
            break
        framework |= more
    span = {name: node.end_lineno - node.lineno + 1 + len(node.decorator_list) for name, node in funcs.items()}
    shown = path.relative_to(ROOT) if path.is_relative_to(ROOT) else path
    lines, framework_lines = len(source.splitlines()), sum(span[n] for n in framework)
    return {"file": str(shown), "lines": lines, "framework": framework_lines,
            "method": sum(span[n] for n in names - framework), "share": framework_lines / lines}


def selector_files() -> dict[str, Path]:
    """Each registered method's selector file, by method name (FullKV's and the oracles' included)."""
    from locks.core.registry import discover

    return {name: Path(inspect.getsourcefile(cls)).resolve() for name, cls in sorted(discover().items())}


def table(rows: list[dict]) -> str:
    lines = ["| method | file | lines | method code | framework | framework share |", "|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['name']} | `{r['file']}` | {r['lines']} | {r['method']} | {r['framework']} | "
                     f"{r['share']:.0%} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--check", action="store_true", help="exit 1 when a file's framework share exceeds --limit")
    p.add_argument("--limit", type=float, default=0.25)
    args = p.parse_args(argv)
    rows = [{"name": name, **split(path)} for name, path in selector_files().items()]
    print(table(rows))
    over = [r["name"] for r in rows if r["share"] > args.limit]
    if args.check and over:
        print(f"framework share above {args.limit:.0%}: {', '.join(over)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
