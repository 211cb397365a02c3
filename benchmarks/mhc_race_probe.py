"""Does the bit-for-bit test of the mHC forward catch the refill race it guards against? (issue 14)

    python3 benchmarks/mhc_race_probe.py [--calls 300] [--json OUT]   (on the GPU; carry: [".gpu"])

tests/gpu/test_mhc_triton.py::test_forward_gives_the_same_bits_on_every_call compares 300 forwards of 64k tokens
of `small`'s fp32 streams with the first. KernelConfig refuses the racy build (two to four stages with the tile
read by the TF32 product from shared memory), so this launches the kernel itself with each form, the same inputs
and the same count, and reports how many calls differed. The old form must differ in some calls for the test to
mean anything; the one-stage and tile-in-registers forms must not differ at all.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

EPS = 1e-6
# (label, block_rows, block_k, num_warps, stages, tile_in_registers); the first is the build used until 7ee4889.
FORMS = [("three stages, tile from shared memory (the old default)", 64, 128, 4, 3, False),
         ("two stages, tile from shared memory", 64, 128, 4, 2, False),
         ("one stage, 64 x 128", 64, 128, 4, 1, False),
         ("one stage, 64 x 64 (the default since 5d3a7e9)", 64, 64, 4, 1, False),
         ("three stages, tile in registers", 64, 128, 4, 3, True)]


def launch(x: torch.Tensor, weight: torch.Tensor, form: tuple) -> tuple[torch.Tensor, torch.Tensor]:
    import triton

    from genolc.model.ops.mhc import triton as mhc_triton

    _, block_rows, block_k, warps, stages, in_registers = form
    rows, logits = x.shape[0], weight.shape[0]
    out = torch.empty((rows, logits), dtype=torch.float32, device=x.device)
    rstd = torch.empty(rows, dtype=torch.float32, device=x.device)
    mhc_triton._kernel()[(triton.cdiv(rows, block_rows),)](
        x, weight, out, rstd, rows, x.shape[1], logits, EPS, x.stride(0), weight.stride(0), out.stride(0),
        BLOCK_ROWS=block_rows, BLOCK_K=block_k, BLOCK_W=max(16, triton.next_power_of_2(logits)),
        PRECISION="tf32", TILE_IN_REGISTERS=in_registers, num_warps=warps, num_stages=stages)
    return out, rstd


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--calls", type=int, default=300)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    if not torch.cuda.is_available():
        parser.error("needs a CUDA device")
    if args.calls < 1:
        parser.error(f"--calls must be at least 1, got {args.calls}")
    gen = torch.Generator(device="cuda").manual_seed(65536 + 4096)
    x = torch.randn(65536, 4096, generator=gen, device="cuda") * torch.rand(65536, 1, generator=gen, device="cuda") * 4
    weight = torch.randn(24, 4096, generator=gen, device="cuda") * 0.02
    rows = []
    for form in FORMS:
        first, first_rstd = launch(x, weight, form)
        differing = 0
        for _ in range(args.calls):
            got, rstd = launch(x, weight, form)
            differing += int(not torch.equal(got, first) or not torch.equal(rstd, first_rstd))
        rows.append({"form": form[0], "block_rows": form[1], "block_k": form[2], "num_warps": form[3],
                     "stages": form[4], "tile_in_registers": form[5], "calls": args.calls,
                     "calls_differing_from_first": differing})
        print(f"{form[0]:<58} {differing:>4} of {args.calls} calls differ", flush=True)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({"rows": rows, "device": torch.cuda.get_device_name()}, indent=1) + "\n")


if __name__ == "__main__":
    main()
