"""The import graph of the project's packages (every import statement, at module level or inside a function, read
with `ast`): no cycles, and every import goes downward through the layers of docs/architecture.md:

    locks.errors  <  locks.kernels  <  locks.core  <  methods (locks.method, baselines)  <  eval  <  bench, paper_figs

with two more rules: a method imports no other method, and the benchmark modules of eval/ (the data, prompts and
scorers of RULER, LongBench, InfiniteBench) import nothing of the selector layer but locks.errors."""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("locks", "baselines", "eval", "bench", "paper_figs")
LAYERS = [  # (prefix, layer); the longest matching prefix wins
    ("locks.errors", 0), ("locks.offline_text", 0), ("locks.kernels", 1), ("locks.core", 2), ("locks.method", 3), ("baselines", 3),
    ("eval", 4), ("bench", 5), ("paper_figs", 5), ("locks", 2),
]
METHODS = ("locks.method", "baselines")
DATA = ("locks.errors", "locks.offline_text")  # what a benchmark module may import of the selector packages
BENCHMARK_MODULES = ("eval.ruler", "eval.longbench", "eval.infinitebench", "eval.benchmarks")


def modules() -> dict[str, Path]:
    out = {}
    for package in PACKAGES:
        for path in (ROOT / package).rglob("*.py"):
            parts = path.relative_to(ROOT).with_suffix("").parts
            name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
            out[name] = path
    return out


def imports_of(name: str, path: Path, known: dict) -> set[str]:
    """Project modules imported by a module. `from pkg import x` names pkg.x when that is a module, else pkg."""
    is_package = path.name == "__init__.py"
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = name.split(".") if is_package else name.split(".")[:-1]
                anchor = anchor[: len(anchor) - node.level + 1]
                base = ".".join(anchor + ([node.module] if node.module else []))
            targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in known else base for a in node.names]
        else:
            continue
        for t in targets:
            while t and t not in known:  # `import a.b.c` of a module a.b.c; an unknown tail is an attribute
                t = t.rpartition(".")[0]
            if t and t != name and not name.startswith(t + "."):  # a module's own package: runs first anyway
                out.add(t)
    return out


def layer(name: str) -> int:
    return max(((len(p), lay) for p, lay in LAYERS if name == p or name.startswith(p + ".")), default=(0, 9))[1]


def method_of(name: str) -> str | None:
    if name == "locks.method" or name.startswith("locks.method."):
        return "locks.method"
    if name.startswith("baselines."):
        return ".".join(name.split(".")[:2])
    return None


@pytest.fixture(scope="module")
def graph():
    known = modules()
    return {name: imports_of(name, path, known) for name, path in known.items()}


def test_no_import_cycles(graph):
    state, stack, cycles = {}, [], []

    def visit(u):
        state[u] = 1
        stack.append(u)
        for v in sorted(graph.get(u, ())):
            if state.get(v) == 1:
                cycles.append(" -> ".join(stack[stack.index(v):] + [v]))
            elif v not in state:
                visit(v)
        stack.pop()
        state[u] = 2

    for m in sorted(graph):
        if m not in state:
            visit(m)
    assert not cycles, "import cycles:\n  " + "\n  ".join(cycles)


def test_imports_go_down_the_layers(graph):
    bad = []
    for src, targets in sorted(graph.items()):
        for dst in sorted(targets):
            if layer(dst) > layer(src):
                bad.append(f"{src} (layer {layer(src)}) imports {dst} (layer {layer(dst)})")
            elif method_of(src) and method_of(dst) and method_of(src) != method_of(dst):
                bad.append(f"method {method_of(src)} imports method {method_of(dst)} ({src} -> {dst})")
            elif src.startswith(BENCHMARK_MODULES) and dst.startswith(("locks", "baselines")) and dst not in DATA:
                bad.append(f"benchmark module {src} imports {dst} (only {', '.join(DATA)} are allowed)")
    assert not bad, "imports against the layering (docs/architecture.md):\n  " + "\n  ".join(bad)


def test_the_check_sees_real_edges(graph):
    """The walker finds imports at module level and inside functions (so the two tests above can fail)."""
    assert "locks.core.selector" in graph["locks.core.paging"]
    assert "locks.method.kernels" in graph["locks.method.selector"]  # a lazy import inside a method
    assert "locks.kernels.decode" in graph["locks.kernels"] and layer("locks.kernels.decode") == 1
    assert layer("baselines.quest.kernels") == 3 and method_of("baselines.quest.kernels") == "baselines.quest"
