"""python benchmarks/bench_mhc_block_input.py [--tokens 32768]   (GPU; carry [".gpu"])

A hyper-connection's glue around its block, as a decoder layer runs it on CUDA with bf16 streams under bf16 autocast:
the hyper-connection's forward compiled (as genolc/train/apply.py compiles it), a stand-in block
(``block_out = 2 * block_input``), then the merge (the fused fp32 op). Timed forward and forward + backward for one
chunk of ``--tokens`` with `small`'s (D = 1024) and `base`'s (D = 1536) widths, three ways of reading the streams:

- ``two_ops``: what genolc ran until the fused block input: the mixing-logits op, then the pre weights and the
  weighted sum of the streams compiled by inductor. In the backward, inductor reduces the block input's gradient
  against the streams (for the pre weights), the mixing op's kernel writes its share of the streams' gradient, and
  a compiled element-wise pass adds the block input's share to it.
- ``fused_merge_apart``: the fused custom op (genolc/model/ops/mhc/op.py) as session 36 ran it: the weighted sum in a
  kernel of its own, and a backward whose mixing kernel adds the block input's share before it writes the streams'
  gradient; the merge reads the streams directly, so autograd adds the merge's share of their gradient in a pass
  of its own.
- ``fused``: ``genolc.model.ops.dispatch.mhc_block_input`` as the model calls it now: the merge reads the op's alias
  of the streams (op.BlockInputPassingStreams), and the mixing kernel adds the merge's share as well.

Per way: median of 20
after a warm-up (gpu_bench_common.measure), the gradients' error against fp64 autograd of the reference, and the
kernels of one forward and backward. Writes JSON (command, git SHA, device) to $OUT or
benchmarks/results/mhc_block_input_<date>.json.
"""

from __future__ import annotations

import argparse
import functools
import json

import torch

from gpu_bench_common import measure, profiled_kernels, rel_err, write_results
from genolc.model import build_model, preset
from genolc.model.ops import dispatch
from genolc.model.ops.mhc import reference, triton as mhc_triton


def fused_merge_apart(x, *args):
    """The fused op, with the merge reading the streams themselves rather than the op's alias of them."""
    logits, block_input, _ = dispatch.mhc_block_input(x, *args)
    return logits, block_input, x


WAYS = {"two_ops": functools.partial(reference.block_input, mixing=dispatch.mhc_mixing_logits),
        "fused_merge_apart": fused_merge_apart, "fused": dispatch.mhc_block_input}


def glue(connection, streams):
    """The layer's glue around a stand-in block: the hyper-connection's forward, then the merge in fp32."""
    post, comb, block_input, for_merge = connection(streams)
    return dispatch.mhc_merge(2 * block_input, post, comb, for_merge, compute_dtype=torch.float32)


def exact_glue(connection, streams):
    """:func:`glue` in fp64 with the reference formulas (a copy of the connection's parameters)."""
    fn, scale, base = (p.detach().double().requires_grad_() for p in (connection.fn, connection.scale,
                                                                       connection.base))
    n = connection.n_streams
    batch, length = streams.shape[:2]
    mixed, block_input, _ = reference.block_input(streams.reshape(batch * length, -1), fn, scale, base,
                                                  connection.norm_eps, connection.eps, n)
    _, post_logit, comb_logit = mixed.view(batch, length, -1).split([n, n, n * n], dim=-1)
    _, post_bias, comb_bias = base.split([n, n, n * n])
    post = 2 * torch.sigmoid(post_logit * scale[1] + post_bias)
    comb = reference.comb_weights(comb_logit.view(batch, length, n, n) * scale[2] + comb_bias.view(n, n),
                                  connection.sinkhorn_iters, connection.eps)
    out = reference.merge(2 * block_input.view(batch, length, -1), post, comb, streams)
    return out, (fn, scale, base)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tokens", type=int, default=32768)
    args = parser.parse_args()
    if args.tokens < 1:
        parser.error(f"--tokens must be positive, got {args.tokens}")
    if not torch.cuda.is_available():
        parser.error("needs a CUDA device (it times the hyper-connection's kernels there)")
    rows = []
    for name in ("small", "base"):
        torch.manual_seed(0)
        connection = build_model(preset(name), device="cuda").layers[1].attn_hc
        n, dim = connection.n_streams, connection.fn.shape[1] // connection.n_streams
        streams = (torch.randn(1, args.tokens, n, dim, device="cuda") * 2).to(torch.bfloat16).requires_grad_()
        grad = torch.randn(1, args.tokens, n, dim, device="cuda").to(torch.bfloat16)
        leaves = [streams, connection.fn, connection.scale, connection.base]
        reason = mhc_triton.block_input_unsupported_reason(streams.reshape(args.tokens, -1), connection.fn,
                                                           connection.scale, connection.base, n)
        if reason is not None:
            parser.error(f"{name}: the block-input kernels do not take its operands ({reason})")
        exact_streams = streams.detach().double().requires_grad_()
        exact_out, exact_params = exact_glue(connection, exact_streams)
        exact_grads = torch.autograd.grad(exact_out, [exact_streams, *exact_params], grad.double())
        for way, input_op in WAYS.items():
            connection.input_op = input_op
            forward = torch.compile(type(connection).forward, dynamic=False)
            module = functools.partial(forward, connection)

            def forward_only():
                with torch.autocast("cuda", dtype=torch.bfloat16):
                    return glue(module, streams.detach())

            def forward_backward():
                with torch.autocast("cuda", dtype=torch.bfloat16):
                    out = glue(module, streams)
                return torch.autograd.grad(out, leaves, grad)

            grads = forward_backward()
            rows.append({"preset": name, "tokens": args.tokens, "dim": dim, "way": way,
                         "forward_ms": round(measure(forward_only, repeats=20)["ms"], 3),
                         "forward_backward_ms": round(measure(forward_backward, repeats=20)["ms"], 3),
                         "gradient_errors_vs_fp64": {part: rel_err(g, e) for part, g, e in
                                                     zip(("streams", "fn", "scale", "base"), grads, exact_grads)},
                         "kernels": profiled_kernels(forward_backward)})
            print(json.dumps({k: v for k, v in rows[-1].items() if k != "kernels"}))
            torch._dynamo.reset()
    timing = {"timing": "median of 20 after one warm-up, CUDA events"}
    print(f"wrote {write_results('mhc_block_input', rows, timing)}")


if __name__ == "__main__":
    main()
