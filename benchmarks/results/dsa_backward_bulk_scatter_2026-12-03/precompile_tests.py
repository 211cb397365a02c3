"""Compiles the TileLang backward kernels tests/gpu/test_dsa_tilelang.py uses, in parallel (nvcc outside the GIL).

A record of the experiment: it runs only at git d5a427e, where BackwardConfig had its ``scatter`` field (removed
in 8922bc6)."""
import dataclasses, time
from concurrent.futures import ThreadPoolExecutor
from genolc.model.ops.dsa.tilelang import backward as b, backward_slabs as s, forward as f
jobs = []
for topk, heads, rank in ((256, 12, 384), (64, 8, 256), (32, 3, 64)):
    width, scale = topk + 3, 0.7 * rank ** -0.5
    jobs.append((f.compiled_kernel, (heads, rank, width, "bfloat16", scale, f.default_config(rank))))
    for scatter in ("atomic", "bulk"):
        jobs.append((b.compiled_backward_kernel, (heads, rank, width, "bfloat16", scale,
                                                  dataclasses.replace(b.default_backward_config(rank), scatter=scatter))))
        jobs.append((s.compiled_slabbed_backward_kernel, (heads, rank, width, "bfloat16", scale,
                                                          dataclasses.replace(s.default_slabbed_config(rank), scatter=scatter))))
start = time.monotonic()
with ThreadPoolExecutor(12) as pool:
    for fut in [pool.submit(fn, *args) for fn, args in jobs]:
        fut.result()
print(f"compiled {len(jobs)} kernels in {time.monotonic() - start:.0f} s")
