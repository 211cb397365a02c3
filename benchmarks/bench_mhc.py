"""python benchmarks/bench_mhc.py [--tokens 32768]   (on the GPU; carry: [".gpu"])

mHC's mixing logits for one chunk of ``--tokens``, fp32 streams (``--stream-dtype float32``; the trainer's streams are
bf16 by default, as in the last item below), shapes of `small` (K = 4 x 1024) and `base` (K = 4 x 1536), 24 logits,
under bf16 autocast as the trainer runs:

- ``compiled reference``: the reference formula (RMS norm, then a Linear) under torch.compile, which is what
  genolc ran before the fused kernel (inductor's norm-and-cast kernel, then cuBLAS's product);
- ``fused op``: ``genolc.model.ops.mhc.op.mixing_logits`` (the forward and backward Triton kernels behind custom
  ops);
- the forward and backward kernels alone with each candidate tile config;
- the forward kernel on bf16 streams at the default and each candidate config, and the backward kernel as the
  trainer launches it (bf16 streams, the block input's and the merge's shares of x's gradient added) with each of
  ``TRAINER_BACKWARD_CANDIDATES``.

Forward and forward + backward, median of 20 after a warm-up (gpu_bench_common.measure), the streams' read
bandwidth of the forward, and the error against fp64. Writes JSON (command, git SHA, device) to $OUT or
benchmarks/results/mhc_<date>.json.
"""

from __future__ import annotations

import argparse
import json

import torch

from gpu_bench_common import measure, write_results
from genolc.model.ops.mhc import op, reference, triton as mhc_triton
from genolc.model.presets import base, small

# One stage, and pipelined with the tile in registers (the configs that have no refill race; KernelConfig's note).
CANDIDATES = [mhc_triton.KernelConfig(64, 128, 4), mhc_triton.KernelConfig(64, 64, 4),
              mhc_triton.KernelConfig(128, 128, 8), mhc_triton.KernelConfig(32, 128, 4),
              mhc_triton.KernelConfig(64, 128, 4, stages=3, tile_in_registers=True),
              mhc_triton.KernelConfig(128, 128, 8, stages=3, tile_in_registers=True),
              mhc_triton.KernelConfig(64, 64, 4, stages=4, tile_in_registers=True)]
BACKWARD_CANDIDATES = [mhc_triton.BackwardConfig(4096, 64, 64, 4, 2), mhc_triton.BackwardConfig(4096, 64, 128, 8, 2),
                       mhc_triton.BackwardConfig(2048, 64, 64, 4, 3), mhc_triton.BackwardConfig(8192, 128, 64, 8, 2),
                       mhc_triton.BackwardConfig(2048, 32, 128, 4, 3)]
# As the trainer launches the backward (bf16 streams, the block input's and the merge's shares added), the default
# builds at 220 registers: two programs, 8 warps an SM. 32-row steps take 156-168 (three programs, 12 warps; sm_90
# lowering here). Which is faster is for the device to say.
TRAINER_BACKWARD_CANDIDATES = [mhc_triton.DEFAULT_BACKWARD_CONFIG, mhc_triton.BackwardConfig(2048, 32, 64, 4, 3),
                               mhc_triton.BackwardConfig(2048, 32, 64, 4, 2),
                               mhc_triton.BackwardConfig(4096, 64, 64, 4, 2),
                               mhc_triton.BackwardConfig(2048, 32, 128, 4, 2)]


def trainer_forward(tokens: int, name: str, config, weight: torch.Tensor, eps: float) -> list[dict]:
    """The forward kernel at each of CANDIDATES on bf16 streams, as the trainer's are by default; the logits against
    the default config's. A pipelined config becomes the default only after tests/gpu/triton_lowering_check.py's race
    walk has passed it on bf16 streams (KernelConfig's note). Built here for sm_90 on bf16 streams (2026-12-05,
    Triton 3.9): the default 124 registers; 64 x 64 at four stages with the tile in registers 166 and no refill race
    found; 64 x 128 and 128 x 128 at three stages spill (120 and 16 bytes)."""
    x = torch.randn(tokens, config.hc_mult * config.hidden_size, device="cuda").bfloat16()
    read_gb = x.numel() * x.element_size() / 1e9
    found, default_logits = [], None
    for candidate in [mhc_triton.DEFAULT_CONFIG, *(c for c in CANDIDATES if c != mhc_triton.DEFAULT_CONFIG)]:
        def run():
            return mhc_triton.fused_mixing_logits(x, weight, eps, tf32=True, config=candidate)

        timed = measure(run, repeats=20)["ms"]
        logits, _ = run()
        default_logits = logits if default_logits is None else default_logits
        found.append({"preset": name, "tokens": tokens, "k": x.shape[1], "way": "forward kernel, bf16 streams",
                      "config": vars(candidate), "forward_ms": round(timed, 3),
                      "forward_read_tb_per_s": round(read_gb / timed, 2),
                      "logits_max_diff_vs_default": float((logits - default_logits).abs().max())})
        print(json.dumps(found[-1]))
    return found


def trainer_backward(tokens: int, name: str, config, scaled: torch.Tensor, coef: torch.Tensor,
                     weight: torch.Tensor) -> list[dict]:
    """The backward kernel at each of TRAINER_BACKWARD_CANDIDATES as the trainer launches it: bf16 streams, the block
    input's share (``pre``, its gradient) and the merge's (``grad_x``) added; dx against the default config's."""
    n, dim = config.hc_mult, config.hidden_size
    x = torch.randn(tokens, n * dim, device="cuda").bfloat16()
    pre = torch.rand(tokens, n, device="cuda")
    grad_block = torch.randn(tokens, dim, device="cuda").bfloat16()
    grad_x = torch.randn(tokens, n * dim, device="cuda").bfloat16()
    # Streams and dx, the block input's gradient and the merge's share of x's: the bytes one call moves.
    moved_gb = (3 * x.numel() + grad_block.numel()) * 2 / 1e9
    found, default_dx = [], None
    for candidate in TRAINER_BACKWARD_CANDIDATES:
        def run():
            return mhc_triton.fused_mixing_logits_backward(scaled, coef, x, weight, tf32=True, pre=pre,
                                                           grad_block=grad_block, grad_x=grad_x, config=candidate)

        timed = measure(run, repeats=20)["ms"]
        dx, _ = run()
        default_dx = dx.float() if default_dx is None else default_dx
        found.append({"preset": name, "tokens": tokens, "k": n * dim, "way": "backward kernel, as the trainer runs it",
                      "config": vars(candidate), "backward_ms": round(timed, 3),
                      "tb_per_s": round(moved_gb / timed, 2),
                      "dx_max_diff_vs_default": float((dx.float() - default_dx).abs().max())})
        print(json.dumps(found[-1]))
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tokens", type=int, default=32768)
    args = parser.parse_args()
    rows = []
    eps = 1e-6
    ways = {"compiled reference": torch.compile(reference.mixing_logits, dynamic=False),
            "fused op": torch.compile(op.mixing_logits, dynamic=False)}
    for name, config in (("small", small()), ("base", base())):
        cols = config.hc_mult * config.hidden_size
        logits = (2 + config.hc_mult) * config.hc_mult
        x = torch.randn(args.tokens, cols, device="cuda", requires_grad=True)
        weight = (torch.randn(logits, cols, device="cuda") * 0.02).requires_grad_()
        grad = torch.randn(args.tokens, logits, device="cuda")
        x64 = x.detach().double()
        exact = torch.rsqrt(x64.square().mean(-1, keepdim=True) + eps) * (x64 @ weight.detach().double().t())
        read_gb = x.numel() * x.element_size() / 1e9

        def error(result: torch.Tensor) -> float:
            return float((result.double() - exact).norm() / exact.norm())

        for way, function in ways.items():
            def forward():
                with torch.autocast("cuda", dtype=torch.bfloat16):
                    return function(x.detach(), weight.detach(), eps)

            def forward_backward():
                with torch.autocast("cuda", dtype=torch.bfloat16):
                    out = function(x, weight, eps)
                return torch.autograd.grad(out, (x, weight), grad)

            timed = measure(forward, repeats=20)["ms"]
            rows.append({"preset": name, "tokens": args.tokens, "k": cols, "way": way, "forward_ms": round(timed, 3),
                         "forward_read_tb_per_s": round(read_gb / timed, 2),
                         "forward_backward_ms": round(measure(forward_backward, repeats=20)["ms"], 3),
                         "relative_error_vs_fp64": error(forward())})
            print(json.dumps(rows[-1]))
        for candidate in CANDIDATES:
            timed = measure(lambda: mhc_triton.fused_mixing_logits(x.detach(), weight.detach(), eps, tf32=True,
                                                                   config=candidate), repeats=20)["ms"]
            result, _ = mhc_triton.fused_mixing_logits(x.detach(), weight.detach(), eps, tf32=True, config=candidate)
            rows.append({"preset": name, "tokens": args.tokens, "k": cols, "way": "kernel", "config": vars(candidate),
                         "forward_ms": round(timed, 3), "forward_read_tb_per_s": round(read_gb / timed, 2),
                         "relative_error_vs_fp64": error(result)})
            print(json.dumps(rows[-1]))
        scaled, coef = torch.randn_like(grad), torch.randn(args.tokens, device="cuda")
        for candidate in BACKWARD_CANDIDATES:
            timed = measure(lambda: mhc_triton.fused_mixing_logits_backward(
                scaled, coef, x.detach(), weight.detach(), tf32=True, config=candidate), repeats=20)["ms"]
            rows.append({"preset": name, "tokens": args.tokens, "k": cols, "way": "backward kernel",
                         "config": vars(candidate), "backward_ms": round(timed, 3),
                         "read_and_write_tb_per_s": round(2 * read_gb / timed, 2)})
            print(json.dumps(rows[-1]))
        rows += trainer_forward(args.tokens, name, config, weight.detach(), eps)
        rows += trainer_backward(args.tokens, name, config, scaled, coef, weight.detach())
    notes = {"timing": "median of 20 after one warm-up, CUDA events",
             "default_config": vars(mhc_triton.DEFAULT_CONFIG),
             "default_backward_config": vars(mhc_triton.DEFAULT_BACKWARD_CONFIG)}
    print(f"wrote {write_results('mhc', rows, notes)}")


if __name__ == "__main__":
    main()
