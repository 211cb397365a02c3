"""Context parallelism on two GPUs (NCCL, fast kernels) against one GPU: `small` at 64k tokens, bf16.

The reference is the chunk-recurrent step on one GPU (tests/gpu/test_chunked_step_fast.py checks it against the whole
window); then two processes run the same window with --cp 2: zigzag whole shares with per-layer recompute, and
contiguous with 32k chunks split over the ranks, each with KDA by state passing; and KDA by heads
(genolc/parallel/kda_heads.py: fla's chunk_kda over the whole span for half the heads), whole and in 32k chunks. Same
weights and window (random A/C/G/T, a stretch of weight 0), indexer KL ("sparse") and MoE balance loss on. bf16 with
fp32 master weights: equal to bf16 rounding, as the chunked step's test measures it (loss 1e-3 relative, all gradients
together 1 %, each within 5 %). This also checks fla's chunk_kda with ``Dv + Dk`` value columns and an initial state
(genolc/parallel/kda_cp.py).

    python -m pytest tests/gpu/test_context_parallel_fast.py -m gpu -s     # on a host with 2 GPUs
"""

from __future__ import annotations

import os
import time

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from genolc.model import build_model, preset
from genolc.train.chunked import chunked_forward_backward
from genolc.train.loss import LossTerms
from process_group import free_port

pytestmark = pytest.mark.gpu

LENGTH = 65536
# (layout, chunk, recompute, KDA form)
CASES = [("zigzag", None, True, "state"), ("contiguous", 32768, False, "state"), ("zigzag", None, False, "heads"),
         ("zigzag", 32768, False, "heads")]


def _inputs(device):
    generator = torch.Generator().manual_seed(0)
    ids = torch.randint(0, 4, (1, LENGTH + 1), generator=generator).to(device)
    weights = torch.ones(1, LENGTH, device=device)
    weights[0, 1000:1500] = 0.0
    terms = LossTerms(total_weight=float(weights.sum()), grad_accum=1, moe_balance_coef=0.01, indexer_kl_coef=1.0,
                      indexer_mode="sparse")
    return ids, weights, terms


def _model(device):
    torch.manual_seed(0)
    return build_model(preset("small")).to(device)


def _autocast():
    return torch.autocast("cuda", dtype=torch.bfloat16)


def _grads(model) -> dict[str, torch.Tensor]:
    return {name: p.grad.detach().float().cpu().clone() for name, p in model.named_parameters()
            if p.grad is not None}


def _worker(rank: int, port: int, results: str) -> None:
    from genolc.parallel.apply import apply_context_parallel
    from genolc.parallel.step import all_reduce_gradients, context_parallel_forward_backward
    from genolc.train.apply import apply_recompute

    torch.cuda.set_device(rank)
    dist.init_process_group("nccl", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    device = torch.device("cuda", rank)
    ids, weights, terms = _inputs(device)
    out = {}
    for layout, chunk, recompute, kda in CASES:
        model = _model(device)
        if recompute:
            apply_recompute(model)
        context = apply_context_parallel(model, dist.group.WORLD, layout, kda=kda)
        torch.cuda.synchronize()
        started = time.monotonic()
        if chunk is None:
            result = context_parallel_forward_backward(model, context, ids, weights, terms, _autocast, lambda x: x)
        else:
            result = chunked_forward_backward(model, ids, weights, terms, chunk, _autocast, lambda x: x,
                                              shard=context)
        all_reduce_gradients(model)
        torch.cuda.synchronize()
        seconds = time.monotonic() - started
        values = torch.tensor([float(result.lm), *(float(result.aux[k]) for k in ("moe_balance", "indexer_kl"))],
                              dtype=torch.float64, device=device)
        dist.all_reduce(values)
        out[(layout, chunk, recompute, kda)] = (values.tolist(), _grads(model), seconds,
                                           torch.cuda.max_memory_allocated(device) / 2 ** 30)
        if rank == 0:
            # Said as each case ends: a device call's time limit can cut the test before the comparison.
            print(f"case {(layout, chunk, recompute, kda)} done in {seconds:.1f} s: lm/balance/kl {values.tolist()}",
                  flush=True)
        del model, context, result
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)
    if rank == 0:
        torch.save(out, results)
    dist.destroy_process_group()


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 CUDA devices")
def test_context_parallel_two_gpus_matches_one_small_64k(tmp_path):
    device = torch.device("cuda", 0)
    ids, weights, terms = _inputs(device)
    model = _model(device)
    result = chunked_forward_backward(model, ids, weights, terms, 16384, _autocast)
    reference = [float(result.lm), float(result.aux["moe_balance"]), float(result.aux["indexer_kl"])]
    print(f"one GPU, 16k chunks: lm/balance/kl {reference}", flush=True)
    expected = _grads(model)
    del model, result
    torch.cuda.empty_cache()

    results = tmp_path / "cp.pt"
    for name, value in (("NCCL_NVLS_ENABLE", "0"), ("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1"),
                        ("NVSHMEM_DISABLE_NVLS", "1")):
        os.environ.setdefault(name, value)      # NVLink multicast stays off on shared GPU hosts
    mp.spawn(_worker, args=(free_port(), str(results)), nprocs=2, join=True)
    for case, (values, got, seconds, peak) in torch.load(results).items():
        errors = {name: float((got[name] - expected[name]).norm() / expected[name].norm().clamp_min(1e-30))
                  for name in expected}
        worst = sorted(errors.items(), key=lambda item: -item[1])[:6]
        total = float(torch.sqrt(sum(((got[n] - expected[n]) ** 2).sum() for n in expected))
                      / torch.sqrt(sum((expected[n] ** 2).sum() for n in expected)))
        print(f"{case}: {seconds:.1f} s, peak {peak:.1f} GiB (rank 0); lm/balance/kl {values} vs one GPU "
              f"{reference}; all gradients {total:.2e}; worst {worst}", flush=True)
        assert values[0] == pytest.approx(reference[0], rel=1e-3), case
        assert values[1] == pytest.approx(reference[1], rel=2e-2), case
        assert values[2] == pytest.approx(reference[2], rel=2e-2), case
        assert set(got) == set(expected), case
        assert total < 1e-2, case
        assert worst[0][1] < 5e-2, (case, worst)
