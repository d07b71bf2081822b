"""Helpers shared by the Triton kernels: the one launch function, interpreter detection, dot precision, launch sizes.

Only long-standing Triton features are used by the kernels (tl.load/tl.store with masks, tl.dot, tl.arange,
tl.program_id, reductions, tl.where, constexpr block sizes): the GPU image has triton 3.6, CI has 3.9 under
TRITON_INTERPRET=1; scripts/compile_kernels.py compiles every launch configuration with both (docs/kernels.md).

Every entry point launches through `launch`. Inside `recording_launches()` nothing runs: each launch is recorded
with its exact arguments (tensors may live on the "meta" device, so 1M-token shapes cost no memory), which is how
scripts/compile_kernels.py learns the configurations the entry points pick, from the entry points themselves.
"""
from __future__ import annotations

import contextlib
import dataclasses
import math
import os

import torch
import triton
import triton.language as tl

try:  # triton >= 3.0 (3.6 on the GPU image, 3.9 in CI)
    from triton.runtime.interpreter import InterpretedFunction as _Interpreted
except Exception:  # pragma: no cover
    _Interpreted = ()

if os.environ.get("TRITON_INTERPRET") == "1":
    from locks.kernels.interpreter import install as _install_interpreter_patch

    _install_interpreter_patch()  # the language patched once per launch (locks/kernels/interpreter.py)

_SMS: dict = {}
_POISON = [False]
_RECORDING: list = []  # [(launches list, SM count, resident-blocks callable)] while recording_launches() runs


@dataclasses.dataclass
class Launch:
    """One recorded kernel launch: kernel[grid](*args, **meta)."""

    kernel: object
    grid: tuple
    args: tuple
    meta: dict


DEFAULT_RESIDENT_BLOCKS = 4  # resident blocks per SM assumed where no compiled kernel says (interpreter, recording)
_RESIDENT: dict = {}


def blocks_per_sm(regs: int, num_warps: int, shared: int, *, regs_per_sm: int = 65536,
                  smem_per_sm: int = 228 * 1024, threads_per_sm: int = 2048, max_blocks: int = 32,
                  smem_reserved: int = 1024) -> tuple[int, str]:
    """(blocks of one kernel configuration resident on an SM at once, what limits them). Registers are allocated
    per warp in units of 256, each block also takes `smem_reserved` bytes of shared memory (sm_80 and later):
        by_regs = (regs_per_sm // (ceil(regs * 32 / 256) * 256)) // num_warps
        by_smem = smem_per_sm // (shared + smem_reserved),   by_threads = threads_per_sm // (32 * num_warps)."""
    per_warp = -(-max(int(regs), 1) * 32 // 256) * 256
    limits = {"registers": (regs_per_sm // per_warp) // num_warps,
              "shared memory": smem_per_sm // (int(shared) + smem_reserved),
              "threads": threads_per_sm // (32 * num_warps), "blocks": max_blocks}
    limiter = min(limits, key=limits.get)
    return limits[limiter], limiter


def resident_blocks(kernel, args: tuple, meta: dict, device: torch.device) -> int:
    """Blocks of this launch configuration resident per SM, from the compiled kernel (compiled once per configuration
    with `kernel.warmup`, cached): what `decode_splits` sizes a single wave with. DEFAULT_RESIDENT_BLOCKS off CUDA;
    while recording, what the recorder's `resident` callable answers."""
    if _RECORDING:
        hook = _RECORDING[-1][2]
        return int(hook(kernel, args, meta)) if hook is not None else DEFAULT_RESIDENT_BLOCKS
    if device.type != "cuda" or interpreted(kernel):
        return DEFAULT_RESIDENT_BLOCKS
    key = (device.index, id(kernel), tuple(a.dtype if isinstance(a, torch.Tensor) else type(a) for a in args),
           tuple(sorted(meta.items())))
    blocks = _RESIDENT.get(key)
    if blocks is None:
        compiled = kernel.warmup(*args, grid=(1,), **meta)
        compiled._init_handles()  # loads the module: fills n_regs
        props = torch.cuda.get_device_properties(device)
        blocks, _ = blocks_per_sm(
            compiled.n_regs, compiled.metadata.num_warps, compiled.metadata.shared,
            regs_per_sm=getattr(props, "regs_per_multiprocessor", 65536),
            smem_per_sm=getattr(props, "shared_memory_per_multiprocessor", 228 * 1024),
            threads_per_sm=getattr(props, "max_threads_per_multi_processor", 2048))
        blocks = _RESIDENT[key] = max(1, blocks)
    return blocks


def launch(kernel, grid: tuple, *args, **meta) -> None:
    """kernel[grid](*args, **meta), or record it inside `recording_launches()`."""
    if _RECORDING:
        _RECORDING[-1][0].append(Launch(kernel, tuple(int(g) for g in grid), args, meta))
        return
    kernel[grid](*args, **meta)


@contextlib.contextmanager
def recording_launches(sms: int = 132, resident=None):
    """Record the launches of the entry points instead of running them (yields the list they are appended to).
    Tensors may be on the meta device; `num_sms` answers `sms` (the target GPU's SM count: 132 on an H200) and
    `resident_blocks` answers resident(kernel, args, meta) (None: DEFAULT_RESIDENT_BLOCKS)."""
    launches: list = []
    _RECORDING.append((launches, int(sms), resident))
    try:
        yield launches
    finally:
        _RECORDING.pop()


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
        if t is None or (_RECORDING and t.device.type == "meta"):
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
    """Streaming multiprocessors of the device (4 under the interpreter: small grids that still split; the target's
    count while recording launches)."""
    if _RECORDING:
        return _RECORDING[-1][1]
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
