"""Peak tensor memory on CPU: a dispatch mode that adds each new storage's bytes and subtracts them when the storage
is freed (tests/train/test_chunked_memory.py, tests/parallel/test_context_parallel_memory.py)."""

from __future__ import annotations

import contextlib
import weakref

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten


class PeakTensorBytes(TorchDispatchMode):
    """The most bytes of tensor storage created inside the mode and alive at once."""

    def __init__(self) -> None:
        super().__init__()
        self.live: dict[int, int] = {}
        self.current = 0
        self.peak = 0

    def _free(self, key: int) -> None:
        self.current -= self.live.pop(key, 0)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for value in tree_flatten(out)[0]:
            if isinstance(value, torch.Tensor):
                storage = value.untyped_storage()
                key = storage.data_ptr()
                if key and key not in self.live:
                    self.live[key] = storage.nbytes()
                    self.current += storage.nbytes()
                    weakref.finalize(storage, self._free, key)
        self.peak = max(self.peak, self.current)
        return out


def use_fast_kernel_stand_ins(model) -> None:
    """Run ``model``'s token mixers through the fast ops' autograd Functions (SegmentedKDA, SparseLatentAttention)
    around CPU stand-in kernels: what is saved for backward depends on the Functions, not on the kernels inside."""
    from genolc.model.layers.dsa import DSAAttention
    from genolc.model.layers.kda import KimiDeltaAttention
    from genolc.model.ops.dsa import reference as dsa_reference, triton as dsa_triton
    from genolc.model.ops.kda import fla as kda_fla

    def kda_op(q, k, v, g, beta, initial_state=None, output_final_state=False, use_qk_l2norm_in_kernel=False,
               use_gate_in_kernel=False, A_log=None, dt_bias=None, lower_bound=None, **unused):
        q, k, v, g, beta, initial_state = kda_fla.prepare_inputs(q, k, v, g, beta, initial_state)
        gate = kda_fla.resolve_gate(q, use_gate_in_kernel, A_log, dt_bias, lower_bound, None)
        return kda_fla.segmented_kda(q, k, v, g, beta, q.shape[-1] ** -0.5, initial_state, output_final_state,
                                      use_qk_l2norm_in_kernel, q.shape[1] // 2 + 1,
                                      kernel=kda_fla.reference_segment_kernel, gate=gate)

    def sparse_forward(q_lat, latent, indices, scale):
        return (dsa_reference.sparse_latent_attention(q_lat, latent, indices, scale),
                torch.zeros(q_lat.shape[:3]))

    def sparse_op(q_lat, latent, indices, softmax_scale, **unused):
        q_lat, latent, indices = dsa_triton.prepare_inputs(q_lat, latent, indices.int())
        return dsa_triton.SparseLatentAttention.apply(q_lat, latent, indices, softmax_scale, (sparse_forward, None))

    for module in model.modules():
        if isinstance(module, KimiDeltaAttention):
            module.kda_op = kda_op
        if isinstance(module, DSAAttention):
            module.sparse_attention_op = sparse_op


def use_cuda_mhc_ops(model) -> None:
    """Run ``model``'s hyper-connections through the custom ops CUDA dispatches to (genolc.model.ops.mhc.op: the fused
    mixing logits with the block input, and the comb weights, whose autograd saves what the CUDA kernels' does) on their
    CPU paths."""
    from genolc.model.layers.mhc import HyperConnection
    from genolc.model.ops.mhc import op as mhc_op

    for module in model.modules():
        if isinstance(module, HyperConnection):
            module.input_op = mhc_op.block_input
            module.comb_op = mhc_op.comb_weights_op


class _GroupedMatmul(torch.autograd.Function):
    """``torch._grouped_mm`` for 2-D ``a`` and 3-D ``b`` with saved values as on CUDA, whose derivative keeps its two
    inputs (the CPU fallback keeps per-group slices and products besides)."""

    @staticmethod
    def forward(ctx, a, b, offs):
        ctx.save_for_backward(a, b, offs)
        return _grouped_products(a, b, offs)

    @staticmethod
    def backward(ctx, grad):
        a, b, offs = ctx.saved_tensors
        grad_a, grad_b = torch.zeros_like(a), torch.zeros_like(b)
        start = 0
        for group, end in enumerate(offs.tolist()):
            grad_a[start:end] = grad[start:end] @ b[group].transpose(0, 1)
            grad_b[group] = a[start:end].transpose(0, 1) @ grad[start:end]
            start = end
        return grad_a, grad_b, None


def _grouped_products(a, b, offs):
    out = a.new_empty(a.shape[0], b.shape[-1])
    start = 0
    for group, end in enumerate(offs.tolist()):
        out[start:end] = a[start:end] @ b[group]
        start = end
    return out


@contextlib.contextmanager
def grouped_mm_saving_as_on_cuda():
    """``torch._grouped_mm`` replaced by :class:`_GroupedMatmul` while the block runs."""
    original = torch._grouped_mm
    torch._grouped_mm = lambda a, b, offs=None, **unused: _GroupedMatmul.apply(a, b, offs)
    try:
        yield
    finally:
        torch._grouped_mm = original


def saved_bytes_per_module(model, modules, run, bf16: bool = False) -> list[int]:
    """Bytes autograd saves for backward inside each of ``modules`` (in call order; the model's parameters left out)
    while ``run()`` runs the model's forward, under bf16 autocast with ``bf16``."""
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    saved: dict[int, int] = {}
    per_module: list[int] = []

    def pack(tensor):
        ptr = tensor.untyped_storage().data_ptr()
        if ptr not in params:
            saved[ptr] = tensor.untyped_storage().nbytes()
        return tensor

    handles = []
    for module in modules:
        handles.append(module.register_forward_pre_hook(lambda *args: saved.clear()))
        handles.append(module.register_forward_hook(lambda *args: per_module.append(sum(saved.values()))))
    try:
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor), \
                torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            run()
    finally:
        for handle in handles:
            handle.remove()
    return per_module
