"""The Triton kernels of :mod:`genolc.model.ops.kda.conv_triton` (the algorithm is described there).

Imports Triton at import time: conv_triton imports this module when it first runs. Written for four taps; a shorter
filter has its missing taps zero (the weight loads are masked), a longer one goes to conv.py's torch code.
"""

import triton
import triton.language as tl


@triton.jit
def _rows(base, rows, cols, col_ok, n_rows, stride):
    """The ``[segments, channels]`` fp32 tile of ``rows`` (zero where a row is outside [0, n_rows))."""
    ok = (rows >= 0) & (rows < n_rows)
    return tl.load(base + rows.to(tl.int64)[:, None] * stride + cols[None, :], mask=ok[:, None] & col_ok[None, :],
                   other=0.0).to(tl.float32)


@triton.jit
def _pre_activation(x0, x1, x2, x3, w0, w1, w2, w3):
    """z = sum_j w[j] * padded[t + j] for the window ``x0..x3``, over ascending taps as conv.py sums it."""
    z = w0[None, :] * x0
    z += w1[None, :] * x1
    z += w2[None, :] * x2
    z += w3[None, :] * x3
    return z


@triton.jit
def _silu_grad(z, g):
    gate = tl.sigmoid(z)
    return (z * (1.0 - gate) + 1.0) * gate * g


@triton.jit
def _gm_at(padded_base, grad_base, t, cols, col_ok, w0, w1, w2, w3, length, padded_length, stride_pt, stride_gt):
    """gm at the rows ``t``, computed from scratch (zero where t is outside [0, L))."""
    z = _pre_activation(_rows(padded_base, t, cols, col_ok, padded_length, stride_pt),
                        _rows(padded_base, t + 1, cols, col_ok, padded_length, stride_pt),
                        _rows(padded_base, t + 2, cols, col_ok, padded_length, stride_pt),
                        _rows(padded_base, t + 3, cols, col_ok, padded_length, stride_pt), w0, w1, w2, w3)
    return _silu_grad(z, _rows(grad_base, t, cols, col_ok, length, stride_gt))


@triton.jit
def _step(x0, x1, x2, x3, g, gm1, gm2, gm3, dw0, dw1, dw2, dw3, w0, w1, w2, w3, s, cols, col_ok, d_padded_base,
          padded_length, stride_dt):
    """One row ``s`` of every segment: gm[s] from the window ``x0..x3`` = padded[s..s + 3] and ``g`` = g[s],
    d_padded[s] stored, the taps' sums grown; returns the state moved on by a row. d_padded sums over ascending k,
    as conv.py does."""
    gm0 = _silu_grad(_pre_activation(x0, x1, x2, x3, w0, w1, w2, w3), g)
    out = w0[None, :] * gm0
    out += w1[None, :] * gm1
    out += w2[None, :] * gm2
    out += w3[None, :] * gm3
    tl.store(d_padded_base + s.to(tl.int64)[:, None] * stride_dt + cols[None, :],
             out.to(d_padded_base.dtype.element_ty), mask=(s < padded_length)[:, None] & col_ok[None, :])
    return x1, x2, x3, gm0, gm1, gm2, dw0 + gm0 * x0, dw1 + gm0 * x1, dw2 + gm0 * x2, dw3 + gm0 * x3


@triton.jit
def _part(ptr0, ptr1, ptr2, first_col, part_width):
    """The part tensor (of up to three, each ``part_width`` channels wide) that holds channel ``first_col``, and the
    channel its column 0 is."""
    part = first_col // part_width
    ptr = ptr0
    if part == 1:
        ptr = ptr1
    elif part == 2:
        ptr = ptr2
    return ptr, part * part_width


@triton.jit
def _program(channels, BLOCK_C: tl.constexpr):
    """The program's segment group, batch row, first channel, channels and their mask."""
    first_col = tl.program_id(1) * BLOCK_C
    cols = first_col + tl.arange(0, BLOCK_C)
    return tl.program_id(0), tl.program_id(2), first_col, cols, cols < channels


@triton.jit
def _taps(weight_ptr, cols, col_ok, TAPS: tl.constexpr):
    """The four taps of ``cols``; those past K are zero, so the four-tap sums lose nothing to them."""
    w0 = tl.load(weight_ptr + cols * TAPS, mask=col_ok, other=0.0).to(tl.float32)
    w1 = tl.load(weight_ptr + cols * TAPS + 1, mask=col_ok & (TAPS > 1), other=0.0).to(tl.float32)
    w2 = tl.load(weight_ptr + cols * TAPS + 2, mask=col_ok & (TAPS > 2), other=0.0).to(tl.float32)
    w3 = tl.load(weight_ptr + cols * TAPS + 3, mask=col_ok & (TAPS > 3), other=0.0).to(tl.float32)
    return w0, w1, w2, w3


@triton.jit
def _forward_step(x0, x1, x2, x3, w0, w1, w2, w3, t, part_cols, col_ok, out_base, length, stride_ot):
    """y[t] = silu(z[t]) stored for one row of every segment; returns the window moved on by a row."""
    z = _pre_activation(x0, x1, x2, x3, w0, w1, w2, w3)
    tl.store(out_base + t.to(tl.int64)[:, None] * stride_ot + part_cols[None, :],
             (z * tl.sigmoid(z)).to(out_base.dtype.element_ty), mask=(t < length)[:, None] & col_ok[None, :])
    return x1, x2, x3


@triton.jit
def conv_silu_forward_kernel(padded_ptr, weight_ptr, out0_ptr, out1_ptr, out2_ptr,
                             length, padded_length, channels, part_width,
                             stride_pb, stride_pt, stride_ob, stride_ot,
                             TAPS: tl.constexpr, SEGMENT_ROWS: tl.constexpr, SEGMENTS: tl.constexpr,
                             BLOCK_C: tl.constexpr):
    group, batch, first_col, cols, col_ok = _program(channels, BLOCK_C)
    out_ptr, part_col0 = _part(out0_ptr, out1_ptr, out2_ptr, first_col, part_width)
    out_base = out_ptr + batch.to(tl.int64) * stride_ob
    part_cols = cols - part_col0
    padded_base = padded_ptr + batch.to(tl.int64) * stride_pb
    w0, w1, w2, w3 = _taps(weight_ptr, cols, col_ok, TAPS)
    t = (group * SEGMENTS + tl.arange(0, SEGMENTS)) * SEGMENT_ROWS
    x0 = _rows(padded_base, t, cols, col_ok, padded_length, stride_pt)
    x1 = _rows(padded_base, t + 1, cols, col_ok, padded_length, stride_pt)
    x2 = _rows(padded_base, t + 2, cols, col_ok, padded_length, stride_pt)
    for _ in range(0, SEGMENT_ROWS, 4):
        xa = _rows(padded_base, t + 3, cols, col_ok, padded_length, stride_pt)
        xb = _rows(padded_base, t + 4, cols, col_ok, padded_length, stride_pt)
        xc = _rows(padded_base, t + 5, cols, col_ok, padded_length, stride_pt)
        xd = _rows(padded_base, t + 6, cols, col_ok, padded_length, stride_pt)
        x0, x1, x2 = _forward_step(x0, x1, x2, xa, w0, w1, w2, w3, t, part_cols, col_ok, out_base, length,
                                   stride_ot)
        x0, x1, x2 = _forward_step(x0, x1, x2, xb, w0, w1, w2, w3, t + 1, part_cols, col_ok, out_base, length,
                                   stride_ot)
        x0, x1, x2 = _forward_step(x0, x1, x2, xc, w0, w1, w2, w3, t + 2, part_cols, col_ok, out_base, length,
                                   stride_ot)
        x0, x1, x2 = _forward_step(x0, x1, x2, xd, w0, w1, w2, w3, t + 3, part_cols, col_ok, out_base, length,
                                   stride_ot)
        t += 4


@triton.jit
def conv_silu_backward_kernel(grad0_ptr, grad1_ptr, grad2_ptr, padded_ptr, weight_ptr, d_padded_ptr, d_weight_ptr,
                              length, padded_length, channels, part_width,
                              stride_gb, stride_gt, stride_pb, stride_pt, stride_db, stride_dt,
                              TAPS: tl.constexpr, SEGMENT_ROWS: tl.constexpr, SEGMENTS: tl.constexpr,
                              BLOCK_C: tl.constexpr):
    group, batch, first_col, cols, col_ok = _program(channels, BLOCK_C)
    grad_ptr, part_col0 = _part(grad0_ptr, grad1_ptr, grad2_ptr, first_col, part_width)
    # g is read at the part's own columns; padded, d_padded and the taps at the full width's.
    grad_base = grad_ptr + batch.to(tl.int64) * stride_gb - part_col0
    padded_base = padded_ptr + batch.to(tl.int64) * stride_pb
    d_padded_base = d_padded_ptr + batch.to(tl.int64) * stride_db
    w0, w1, w2, w3 = _taps(weight_ptr, cols, col_ok, TAPS)
    s = (group * SEGMENTS + tl.arange(0, SEGMENTS)) * SEGMENT_ROWS
    # A segment starts from gm of the three rows before it (recomputed: they are its neighbour's) and the padded
    # rows s, s + 1, s + 2 that z[s] reads beside s + 3.
    gm1 = _gm_at(padded_base, grad_base, s - 1, cols, col_ok, w0, w1, w2, w3, length, padded_length, stride_pt,
                 stride_gt)
    gm2 = _gm_at(padded_base, grad_base, s - 2, cols, col_ok, w0, w1, w2, w3, length, padded_length, stride_pt,
                 stride_gt)
    gm3 = _gm_at(padded_base, grad_base, s - 3, cols, col_ok, w0, w1, w2, w3, length, padded_length, stride_pt,
                 stride_gt)
    x0 = _rows(padded_base, s, cols, col_ok, padded_length, stride_pt)
    x1 = _rows(padded_base, s + 1, cols, col_ok, padded_length, stride_pt)
    x2 = _rows(padded_base, s + 2, cols, col_ok, padded_length, stride_pt)
    dw0 = tl.zeros((SEGMENTS, BLOCK_C), dtype=tl.float32)
    dw1 = tl.zeros((SEGMENTS, BLOCK_C), dtype=tl.float32)
    dw2 = tl.zeros((SEGMENTS, BLOCK_C), dtype=tl.float32)
    dw3 = tl.zeros((SEGMENTS, BLOCK_C), dtype=tl.float32)
    # Four rows a pass, their eight loads first: a step alone reads two rows, too few bytes in flight to keep the
    # memory busy at the occupancy the state's registers leave.
    for _ in range(0, SEGMENT_ROWS, 4):
        xa = _rows(padded_base, s + 3, cols, col_ok, padded_length, stride_pt)
        xb = _rows(padded_base, s + 4, cols, col_ok, padded_length, stride_pt)
        xc = _rows(padded_base, s + 5, cols, col_ok, padded_length, stride_pt)
        xd = _rows(padded_base, s + 6, cols, col_ok, padded_length, stride_pt)
        ga = _rows(grad_base, s, cols, col_ok, length, stride_gt)
        gb = _rows(grad_base, s + 1, cols, col_ok, length, stride_gt)
        gc = _rows(grad_base, s + 2, cols, col_ok, length, stride_gt)
        gd = _rows(grad_base, s + 3, cols, col_ok, length, stride_gt)
        x0, x1, x2, gm1, gm2, gm3, dw0, dw1, dw2, dw3 = _step(
            x0, x1, x2, xa, ga, gm1, gm2, gm3, dw0, dw1, dw2, dw3, w0, w1, w2, w3, s, cols, col_ok, d_padded_base,
            padded_length, stride_dt)
        x0, x1, x2, gm1, gm2, gm3, dw0, dw1, dw2, dw3 = _step(
            x0, x1, x2, xb, gb, gm1, gm2, gm3, dw0, dw1, dw2, dw3, w0, w1, w2, w3, s + 1, cols, col_ok,
            d_padded_base, padded_length, stride_dt)
        x0, x1, x2, gm1, gm2, gm3, dw0, dw1, dw2, dw3 = _step(
            x0, x1, x2, xc, gc, gm1, gm2, gm3, dw0, dw1, dw2, dw3, w0, w1, w2, w3, s + 2, cols, col_ok,
            d_padded_base, padded_length, stride_dt)
        x0, x1, x2, gm1, gm2, gm3, dw0, dw1, dw2, dw3 = _step(
            x0, x1, x2, xd, gd, gm1, gm2, gm3, dw0, dw1, dw2, dw3, w0, w1, w2, w3, s + 3, cols, col_ok,
            d_padded_base, padded_length, stride_dt)
        s += 4
    slot = (batch * tl.num_programs(0) + group).to(tl.int64) * channels * TAPS
    tl.store(d_weight_ptr + slot + cols * TAPS, tl.sum(dw0, axis=0), mask=col_ok)
    tl.store(d_weight_ptr + slot + cols * TAPS + 1, tl.sum(dw1, axis=0), mask=col_ok & (TAPS > 1))
    tl.store(d_weight_ptr + slot + cols * TAPS + 2, tl.sum(dw2, axis=0), mask=col_ok & (TAPS > 2))
    tl.store(d_weight_ptr + slot + cols * TAPS + 3, tl.sum(dw3, axis=0), mask=col_ok & (TAPS > 3))
