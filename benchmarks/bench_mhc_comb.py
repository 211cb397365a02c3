"""python benchmarks/bench_mhc_comb.py [--tokens 16384]   (on the GPU; carry: [".gpu"])

mHC's hyper-connection forward (``genolc.model.layers.mhc.HyperConnection``: mixing logits, the pre/post weights,
the mixing matrix ``comb = sinkhorn(softmax(logits) + eps)``, the block input) for one chunk of ``--tokens`` with the
shapes of `small` and `base`, bf16 streams, under bf16 autocast and torch.compile as the trainer runs it, with the
mixing matrix from:

- ``reference``: the formula in torch, which inductor compiled to one kernel per Sinkhorn normalisation
  (``triton_poi_fused_add_div_sum_*``, ~57 launches a forward in the 512k `base` profile);
- ``fused``: the custom op with its two Triton kernels (genolc/model/ops/mhc/comb_triton.py), the default on CUDA.

Per form: forward and forward + backward (median of 20 after a warm-up, CUDA events; wall time of the host too,
since the launches are the cost), the kernels launched by one forward + backward (torch.profiler), and the error of
``comb`` and of the streams' gradient against the reference form. JSON (command, git SHA, device) to $OUT or
benchmarks/results/mhc_comb_<date>.json.
"""

from __future__ import annotations

import argparse
import json
import time

import torch

from gpu_bench_common import measure, rel_err, write_results
from genolc.model import build_model
from genolc.model.ops import dispatch
from genolc.model.ops.mhc import reference
from genolc.model.presets import base, small


def launches(run) -> dict:
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as profiler:
        run()
        torch.cuda.synchronize()
    kernels = [e for e in profiler.key_averages() if str(getattr(e, "device_type", "")).endswith("CUDA")]
    return {"kernel_launches": sum(e.count for e in kernels),
            "kernel_ms": round(sum(float(e.self_device_time_total) for e in kernels) / 1e3, 3)}


def host_ms(run, repeats: int = 20) -> float:
    torch.cuda.synchronize()
    started = time.perf_counter()
    for _ in range(repeats):
        run()
    torch.cuda.synchronize()
    return round((time.perf_counter() - started) * 1e3 / repeats, 3)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tokens", type=int, default=16384)
    args = parser.parse_args()
    rows = []
    for name, config in (("small", small()), ("base", base())):
        torch.manual_seed(0)
        connection = build_model(config.replace(num_hidden_layers=1, layer_types=config.layer_types[:1],
                                                mlp_layer_types=config.mlp_layer_types[:1],
                                                indexer_types=config.indexer_types[:1]),
                                 device="cuda").layers[0].attn_hc
        streams = torch.randn(1, args.tokens, config.hc_mult, config.hidden_size, device="cuda",
                              dtype=torch.bfloat16, requires_grad=True)
        results = {}
        for form, comb_op in (("reference", reference.comb_weights), ("fused", dispatch.mhc_comb_weights)):
            connection.comb_op = comb_op
            compiled = torch.compile(type(connection).forward, dynamic=False)

            def forward():
                with torch.no_grad(), torch.autocast("cuda", dtype=torch.bfloat16):
                    return compiled(connection, streams)

            def forward_backward():
                with torch.autocast("cuda", dtype=torch.bfloat16):
                    post, comb, block_input, _ = compiled(connection, streams)
                loss = post.float().sum() + comb.float().square().sum() + block_input.float().square().sum()
                return comb.detach(), torch.autograd.grad(loss, streams)[0]

            results[form] = forward_backward()
            rows.append({"preset": name, "tokens": args.tokens, "form": form,
                         "forward_ms": round(measure(forward, repeats=20)["ms"], 3),
                         "forward_backward_ms": round(measure(forward_backward, repeats=20)["ms"], 3),
                         "forward_backward_host_ms": host_ms(forward_backward), **launches(forward_backward)})
            torch._dynamo.reset()
        rows[-1]["comb_error_vs_reference"] = rel_err(results["fused"][0], results["reference"][0])
        rows[-1]["streams_grad_error_vs_reference"] = rel_err(results["fused"][1], results["reference"][1])
        for row in rows[-2:]:
            print(json.dumps(row))
    print(f"wrote {write_results('mhc_comb', rows, {'timing': 'median of 20 after one warm-up, CUDA events'})}")


if __name__ == "__main__":
    main()
