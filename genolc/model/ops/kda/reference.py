"""Kimi Delta Attention (KDA), chunked pure-torch reference.

Per head the state ``S`` is a ``[Dk, Dv]`` matrix. Each step decays it per key channel, then applies a delta-rule
update that moves the value the state predicts for ``k_t`` towards ``v_t`` by ``beta_t``:

    S_t = (I - beta_t k_t k_t^T) diag(exp(g_t)) S_{t-1} + beta_t k_t v_t^T,      o_t = S_t^T (scale * q_t)

The chunked form processes ``chunk_size`` steps at once. Inside a chunk, with ``G_r`` the cumulative log decay up
to step r, the values actually written (``u``) solve a unit lower-triangular system

    (I + M) u = beta * v - (beta * k * exp(G)) S_0,     M[r, j] = beta_r sum_d k_r[d] k_j[d] exp(G_r[d] - G_j[d]), j < r

and the chunk's outputs and final state follow from ``u`` and the chunk's initial state ``S_0``. Decay factors are
always formed from differences ``G_r - G_j`` (r >= j), never as ``exp(G_r) * exp(-G_j)``, so nothing overflows at
long chunks with strong decay. Memory per chunk is ``[B, H, C, C, Dk]``; the whole op is linear in T.
"""

from __future__ import annotations

import torch

from genolc.model.ops.kda.gate import kda_gate
from genolc.model.ops.precision import autocast_off


def l2_normalize(x: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """``x / sqrt(sum(x^2) + eps)`` over the last dim (fla's convention: eps inside the root, not a max)."""
    return x / torch.sqrt((x * x).sum(dim=-1, keepdim=True) + eps)


def _check_shapes(q, k, v, g, beta, initial_state) -> None:
    if q.dim() != 4 or k.shape != q.shape:
        raise ValueError(f"q and k must both be [B, T, H, Dk]; got q {tuple(q.shape)}, k {tuple(k.shape)}")
    batch, length, heads, key_dim = q.shape
    if v.dim() != 4 or v.shape[:3] != (batch, length, heads):
        raise ValueError(f"v must be [B, T, H, Dv] = [{batch}, {length}, {heads}, Dv]; got {tuple(v.shape)}")
    if g.shape != q.shape:
        raise ValueError(f"g (log decay) must be [B, T, H, Dk] = {tuple(q.shape)}; got {tuple(g.shape)}")
    if beta.shape != (batch, length, heads):
        raise ValueError(f"beta must be [B, T, H] = [{batch}, {length}, {heads}]; got {tuple(beta.shape)}")
    if initial_state is not None and initial_state.shape != (batch, heads, key_dim, v.shape[-1]):
        raise ValueError(f"initial_state must be [B, H, Dk, Dv] = [{batch}, {heads}, {key_dim}, {v.shape[-1]}]; "
                         f"got {tuple(initial_state.shape)}")


def _check_gate(q: torch.Tensor, use_gate_in_kernel: bool, A_log: torch.Tensor | None,
                dt_bias: torch.Tensor | None, lower_bound: float | None) -> None:
    heads, key_dim = q.shape[2], q.shape[3]
    if not use_gate_in_kernel:
        if A_log is not None or dt_bias is not None or lower_bound is not None:
            raise ValueError("A_log, dt_bias and lower_bound describe the gate applied inside the op; pass them "
                             "with use_gate_in_kernel=True (g is then the raw pre-activation), or finish g yourself")
        return
    if A_log is None and lower_bound is None:
        raise ValueError("use_gate_in_kernel=True needs A_log (and/or lower_bound) to form the decay")
    if A_log is not None and A_log.shape != (heads,):
        raise ValueError(f"A_log must be [H] = [{heads}]; got {tuple(A_log.shape)}")
    if dt_bias is not None and dt_bias.shape != (heads * key_dim,):
        raise ValueError(f"dt_bias must be [H * Dk] = [{heads * key_dim}]; got {tuple(dt_bias.shape)}")
    if lower_bound is not None and not lower_bound < 0:
        raise ValueError(f"lower_bound is a log decay and must be negative; got {lower_bound}")


@autocast_off
def chunk_kda(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    scale: float | None = None,
    initial_state: torch.Tensor | None = None,
    output_final_state: bool = False,
    use_qk_l2norm_in_kernel: bool = False,
    chunk_size: int = 64,
    use_gate_in_kernel: bool = False,
    A_log: torch.Tensor | None = None,
    dt_bias: torch.Tensor | None = None,
    lower_bound: float | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Chunked KDA (fla ``chunk_kda`` semantics), computed in fp32.

    Args:
        q, k: ``[B, T, H, Dk]``. v: ``[B, T, H, Dv]``.
        g: ``[B, T, H, Dk]`` per-channel log decay (<= 0) applied before step t's update; with
            ``use_gate_in_kernel`` the raw gate pre-activation, turned into the decay by :func:`kda_gate` with
            ``A_log [H]``, ``dt_bias [H * Dk]`` and ``lower_bound``.
        beta: ``[B, T, H]`` delta-rule step size.
        scale: query scale, default ``Dk ** -0.5``.
        initial_state: ``[B, H, Dk, Dv]`` or None (zeros).
        use_qk_l2norm_in_kernel: L2-normalise q and k (in fp32) first.
    Returns:
        ``(o [B, T, H, Dv] in q's dtype, final_state [B, H, Dk, Dv] fp32 or None)``.
    """
    _check_shapes(q, k, v, g, beta, initial_state)
    _check_gate(q, use_gate_in_kernel, A_log, dt_bias, lower_bound)
    if chunk_size < 1:
        raise ValueError(f"chunk_size must be positive, got {chunk_size}")
    if use_gate_in_kernel:
        g = kda_gate(g, A_log, dt_bias, lower_bound)
    out_dtype = q.dtype
    batch, length, heads, key_dim = q.shape
    value_dim = v.shape[-1]
    scale = key_dim ** -0.5 if scale is None else scale

    # [B, H, T, D] in fp32: the state recurrence loses too much in half precision.
    q, k, v, g = (x.transpose(1, 2).float() for x in (q, k, v, g))
    beta = beta.transpose(1, 2).float()
    if use_qk_l2norm_in_kernel:
        q, k = l2_normalize(q), l2_normalize(k)
    q = q * scale

    state = (q.new_zeros(batch, heads, key_dim, value_dim) if initial_state is None
             else initial_state.float())
    outputs = []
    for start in range(0, length, chunk_size):
        stop = min(start + chunk_size, length)
        q_c, k_c, v_c, b_c = q[:, :, start:stop], k[:, :, start:stop], v[:, :, start:stop], beta[:, :, start:stop]
        cum_decay = g[:, :, start:stop].cumsum(dim=2)                      # G: [B, H, C, Dk]
        c = stop - start
        lower = torch.ones(c, c, dtype=torch.bool, device=q.device).tril()
        # exp(G_r - G_j) for j <= r, zero above the diagonal: [B, H, C, C, Dk].
        pair_decay = (cum_decay.unsqueeze(3) - cum_decay.unsqueeze(2)).masked_fill(~lower[..., None], float("-inf"))
        pair_decay = pair_decay.exp()

        key_key = torch.einsum("bhrd,bhjd,bhrjd->bhrj", k_c, k_c, pair_decay)
        strictly_lower = lower.logical_and(~torch.eye(c, dtype=torch.bool, device=q.device))
        system = torch.eye(c, device=q.device) + (b_c.unsqueeze(-1) * key_key).masked_fill(~strictly_lower, 0.0)
        decayed_keys = k_c * cum_decay.exp()                                # k_r * exp(G_r), G_r <= 0
        rhs = torch.cat([b_c.unsqueeze(-1) * v_c, b_c.unsqueeze(-1) * decayed_keys], dim=-1)
        solved = torch.linalg.solve_triangular(system, rhs, upper=False, unitriangular=True)
        u_free, w = solved.split([value_dim, key_dim], dim=-1)
        written = u_free - w @ state                                        # u: [B, H, C, Dv]

        query_key = torch.einsum("bhrd,bhjd,bhrjd->bhrj", q_c, k_c, pair_decay)
        outputs.append((q_c * cum_decay.exp()) @ state + query_key @ written)

        chunk_decay = cum_decay[:, :, -1:]                                  # G_C: [B, H, 1, Dk]
        carried_keys = k_c * (chunk_decay - cum_decay).exp()
        state = state * chunk_decay.transpose(-1, -2).exp() + carried_keys.transpose(-1, -2) @ written

    out = torch.cat(outputs, dim=2).transpose(1, 2).to(out_dtype)
    return out, (state if output_final_state else None)


@autocast_off
def recurrent_kda(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    scale: float | None = None,
    initial_state: torch.Tensor | None = None,
    output_final_state: bool = False,
    use_qk_l2norm_in_kernel: bool = False,
    use_gate_in_kernel: bool = False,
    A_log: torch.Tensor | None = None,
    dt_bias: torch.Tensor | None = None,
    lower_bound: float | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Step-by-step KDA, the definition itself; same arguments and shapes as :func:`chunk_kda`. For tests."""
    _check_shapes(q, k, v, g, beta, initial_state)
    _check_gate(q, use_gate_in_kernel, A_log, dt_bias, lower_bound)
    if use_gate_in_kernel:
        g = kda_gate(g, A_log, dt_bias, lower_bound)
    out_dtype = q.dtype
    batch, length, heads, key_dim = q.shape
    scale = key_dim ** -0.5 if scale is None else scale
    q, k, v, g, beta = (x.float() for x in (q, k, v, g, beta))
    if use_qk_l2norm_in_kernel:
        q, k = l2_normalize(q), l2_normalize(k)
    state = q.new_zeros(batch, heads, key_dim, v.shape[-1]) if initial_state is None else initial_state.float()
    outputs = []
    for t in range(length):
        state = state * g[:, t].exp().unsqueeze(-1)
        predicted = torch.einsum("bhkv,bhk->bhv", state, k[:, t])
        delta = beta[:, t].unsqueeze(-1) * (v[:, t] - predicted)
        state = state + k[:, t].unsqueeze(-1) * delta.unsqueeze(-2)
        outputs.append(torch.einsum("bhkv,bhk->bhv", state, q[:, t] * scale))
    out = torch.stack(outputs, dim=1).to(out_dtype)
    return out, (state if output_final_state else None)
