"""finetune's routing tallies (genolc.routing.RoutingTally, fed by a hook on every MoE gate) add up on the GPU: a
call makes no host sync (it used to make two or three, each draining the launch queue mid-forward), and the
figures read back afterwards equal those of the same routing tallied on the CPU. Needs CUDA."""

from __future__ import annotations

import pytest
import torch

if not torch.cuda.is_available():
    pytest.skip("needs a CUDA device", allow_module_level=True)

from genolc.routing import RoutingTally  # noqa: E402

pytestmark = pytest.mark.gpu


def test_tally_calls_make_no_host_sync_and_read_back_exactly():
    generator = torch.Generator().manual_seed(0)
    calls = [(torch.randint(0, 16, (n, 2), generator=generator), torch.rand(n, 16, generator=generator))
             for n in (65536, 65536, 40000, 70000)]
    on_gpu, on_cpu = (RoutingTally(n_experts=16, top_k=2, group_tokens=65536) for _ in range(2))
    moved = [(ids.cuda(), scores.cuda()) for ids, scores in calls]
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        for ids, scores in moved:
            on_gpu.add(ids, scores)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    for ids, scores in calls:
        on_cpu.add(ids, scores)
    gpu, cpu = on_gpu.summary(), on_cpu.summary()
    assert gpu["tokens_per_expert"] == cpu["tokens_per_expert"] and gpu["drop_share"] == cpu["drop_share"]
    assert gpu["groups"] == cpu["groups"] == 5
    assert gpu["router_entropy"] == pytest.approx(cpu["router_entropy"], rel=1e-6)
