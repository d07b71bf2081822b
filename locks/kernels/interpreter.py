"""The Triton interpreter (TRITON_INTERPRET=1, the CPU runs of every kernel), made to patch the language once per
launch.

A launch under the interpreter rebinds triton.language's builtins to their NumPy versions (`_patch_lang`) and
undoes that when the launch ends. It also calls `_patch_lang` again at every call of a @triton.jit helper inside
the kernel, including the combine function of each reduction (every tl.sum, tl.max): an `inspect.getmembers` scan
of the language modules that finds them already rebound and changes nothing. In kernels with reductions inside
loops (LRQK's r x r solves, binary searches) that scan was half the interpreter's time. `install()` keeps the first
patch of each set of language modules for the rest of the launch and skips the repeats. Only the interpreter's
speed changes: the launch-level patch and its restore are untouched, so every result is the same.

Two more speed-ups of the same kind, with results bit for bit the same: the NumPy dtype of a Triton dtype
(`_get_np_dtype`, which rebuilt a 20-entry table at every call) is memoized, and a reduction whose combine function
is a bitwise xor, or or and (tl.sort's bitonic merge reduces with xor at every stage) runs as one NumPy ufunc
reduction instead of the interpreter's element-by-element Python loop (exact: integer ops, any order).

Installed by locks/kernels/_common.py when the interpreter is on and these internals exist (triton 3.x); with any
other Triton nothing is changed.
"""
from __future__ import annotations

import inspect

import numpy as np


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
    langs_of: dict = {}  # id(a module's globals) -> the language modules it sees (modules live as long as the run)
    launch = executor.__call__

    def patch_once(fn):
        scope_id = id(fn.__globals__)
        langs = langs_of.get(scope_id)
        if langs is None:
            langs = langs_of[scope_id] = tuple(sorted(
                id(v) for v in fn.__globals__.values() if inspect.ismodule(v) and v in (tl, tl.core)))
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
    _memoize_np_dtype(interpreter, tl)
    _bitwise_reductions_in_numpy(interpreter, tl)
    return True


def _memoize_np_dtype(interpreter, tl) -> None:
    to_np = getattr(interpreter, "_get_np_dtype", None)
    if to_np is None:  # pragma: no cover
        return
    memo: dict = {}

    def np_dtype(tt_dtype):
        if isinstance(tt_dtype, tl.block_type):  # the element type decides
            tt_dtype = tt_dtype.element_ty
        key = ("pointer",) if isinstance(tt_dtype, tl.pointer_type) else tt_dtype
        found = memo.get(key)
        if found is None:
            found = memo[key] = to_np(tt_dtype)
        return found

    interpreter._get_np_dtype = np_dtype


def _bitwise_reductions_in_numpy(interpreter, tl) -> None:
    reduce_ops, standard = getattr(interpreter, "ReduceOps", None), getattr(tl, "standard", None)
    if reduce_ops is None or standard is None:  # pragma: no cover
        return
    ufuncs = {getattr(standard, name): ufunc for name, ufunc in
              (("_xor_combine", np.bitwise_xor), ("_or_combine", np.bitwise_or), ("_and_combine", np.bitwise_and))
              if hasattr(standard, name)}
    generic = reduce_ops.apply_impl

    def apply_impl(self, input):
        ufunc = ufuncs.get(self.combine_fn)
        if ufunc is None or len(input) != 1:
            return generic(self, input)
        x = input[0]
        data = x.handle.data
        if self.axis is None:
            out = ufunc.reduce(data.reshape(-1))
            if self.keep_dims:
                out = np.asarray(out).reshape(1)  # as the generic path: the flattened input, kept 1-d
        else:
            out = ufunc.reduce(data, axis=self.axis, keepdims=self.keep_dims)
        return self.to_tensor(out, x.dtype)

    reduce_ops.apply_impl = apply_impl
