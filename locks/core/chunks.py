"""A step's temporaries bounded by working through the slots a chunk at a time (DoubleSparsity's fp64 label scores,
MagicPIG's code comparisons): the same result as one pass, with one chunk's temporaries at a time."""
from __future__ import annotations

from typing import Callable

import torch
from torch import Tensor


def by_chunks(total: int, step: int, compute: Callable[[slice], Tensor]) -> Tensor:
    """compute(slice of `step` slots) over 0 .. total - 1, joined along the last axis; one call (and no copy) when
    one chunk covers them, so a static step that fits one chunk launches nothing more."""
    parts = [compute(slice(i, min(i + step, total))) for i in range(0, total, max(1, step))]
    return parts[0] if len(parts) == 1 else torch.cat(parts, dim=-1)
