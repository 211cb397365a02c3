"""Kimi Delta Attention (KDA), the linear-attention mixer of GLM-5.3-Flash's "linear_attention" layers.

Per token: q, k, v projections pass a short causal depthwise convolution and SiLU; q and k are L2-normalised
(inside the op); a per-channel forget gate with a lower bound gives the log decay ``g``; ``beta = sigmoid(b_proj x)``
is the delta-rule step; the op's output goes through a sigmoid-gated RMSNorm per head and the output projection.

Parameter names match transformers' ``Glm5NextTextLinearAttention`` so checkpoints load as they are. The op is the
module attribute ``kda_op``, by default ``genolc.model.ops.dispatch.chunk_kda``: the pure-torch reference for CPU
tensors, fla's kernel (segment-wise over T) for CUDA tensors. No flag here chooses an implementation.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from genolc.model.cache import LayerCache
from genolc.model.config import ModelConfig
from genolc.model.layers.norm import GatedRMSNorm
from genolc.model.ops.dispatch import chunk_kda
from genolc.model.ops.kda.conv import causal_conv_silu, causal_conv_silu_parts
from genolc.model.ops.kda.gate import kda_gate


class ForgetGate(nn.Module):
    """Per-channel log decay ``g [B, T, H, Dk]`` (<= 0) from a low-rank projection of the input.

    With a lower bound ``lb`` (GLM-5.3-Flash: -5): ``g = lb * sigmoid(exp(A_log) * (f + dt_bias))``, so each step
    decays by at most ``exp(lb)``. Without one: ``g = -exp(A_log) * softplus(f + dt_bias)`` (Mamba-style).
    The layer hands the KDA op the projection ``f`` (:meth:`pre_activation`) and these parameters, and the op forms
    ``g`` (inside fla's kernel on CUDA, so no fp32 ``[B, T, H, Dk]`` decay is stored); ``forward`` is that same
    gate in torch.
    """

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.num_heads = config.linear_num_heads
        self.head_dim = config.linear_head_dim
        width = self.num_heads * self.head_dim
        self.f_a_proj = nn.Linear(config.hidden_size, self.head_dim, bias=False)
        self.f_b_proj = nn.Linear(self.head_dim, width, bias=False)
        self.dt_bias = nn.Parameter(torch.zeros(width, dtype=torch.float32))
        self.A_log = nn.Parameter(torch.zeros(self.num_heads, dtype=torch.float32))
        self.lower_bound = config.linear_lower_bound

    def pre_activation(self, x: torch.Tensor) -> torch.Tensor:
        """``f [B, T, H, Dk]`` in the projection's dtype, before ``dt_bias``."""
        return self.expand(self.f_a_proj(x))

    def expand(self, low_rank: torch.Tensor) -> torch.Tensor:
        """``f [B, T, H, Dk]`` from ``f_a_proj``'s output ``[B, T, Dk]`` (the KDA layer makes that in one product with
        its other input projections)."""
        batch, length = low_rank.shape[:2]
        return self.f_b_proj(low_rank).view(batch, length, self.num_heads, self.head_dim)

    def op_arguments(self, heads: slice | None = None) -> dict:
        """The KDA op's keyword arguments that form this gate from :meth:`pre_activation` inside the op (``heads``:
        those of a range of heads only, for an op call over those heads)."""
        A_log, dt_bias = self.A_log, self.dt_bias
        if heads is not None:
            A_log, dt_bias = A_log[heads], dt_bias.view(self.num_heads, self.head_dim)[heads].reshape(-1)
        return dict(use_gate_in_kernel=True, A_log=A_log, dt_bias=dt_bias, lower_bound=self.lower_bound)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return kda_gate(self.pre_activation(x), self.A_log, self.dt_bias, self.lower_bound)


class KimiDeltaAttention(nn.Module):
    """``forward(x [B, T, D]) -> [B, T, D]``: one KDA token mixer (training / prefill, no cache)."""

    def __init__(self, config: ModelConfig, layer_idx: int) -> None:
        super().__init__()
        self.layer_idx = layer_idx
        self.num_heads = config.linear_num_heads
        self.head_dim = config.linear_head_dim
        width = self.num_heads * self.head_dim
        self.width = width
        hidden = config.hidden_size
        self.q_proj = nn.Linear(hidden, width, bias=False)
        self.k_proj = nn.Linear(hidden, width, bias=False)
        self.v_proj = nn.Linear(hidden, width, bias=False)
        # Depthwise causal conv over the concatenated q, k, v channels; its weight stays fp32 like transformers'.
        self.conv1d = nn.Conv1d(3 * width, 3 * width, kernel_size=config.linear_conv_kernel_dim, groups=3 * width,
                                bias=False, padding=config.linear_conv_kernel_dim - 1, dtype=torch.float32)
        self.forget_gate = ForgetGate(config)
        self.b_proj = nn.Linear(hidden, self.num_heads, bias=False)
        self.g_a_proj = nn.Linear(hidden, self.head_dim, bias=False)
        self.g_b_proj = nn.Linear(self.head_dim, width, bias=False)
        self.o_norm = GatedRMSNorm(self.head_dim, eps=config.rms_norm_eps)
        self.o_proj = nn.Linear(width, hidden, bias=False)
        self.kda_op = chunk_kda

    def short_conv(self, qkv: torch.Tensor, tail: torch.Tensor | None = None) -> torch.Tensor:
        """Causal depthwise conv + SiLU over ``[B, T, C]``: output t sees inputs t-K+1 .. t.

        ``tail [B, <= K-1, C]``: the inputs just before ``qkv`` (a chunk's predecessors); zeros where absent.
        """
        return causal_conv_silu(self.padded_conv_input(qkv, tail), self.conv1d.weight[:, 0])

    def padded_conv_input(self, qkv: torch.Tensor, tail: torch.Tensor | None = None) -> torch.Tensor:
        """``[B, K - 1 + T, C]``: ``qkv`` preceded by the ``K - 1`` inputs before it (``tail``, zeros where absent)."""
        kernel = self.conv1d.weight.shape[-1]
        known = 0 if tail is None else tail.shape[1]
        inputs = qkv if not known else torch.cat([tail.to(qkv.dtype), qkv], dim=1)
        return F.pad(inputs, (0, 0, kernel - 1 - known, 0))

    def mixer_inputs(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """Per-token inputs of ``x [B, T, D]``: the convolution's input (q, k, v projections side by side,
        ``[B, T, 3 W]``), the forget gate's pre-activation ``[B, T, H, Dk]``, ``beta [B, T, H]`` and the output
        gate's low-rank projection ``g_a_proj(x) [B, T, Dk]`` (for :meth:`output`).

        All six projections of ``x`` are one product with their weights stacked: x's gradient is one GEMM instead
        of six and five additions, and q, k, v need no concatenation (the H200 profile of issue 14)."""
        weights = [self.q_proj.weight, self.k_proj.weight, self.v_proj.weight, self.b_proj.weight,
                   self.forget_gate.f_a_proj.weight, self.g_a_proj.weight]
        widths = [3 * self.width, self.num_heads, self.head_dim, self.head_dim]
        # Zero rows up to a multiple of 16: cuBLAS's fast bf16 kernels want the product's rows 16-byte aligned
        # (`base`'s 4876 columns would not be).
        padding = -sum(widths) % 16
        if padding:
            weights.append(self.q_proj.weight.new_zeros(padding, x.shape[-1]))
        conv_input, b, forget_low, gate_low, _ = F.linear(x, torch.cat(weights)).split(widths + [padding], dim=-1)
        # The narrow outputs are copied out: saved as views (by the projections that take them) they would keep
        # the whole product alive for backward.
        gate_input = self.forget_gate.expand(forget_low.contiguous())
        return conv_input, gate_input, torch.sigmoid(b), gate_low.contiguous()

    def convolved_heads(self, qkv: torch.Tensor, tail: torch.Tensor | None = None
                        ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """:meth:`short_conv`, then :meth:`split_heads` with each of q, k, v contiguous: the convolution writes the
        three tensors itself (conv.causal_conv_silu_parts). fla would copy strided slices of one output."""
        heads_shape = (*qkv.shape[:2], self.num_heads, self.head_dim)
        parts = causal_conv_silu_parts(self.padded_conv_input(qkv, tail), self.conv1d.weight[:, 0], 3)
        q, k, v = (part.view(heads_shape) for part in parts)
        return q, k, v

    def split_heads(self, qkv: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The short convolution's output ``[B, T, 3 W]`` as q, k, v ``[B, T, H, Dk]``."""
        heads_shape = (*qkv.shape[:2], self.num_heads, self.head_dim)
        q, k, v = (t.reshape(heads_shape) for t in qkv.split(self.width, dim=-1))
        return q, k, v

    def recurrence(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, gate_input: torch.Tensor,
                   beta: torch.Tensor, initial_state: torch.Tensor | None,
                   output_final_state: bool, heads: slice | None = None,
                   keep_intermediates: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
        """``(core [B, T, H, Dv], final state or None)``: the KDA op from ``initial_state`` (None: zeros). With
        ``heads`` the inputs hold only that range of heads (genolc/parallel/kda_heads.py); ``keep_intermediates``:
        the op keeps what its backward would compute again (asked only then, so ops without the option serve)."""
        kept = {"keep_intermediates": True} if keep_intermediates else {}
        return self.kda_op(q, k, v, gate_input, beta, initial_state=initial_state,
                           output_final_state=output_final_state, use_qk_l2norm_in_kernel=True,
                           **self.forget_gate.op_arguments(heads), **kept)

    def output(self, core: torch.Tensor, gate_low: torch.Tensor) -> torch.Tensor:
        """The op's ``core [B, T, H, Dv]`` through the gated norm (its gate from ``gate_low = g_a_proj(x)
        [B, T, Dk]``, :meth:`mixer_inputs`) and ``o_proj``."""
        batch, length = gate_low.shape[:2]
        gate = self.g_b_proj(gate_low).view(batch, length, self.num_heads, self.head_dim)
        return self.o_proj(self.o_norm(core, gate).reshape(batch, length, self.width))

    def forward(self, x: torch.Tensor, cache: LayerCache | None = None) -> torch.Tensor:
        """``x [B, T, D] -> [B, T, D]``; with ``cache`` (genolc.model.cache) x is one chunk of a window: the state
        and convolution inputs of the positions before it come from ``cache.past``, this chunk's go to
        ``cache.present``. genolc/parallel/kda_cp.py runs the same steps over a context-parallel rank's pieces."""
        if x.dim() != 3:
            raise ValueError(f"KDA input must be [B, T, D]; got {tuple(x.shape)}")
        conv_input, gate_input, beta, gate_low = self.mixer_inputs(x)
        conv_tail = None if cache is None else cache.past.get("conv_tail")
        q, k, v = self.convolved_heads(conv_input, conv_tail)
        initial_state = None if cache is None else cache.past.get("state")
        core, final_state = self.recurrence(q, k, v, gate_input, beta, initial_state, cache is not None,
                                            keep_intermediates=cache is not None and cache.keep_kda_intermediates)
        if cache is not None:
            keep = self.conv1d.weight.shape[-1] - 1
            seen = conv_input if conv_tail is None or conv_input.shape[1] >= keep else \
                torch.cat([conv_tail.to(conv_input.dtype), conv_input], 1)
            # A copy: a view would keep the chunk's whole input product alive until the chunk's backward.
            cache.present["conv_tail"] = seen[:, max(0, seen.shape[1] - keep):].clone()
            cache.present["state"] = final_state
        return self.output(core, gate_low)
