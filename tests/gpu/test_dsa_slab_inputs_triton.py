"""The slab-ordered DSA backward's inputs on CUDA. The slab order's Triton kernel (genolc.model.ops.dsa.slab_order): the
same rows and offsets as the torch form, into poisoned buffers, on ascending rows (packed), rows in any order
(counting-sorted) and a mix, int32 and int64, strided, up to the kernel's 255 slabs; slab_order picks it for CUDA rows.
The row dot's (genolc.model.ops.dsa.row_dot): rowsum(O * dO) in fp32 at both presets' shapes. Needs CUDA."""

from __future__ import annotations

import pytest
import torch

if not torch.cuda.is_available():
    pytest.skip("needs a CUDA device", allow_module_level=True)

from genolc.model.ops.dsa import row_dot, slab_order  # noqa: E402
from slab_order_check import slab_order_problems, slab_test_rows  # noqa: E402

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("batch, length, width, kv_len, slab_rows, order, dtype, strided", [
    (2, 37, 13, 101, 32, "ascending", torch.int32, False),
    (2, 37, 13, 101, 32, "any", torch.int32, False),
    (1, 1500, 2051, 70000, 4096, "ascending", torch.int32, False),
    (2, 300, 2051, 70000, 4096, "any", torch.int64, True),
    (1, 500, 2051, 70000, 4096, "mixed", torch.int32, False),
    (2, 23, 200, 255, 1, "ascending", torch.int64, False),
    (2, 23, 200, 255, 1, "any", torch.int32, False),
    (2, 19, 50, 60, 1000, "any", torch.int32, False),
])
def test_kernel_matches_the_torch_form(batch, length, width, kv_len, slab_rows, order, dtype, strided):
    assert slab_order_problems(batch, length, width, kv_len, slab_rows, order, dtype, strided, device="cuda") == []


def test_slab_order_runs_the_kernel_on_cuda_and_the_torch_form_past_its_slabs(monkeypatch):
    calls = []
    kernel_form = slab_order.slab_order_triton
    monkeypatch.setattr(slab_order, "slab_order_triton", lambda *a, **k: calls.append(a) or kernel_form(*a, **k))
    indices = slab_test_rows(1, 9, 40, 300, "ascending", seed=0).cuda()
    slab_order.slab_order(indices, 32, 300)
    assert len(calls) == 1
    rows, offsets = slab_order.slab_order(indices, 1, 300)           # 300 slabs: the torch form
    assert len(calls) == 1 and offsets.shape[-1] == 301
    assert torch.equal(rows, slab_order.slab_order_reference(indices, 1, 300)[0])


@pytest.mark.parametrize("batch, length, heads, rank, dtype", [
    (1, 4099, 8, 256, torch.bfloat16), (2, 1001, 12, 384, torch.bfloat16), (1, 333, 5, 40, torch.float32)])
def test_row_dot_kernel_matches_float64(batch, length, heads, rank, dtype, monkeypatch):
    gen = torch.Generator(device="cuda").manual_seed(length)
    out, d_out = (torch.randn(batch, length, heads, rank, device="cuda", generator=gen).to(dtype) for _ in range(2))
    expected = (out.double() * d_out.double()).sum(-1)
    calls = []
    kernel = row_dot.row_dot_triton
    monkeypatch.setattr(row_dot, "row_dot_triton", lambda *args: calls.append(1) or kernel(*args))
    got = row_dot.row_dot(out, d_out)
    assert calls, "the dispatch ran the torch form, not the kernel"
    assert got.dtype == torch.float32 and got.shape == expected.shape
    torch_error = (row_dot.row_dot_reference(out, d_out).double() - expected).abs().max()
    assert (got.double() - expected).abs().max() <= max(2 * torch_error, 1e-6)
