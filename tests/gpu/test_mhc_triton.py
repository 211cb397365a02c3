"""The fused mHC kernels (genolc/model/ops/mhc/triton.py: the mixing logits, the block input; comb_triton.py: the
mixing matrix) and their custom ops on CUDA against the pure-torch reference in fp64. Needs CUDA."""

from __future__ import annotations

import pytest
import torch

if not torch.cuda.is_available():
    pytest.skip("needs a CUDA device", allow_module_level=True)

from genolc.model.ops import dispatch  # noqa: E402
from genolc.model.ops.mhc import op, reference, triton as mhc_triton  # noqa: E402

pytestmark = pytest.mark.gpu

EPS = 1e-6


def _exact(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    x64 = x.double()
    return torch.rsqrt(x64.square().mean(-1, keepdim=True) + EPS) * (x64 @ weight.double().t())


def _streams(rows: int, cols: int, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator(device="cuda").manual_seed(rows + cols)
    x = torch.randn(rows, cols, generator=gen, device="cuda") * torch.rand(rows, 1, generator=gen, device="cuda") * 4
    weight = torch.randn(24, cols, generator=gen, device="cuda") * 0.02
    return x.to(dtype), weight


def _relative(actual: torch.Tensor, expected: torch.Tensor) -> float:
    actual, expected = actual.detach().double(), expected.detach().double()
    return float((actual - expected).norm() / expected.norm())


@pytest.mark.parametrize("rows, cols, dtype, tf32", [
    (1, 4096, torch.float32, False),
    (37, 6144, torch.float32, True),
    (32771, 4096, torch.float32, True),
    (32771, 6144, torch.float32, False),
    (5003, 6144, torch.bfloat16, True),
])
def test_kernel_matches_exact_logits(rows, cols, dtype, tf32):
    x, weight = _streams(rows, cols, dtype)
    out = torch.full((rows, 24), float("nan"), device="cuda")
    got, rstd = mhc_triton.fused_mixing_logits(x, weight, EPS, tf32=tf32, out=out)
    assert got is out and bool(torch.isfinite(got).all())
    # TF32 keeps 10 mantissa bits of each operand: ~2^-11 per product, averaging out over K.
    assert _relative(got, _exact(x, weight)) < (2e-3 if tf32 else 1e-5)
    assert _relative(rstd, torch.rsqrt(x.double().square().mean(-1) + EPS)) < 1e-6


@pytest.mark.parametrize("dtype, config", [
    (torch.float32, mhc_triton.DEFAULT_CONFIG),
    (torch.bfloat16, mhc_triton.DEFAULT_CONFIG),
    (torch.float32, mhc_triton.KernelConfig(64, 128, 4, stages=3, tile_in_registers=True)),
])
def test_forward_gives_the_same_bits_on_every_call(dtype, config):
    # Pipelined with fp32 streams in shared memory, the kernel refilled a tile that its asynchronous TF32 product
    # still read (KernelConfig's note): one run of six of `small`'s forward at 64k differed. 300 calls on 64k tokens
    # of `small`'s streams (K = 4096), each compared with the first bit for bit.
    x, weight = _streams(65536, 4096, dtype)
    first, first_rstd = mhc_triton.fused_mixing_logits(x, weight, EPS, tf32=True, config=config)
    differing = 0
    for _ in range(300):
        got, rstd = mhc_triton.fused_mixing_logits(x, weight, EPS, tf32=True, config=config)
        differing += int(not torch.equal(got, first)) + int(not torch.equal(rstd, first_rstd))
    assert differing == 0, f"{differing} of 300 calls gave other logits or rstd than the first"


@pytest.mark.parametrize("config", [mhc_triton.KernelConfig(32, 128, 4), mhc_triton.KernelConfig(128, 32, 8),
                                    mhc_triton.KernelConfig(64, 128, 4, stages=3, tile_in_registers=True)])
def test_other_tile_configs(config):
    x, weight = _streams(4099, 6144, torch.float32)
    got, _ = mhc_triton.fused_mixing_logits(x, weight, EPS, tf32=False, config=config)
    assert _relative(got, _exact(x, weight)) < 1e-5


@pytest.mark.parametrize("rows, dtype, config", [
    (32771, torch.float32, mhc_triton.DEFAULT_BACKWARD_CONFIG),
    (4099, torch.float32, mhc_triton.BackwardConfig(1024, 32, 128, 8, 3)),
    (37, torch.bfloat16, mhc_triton.DEFAULT_BACKWARD_CONFIG),
])
def test_backward_kernel_matches_exact_gradients(rows, dtype, config):
    x, weight = _streams(rows, 6144, dtype)
    grad = torch.randn(rows, 24, device="cuda")
    logits, rstd = mhc_triton.fused_mixing_logits(x, weight, EPS, tf32=False)
    scaled = grad * rstd[:, None]
    coef = rstd.square() / x.shape[1] * (grad * logits).sum(-1)
    dx, dweight = mhc_triton.fused_mixing_logits_backward(scaled, coef, x, weight, tf32=False, config=config)
    x64, weight64 = x.double().requires_grad_(), weight.double().requires_grad_()
    expected = torch.autograd.grad(_exact(x64, weight64), (x64, weight64), grad.double())
    assert dx.dtype == dtype and dweight.dtype == torch.float32
    assert _relative(dx, expected[0]) < (3e-3 if dtype == torch.bfloat16 else 1e-5)
    assert _relative(dweight, expected[1]) < 1e-5


def test_strided_rows_odd_width_and_bf16_weight():
    """x as rows of a wider buffer (stride(0) != K), K off every tile grid, 40 logits, a bf16 weight."""
    gen = torch.Generator(device="cuda").manual_seed(7)
    x = torch.randn(1001, 4160, generator=gen, device="cuda")[:, :4100]
    weight = (torch.randn(40, 4100, generator=gen, device="cuda") * 0.02).bfloat16()
    grad = torch.randn(1001, 40, generator=gen, device="cuda")
    logits, rstd = mhc_triton.fused_mixing_logits(x, weight, EPS, tf32=False)
    assert _relative(logits, _exact(x, weight)) < 1e-5
    scaled = grad * rstd[:, None]
    coef = rstd.square() / x.shape[1] * (grad * logits).sum(-1)
    dx, dweight = mhc_triton.fused_mixing_logits_backward(scaled, coef, x, weight, tf32=False)
    x64, weight64 = x.double().requires_grad_(), weight.double().requires_grad_()
    expected = torch.autograd.grad(_exact(x64, weight64), (x64, weight64), grad.double())
    assert dx.is_contiguous() and _relative(dx, expected[0]) < 1e-5
    assert dweight.dtype == torch.bfloat16 and _relative(dweight, expected[1]) < 3e-3


def test_dispatch_sends_what_the_kernels_do_not_take_to_the_reference(monkeypatch):
    calls = []
    monkeypatch.setattr(op, "mixing_logits", lambda *args: calls.append(args) or reference.mixing_logits(*args))
    x64, weight64 = (t.double() for t in _streams(37, 4096, torch.float32))
    assert torch.equal(dispatch.mhc_mixing_logits(x64, weight64, EPS), reference.mixing_logits(x64, weight64, EPS))
    x, _ = _streams(37, 4096, torch.float32)
    wide = torch.randn(160, 4096, device="cuda") * 0.02          # more logits than MAX_LOGITS
    assert torch.equal(dispatch.mhc_mixing_logits(x, wide, EPS), reference.mixing_logits(x, wide, EPS))
    assert not calls
    weight = torch.randn(24, 4096, device="cuda") * 0.02
    dispatch.mhc_mixing_logits(x, weight, EPS)
    assert len(calls) == 1


@pytest.mark.parametrize("compiled", [False, True])
def test_op_gradients_under_autocast(compiled):
    """The op as the model calls it (bf16 autocast on: TF32 products forward and backward), eagerly and inside
    torch.compile, against fp64 autograd."""
    x, weight = _streams(3001, 6144, torch.float32)
    x.requires_grad_()
    weight.requires_grad_()
    grad = torch.randn(3001, 24, device="cuda")
    function = torch.compile(op.mixing_logits, dynamic=False) if compiled else op.mixing_logits
    with torch.autocast("cuda", dtype=torch.bfloat16):
        logits = function(x, weight, EPS)
    assert logits.dtype == torch.float32
    mine = torch.autograd.grad(logits, (x, weight), grad)
    x64, weight64 = x.detach().double().requires_grad_(), weight.detach().double().requires_grad_()
    expected = torch.autograd.grad(_exact(x64, weight64), (x64, weight64), grad.double())
    assert _relative(logits, _exact(x, weight)) < 2e-3
    # 355bc9d on the H200: dx 7.4e-4 (TF32).
    assert mine[0].dtype == torch.float32 and _relative(mine[0], expected[0]) < 2e-3
    assert _relative(mine[1], expected[1]) < 2e-3


def _comb_logits(rows: int, n: int) -> torch.Tensor:
    gen = torch.Generator(device="cuda").manual_seed(rows + n)
    return torch.randn(rows, n, n, generator=gen, device="cuda") * 3


@pytest.mark.parametrize("rows, n, iterations", [(1, 4, 20), (37, 4, 20), (70001, 4, 20), (1001, 3, 20),
                                                 (513, 8, 5)])
def test_comb_kernels_match_fp64_autograd(rows, n, iterations):
    """Softmax and Sinkhorn fused (genolc/model/ops/mhc/comb_triton.py), into a NaN-filled output, against fp64
    autograd of the reference: rows off the 64-token block, N off a power of two, more rows than one backward launch
    takes (BACKWARD_ROWS)."""
    from genolc.model.ops.mhc import comb_triton

    logits = _comb_logits(rows, n)
    grad = torch.randn_like(logits)
    leaf = logits.double().requires_grad_()
    expected = reference.comb_weights(leaf, iterations, EPS)
    (expected_grad,) = torch.autograd.grad(expected, leaf, grad.double())
    out = torch.full_like(logits, float("nan"))
    got = comb_triton.comb_weights(logits, iterations, EPS, out=out)
    dlogits = comb_triton.comb_weights_backward(grad, logits, iterations, EPS)
    assert got is out and _relative(got, expected) < 1e-6
    assert torch.isfinite(dlogits).all() and _relative(dlogits, expected_grad) < 1e-5
    again = comb_triton.comb_weights_backward(grad, logits, iterations, EPS)
    assert torch.equal(again, dlogits)


@pytest.mark.parametrize("compiled", [False, True])
def test_hyper_connection_comb_on_cuda_matches_the_reference(compiled, monkeypatch):
    """A `small` hyper-connection on CUDA under bf16 autocast, its mixing matrix from the fused op (the default on
    CUDA; both kernels must run), eagerly and compiled, against the same module with the reference formula."""
    from genolc.model import build_model, preset
    from genolc.model.ops.mhc import comb_triton

    calls = []
    for name in ("comb_weights", "comb_weights_backward"):
        kernel = getattr(comb_triton, name)
        monkeypatch.setattr(comb_triton, name, lambda *args, kernel=kernel, name=name, **kwargs:
                            calls.append(name) or kernel(*args, **kwargs))

    torch.manual_seed(0)
    connection = build_model(preset("small"), device="cuda").layers[0].attn_hc
    streams = torch.randn(1, 3001, 4, 1024, device="cuda", requires_grad=True)

    def run(module):
        with torch.autocast("cuda", dtype=torch.bfloat16):
            post, comb, block_input, _ = module(streams)
        loss = (post.float().square().sum() + comb.float().square().sum() + block_input.float().square().sum())
        return comb.detach(), torch.autograd.grad(loss, [streams, connection.fn, connection.base, connection.scale])

    assert connection.comb_op is dispatch.mhc_comb_weights
    reference_comb, reference_grads = run(lambda s: _with_reference_comb(connection, s))
    forward = torch.compile(connection.forward, dynamic=False) if compiled else connection.forward
    comb, grads = run(forward)
    assert set(calls) == {"comb_weights", "comb_weights_backward"}
    assert _relative(comb, reference_comb) < 1e-5
    for mine, theirs in zip(grads, reference_grads):
        assert _relative(mine, theirs) < 1e-4


def _with_reference_comb(connection, streams):
    connection.comb_op = reference.comb_weights
    try:
        return connection.forward(streams)
    finally:
        connection.comb_op = dispatch.mhc_comb_weights


def _block_input_operands(rows: int, dim: int, dtype: torch.dtype, n: int = 4):
    gen = torch.Generator(device="cuda").manual_seed(rows + dim)
    x = torch.randn(rows, n * dim, generator=gen, device="cuda") * torch.rand(rows, 1, generator=gen, device="cuda")
    weight = torch.randn((2 + n) * n, n * dim, generator=gen, device="cuda") * 0.02
    scale = torch.rand(3, generator=gen, device="cuda") + 0.5
    base = torch.randn((2 + n) * n, generator=gen, device="cuda") * 0.5
    return [t.requires_grad_() for t in (x.mul(4).to(dtype), weight, scale, base)]


@pytest.mark.parametrize("rows, dim, dtype", [
    (3001, 1024, torch.bfloat16),      # `small`'s streams, the trainer's dtype
    (517, 1536, torch.float32),        # `base`'s width, --stream-dtype float32
    (77, 40, torch.bfloat16),          # a stream's columns ending inside the backward's 64-column tile
])
def test_block_input_op_matches_fp64_autograd(rows, dim, dtype, monkeypatch):
    """The hyper-connection's block input as the model calls it (dispatch.mhc_block_input under bf16 autocast; all
    three of its kernels must run, the last one given the merge's share of x's gradient through the op's third
    output) against fp64 autograd of the reference. Inside a compiled method the op runs eagerly (it is
    dynamo-disabled): tests/gpu/test_compile_fast.py compiles the hyper-connection with its merge."""
    calls = []
    for name in ("block_input", "block_input_backward", "fused_mixing_logits_backward"):
        kernel = getattr(mhc_triton, name)
        monkeypatch.setattr(mhc_triton, name, lambda *args, kernel=kernel, name=name, **kwargs: calls.append(
            (name, "grad_block" in kwargs, kwargs.get("grad_x") is not None and bool(kwargs["grad_x"].any())))
            or kernel(*args, **kwargs))
    leaves = _block_input_operands(rows, dim, dtype)
    grad_logits = torch.randn(rows, 24, device="cuda")
    grad_block = torch.randn(rows, dim, device="cuda").to(dtype)
    grad_merge = torch.randn(rows, 4 * dim, device="cuda").to(dtype)
    with torch.autocast("cuda", dtype=torch.bfloat16):
        outputs = dispatch.mhc_block_input(*leaves, EPS, 1e-6, 4)
    logits, block, for_merge = outputs
    assert for_merge.data_ptr() == leaves[0].data_ptr()
    mine = torch.autograd.grad(outputs, leaves, [grad_logits, grad_block, grad_merge])
    exact_leaves = [t.detach().double().requires_grad_() for t in leaves]
    exact_outputs = reference.block_input(*exact_leaves, EPS, 1e-6, 4)
    exact_logits, exact_block, _ = exact_outputs
    exact = torch.autograd.grad(exact_outputs, exact_leaves,
                                [grad_logits.double(), grad_block.double(), grad_merge.double()])
    assert set(calls) == {("block_input", False, False), ("block_input_backward", False, False),
                          ("fused_mixing_logits_backward", True, True)}
    assert logits.dtype == torch.float32 and block.dtype == dtype
    # TF32 products (~2^-11 an operand); bf16 outputs rounded once (2^-9 relative on average).
    assert _relative(logits, exact_logits) < 2e-3 and _relative(block, exact_block) < 4e-3
    assert [g.dtype for g in mine] == [dtype, torch.float32, torch.float32, torch.float32]
    for name, got, truth in zip(("x", "weight", "scale", "base"), mine, exact):
        # scale's gradient is one sum over every token and stream of dz * logit, whose terms cancel: the TF32
        # products' rounding then shows larger in it (6.2e-3 for the fp32 case on the H200, 2026-12-05; rounding the
        # product's inputs to TF32 alone gives 7e-5 to 1.7e-3 on CPU, by draw). The interpreter check holds the
        # kernels' IEEE form to 1e-5.
        assert _relative(got, truth) < (2e-2 if name == "scale" else 4e-3), name


def test_block_input_dispatch_sends_what_the_kernels_do_not_take_to_the_reference(monkeypatch):
    calls = []
    monkeypatch.setattr(op, "block_input", lambda *args: calls.append(args) or reference.block_input(*args))
    x, weight, scale, base = (t.detach() for t in _block_input_operands(37, 64, torch.float32))
    x64 = x.double()
    expected = reference.block_input(x64, weight.double(), scale.double(), base.double(), EPS, 1e-6, 4)
    got = dispatch.mhc_block_input(x64, weight.double(), scale.double(), base.double(), EPS, 1e-6, 4)
    assert all(torch.equal(a, b) for a, b in zip(got, expected))
    three = torch.randn(37, 3 * 64, device="cuda")                 # 3 streams: not a power of two
    dispatch.mhc_block_input(three, torch.randn(15, 3 * 64, device="cuda"), scale, base[:15], EPS, 1e-6, 3)
    dispatch.mhc_block_input(x, weight, scale.double(), base, EPS, 1e-6, 4)       # an fp64 scale
    assert not calls
    dispatch.mhc_block_input(x, weight, scale, base, EPS, 1e-6, 4)
    assert len(calls) == 1
