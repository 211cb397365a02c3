"""python benchmarks/bench_mhc_merge.py [--tokens 32768] [--stream-dtype bfloat16|float32]   (GPU; carry [".gpu"])

mHC's merge, ``new_streams = post ⊗ block_out + comb^T @ streams`` per token (``genolc.model.layers.mhc.
merge_streams``), for one chunk of ``--tokens`` with the shapes of `small` (D = 1024) and `base` (D = 1536), fp32
streams and a bf16 block output, under bf16 autocast and torch.compile as the trainer runs it. The model's own
``merge_streams`` (``model``) beside three forms of the same sum:

- ``matmul``: the model's form up to 2026-12-02. Under autocast the ``[4, 4] x [4, D]`` product per token is a bf16
  batched GEMM: the fp32 streams are cast to bf16 first, then cuBLAS runs a batch of one problem per token, then the
  sum with ``post ⊗ block_out`` is added. The `base` 128k profile after 573b619 shows a skinny batched GEMM
  (``nvjet_sm90_tst_512x32_64x3_2x1_v_bz_NTT``, 384 calls, 548 ms of 6.5 s of kernels) beside two pointwise
  kernels named ``..._to_copy_bmm_view_1`` and ``..._add_bmm_mul_unsqueeze_view_2`` with the same call count.
  That this form compiles to those kernels is a reading of the call counts; the script records the kernels each
  form's forward launches (torch.profiler) so that the names and times can be set beside the profile's;
- ``unrolled``: the four terms written out (``comb[..., n, :, None] * streams[..., n, None, :]``), all element-wise,
  so inductor can fuse the forward into one pass in fp32;
- ``broadcast_sum``: ``(comb^T[..., None] * streams[..., None, :, :]).sum(-2)``, the same as one broadcast and a sum
  over the four streams.

With ``--stream-dtype bfloat16`` (the trainer's streams since fa33e7c) the forms are ``compiled_fp32`` (the same sum
in fp32, rounded once, compiled by inductor: what the trainer ran until the merge kernels) and ``op``
(``genolc.model.ops.dispatch.mhc_merge``, the custom op over genolc/model/ops/mhc/merge_triton.py, uncompiled, as
the trainer now runs it). ``op`` is timed with fp32 streams too.

Forward and forward + backward (gradients for all four inputs), median of 20 after a warm-up
(gpu_bench_common.measure), each form's error against fp64 (output and the four gradients), and the kernels of
one forward with grad. Writes JSON (command, git SHA, device) to $OUT or
benchmarks/results/mhc_merge_<date>.json. Run on 2026-12-02 (mhc_merge_2026-12-02.json): ``unrolled`` took `base`'s
forward from 2.31 to 0.74 ms and forward + backward from 5.21 to 2.26 ms, so the model's ``merge_streams`` is now
that form (``model`` and ``matmul`` in that file are the same, older form).
"""

from __future__ import annotations

import argparse
import functools
import itertools
import json

import torch

from gpu_bench_common import measure, profiled_kernels, rel_err, write_results
from genolc.model.layers.mhc import merge_streams
from genolc.model.ops.dispatch import mhc_merge
from genolc.model.ops.mhc.reference import merge as reference_merge
from genolc.model.presets import base, small


def matmul(block_out, post, comb, streams):
    dtype = streams.dtype
    return post.to(dtype).unsqueeze(-1) * block_out.unsqueeze(-2) + comb.to(dtype).transpose(-1, -2) @ streams


def unrolled(block_out, post, comb, streams):
    dtype = streams.dtype
    merged = post.to(dtype).unsqueeze(-1) * block_out.unsqueeze(-2)
    for n in range(streams.shape[-2]):
        merged = merged + comb[..., n, :, None].to(dtype) * streams[..., n, None, :]
    return merged


def broadcast_sum(block_out, post, comb, streams):
    dtype = streams.dtype
    mixed = (comb.to(dtype).transpose(-1, -2)[..., None] * streams[..., None, :, :]).sum(-2)
    return post.to(dtype).unsqueeze(-1) * block_out.unsqueeze(-2) + mixed


def compiled_fp32(block_out, post, comb, streams):
    return reference_merge(block_out, post, comb, streams, compute_dtype=torch.float32)


def sweep(preset, block_out, post, comb, streams, grad) -> list[dict]:
    """The kernels alone (no custom-op dispatch) at each tile config; the default is merge_triton's."""
    from genolc.model.ops.mhc import merge_triton

    rows = []
    for rows_per_program, block_d, warps in itertools.product((1, 2, 4, 8), (128, 256, 512), (4, 8)):
        config = dict(rows_per_program=rows_per_program, block_d=block_d, num_warps=warps)
        row = {"preset": preset, "form": "kernels", "config": config,
               "default": (rows_per_program, block_d, warps) == (merge_triton.ROWS, merge_triton.BLOCK_D,
                                                                merge_triton.NUM_WARPS),
               "forward_ms": round(measure(lambda: merge_triton.merge(block_out, post, comb, streams, **config),
                                           repeats=20)["ms"], 3),
               "backward_ms": round(measure(lambda: merge_triton.merge_backward(grad, block_out, post, comb,
                                                                                 streams, **config),
                                            repeats=20)["ms"], 3)}
        rows.append(row)
        print(json.dumps(row))
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tokens", type=int, default=32768)
    parser.add_argument("--stream-dtype", choices=("bfloat16", "float32"), default="bfloat16")
    parser.add_argument("--sweep", action="store_true",
                        help="time the kernels alone at other tiles (tokens a program x columns a block x warps)")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        parser.error("needs a CUDA device (it times the merge's compiled form and kernels there)")
    stream_dtype = getattr(torch, args.stream_dtype)
    if stream_dtype == torch.float32:
        forms = {"model": merge_streams, "matmul": matmul, "unrolled": unrolled, "broadcast_sum": broadcast_sum}
    else:
        forms = {"compiled_fp32": compiled_fp32}
    forms["op"] = functools.partial(mhc_merge, compute_dtype=torch.float32)
    rows = []
    for name, config in (("small", small()), ("base", base())):
        n, dim = config.hc_mult, config.hidden_size
        streams = torch.randn(1, args.tokens, n, dim, device="cuda").to(stream_dtype).requires_grad_()
        block_out = torch.randn(1, args.tokens, dim, device="cuda", dtype=torch.bfloat16, requires_grad=True)
        post = (2 * torch.rand(1, args.tokens, n, device="cuda")).requires_grad_()
        comb = torch.softmax(torch.randn(1, args.tokens, n, n, device="cuda"), -1).requires_grad_()
        inputs = (block_out, post, comb, streams)
        grad = torch.randn(1, args.tokens, n, dim, device="cuda").to(stream_dtype)
        exact_inputs = [t.detach().double().requires_grad_() for t in inputs]
        exact = matmul(*exact_inputs)
        exact_grads = torch.autograd.grad(exact, exact_inputs, grad.double())
        exact = exact.detach()
        for form, function in forms.items():
            compiled = function if form == "op" else torch.compile(function, dynamic=False)

            def forward():
                with torch.autocast("cuda", dtype=torch.bfloat16):
                    return compiled(*(t.detach() for t in inputs))

            def forward_backward():
                with torch.autocast("cuda", dtype=torch.bfloat16):
                    out = compiled(*inputs)
                return torch.autograd.grad(out, inputs, grad)

            result = forward()
            grads = forward_backward()

            def forward_with_grad():
                with torch.autocast("cuda", dtype=torch.bfloat16):
                    compiled(*inputs)

            rows.append({"preset": name, "tokens": args.tokens, "dim": dim, "form": form,
                         "stream_dtype": args.stream_dtype,
                         "forward_ms": round(measure(forward, repeats=20)["ms"], 3),
                         "forward_backward_ms": round(measure(forward_backward, repeats=20)["ms"], 3),
                         "out_dtype": str(result.dtype), "relative_error_vs_fp64": rel_err(result, exact),
                         "gradient_errors_vs_fp64": {part: rel_err(g, e) for part, g, e in
                                                     zip(("block_out", "post", "comb", "streams"), grads,
                                                         exact_grads)},
                         "forward_kernels": profiled_kernels(forward_with_grad)})
            print(json.dumps({k: v for k, v in rows[-1].items() if k != "forward_kernels"}))
        if args.sweep:
            rows += sweep(name, *(t.detach() for t in inputs), grad)
    timing = {"timing": "median of 20 after one warm-up, CUDA events"}
    print(f"wrote {write_results(f'mhc_merge_{args.stream_dtype}', rows, timing)}")


if __name__ == "__main__":
    main()
