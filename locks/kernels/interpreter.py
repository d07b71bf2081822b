"""The Triton interpreter (TRITON_INTERPRET=1, the CPU runs of every kernel), made to patch the language once per
launch.

A launch under the interpreter rebinds triton.language's builtins to their NumPy versions (`_patch_lang`) and
undoes that when the launch ends. It also calls `_patch_lang` again at every call of a @triton.jit helper inside
the kernel, including the combine function of each reduction (every tl.sum, tl.max): an `inspect.getmembers` scan
of the language modules that finds them already rebound and changes nothing. In kernels with reductions inside
loops (LRQK's r x r solves, binary searches) that scan was half the interpreter's time. `install()` keeps the first
patch of each set of language modules for the rest of the launch and skips the repeats. Only the interpreter's
speed changes: the launch-level patch and its restore are untouched, so every result is the same.

Installed by locks/kernels/_common.py when the interpreter is on and these internals exist (triton 3.x); with any
other Triton nothing is changed.
"""
from __future__ import annotations

import inspect


def install() -> bool:
    """Patch the interpreter in place (idempotent); False where its internals are not the expected ones."""
    try:
        import triton.language as tl
        from triton.runtime import interpreter
    except Exception:  # pragma: no cover
        return False
    executor = getattr(interpreter, "GridExecutor", None)
    patch, scope = getattr(interpreter, "_patch_lang", None), getattr(interpreter, "_LangPatchScope", None)
    if executor is None or patch is None or scope is None or not hasattr(executor, "__call__"):
        return False
    if getattr(patch, "_once_per_launch", False):
        return True
    patched: set = set()
    launch = executor.__call__

    def patch_once(fn):
        langs = tuple(sorted(id(v) for v in fn.__globals__.values() if inspect.ismodule(v) and v in (tl, tl.core)))
        if langs in patched:
            return scope()
        patched.add(langs)
        return patch(fn)

    def run_launch(self, *args, **kwargs):
        patched.clear()
        try:
            return launch(self, *args, **kwargs)
        finally:
            patched.clear()

    patch_once._once_per_launch = True
    interpreter._patch_lang = patch_once
    executor.__call__ = run_launch
    return True
