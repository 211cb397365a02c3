"""mHC's mixing matrix from its logits, ``comb = sinkhorn(softmax(logits) + eps)``, in two Triton kernels.

Each token's ``[N, N]`` matrix is tiny (16 values at N = 4), and transformers' formula normalises it ``2 I - 1``
times (I = ``hc_sinkhorn_iters``, 20). Compiled by inductor, each normalisation became a kernel of its own: about
57 launches per hyper-connection forward and some 116k a `base` step at 512k, each a microsecond of work
(``triton_poi_fused_add_div_sum_*``), so the GPU waited on their launches. On the H200 (2026-12-02,
benchmarks/results/mhc_comb_2026-12-02/) one hyper-connection's forward and backward for a 16k chunk of `base` went
from 4.79 to 3.42 ms (204 to 49 launches), `base`'s bare 512k step from 19.39 to 18.56 s, and the cold first step's
inductor compile from 41 to 21 s. Here one program takes ``BLOCK`` tokens' matrices, as ``[BLOCK, NP, NP]`` register
tensors (N padded to a power of two, the padding held at zero), through the softmax and every normalisation:

    forward    logits -> comb, one read and one write per token
    backward   recomputes the forward, keeping each normalisation's input in a scratch buffer (fp32, ``2 I - 1``
               matrices per token, the program's own rows), then runs back through them:
               y = x / (s + eps), s = sum of x along the axis  =>  dx = (dy - sum(dy * y)) / (s + eps)
               and through the softmax: dlogits = p * (dp - sum(dp * p)).

Sums run over N values in fp32 in a fixed order, so results are the same on every call. Runs on CUDA, or on CPU
tensors under ``TRITON_INTERPRET=1`` (tests/gpu/triton_interpreter_check.py). The kernels are in comb_kernels.py,
imported (with Triton) at the first call.
"""

from __future__ import annotations

import functools

import torch

BLOCK = 64
MAX_STREAMS = 8
# Tokens per backward launch: bounds the scratch buffer, 2 I - 1 padded matrices of fp32 a token (2,496 bytes at
# N = 4 and I = 20: 156 MiB; N = 5-8 pads to 8, four times that).
BACKWARD_ROWS = 65536


@functools.cache
def _kernels():
    from genolc.model.ops.mhc import comb_kernels

    return comb_kernels.comb_forward_kernel, comb_kernels.comb_backward_kernel


def unsupported_reason(logits: torch.Tensor) -> str | None:
    """Why the kernels cannot take ``logits``, or None: fp32 ``[..., N, N]`` with N <= ``MAX_STREAMS``."""
    if logits.dtype != torch.float32:
        return f"logits are {logits.dtype}, the kernels take float32"
    if logits.dim() < 2 or logits.shape[-1] != logits.shape[-2]:
        return f"logits must be [..., N, N], got {tuple(logits.shape)}"
    if not 1 <= logits.shape[-1] <= MAX_STREAMS:
        return f"N = {logits.shape[-1]} streams, the kernels take 1..{MAX_STREAMS}"
    return None


def _check(logits: torch.Tensor, iterations: int) -> None:
    reason = unsupported_reason(logits)
    if reason is not None:
        raise ValueError(reason)
    if iterations < 1:
        raise ValueError(f"iterations must be at least 1, got {iterations}")


def _padded(n: int) -> int:
    return 1 << (n - 1).bit_length()


def comb_weights(logits: torch.Tensor, iterations: int, eps: float, *, out: torch.Tensor | None = None
                 ) -> torch.Tensor:
    """``sinkhorn(softmax(logits) + eps, iterations, eps)`` of fp32 ``logits [..., N, N]`` (a new contiguous
    tensor, or ``out``: contiguous, of the logits' shape and dtype)."""
    _check(logits, iterations)
    logits = logits.contiguous()
    n = logits.shape[-1]
    if out is not None and (out.shape != logits.shape or out.dtype != logits.dtype or not out.is_contiguous()
                            or out.device != logits.device):
        raise ValueError(f"out must be a contiguous {logits.dtype} tensor of shape {tuple(logits.shape)} on "
                         f"{logits.device}, got {out.dtype} {tuple(out.shape)} on {out.device}")
    out = torch.empty_like(logits) if out is None else out
    rows = logits.numel() // (n * n)
    if rows:
        forward, _ = _kernels()
        forward[(-(-rows // BLOCK),)](logits, out, rows, eps, N=n, NP=_padded(n), ITERS=iterations, BLOCK=BLOCK)
    return out


def comb_weights_backward(grad: torch.Tensor, logits: torch.Tensor, iterations: int, eps: float) -> torch.Tensor:
    """The gradient of :func:`comb_weights` with respect to ``logits``, given that of its output."""
    _check(logits, iterations)
    if grad.shape != logits.shape:
        raise ValueError(f"grad {tuple(grad.shape)} and logits {tuple(logits.shape)} must have one shape")
    logits, grad = logits.contiguous(), grad.float().contiguous()
    n = logits.shape[-1]
    padded = _padded(n)
    rows = logits.numel() // (n * n)
    dlogits = torch.empty_like(logits)
    if not rows:
        return dlogits
    _, backward = _kernels()
    launch_rows = min(rows, BACKWARD_ROWS)
    programs = -(-launch_rows // BLOCK)
    scratch = torch.empty(programs * (2 * iterations - 1) * BLOCK * padded * padded, dtype=torch.float32,
                          device=logits.device)
    flat_grad, flat_logits, flat_out = (t.view(rows, n * n) for t in (grad, logits, dlogits))
    for start in range(0, rows, BACKWARD_ROWS):
        stop = min(start + BACKWARD_ROWS, rows)
        backward[(-(-(stop - start) // BLOCK),)](flat_grad[start:stop], flat_logits[start:stop],
                                                 flat_out[start:stop], scratch, stop - start, eps, N=n, NP=padded,
                                                 ITERS=iterations, BLOCK=BLOCK)
    return dlogits
