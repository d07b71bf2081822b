"""The masked gather of missed rows from a host store (locks/core/host_rows.py, locks/kernels/gather.py): the Triton
kernel (interpreted on CPU) equals the PyTorch reference, rows not missed are zeros and never read, and on CUDA the
store's device view aliases the pinned host memory."""
import pytest
import torch

from locks.core.host_rows import device_view, gather_missed_rows
from locks.errors import ConfigError


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("width", [24, 1024, 1500])  # one block, exactly the block cap, several blocks
def test_kernel_gathers_the_missed_rows_only(dtype, width):
    from locks.kernels import gather_rows

    g = torch.Generator().manual_seed(0)
    src = torch.randn(2, 3, 40, width, generator=g).to(dtype)
    rows = torch.stack([torch.randperm(40, generator=g)[:7] for _ in range(6)]).view(2, 3, 7)  # distinct per head
    missed = torch.rand(2, 3, 7, generator=g) < 0.5
    b, h = torch.arange(2).view(2, 1, 1).expand_as(rows), torch.arange(3).view(1, 3, 1).expand_as(rows)
    expected = torch.where(missed[..., None], src[b, h, rows], torch.zeros((), dtype=dtype))
    assert torch.equal(gather_missed_rows(src, rows, missed), expected)  # the reference (CPU tensors)
    poisoned = src.clone()
    poisoned[b[~missed], h[~missed], rows[~missed]] = float("nan")  # rows not missed must not be loaded
    assert torch.equal(gather_rows(poisoned, rows, missed), expected)
    assert torch.equal(gather_missed_rows(poisoned, rows, missed), expected)


def test_device_view_off_cuda_is_the_store_itself():
    store = torch.zeros(2, 3)
    assert device_view(store, "cpu") is store


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA (the H200 session runs it)")
def test_device_view_aliases_pinned_host_memory():
    host = torch.arange(4 * 6, dtype=torch.bfloat16).view(4, 6).pin_memory()
    view = device_view(host, "cuda")
    assert view.device.type == "cuda" and view.dtype == host.dtype and view.shape == host.shape
    host[2, 3] = 100.0  # written on the host, read by the device without a copy
    assert float(view[2, 3]) == 100.0
    out = gather_missed_rows(view.view(1, 1, 4, 6), torch.tensor([[[2, 0]]], device="cuda"),
                             torch.tensor([[[True, False]]], device="cuda"))
    assert torch.equal(out.cpu(), torch.stack([host[2], torch.zeros(6, dtype=host.dtype)]).view(1, 1, 2, 6))
    with pytest.raises(ConfigError, match="pinned"):
        device_view(torch.zeros(3), "cuda")
