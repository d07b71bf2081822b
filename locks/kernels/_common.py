"""Helpers shared by the Triton kernels: interpreter detection, dot precision, launch sizes.

Only long-standing Triton features are used by the kernels (tl.load/tl.store with masks, tl.dot, tl.arange,
tl.program_id, reductions, tl.where, constexpr block sizes): the GPU image has triton 3.6, CI has 3.9 under
TRITON_INTERPRET=1.
"""
from __future__ import annotations

import contextlib
import math

import torch
import triton
import triton.language as tl

try:  # triton >= 3.0 (3.6 on the GPU image, 3.9 in CI)
    from triton.runtime.interpreter import InterpretedFunction as _Interpreted
except Exception:  # pragma: no cover
    _Interpreted = ()

_SMS: dict = {}
_POISON = [False]


def empty(*shape, dtype: torch.dtype, device) -> torch.Tensor:
    """torch.empty for every kernel output and workspace; NaN-filled (floats) inside `poisoned()`, so that tests
    catch elements a kernel fails to write."""
    t = torch.empty(*shape, dtype=dtype, device=device)
    if _POISON[0] and t.is_floating_point():
        t.fill_(float("nan"))
    return t


@contextlib.contextmanager
def poisoned():
    """Test hook: outputs and workspaces allocated by the kernels' entry points start as NaN."""
    old = _POISON[0]
    _POISON[0] = True
    try:
        yield
    finally:
        _POISON[0] = old


def interpreted(kernel) -> bool:
    """True when `kernel` was decorated under TRITON_INTERPRET=1 (it then runs on CPU tensors through numpy)."""
    return bool(_Interpreted) and isinstance(kernel, _Interpreted)


def check_device(kernel, *tensors: torch.Tensor) -> None:
    """Kernels run on CUDA tensors, or on CPU tensors under the Triton interpreter; anything else is an error."""
    for t in tensors:
        if t is None:
            continue
        if t.device.type == "cuda":
            if interpreted(kernel):
                raise RuntimeError("TRITON_INTERPRET=1 was set when the kernels were imported: they cannot run on CUDA "
                                   "tensors in this process")
            continue
        if t.device.type == "cpu" and interpreted(kernel):
            continue
        raise RuntimeError(f"Triton kernels need CUDA tensors (or TRITON_INTERPRET=1 set before importing "
                           f"locks.kernels for CPU tensors); got a tensor on {t.device}")


def dot_in_f32(kernel, *dtypes: torch.dtype) -> bool:
    """Whether a kernel's tl.dot runs on fp32 operands (IEEE precision, never TF32) instead of 16-bit ones.

    16-bit tensor-core dots are used only when every operand is already 16-bit (bf16/fp16 products are exact and
    accumulate in fp32). The interpreter's bf16 dot multiplies raw bit patterns (triton 3.9: np.matmul on the uint16
    storage), so under the interpreter the same operands (already rounded to 16 bits) are upcast and the dot runs in
    fp32: the products are identical, only the accumulation order differs from the GPU.
    """
    if interpreted(kernel):
        return True
    return not all(dt in (torch.bfloat16, torch.float16) for dt in dtypes)


def num_sms(device: torch.device) -> int:
    """Streaming multiprocessors of the device (4 under the interpreter: small grids that still split)."""
    if device.type != "cuda":
        return 4
    idx = device.index if device.index is not None else torch.cuda.current_device()
    if idx not in _SMS:
        _SMS[idx] = torch.cuda.get_device_properties(idx).multi_processor_count
    return _SMS[idx]


def pow2(x: int, minimum: int = 1) -> int:
    return max(minimum, triton.next_power_of_2(max(1, int(x))))


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


def tl_dtype(dtype: torch.dtype):
    return {torch.float32: tl.float32, torch.bfloat16: tl.bfloat16, torch.float16: tl.float16}[dtype]


LOG2E = math.log2(math.e)
