"""python benchmarks/bench_kda_conv.py [--presets small,base] [--configs 128x8x64x4,...]   (on the GPU; carry: [".gpu"])

KDA's short convolution with SiLU (genolc/model/ops/kda/conv.py) on one chunk of each preset's training step
(`small` 64k tokens, `base` 32k, as the trainer chunks 512k), with a 3-token tail from the chunk before:

- ``layer``: ``KimiDeltaAttention.convolved_heads`` compiled as the trainer compiles it (torch.compile, static
  shapes, bf16 autocast), forward alone (no grad, the chunked step's first pass) and forward and backward (gradients
  of the projections and of the taps), two ways: ``triton`` (the custom ops ``genolc::kda_conv_silu`` and its
  backward, conv_triton.py's kernels) and ``traced`` (as before them: the torch forward and backward traced into
  inductor's kernels, one output split into q, k, v and copied);
- ``kernels``: the forward (q, k, v as three parts) and the backward alone on the same tensors, the Triton kernels
  at each ``--configs`` tile (segment rows x segments x channels x warps), and the torch code compiled and eager.

Median of 20 after a warm-up (gpu_bench_common.measure); every gradient's error against fp64 autograd of the
definition (F.conv1d); the kernels one layer forward and backward launches (torch.profiler). Writes JSON (command,
git SHA, device) to $OUT or benchmarks/results/kda_conv_<date>.json.
"""

from __future__ import annotations

import argparse
import json

import torch

from gpu_bench_common import measure, profiled_kernels, rel_err, write_results
from genolc.model.layers.kda import KimiDeltaAttention
from genolc.model.ops.kda import conv, conv_triton
from genolc.model.presets import preset

CHUNK = {"small": 65536, "base": 32768}


class TracedTorchConv(torch.autograd.Function):
    """The convolution as it was before its kernels: torch forward and backward, which torch.compile traced."""

    @staticmethod
    def forward(ctx, padded, weight):
        ctx.save_for_backward(padded, weight)
        return conv.F.silu(conv._pre_activation(padded, weight), inplace=True).to(padded.dtype)

    @staticmethod
    def backward(ctx, grad_out):
        padded, weight = ctx.saved_tensors
        return conv.torch_conv_silu_backward([grad_out], padded, weight)


def traced_heads(layer, qkv, tail):
    """``convolved_heads`` before the kernels: one output, split into q, k, v and each made contiguous."""
    out = TracedTorchConv.apply(layer.padded_conv_input(qkv, tail), layer.conv1d.weight[:, 0])
    return tuple(part.contiguous() for part in layer.split_heads(out))


def parse_config(text: str) -> conv_triton.ConvBackwardConfig:
    rows, segments, channels, warps = (int(part) for part in text.split("x"))
    return conv_triton.ConvKernelConfig(segment_rows=rows, segments=segments, block_channels=channels,
                                          num_warps=warps)


def exact_gradients(layer, qkv, tail, grads):
    """fp64 autograd of F.conv1d + SiLU over the layer's padded input: (d_qkv, d_taps)."""
    weight = layer.conv1d.weight.detach()[:, 0].double().requires_grad_()
    leaf = qkv.detach().double().requires_grad_()
    padded = torch.cat([tail.double(), leaf], dim=1)
    out = conv.reference_causal_conv_silu(padded, weight)
    d_qkv, d_weight = torch.autograd.grad(out, (leaf, weight), torch.cat([g.flatten(2) for g in grads], -1).double())
    return d_qkv, d_weight


def bench_layer(name: str, layer, qkv, tail, grads, exact) -> list[dict]:
    rows = []
    for way, function in (("triton", KimiDeltaAttention.convolved_heads), ("traced", traced_heads)):
        torch._dynamo.reset()
        compiled = torch.compile(function, dynamic=False)

        def forward_backward():
            with torch.autocast("cuda", dtype=torch.bfloat16):
                heads = compiled(layer, qkv, tail)
            return torch.autograd.grad(heads, (qkv, layer.conv1d.weight), grads)

        def forward():
            with torch.no_grad(), torch.autocast("cuda", dtype=torch.bfloat16):
                return compiled(layer, qkv, tail)

        d_qkv, d_weight = forward_backward()
        rows.append({"preset": name, "part": "layer", "way": way, "tokens": qkv.shape[1], "channels": qkv.shape[2],
                     "forward_ms": round(measure(forward, repeats=20)["ms"], 3),
                     "forward_backward_ms": round(measure(forward_backward, repeats=20)["ms"], 3),
                     "d_qkv_error_vs_fp64": rel_err(d_qkv, exact[0]),
                     "d_taps_error_vs_fp64": rel_err(d_weight[:, 0], exact[1]),
                     "kernels": profiled_kernels(forward_backward)})
        print(json.dumps({k: v for k, v in rows[-1].items() if k != "kernels"}))
    return rows


def bench_kernels(name: str, grads, padded, weight, configs, exact) -> list[dict]:
    """The forward (three parts) and the backward alone at each tile, and the torch code compiled and eager."""
    compiled_forward = torch.compile(conv.torch_conv_silu_parts, dynamic=False)
    compiled_backward = torch.compile(conv.torch_conv_silu_backward, dynamic=False)
    ways = {}
    for c in configs:
        tag = f"triton {c.segment_rows}x{c.segments}x{c.block_channels}x{c.num_warps}"
        ways[tag] = (lambda c=c: conv_triton.conv_silu_forward(padded, weight, 3, c),
                     lambda c=c: conv_triton.conv_silu_backward(grads, padded, weight, c))
    ways["torch compiled"] = (lambda: compiled_forward(padded, weight, 3),
                              lambda: compiled_backward(grads, padded, weight))
    ways["torch eager"] = (lambda: conv.torch_conv_silu_parts(padded, weight, 3),
                           lambda: conv.torch_conv_silu_backward(grads, padded, weight))
    rows = []
    for way, (forward, backward) in ways.items():
        d_padded, d_weight = backward()
        rows.append({"preset": name, "part": "kernels", "way": way, "tokens": padded.shape[1] - 3,
                     "channels": padded.shape[2], "forward_ms": round(measure(forward, repeats=20)["ms"], 3),
                     "backward_ms": round(measure(backward, repeats=20)["ms"], 3),
                     "d_padded_error_vs_fp64": rel_err(d_padded[:, 3:], exact[0]),
                     "d_taps_error_vs_fp64": rel_err(d_weight, exact[1])})
        print(json.dumps(rows[-1]))
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--presets", default="small,base")
    parser.add_argument("--configs", default="128x8x64x4,64x8x64x4,128x16x64x4,128x4x64x2,128x8x128x4,"
                                              "128x16x64x8,256x16x64x4",
                        help="Triton tiles to time: segment rows x segments x channels x warps, comma-separated")
    args = parser.parse_args()
    configs = [parse_config(text) for text in args.configs.split(",")]
    rows = []
    for name in args.presets.split(","):
        torch.manual_seed(0)
        layer = KimiDeltaAttention(preset(name), layer_idx=0).cuda()
        channels = layer.conv1d.weight.shape[0]
        qkv = torch.randn(1, CHUNK[name], channels, device="cuda", dtype=torch.bfloat16, requires_grad=True)
        tail = torch.randn(1, 3, channels, device="cuda", dtype=torch.bfloat16)
        heads_shape = (1, CHUNK[name], layer.num_heads, layer.head_dim)
        grads = tuple(torch.randn(heads_shape, device="cuda", dtype=torch.bfloat16) for _ in range(3))
        exact = exact_gradients(layer, qkv, tail, grads)
        rows += bench_layer(name, layer, qkv, tail, grads, exact)
        padded = torch.cat([tail, qkv.detach()], dim=1)
        part_grads = [g.flatten(2) for g in grads]
        rows += bench_kernels(name, part_grads, padded, layer.conv1d.weight.detach()[:, 0].contiguous(), configs,
                              exact)
        del exact
        torch.cuda.empty_cache()
    print(f"wrote {write_results('kda_conv', rows, {'timing': 'median of 20 after one warm-up, CUDA events'})}")


if __name__ == "__main__":
    main()
