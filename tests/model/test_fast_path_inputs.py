"""What the CUDA kernels would be handed inside the real model, checked on CPU.

The full model (the small preset's head shapes, three layers: KDA, a full DSA layer, a shared DSA layer; a short
top-k so T=300 selects) runs forward and backward the way the trainer and the scorer run it on CUDA. Spies in
place of the dispatch functions record every call's tensors, pass them through the fast op's own
``prepare_inputs`` and ``check_kernel_inputs`` (the functions the fast op runs before its kernel), then call the
reference so the model keeps running. Any call the fast op would refuse fails the test.

CPU autocast and CUDA autocast cast different op lists: CUDA runs ``layer_norm``, ``softmax``, ``sum``, ``pow``,
``rsqrt``... in fp32, CPU does not. ``CudaAutocastPolicy`` adds CUDA's fp32 list on top of CPU autocast (whose
lower-precision list, Linear / matmul / conv, matches CUDA's), so the dtypes reaching the ops are CUDA's.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from typing import Any, Callable

import pytest
import torch
from torch.overrides import TorchFunctionMode
from torch.utils.checkpoint import checkpoint as torch_checkpoint

import genolc.model.indexer_loss as indexer_loss_module
import genolc.model.layers.moe as moe_layer
from genolc.model.checkpoint import model_from_tensors
from genolc.model.model import build_model
from genolc.model.ops import dispatch
from genolc.model.ops.dsa import triton as dsa_triton
from genolc.model.ops.dsa import reference as dsa_reference
from genolc.model.ops.indexer import triton as indexer_triton
from genolc.model.ops.kda import fla as kda_fla
from genolc.model.ops.moe import grouped_mm as moe_grouped_mm
from genolc.model.presets import preset

SEQ_LEN = 300

# CUDA autocast's fp32 ops (aten/src/ATen/autocast_mode.cpp: the fp32 list and the fp32_set_opt_dtype list) as
# torch-function names; Tensor operators appear under their dunder names.
CUDA_FP32_OPS = frozenset({
    "acos", "asin", "cosh", "erfinv", "exp", "expm1", "log", "log10", "log2", "log1p", "reciprocal", "rsqrt", "sinh",
    "tan", "pow", "__pow__", "__rpow__", "softplus", "layer_norm", "group_norm", "norm", "cosine_similarity",
    "nll_loss", "kl_div", "mse_loss", "l1_loss", "smooth_l1_loss", "huber_loss", "binary_cross_entropy_with_logits",
    "dist", "cdist", "renorm", "logsumexp", "prod", "softmax", "log_softmax", "cumprod", "cumsum", "sum",
    "cross_entropy", "linalg_vector_norm", "vector_norm"})


class CudaAutocastPolicy(TorchFunctionMode):
    """Under CPU autocast, run CUDA autocast's fp32 ops in fp32 (reduced-precision inputs upcast first)."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if (torch.is_autocast_enabled("cpu") and getattr(func, "__name__", "") in CUDA_FP32_OPS
                and kwargs.get("dtype") is None):
            args = tuple(_to_fp32(a) for a in args)
            kwargs = {k: _to_fp32(v) for k, v in kwargs.items()}
        return func(*args, **kwargs)


def keep_policy_in_recompute(monkeypatch: pytest.MonkeyPatch) -> None:
    """Activation checkpoints recompute in backward, where the torch-function mode is not on the stack (autocast
    is: checkpoint restores it), so the model's checkpointed functions enter the policy themselves."""
    def with_policy(function):
        def run(*args, **kwargs):
            with CudaAutocastPolicy():
                return function(*args, **kwargs)
        return run

    for module in (indexer_loss_module, dsa_reference):
        monkeypatch.setattr(module, "checkpoint",
                            lambda function, *args, **kwargs: torch_checkpoint(with_policy(function), *args, **kwargs))


def _to_fp32(value: Any) -> Any:
    if isinstance(value, torch.Tensor) and value.dtype in (torch.bfloat16, torch.float16):
        return value.float()
    return value


def describe(tensor: torch.Tensor) -> str:
    return (f"{tensor.dtype} {tuple(tensor.shape)} stride={tensor.stride()} contiguous={tensor.is_contiguous()} "
            f"requires_grad={tensor.requires_grad}")


@dataclass
class Call:
    op: str
    inputs: dict[str, str]
    error: str | None


@dataclass
class Recorder:
    calls: list[Call] = field(default_factory=list)

    def check(self, op: str, named: dict[str, torch.Tensor], validate: Callable[[], None]) -> None:
        error = None
        try:
            with torch.no_grad():
                validate()
        except ValueError as exc:
            error = str(exc)
        self.calls.append(Call(op, {name: describe(t) for name, t in named.items() if t is not None}, error))


def grouped_mm_meta_check(x: torch.Tensor, gate_up_proj: torch.Tensor, down_proj: torch.Tensor) -> None:
    """Run both of ``_experts_chunk``'s grouped GEMMs on meta tensors laid out as on CUDA: torch's own checks
    (dtype, strides, alignment) then judge the operands, independently of ``moe_grouped_mm.check_kernel_inputs``."""
    def meta(t: torch.Tensor) -> torch.Tensor:
        return torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device="meta")

    slots, experts = x.shape[0] * 2, gate_up_proj.shape[0]
    offs = torch.empty(experts, dtype=torch.int32, device="meta")
    grouped_in = torch.empty(slots, x.shape[1], dtype=x.dtype, device="meta")
    hidden = torch._grouped_mm(grouped_in, meta(gate_up_proj).transpose(1, 2), offs=offs)
    gate, up = hidden.chunk(2, dim=-1)
    torch._grouped_mm(torch.empty_like(gate, memory_format=torch.contiguous_format), meta(down_proj).transpose(1, 2),
                      offs=offs)


def attach_spies(model: torch.nn.Module, recorder: Recorder, monkeypatch: pytest.MonkeyPatch) -> None:
    def kda_spy(q, k, v, g, beta, scale=None, initial_state=None, **kwargs):
        def validate():
            prepared = kda_fla.prepare_inputs(q, k, v, g, beta, initial_state)
            gate = kda_fla.resolve_gate(prepared[0], kwargs.get("use_gate_in_kernel", False), kwargs.get("A_log"),
                                         kwargs.get("dt_bias"), kwargs.get("lower_bound"), None)
            kda_fla.check_kernel_inputs(*prepared, gate)
        recorder.check("chunk_kda", dict(q=q, k=k, v=v, g=g, beta=beta, initial_state=initial_state,
                                         A_log=kwargs.get("A_log"), dt_bias=kwargs.get("dt_bias")), validate)
        return dispatch.chunk_kda(q, k, v, g, beta, scale=scale, initial_state=initial_state, **kwargs)

    def select_spy(index_q, head_weights, pooled, **kwargs):
        def validate():
            indexer_triton.check_kernel_inputs(*indexer_triton.prepare_inputs(index_q, head_weights, pooled))
        recorder.check("select_indices", dict(index_q=index_q, head_weights=head_weights, pooled=pooled), validate)
        return dispatch.select_indices(index_q, head_weights, pooled, **kwargs)

    def sparse_spy(q_lat, latent, indices, softmax_scale, **kwargs):
        def validate():
            dsa_triton.check_kernel_inputs(*dsa_triton.prepare_inputs(q_lat, latent, indices))
        recorder.check("sparse_latent_attention", dict(q_lat=q_lat, latent=latent, indices=indices), validate)
        return dispatch.sparse_latent_attention(q_lat, latent, indices, softmax_scale, **kwargs)

    def experts_spy(x, expert_ids, weights, gate_up_proj, down_proj, swiglu_limit):
        def validate():
            prepared = moe_grouped_mm.prepare_inputs(x, gate_up_proj, down_proj)
            moe_grouped_mm.check_kernel_inputs(*prepared)
            try:
                grouped_mm_meta_check(*prepared)
            except RuntimeError as exc:
                raise ValueError(f"torch._grouped_mm (meta) refused the operands: {exc}") from exc
        recorder.check("routed_experts", dict(x=x, expert_ids=expert_ids, weights=weights, gate_up_proj=gate_up_proj,
                                              down_proj=down_proj), validate)
        return dispatch.routed_experts(x, expert_ids, weights, gate_up_proj, down_proj, swiglu_limit)

    for module in model.modules():
        if hasattr(module, "kda_op"):
            module.kda_op = kda_spy
        if hasattr(module, "select_op"):
            module.select_op = select_spy
            module.sparse_attention_op = sparse_spy
    monkeypatch.setattr(moe_layer, "routed_experts", experts_spy)


def small_heads_config():
    return preset("small").replace(
        num_hidden_layers=3, hidden_size=512, intermediate_size=1024, moe_intermediate_size=256, index_topk=64,
        layer_types=("linear_attention", "indexed_attention", "indexed_attention"),
        mlp_layer_types=("dense", "sparse", "sparse"), indexer_types=("full", "full", "shared"))


@pytest.fixture(scope="module")
def fp32_model():
    torch.manual_seed(0)
    return build_model(small_heads_config())


def assert_fast_ops_accept(recorder: Recorder) -> None:
    ops = {call.op for call in recorder.calls}
    assert ops == {"chunk_kda", "select_indices", "sparse_latent_attention", "routed_experts"}, ops
    refused = [call for call in recorder.calls if call.error is not None]
    assert not refused, "\n".join(f"{c.op}: {c.error}\n    " + "\n    ".join(f"{k}: {v}" for k, v in c.inputs.items())
                                  for c in refused)


@pytest.mark.parametrize("cuda_policy", [False, True], ids=["cpu-autocast", "cuda-autocast-policy"])
def test_trainer_bf16_autocast_calls_satisfy_fast_ops(fp32_model, monkeypatch, cuda_policy):
    """The trainer: fp32 master weights, bf16 autocast, forward + backward with the sparse indexer loss."""
    recorder = Recorder()
    attach_spies(fp32_model, recorder, monkeypatch)
    ids = torch.randint(0, fp32_model.config.vocab_size, (1, SEQ_LEN), generator=torch.Generator().manual_seed(1))
    fp32_model.zero_grad(set_to_none=True)
    if cuda_policy:
        keep_policy_in_recompute(monkeypatch)
    with CudaAutocastPolicy() if cuda_policy else contextlib.nullcontext():
        with torch.autocast("cpu", dtype=torch.bfloat16):
            out = fp32_model(ids, indexer_loss="sparse")
        loss = out.logits.float().mean() + out.aux_losses["indexer_kl"] + out.aux_losses["moe_balance"]
        loss.backward()
    assert_fast_ops_accept(recorder)
    assert any("requires_grad=True" in call.inputs["q"] for call in recorder.calls if call.op == "chunk_kda")
    assert fp32_model.layers[0].self_attn.q_proj.weight.grad is not None


def test_scorer_bf16_weights_calls_satisfy_fast_ops(fp32_model, monkeypatch):
    """The scorer on CUDA: weights converted to bf16 by ``load_pretrained(dtype=bfloat16)`` (no autocast)."""
    bf16_model = model_from_tensors(fp32_model.config, fp32_model.state_dict(), where="test", dtype=torch.bfloat16)
    recorder = Recorder()
    attach_spies(bf16_model, recorder, monkeypatch)
    ids = torch.randint(0, bf16_model.config.vocab_size, (1, SEQ_LEN), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        bf16_model.eval()(ids)
    assert_fast_ops_accept(recorder)


def test_cuda_autocast_policy_reproduces_the_indexer_dtype_split():
    """The emulation is what found the bug: under CUDA's policy the pool keys come out fp32 next to bf16
    queries, and the kernel check refuses that pair until ``prepare_inputs`` unifies it."""
    index_q = torch.randn(1, 8, 2, 16, dtype=torch.bfloat16)
    pooled = torch.randn(1, 2, 16)
    weights = torch.rand(1, 8, 2)
    with pytest.raises(ValueError, match="share one dtype"):
        indexer_triton.check_kernel_inputs(index_q, weights, pooled)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        prepared = indexer_triton.prepare_inputs(index_q, weights, pooled)
        with CudaAutocastPolicy():
            normed = torch.nn.functional.layer_norm(torch.randn(4, 16).bfloat16(), (16,))
    assert normed.dtype == torch.float32
    assert [t.dtype for t in prepared] == [torch.bfloat16, torch.float32, torch.bfloat16]
    indexer_triton.check_kernel_inputs(*prepared)
    assert [t.dtype for t in indexer_triton.prepare_inputs(index_q, weights, pooled)] == [torch.float32] * 3


def test_fast_op_checks_refuse_what_the_kernels_cannot_take():
    q = torch.randn(1, 10, 2, 16, dtype=torch.bfloat16)
    latent = torch.randn(1, 10, 16, dtype=torch.bfloat16)
    rows = torch.zeros(1, 10, 4, dtype=torch.int32)
    strided_q = q.transpose(1, 2).contiguous().transpose(1, 2)
    with pytest.raises(ValueError, match="must be contiguous"):
        dsa_triton.check_kernel_inputs(strided_q, latent, rows)
    with pytest.raises(ValueError, match="must be contiguous"):
        dsa_triton.check_kernel_inputs(q, torch.randn(1, 10, 20, dtype=torch.bfloat16)[..., :16], rows)
    with pytest.raises(ValueError, match="int32 or int64"):
        dsa_triton.check_kernel_inputs(q, latent, torch.zeros(1, 10, 4))
    with pytest.raises(ValueError, match="share one dtype"):
        dsa_triton.check_kernel_inputs(q, latent.float(), rows)
    with pytest.raises(ValueError, match="disagree"):
        dsa_triton.check_kernel_inputs(q, latent[..., :8], rows)
    with pytest.raises(ValueError, match="contiguous last dimension"):
        dsa_triton.check_kernel_inputs(q, latent, rows.transpose(1, 2).contiguous().transpose(1, 2))
    # Mixed dtypes meet in the wider one (autocast's dtype under autocast); layouts become contiguous; rows keep
    # their dtype (no int64 copy) and, with a unit last stride, their storage.
    wide_rows = torch.zeros(1, 10, 6, dtype=torch.int32)[..., :4]
    prepared = dsa_triton.prepare_inputs(strided_q, torch.randn(1, 10, 20)[..., :16], wide_rows)
    assert [t.dtype for t in prepared] == [torch.float32, torch.float32, torch.int32]
    assert prepared[2].data_ptr() == wide_rows.data_ptr()
    dsa_triton.check_kernel_inputs(*prepared)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        prepared = dsa_triton.prepare_inputs(q, latent.float(), rows.long())
    assert [t.dtype for t in prepared] == [torch.bfloat16, torch.bfloat16, torch.int64]
    dsa_triton.check_kernel_inputs(*prepared)
    assert dsa_triton.tile_sizes(12, 384) == {"BLOCK_H": 16, "BLOCK_R": 512, "fwd_block_w": 32, "fwd_warps": 8,
                                            "bwd_block_w": 16, "bwd_warps": 8}
    assert dsa_triton.tile_sizes(64, 20)["BLOCK_H"] == 32 and dsa_triton.tile_sizes(64, 20)["BLOCK_R"] == 32
    with pytest.raises(ValueError, match="float32 initial_state"):
        kda_fla.check_kernel_inputs(q, q, q, q.float(), torch.rand(1, 10, 2), torch.zeros(1, 2, 16, 16).bfloat16())
    with pytest.raises(ValueError, match="share one dtype"):
        kda_fla.check_kernel_inputs(q, q.float(), q, q.float(), torch.rand(1, 10, 2), None)
    x, gate_up, down = torch.randn(5, 24), torch.randn(3, 16, 24), torch.randn(3, 24, 8)
    with pytest.raises(ValueError, match="bf16"):
        moe_grouped_mm.check_kernel_inputs(x, gate_up, down)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        prepared = moe_grouped_mm.prepare_inputs(x, gate_up, down)
    moe_grouped_mm.check_kernel_inputs(*prepared)
    grouped_mm_meta_check(*prepared)
    with pytest.raises(ValueError, match="multiples of 8"):
        moe_grouped_mm.check_kernel_inputs(x.bfloat16(), gate_up[:, :8].bfloat16(), down[..., :4].bfloat16())
