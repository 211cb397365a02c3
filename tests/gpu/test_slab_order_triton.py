"""The DSA backward's slab order in Triton (genolc.model.ops.dsa.triton_slab_order) against the pure-torch reference
(backward_slabs.slab_order), bit for bit: odd widths (1 to the widest row it sorts), slabs that do not divide the
keys, bounds counted in the kernel and by torch.searchsorted, int32 and int64 rows, strided rows, -1 slots anywhere
and wholly empty rows, values the model never writes (other negatives, int64 past int32, duplicates, keys past
kv_len), outputs into NaN-poisoned memory; and that the slab-ordered backward runs it on CUDA. Needs CUDA
(benchmarks/bench_slab_order.py times it)."""

from __future__ import annotations

import pytest
import torch

if not torch.cuda.is_available():
    pytest.skip("needs a CUDA device", allow_module_level=True)

from genolc.model.ops.dsa import triton_slab_order  # noqa: E402
from genolc.model.ops.dsa.tilelang import backward_slabs  # noqa: E402

pytestmark = pytest.mark.gpu


def distinct_rows(batch, length, width, kv_len, dtype, holes, seed) -> torch.Tensor:
    """``[B, T, W]`` rows of distinct keys below ``kv_len`` (one in each of W strata, shuffled within the row), a
    fraction ``holes`` of them -1, the first row of each window all -1."""
    gen = torch.Generator(device="cuda").manual_seed(seed)
    stratum = kv_len // width
    keys = torch.randint(0, stratum, (batch, length, width), generator=gen, device="cuda")
    keys += torch.arange(width, device="cuda") * stratum
    keys = keys.gather(-1, torch.rand(keys.shape, generator=gen, device="cuda").argsort(-1))
    keys = keys.masked_fill(torch.rand(keys.shape, generator=gen, device="cuda") < holes, -1)
    keys[:, 0] = -1
    return keys.to(dtype)


def assert_same_as_reference(indices, slab_rows, kv_len, poison, **options):
    expected = backward_slabs.slab_order(indices, slab_rows, kv_len)
    poison()
    rows, offsets = triton_slab_order.slab_order(indices, slab_rows, kv_len, **options)
    for mine, want in ((rows, expected[0]), (offsets, expected[1])):
        assert mine.dtype == torch.int32 and mine.is_contiguous() and mine.device == indices.device
        assert mine.shape == want.shape
        assert torch.equal(mine, want), f"{int((mine != want).sum())} entries differ"
    return rows, offsets


@pytest.mark.parametrize("batch, length, width, slab_rows, kv_len, dtype", [
    (1, 1, 1, 16, 101, torch.int32),
    (2, 37, 5, 16, 101, torch.int64),
    (2, 301, 2051, 32768, 524287, torch.int32),        # `base`/`small` at 512k keys: 17 bounds in the kernel
    (1, 1000, 2051, 32768, 1048573, torch.int32),      # 1M keys: 33 bounds
    (1, 300, 2051, 4096, 1000003, torch.int64),        # 246 bounds: torch.searchsorted
    (3, 77, 4096, 1000, 50001, torch.int32),           # a width that is its own block
    (2, 50, 4097, 1000, 50001, torch.int64),           # one past it: an 8,192-key block
    (1, 20, triton_slab_order.MAX_WIDTH, 4096, 100003, torch.int32),
    (1, 20, 700, 1, 60000, torch.int32),               # 60,000 one-row slabs
])
def test_matches_the_reference(batch, length, width, slab_rows, kv_len, dtype, poison):
    indices = distinct_rows(batch, length, width, kv_len, dtype, holes=0.2, seed=width + length)
    rows, offsets = assert_same_as_reference(indices, slab_rows, kv_len, poison)
    assert torch.equal(offsets[:, 0, -1], torch.zeros_like(offsets[:, 0, -1]))
    assert torch.equal(offsets[..., -1], (indices >= 0).sum(-1).int())


@pytest.mark.parametrize("dtype", [torch.int32, torch.int64])
def test_values_the_model_never_writes(dtype, poison):
    big = [2 ** 31, 2 ** 32 + 3, 2 ** 31 - 1, -2 ** 40] if dtype == torch.int64 else [2 ** 31 - 1, -2 ** 31]
    values = [5, -7, *big, 2 ** 31 - 2, -1, 0, 999, 1000, 5, 5, 1001, 2 ** 30]
    row = torch.tensor(values, dtype=dtype, device="cuda")
    indices = torch.stack([row, row.flip(0), torch.full_like(row, 7), torch.full_like(row, -3)])[None]
    for slab_rows in (1, 64, 999, 2 ** 31 - 5):
        assert_same_as_reference(indices, slab_rows, 1000, poison)
        assert_same_as_reference(indices, slab_rows, 1000, poison, kernel_bounds=0)


def test_strided_empty_and_forced_paths(poison):
    indices = distinct_rows(2, 129, 2051, 524287, torch.int32, holes=0.5, seed=1)
    wide = torch.full((2, 129, 2060), -9, dtype=torch.int32, device="cuda")
    wide[..., :2051] = indices
    assert_same_as_reference(wide[..., :2051], 32768, 524287, poison)
    assert_same_as_reference(indices.transpose(0, 1).contiguous().transpose(0, 1), 32768, 524287, poison)
    for options in ({"kernel_bounds": 0}, {"warps": 8}, {"warps": 16}, {"warps": 2}):
        assert_same_as_reference(indices, 32768, 524287, poison, **options)
    assert_same_as_reference(torch.full((3, 5, 2051), -1, dtype=torch.int64, device="cuda"), 32768, 524287, poison)
    for shape in ((2, 0, 2051), (2, 3, 0)):
        assert_same_as_reference(torch.zeros(shape, dtype=torch.int32, device="cuda"), 4, 10, poison)


def test_refuses_what_the_reference_refuses_and_rows_too_wide():
    indices = torch.tensor([[[5, -1, 0, 3]]], device="cuda")
    for slab_rows, kv_len, match in ((0, 6, "slab_rows"), (4, 2 ** 31, "kv_len"),
                                     (1, backward_slabs.MAX_SLABS + 1, "use slab_rows >= 2")):
        for order in (backward_slabs.slab_order, triton_slab_order.slab_order):
            with pytest.raises(ValueError, match=match):
                order(indices, slab_rows, kv_len)
    too_wide = torch.zeros(1, 1, triton_slab_order.MAX_WIDTH + 1, dtype=torch.int32, device="cuda")
    with pytest.raises(ValueError, match="backward_slabs.slab_order"):
        triton_slab_order.slab_order(too_wide, 4, 10)


@pytest.mark.parametrize("width, expected", [(2051, "triton"), (triton_slab_order.MAX_WIDTH + 1, "torch")])
def test_the_slab_ordered_backward_sorts_with_triton_on_cuda(width, expected, monkeypatch):
    """The backward's order on CUDA rows (its TileLang kernel replaced by a stub: this is about the order's call)."""
    ran = []
    triton_order, torch_order = triton_slab_order.slab_order, backward_slabs.slab_order
    monkeypatch.setattr(triton_slab_order, "slab_order", lambda *args: ran.append("triton") or triton_order(*args))
    monkeypatch.setattr(backward_slabs, "slab_order", lambda *args: ran.append("torch") or torch_order(*args))
    monkeypatch.setattr(backward_slabs, "compiled_slabbed_backward_kernel", lambda *args: lambda *tensors: None)
    q_lat = torch.zeros(1, 3, 2, 64, dtype=torch.bfloat16, device="cuda")
    latent = torch.zeros(1, 5000, 64, dtype=torch.bfloat16, device="cuda")
    indices = torch.randint(-1, 5000, (1, 3, width), dtype=torch.int32, device="cuda")
    lse = torch.zeros(1, 3, 2, device="cuda")
    backward_slabs.sparse_latent_attention_backward_slabs(q_lat, latent, indices, q_lat, lse, q_lat, 0.25,
                                                          slab_rows=1000)
    assert ran == [expected]
