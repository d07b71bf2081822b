"""The tensor memory a region of code holds at its peak, counted op by op (scripts/step_memory.py).

`LiveTensors` is a TorchDispatchMode: every storage an aten op creates inside it (not a view, not an input written
in place) is counted from its creation until it is freed (a weakref finalizer on the storage), and a storage from
before the region that an op reads and that is freed inside it (a buffer replaced by a grown copy) is taken off
again: the count is the net tensor memory since the region began. The most held at once is kept with the largest
tensors alive at that moment and the line of this repository that made each. Memory an op holds only inside its
own kernel is not seen. On CPU it agrees with the process's resident growth when freed blocks go back to the system
(MALLOC_MMAP_THRESHOLD_ set low; docs/memory.md, "A decode step")."""
from __future__ import annotations

import traceback
import weakref
from pathlib import Path

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

ROOT = Path(__file__).resolve().parents[1]


def _source_line() -> str:
    """The innermost frame of this repository's own code (not the virtual environment, not this file)."""
    for frame in reversed(traceback.extract_stack()):
        path = Path(frame.filename)
        if path.is_relative_to(ROOT) and ".venv" not in path.parts and path.name != "live_tensors.py":
            return f"{path.relative_to(ROOT)}:{frame.lineno}"
    return ""


class LiveTensors(TorchDispatchMode):
    def __init__(self, keep: int = 6):
        super().__init__()
        self.keep = keep
        self.now = self.peak = 0
        self.at_peak: list[tuple[int, str, tuple, str]] = []  # (bytes, op, shape, source line), largest first
        self._live: dict[int, tuple[int, str, tuple, str]] = {}
        self._older: set[int] = set()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        inputs = set()
        for a in tree_leaves((args, kwargs)):
            if not isinstance(a, torch.Tensor):
                continue
            storage = a.untyped_storage()
            inputs.add(storage.data_ptr())
            if storage.data_ptr() not in self._live and storage.data_ptr() not in self._older:
                # a storage from before the region that is freed inside it gives its bytes back
                self._older.add(storage.data_ptr())
                weakref.finalize(storage, self._older_freed, storage.nbytes())
        out = func(*args, **(kwargs or {}))
        for t in out if isinstance(out, (tuple, list)) else (out,):
            if not isinstance(t, torch.Tensor) or t._is_view():
                continue
            storage = t.untyped_storage()
            key = storage.data_ptr()
            if key in inputs or key in self._live or storage.nbytes() == 0:
                continue
            self._live[key] = (storage.nbytes(), str(func).removeprefix("aten."), tuple(t.shape), _source_line())
            self.now += storage.nbytes()
            weakref.finalize(storage, self._freed, key)
            if self.now > self.peak:
                self.peak = self.now
                self.at_peak = sorted(self._live.values(), key=lambda v: -v[0])[: self.keep]
        return out

    def _older_freed(self, nbytes: int) -> None:
        self.now -= nbytes

    def _freed(self, key: int) -> None:
        nbytes = self._live.pop(key, (0,))[0]
        self.now -= nbytes
