"""mHC's custom ops (genolc/model/ops/mhc/op.py) on CPU: the mixing logits, whose forward there is the reference
formula, so these tests check the op's hand-written backward; and the mixing matrix (softmax and Sinkhorn), whose
CPU forward is the reference and whose backward is the reference's written-out backward, which these tests check
against autograd of the reference, beside what the op saves. Both: their
registration (fake shapes, autograd) and their use inside the hyper-connection under torch.compile. The CUDA kernels
themselves: tests/gpu/test_mhc_triton.py and, on CPU under Triton's interpreter,
tests/gpu/triton_interpreter_check.py."""

from __future__ import annotations

import pytest
import torch

from genolc.model import build_model, preset
from genolc.model.layers.mhc import HyperConnection
from genolc.model.ops.mhc import op, reference, triton as mhc_triton


def _relative(actual: torch.Tensor, expected: torch.Tensor) -> float:
    return float((actual.double() - expected.double()).norm() / expected.double().norm())


@pytest.mark.parametrize("rows, dtype", [(37, torch.float32), (1, torch.float32), (53, torch.bfloat16)])
def test_backward_matches_autograd_of_the_reference(rows, dtype):
    torch.manual_seed(rows)
    # Streams of unequal scale per token, as after many layers: the norm's own gradient term matters.
    x = (torch.randn(rows, 96) * torch.rand(rows, 1) * 5).to(dtype).requires_grad_()
    weight = torch.randn(24, 96, requires_grad=True)
    grad = torch.randn(rows, 24)

    logits = op.mixing_logits(x, weight, 1e-6)
    logits.backward(grad)
    mine = x.grad.clone(), weight.grad.clone()
    x.grad = weight.grad = None
    expected = reference.mixing_logits(x, weight, 1e-6)
    expected.backward(grad)

    assert logits.dtype == torch.float32 and torch.equal(logits, expected)
    assert mine[0].dtype == dtype and mine[1].dtype == torch.float32
    # bf16 x: both gradients are rounded to bf16 from fp32 sums taken in another order (2^-8 per element at most).
    assert _relative(mine[0], x.grad) < (4e-3 if dtype == torch.bfloat16 else 1e-6)
    assert _relative(mine[1], weight.grad) < 1e-6


def test_gradient_of_one_input_only():
    x = torch.randn(5, 32)
    weight = torch.randn(8, 32, requires_grad=True)
    op.mixing_logits(x, weight, 1e-6).sum().backward()
    assert weight.grad is not None and x.grad is None


def test_rstd_output_is_each_tokens_inverse_rms():
    x = torch.randn(7, 40) * torch.arange(1, 8)[:, None]
    _, rstd = op.mixing_logits_op(x, torch.randn(24, 40), 1e-6, False)
    assert torch.allclose(rstd, 1 / (x.square().mean(-1) + 1e-6).sqrt())


def test_ops_registration_passes_torch_opcheck():
    x = torch.randn(13, 64, requires_grad=True)
    weight = torch.randn(24, 64, requires_grad=True)
    torch.library.opcheck(op.mixing_logits_op, (x, weight, 1e-6, False))
    logits, rstd = op.mixing_logits_op(x.detach(), weight.detach(), 1e-6, False)
    torch.library.opcheck(op.mixing_logits_backward_op, (torch.randn(13, 24), x.detach(), weight.detach(), logits,
                                                         rstd, False))
    # Strided operands: rows of a wider buffer, a transposed weight; the fake shapes must match the real strides.
    wide_x = torch.randn(13, 80)[:, :64]
    transposed = torch.randn(64, 24).t()
    torch.library.opcheck(op.mixing_logits_op, (wide_x, transposed, 1e-6, False))
    logits, rstd = op.mixing_logits_op(wide_x, transposed, 1e-6, False)
    torch.library.opcheck(op.mixing_logits_backward_op, (torch.randn(13, 24), wide_x, transposed, logits, rstd,
                                                         False))


def _block_input_operands(rows: int, dtype: torch.dtype, n: int = 4, dim: int = 24):
    torch.manual_seed(rows + n)
    x = (torch.randn(rows, n * dim) * torch.rand(rows, 1) * 5).to(dtype).requires_grad_()
    weight = (torch.randn((2 + n) * n, n * dim) * 0.1).requires_grad_()
    scale = (torch.rand(3) + 0.5).requires_grad_()
    base = (torch.randn((2 + n) * n) * 0.5).requires_grad_()
    return x, weight, scale, base


@pytest.mark.parametrize("rows, dtype, n", [(37, torch.float32, 4), (1, torch.float32, 4), (53, torch.bfloat16, 4),
                                            (29, torch.float32, 2)])
def test_block_input_backward_matches_autograd_of_the_reference(rows, dtype, n):
    """The op's written-out backward (the formulas its CUDA path runs in kernels) against autograd of
    reference.block_input: the gradients of the streams, the weight, ``scale`` and ``base``."""
    x, weight, scale, base = _block_input_operands(rows, dtype, n)
    grad_logits = torch.randn(rows, weight.shape[0])
    grad_block = torch.randn(rows, x.shape[1] // n).to(dtype)

    logits, block, _ = op.block_input(x, weight, scale, base, 1e-6, 1e-6, n)
    torch.autograd.backward([logits, block], [grad_logits, grad_block])
    mine = [t.grad.clone() for t in (x, weight, scale, base)]
    for t in (x, weight, scale, base):
        t.grad = None
    expected_logits, expected_block, _ = reference.block_input(x, weight, scale, base, 1e-6, 1e-6, n)
    torch.autograd.backward([expected_logits, expected_block], [grad_logits, grad_block])

    assert torch.equal(logits, expected_logits) and torch.equal(block, expected_block) and block.dtype == dtype
    assert [g.dtype for g in mine] == [dtype, torch.float32, torch.float32, torch.float32]
    # bf16 streams: dx is rounded to bf16 from fp32 sums taken in another order.
    tolerances = [4e-3 if dtype == torch.bfloat16 else 1e-6, 1e-6, 1e-5, 1e-5]
    for name, got, tolerance, t in zip(("x", "weight", "scale", "base"), mine, tolerances, (x, weight, scale, base)):
        assert _relative(got, t.grad) < tolerance, name
    # Within the op, only the pre weights' parts of scale and base are read (the hyper-connection uses the rest).
    assert mine[2][0] != 0 and not mine[2][1:].any() and mine[3][:n].all() and not mine[3][n:].any()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_merges_share_of_the_streams_gradient_joins_the_ops_backward(dtype, monkeypatch):
    """The op's third output is x for the merge: a gradient arriving there is added inside the op's backward (which
    gets it as grad_x; on CUDA the mixing kernel adds it), not by autograd beside it. Its x gradient against autograd
    of the reference with a merge reading x, and the alias's values and storage."""
    x, weight, scale, base = _block_input_operands(41, dtype)
    grads = [torch.randn(41, weight.shape[0]), torch.randn(41, x.shape[1] // 4).to(dtype),
             torch.randn(41, x.shape[1]).to(dtype)]
    seen = []
    gradients = op.block_input_gradients
    monkeypatch.setattr(op, "block_input_gradients",
                        lambda *args, **kwargs: seen.append(kwargs["grad_x"]) or gradients(*args, **kwargs))

    outputs = op.block_input(x, weight, scale, base, 1e-6, 1e-6, 4)
    assert torch.equal(outputs[2], x) and outputs[2].data_ptr() == x.data_ptr() and outputs[2] is not x
    mine = torch.autograd.grad(outputs, [x, weight, scale, base], grads)
    assert len(seen) == 1 and seen[0] is not None and torch.equal(seen[0], grads[2])
    expected = torch.autograd.grad(reference.block_input(x, weight, scale, base, 1e-6, 1e-6, 4), [x, weight, scale,
                                                                                                   base], grads)
    # bf16 streams: the op adds the three shares in fp32 and rounds once, autograd rounds the first two first.
    tolerance = 4e-3 if dtype == torch.bfloat16 else 1e-6
    assert mine[0].dtype == dtype and _relative(mine[0], expected[0]) < tolerance
    for got, want in zip(mine[1:], expected[1:]):
        assert _relative(got, want) < 1e-5
    # Only the alias read: the op's backward still runs (its logits and block input take no gradient) and gives x
    # exactly what arrived there.
    seen.clear()
    (only,) = torch.autograd.grad(op.block_input(x, weight, scale, base, 1e-6, 1e-6, 4)[2], [x], grads[2])
    assert len(seen) == 1 and _relative(only, grads[2]) < (4e-3 if dtype == torch.bfloat16 else 1e-6)
    # The alias not read: the backward gets None for it (no zero tensor filled and read in its place).
    seen.clear()
    torch.autograd.grad(op.block_input(x, weight, scale, base, 1e-6, 1e-6, 4)[:2], [x], grads[:2])
    assert seen == [None]


def test_block_input_gradient_through_one_output_only():
    x, weight, scale, base = _block_input_operands(11, torch.float32)
    for pick in (0, 1):
        outputs = op.block_input(x, weight, scale, base, 1e-6, 1e-6, 4)
        outputs[pick].square().sum().backward()
        mine = [t.grad.clone() for t in (x, weight, scale, base)]
        for t in (x, weight, scale, base):
            t.grad = None
        reference.block_input(x, weight, scale, base, 1e-6, 1e-6, 4)[pick].square().sum().backward()
        for got, t in zip(mine, (x, weight, scale, base)):
            # The reference leaves scale and base without a gradient when only the logits are used; the op's are 0.
            expected = torch.zeros_like(got) if t.grad is None else t.grad
            assert (_relative(got, expected) < 1e-5) if expected.any() else not got.any()
        for t in (x, weight, scale, base):
            t.grad = None


def test_hyper_connection_with_the_op_compiled_matches_the_reference():
    """The tiny model's first hyper-connection and its merge around a stand-in block, once with the default ops (the
    references on CPU) eagerly and once with the custom ops, forward and merge compiled as genolc/train/apply.py
    compiles them: same outputs and gradients (what the GPU path runs, minus the kernels), and the merge's share of
    the streams' gradient reaches the op's backward inside the compiled forward too: the alias the merge reads hangs
    off the op's autograd node (traced, AOTAutograd would make it a view of the compiled graph's input, hand the
    op's backward a zero tensor and leave the sum to autograd)."""
    torch.manual_seed(0)
    connection = build_model(preset("tiny")).layers[0].attn_hc
    assert isinstance(connection, HyperConnection)
    streams = torch.randn(2, 19, 4, 64, requires_grad=True)
    merge_inputs = []

    def run():
        post, comb, block_input, for_merge = connection(streams)
        merge_inputs.append(for_merge)
        new = connection.merge(torch.tanh(block_input), post, comb, for_merge)
        loss = new.square().sum() + post.square().sum() + comb.square().sum() + block_input.square().sum()
        return [t.detach() for t in (post, comb, block_input, new)], torch.autograd.grad(
            loss, [streams, connection.fn, connection.scale, connection.base])

    expected_outputs, expected_grads = run()
    assert torch.equal(merge_inputs[0], streams) and merge_inputs[0].data_ptr() == streams.data_ptr()
    connection.input_op = op.block_input
    connection.comb_op = op.comb_weights_op
    connection.forward = torch.compile(connection.forward, dynamic=False)
    connection.merge = torch.compile(connection.merge, dynamic=False)
    outputs, grads = run()
    assert _autograd_nodes_reached(merge_inputs[1].grad_fn, depth=2) & {"BlockInputPassingStreamsBackward"}
    for mine, theirs in zip(outputs + list(grads), expected_outputs + list(expected_grads)):
        assert _relative(mine, theirs) < 1e-5


def _autograd_nodes_reached(node, depth: int) -> set[str]:
    """Names of the autograd nodes within ``depth`` steps of ``node``."""
    names, frontier = set(), [node]
    for _ in range(depth + 1):
        names |= {type(n).__name__ for n in frontier if n is not None}
        frontier = [nxt for n in frontier if n is not None for nxt, _ in n.next_functions]
    return names


def test_a_pipelined_forward_config_needs_the_tile_in_registers():
    # Pipelined with the streams' tile in shared memory, Triton 3.6 refills it while the product reads it.
    with pytest.raises(ValueError, match="tile_in_registers"):
        mhc_triton.KernelConfig(64, 128, 4, stages=3)
    with pytest.raises(ValueError, match="at least 1"):
        mhc_triton.KernelConfig(stages=0)
    assert mhc_triton.KernelConfig(stages=3, tile_in_registers=True).stages == 3


def _comb_logits(rows: int, n: int = 4) -> torch.Tensor:
    torch.manual_seed(rows + n)
    return torch.randn(rows, n, n) * 3


def test_comb_op_is_the_reference_and_its_backward_matches_autograd():
    logits = _comb_logits(37).requires_grad_()
    grad = torch.randn(37, 4, 4)
    mine = op.comb_weights_op(logits, 20, 1e-6)
    (mine_grad,) = torch.autograd.grad(mine, logits, grad)
    expected = reference.comb_weights(logits, 20, 1e-6)
    (expected_grad,) = torch.autograd.grad(expected, logits, grad)
    assert torch.equal(mine, expected)
    # The written-out backward against autograd of the reference: same formulas, sums in another order.
    assert _relative(mine_grad, expected_grad) < 1e-6
    # The last normalisation is over columns: they sum to 1 (rows only approach it in 20 iterations).
    assert torch.allclose(mine.sum(-2), torch.ones(37, 4), atol=1e-5)


def test_comb_op_saves_only_its_logits():
    """What the op keeps for its backward, against autograd of the reference (the softmax and every Sinkhorn step's
    input and sums): the logits alone, 4 N^2 bytes a token."""
    def saved_bytes(function) -> int:
        total = 0

        def pack(tensor):
            nonlocal total
            total += tensor.numel() * tensor.element_size()
            return tensor

        logits = _comb_logits(64).requires_grad_()
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            function(logits, 20, 1e-6)
        return total

    assert saved_bytes(op.comb_weights_op) == 64 * 16 * 4
    assert saved_bytes(reference.comb_weights) > 30 * 64 * 16 * 4


def test_comb_ops_pass_torch_opcheck():
    logits = _comb_logits(13).requires_grad_()
    torch.library.opcheck(op.comb_weights_op, (logits, 20, 1e-6))
    torch.library.opcheck(op.comb_weights_backward_op, (torch.randn(13, 4, 4), logits.detach(), 20, 1e-6))
    # A transposed (non-contiguous) input: the fake shape must match the real output's strides.
    torch.library.opcheck(op.comb_weights_op, (_comb_logits(5).transpose(-1, -2), 3, 1e-6))


def test_comb_dispatch_keeps_cpu_on_the_reference(monkeypatch):
    from genolc.model.ops import dispatch

    monkeypatch.setattr(op, "comb_weights_op", lambda *args: pytest.fail("the custom op ran on CPU"))
    logits = _comb_logits(3)
    assert torch.equal(dispatch.mhc_comb_weights(logits, 20, 1e-6), reference.comb_weights(logits, 20, 1e-6))


def _merge_inputs(tokens: int, n: int = 4, dim: int = 40, dtype: torch.dtype = torch.float32):
    torch.manual_seed(tokens + n + dim)
    return (torch.randn(2, tokens, dim).to(dtype), 2 * torch.rand(2, tokens, n),
            torch.softmax(torch.randn(2, tokens, n, n), -1), torch.randn(2, tokens, n, dim).to(dtype))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_merge_op_is_the_fp32_reference_and_its_backward_matches_autograd(dtype):
    # On CPU the op's forward is reference.merge itself; what this checks is the registration (dtypes, shapes) and
    # the written-out backward, which the CUDA kernels' backward is compared with (tests/gpu, the interpreter).
    inputs = [t.requires_grad_() for t in _merge_inputs(19, dtype=dtype)]
    grad = torch.randn(2, 19, 4, 40).to(dtype)
    mine = op.merge_op(*inputs)
    mine_grads = torch.autograd.grad(mine, inputs, grad)
    expected = reference.merge(*inputs, compute_dtype=torch.float32)
    expected_grads = torch.autograd.grad(expected, inputs, grad)
    assert mine.dtype == dtype and torch.equal(mine, expected)
    for got, want, source in zip(mine_grads, expected_grads, inputs):
        assert got.dtype == source.dtype and got.shape == source.shape
        # The written-out backward against autograd of the formula: the same fp32 sums in another order.
        assert _relative(got, want) < (1e-6 if dtype == torch.float32 else 1e-2)


def test_merge_rounds_once_where_the_streams_own_dtype_would_round_every_term():
    block_out, post, comb, streams = _merge_inputs(64, dtype=torch.bfloat16)
    exact = reference.merge(*(t.double() for t in (block_out, post, comb, streams)))
    once = op.merge_op(block_out, post, comb, streams)
    every_term = reference.merge(block_out, post, comb, streams)
    assert torch.equal(once, exact.bfloat16())
    assert _relative(every_term, exact) > 1.5 * _relative(once, exact)


def test_merge_op_saves_its_inputs_only():
    inputs = [t.requires_grad_() for t in _merge_inputs(8)]
    saved = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t) or t, lambda t: t):
        op.merge_op(*inputs)
    assert len(saved) == 4 and all(any(s is t for t in inputs) for s in saved)


def test_merge_ops_pass_torch_opcheck():
    inputs = [t.requires_grad_() for t in _merge_inputs(5, dtype=torch.bfloat16)]
    torch.library.opcheck(op.merge_op, tuple(inputs))
    torch.library.opcheck(op.merge_backward_op, (torch.randn(2, 5, 4, 40).bfloat16(),
                                                 *(t.detach() for t in inputs)))
    streams = inputs[3].detach().transpose(0, 1)
    torch.library.opcheck(op.merge_op, (inputs[0].detach().transpose(0, 1), inputs[1].detach().transpose(0, 1),
                                        inputs[2].detach().transpose(0, 1), streams))


def test_merge_dispatch_keeps_cpu_on_the_reference(monkeypatch):
    from genolc.model.ops import dispatch

    monkeypatch.setattr(op, "merge_op", lambda *args: pytest.fail("the custom op ran on CPU"))
    inputs = _merge_inputs(3, dtype=torch.bfloat16)
    assert torch.equal(dispatch.mhc_merge(*inputs, compute_dtype=torch.float32),
                       reference.merge(*inputs, compute_dtype=torch.float32))


def test_merge_kernels_refuse_what_they_cannot_take():
    from genolc.model.ops.mhc import merge_triton

    block_out, post, comb, streams = _merge_inputs(3, n=4)
    assert merge_triton.unsupported_reason(block_out, post, comb, streams) is None
    three = _merge_inputs(3, n=3)
    assert "power of two" in merge_triton.unsupported_reason(*three)
    assert "post is" in merge_triton.unsupported_reason(block_out, post[..., :2], comb, streams)
    assert "float64" in merge_triton.unsupported_reason(block_out.double(), post, comb, streams)
    with pytest.raises(ValueError, match="power of two"):
        merge_triton.merge(*three)
    with pytest.raises(ValueError, match="block_d must be a power of two"):
        merge_triton.merge(block_out, post, comb, streams, block_d=96)


def test_block_input_kernels_refuse_what_they_do_not_take():
    """What the dispatch sends to the reference instead (pure torch: no Triton needed to ask)."""
    x, weight, scale, base = (t.detach() for t in _block_input_operands(5, torch.float32))
    assert mhc_triton.block_input_unsupported_reason(x, weight, scale, base, 4) is None
    assert "power of two" in mhc_triton.block_input_unsupported_reason(x, weight, scale, base, 3)
    assert "scale" in mhc_triton.block_input_unsupported_reason(x, weight, scale.double(), base, 4)
    assert "base" in mhc_triton.block_input_unsupported_reason(x, weight, scale, base[:3], 4)
    assert "must each be one of" in mhc_triton.block_input_unsupported_reason(x.double(), weight, scale, base, 4)
