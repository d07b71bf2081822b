"""Check every command the documentation shows, without running a model (seconds; CI runs it through
tests/e2e/test_docs_commands.py).

    python scripts/check_docs.py                      # README.md, docs/**/*.md, paper_figs/README.md
    python scripts/check_docs.py docs/running.md      # some files only

A command is a line of a fenced code block, an indented code line or an inline `code` span that starts with one of
the programs below (after any VAR=value prefix; a trailing backslash continues it, `# ...` is a comment, and a
shell variable set earlier in the same block is substituted). Each is checked as it would run:

- `python run.py ...`: every job of it (a -m sweep expands to all its jobs) is composed through Hydra with the
  project's conf/, then checked by the schema (eval/config_schema.py), by building its method on a small layer (an
  invalid value is a ConfigError; cells a sweep with hydra.launcher.skip_invalid=true skips are allowed) and by
  building its benchmark (unknown tasks, bad counts). Files on disk (data, checkpoints) are not looked at.
- `python scripts/X.py ...`, `python paper_figs/X.py ...`, `python -m <project module> ...`: its argparse parser
  parses the documented arguments (and `--help` exits 0); nothing runs after the parse. `python -m <other module>`:
  the module must be importable.
- `make X`: a target of the Makefile. `bash scripts/X.sh`: the file exists. `pytest ...`: its paths exist and its
  -m markers are registered in pyproject.toml.

Each failure is one line, `file:line: command: what is wrong`; the exit status is the number of failures (max 1).
"""
from __future__ import annotations

import argparse
import contextlib
import io
import itertools
import re
import runpy
import shlex
import sys
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_FILES = ("README.md", "docs", "paper_figs/README.md")
PROGRAMS = ("python", ".venv/bin/python", "make", "bash", "pytest")
PROJECT_PACKAGES = ("eval", "locks", "bench", "baselines", "paper_figs", "scripts")
INLINE = re.compile(r"`([^`\n]+)`")
ASSIGN = re.compile(r"^([A-Za-z_][A-Za-z0-9_]*)=(.*)$")
MAX_JOBS = 64  # a documented sweep is checked job by job up to this many (beyond: the first MAX_JOBS)


@dataclass
class Command:
    path: str  # relative to the repository
    line: int
    text: str  # as written (continuations joined)
    argv: list  # after variable substitution, without VAR=value prefixes and comments


class Parsed(Exception):
    """Raised in place of returning from argparse: the documented arguments parsed, nothing more runs."""


# ------------------------------------------------------------------------------------------------- extraction

def markdown_files(args) -> list[Path]:
    out = []
    for a in args:
        p = (ROOT / a) if not Path(a).is_absolute() else Path(a)
        out += sorted(p.rglob("*.md")) if p.is_dir() else [p]
    return out


def _argv(text: str, env: dict) -> list | None:
    """The words the shell would run: $VAR / ${VAR} set earlier in the block substituted (and split), comments and
    leading VAR=value assignments dropped."""
    text = re.sub(r"\$\{?([A-Za-z_][A-Za-z0-9_]*)\}?", lambda m: env.get(m.group(1), m.group(0)), text)
    try:
        argv = shlex.split(text, comments=True)
    except ValueError:
        return None
    while len(argv) > 1 and ASSIGN.match(argv[0]) and "=" not in argv[0].split("=", 1)[0]:
        argv = argv[1:]
    return argv


def _is_command(argv) -> bool:
    if not argv or argv[0] not in PROGRAMS:
        return False
    if argv[0] in ("python", ".venv/bin/python"):
        return len(argv) > 1 and (argv[1] == "-m" or argv[1].endswith(".py"))
    return len(argv) > 1


def commands_in(path: Path) -> list[Command]:
    """The commands a markdown file shows (see the module docstring)."""
    rel = str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else str(path)
    lines = path.read_text(encoding="utf-8").splitlines()
    out, env, fenced = [], {}, False
    i = 0
    while i < len(lines):
        raw, start = lines[i], i + 1
        if raw.lstrip().startswith("```"):
            fenced, env = not fenced, {}
            i += 1
            continue
        indented = raw.startswith("    ") and not raw.lstrip().startswith(("-", "*", "|"))
        if fenced or indented:
            text = raw.strip()
            while text.endswith("\\") and i + 1 < len(lines):
                i += 1
                text = text[:-1] + " " + lines[i].strip()
            i += 1
            argv = _argv(text, env)
            if argv is not None and len(argv) == 1 and ASSIGN.match(argv[0]):
                name, value = argv[0].split("=", 1)  # VAR="..." alone on its line: a variable for the lines below
                env[name] = value
                continue
            if argv is not None and _is_command(argv):
                out.append(Command(rel, start, text, argv))
            continue
        for span in INLINE.findall(raw):
            argv = _argv(span, {})
            if argv is not None and _is_command(argv):
                out.append(Command(rel, start, span, argv))
        i += 1
    return out


# ------------------------------------------------------------------------------------------------- run.py

def _is_group(key: str) -> bool:
    """A config-group choice or a hydra key: it changes what is composed, so each of its values is composed."""
    return "/" in key or key.startswith("hydra") or (ROOT / "conf" / key).is_dir()


def _sweep(overrides: list[str], multirun: bool, preset_params: dict):
    """A command's jobs: (the override lists to compose: every combination of the swept group choices and hydra
    keys, with the fixed overrides; the (key, value, add) combinations of the other swept keys, set on each composed
    config). Swept keys come from the command line (-m) and from a preset's hydra.sweeper.params for keys the
    command line does not set."""
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.core.override_parser.types import QuotedString

    parser = OverridesParser.create()
    parsed = parser.parse_overrides(overrides)
    keys = {o.key_or_group for o in parsed}
    parsed += parser.parse_overrides([f"{k}={v}" for k, v in preset_params.items() if k not in keys])
    composed, values = [], []
    for o in parsed:
        if not o.is_sweep_override():
            composed.append([o.input_line])
        elif not multirun:
            raise ValueError(f"{o.input_line}: a sweep needs -m")
        elif _is_group(o.key_or_group):
            composed.append([f"{o.get_key_element()}={v}" for v in o.sweep_string_iterator()])
        else:
            # a quoted item ("0,N/2") is its text, as Hydra's sweeper hands it to the job
            values.append([(o.key_or_group, v.text if isinstance(v, QuotedString) else v, o.is_add())
                           for v in o.sweep_iterator()])
    product = lambda lists: [list(c) for c in itertools.islice(itertools.product(*lists), MAX_JOBS)]  # noqa: E731
    return product(composed), product(values)


def check_run(argv: list[str]) -> None:
    """Raise with the reason when a `python run.py` command would stop before any work."""
    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf, open_dict

    from eval.benchmarks import build_benchmark
    from eval.config_schema import check_config
    from eval.runner import rejected

    args = argv[2:]
    if any(a in ("--help", "-h", "--hydra-help") for a in args):
        return
    flags = [a for a in args if a.startswith("-") and a not in ("-m", "--multirun")]
    if flags:
        raise ValueError(f"unknown option {flags[0]} (the checker knows -m, --multirun, --help)")
    multirun = len(flags) < len([a for a in args if a.startswith("-")])
    overrides = [a for a in args if a not in ("-m", "--multirun")]
    valid = 0
    with initialize_config_dir(version_base="1.3", config_dir=str(ROOT / "conf")):
        base = compose(config_name="config", overrides=[o for o in overrides if "," not in o.split("=", 1)[-1]
                                                        or o.split("=", 1)[-1].startswith("[")],
                       return_hydra_config=True)
        params = base.hydra.sweeper.get("params")
        multirun = multirun or str(base.hydra.mode) == "RunMode.MULTIRUN"
        composed, values = _sweep(overrides, multirun, OmegaConf.to_container(params) if params and multirun else {})
        for job in composed:
            cfg = compose(config_name="config", overrides=job, return_hydra_config=True)
            choices = OmegaConf.to_container(cfg.hydra.runtime.choices)
            skip_invalid = bool(OmegaConf.select(cfg, "hydra.launcher.skip_invalid", default=False))
            with open_dict(cfg):
                del cfg["hydra"]
            for combination in values:
                one = cfg.copy()
                for key, value, add in combination:
                    OmegaConf.update(one, key, value, merge=False, force_add=add)
                check_config(one, choices)
                build_benchmark(one.benchmark)
                reason = rejected(OmegaConf.to_container(one, resolve=True))
                if reason is not None and not skip_invalid:
                    label = " ".join(job + [f"{k}={v}" for k, v, _ in combination])
                    raise ValueError(f"job {label}: {reason}")
                valid += reason is None
    if not valid:
        raise ValueError("every job of the sweep is rejected")


# ------------------------------------------------------------------------------------------------- scripts

@contextlib.contextmanager
def _parse_only():
    """argparse stops right after a successful parse (Parsed), so a script's main() never runs its work."""
    original, known = argparse.ArgumentParser.parse_args, argparse.ArgumentParser.parse_known_args
    inside = []  # parse_args calls parse_known_args: only the outermost call stops

    def parse_args(self, args=None, namespace=None):
        inside.append(1)
        try:
            original(self, args, namespace)
        finally:
            inside.pop()
        raise Parsed

    def parse_known_args(self, args=None, namespace=None):
        result = known(self, args, namespace)
        if inside:
            return result
        raise Parsed

    argparse.ArgumentParser.parse_args, argparse.ArgumentParser.parse_known_args = parse_args, parse_known_args
    try:
        yield
    finally:
        argparse.ArgumentParser.parse_args, argparse.ArgumentParser.parse_known_args = original, known


def _parse_with(target: str, is_module: bool, args: list[str]) -> None:
    """Run the script or module as __main__ with `args` until its parser has parsed them."""
    saved = sys.argv[:]
    sys.argv = [target, *args]
    err = io.StringIO()
    try:
        with _parse_only(), contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            if is_module:
                runpy.run_module(target, run_name="__main__", alter_sys=True)
            else:
                runpy.run_path(str(ROOT / target), run_name="__main__")
    except Parsed:
        return
    except SystemExit as e:
        if e.code in (0, None):
            return
        lines = [ln for ln in err.getvalue().splitlines() if ln.strip()]
        raise ValueError(lines[-1] if lines else f"exit status {e.code}") from None
    finally:
        sys.argv = saved
    raise ValueError("it parsed no arguments (no argparse parser was reached)")


def check_python(argv: list[str]) -> None:
    import importlib.util

    if argv[1] == "run.py":
        return check_run(argv)
    if argv[1] == "-m":
        module, args = argv[2], argv[3:]
        if module.split(".")[0] not in PROJECT_PACKAGES:
            if module == "pytest":
                return check_pytest(["pytest", *args])
            if importlib.util.find_spec(module.split(".")[0]) is None or importlib.util.find_spec(module) is None:
                raise ValueError(f"no module named {module}")
            return
        if importlib.util.find_spec(module) is None:
            raise ValueError(f"no module named {module}")
        _parse_with(module, True, ["--help"])
        return _parse_with(module, True, args)
    script = argv[1]
    if not (ROOT / script).is_file():
        raise ValueError(f"no file {script}")
    _parse_with(script, False, ["--help"])
    _parse_with(script, False, argv[2:])


def make_targets() -> set[str]:
    text = (ROOT / "Makefile").read_text()
    return set(re.findall(r"^([A-Za-z][A-Za-z0-9_-]*):", text, flags=re.M))


def check_pytest(argv: list[str]) -> None:
    import tomllib

    markers = {m.split(":")[0].strip() for m in
               tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["pytest"]["ini_options"]["markers"]}
    args = argv[1:]
    takes_value = ("-m", "-k", "-n", "-p", "--dist", "--durations", "--timeout", "--junitxml")  # "-n 2", not a path
    for i, a in enumerate(args):
        if a == "-m" and i + 1 < len(args):
            names = set(re.findall(r"[A-Za-z_]+", args[i + 1])) - {"not", "and", "or"}
            if names - markers:
                raise ValueError(f"unregistered marker(s) {sorted(names - markers)} (pyproject.toml: {sorted(markers)})")
        elif not a.startswith("-") and (i == 0 or args[i - 1] not in takes_value):
            if not (ROOT / a.split("::")[0]).exists():
                raise ValueError(f"no test path {a}")


def check(cmd: Command) -> str | None:
    """None when the command is fine, else what is wrong."""
    from locks.errors import ConfigError

    argv = cmd.argv
    try:
        if argv[0] in ("python", ".venv/bin/python"):
            check_python(argv)
        elif argv[0] == "make":
            missing = [t for t in argv[1:] if not t.startswith("-") and "=" not in t and t not in make_targets()]
            if missing:
                raise ValueError(f"no Makefile target {missing[0]}")
        elif argv[0] == "bash":
            if not (ROOT / argv[1]).is_file():
                raise ValueError(f"no file {argv[1]}")
        elif argv[0] == "pytest":
            check_pytest(argv)
    except ConfigError as e:
        return f"error: {e}"
    except Exception as e:  # noqa: BLE001 -- Hydra's composition errors, parser errors: the reason, one line
        return f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
    return None


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("files", nargs="*", default=list(DEFAULT_FILES), help="markdown files or folders")
    ap.add_argument("--timing", action="store_true", help="print the seconds each check took")
    args = ap.parse_args(argv)
    failures = total = 0
    for path in markdown_files(args.files):
        for cmd in commands_in(path):
            total += 1
            t = time.perf_counter()
            reason = check(cmd)
            if args.timing:
                print(f"{time.perf_counter() - t:6.2f} s  {cmd.path}:{cmd.line}")
            if reason is not None:
                failures += 1
                print(f"{cmd.path}:{cmd.line}: {cmd.text}: {reason}")
    print(f"check_docs: {total} commands, {failures} failing")
    return min(failures, 1)


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    sys.exit(main())
