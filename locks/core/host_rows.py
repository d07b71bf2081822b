"""Host-resident stores read from inside a static (CUDA-graph) decode step: ShadowKV's offloaded values and LRQK's
cold K/V rows (docs/architecture.md, "Offloaded rows in a static step").

An eager step gathers the rows it misses on the host (their ids read back from the device) and copies them over.
A captured step cannot read device values on the host, so the store is read where it lies: pinned host memory is
mapped into the device's address space (unified addressing), `device_view` wraps that address as a device tensor
(no copy), and `gather_missed_rows` reads only the missed rows of a fixed-size slot list through it, in one launch
whose shape is the same at every step. The bound on the transfer is the slot list itself (every selected chunk or
top-k row may miss), so no step can exceed it. Off CUDA the store is an ordinary tensor on the CPU and the same
gather runs in PyTorch.
"""
from __future__ import annotations

import torch
from torch import Tensor

from locks.core.reference import take_rows
from locks.errors import ConfigError


def device_view(host: Tensor, device) -> Tensor:
    """`host` read in place from `device`: on CUDA a device tensor aliasing the pinned host tensor (which must
    outlive it), elsewhere `host` itself."""
    device = torch.device(device)
    if device.type != "cuda":
        return host
    if not host.is_pinned() or not host.is_contiguous():
        raise ConfigError("a host store read inside a CUDA graph must be a contiguous pinned tensor "
                          "(allocate it with pin_memory=True)")

    class _Interface:  # the CUDA array interface of the mapped pinned memory (bytes; the dtype is restored below)
        __cuda_array_interface__ = {"shape": (host.numel() * host.element_size(),), "typestr": "|u1",
                                    "data": (host.data_ptr(), False), "version": 2}

    raw = torch.as_tensor(_Interface(), device=device)
    return raw.view(host.dtype).view(host.shape)


def gather_missed_rows(store: Tensor, rows: Tensor, missed: Tensor) -> Tensor:
    """store [B, H, R, W] (a `device_view` or a tensor on the rows' device), rows [B, H, M] int64, missed
    [B, H, M] bool -> [B, H, M, W]: the named rows where `missed`, zeros elsewhere. On CUDA one Triton launch that
    loads the missed rows only (locks/kernels/gather.py); elsewhere the PyTorch reference."""
    if rows.device.type == "cuda":
        from locks.kernels import gather_rows

        return gather_rows(store, rows, missed)
    out = take_rows(store, rows)
    return torch.where(missed[..., None], out, out.new_zeros(()))
