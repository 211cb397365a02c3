"""``--cp-kda heads`` (genolc/parallel/kda_heads.py) equals one process: loss and every parameter gradient.

As tests/parallel/test_context_parallel.py does for the default ``state`` mode: the `tiny` preset (4 KDA heads, fp32,
CPU reference ops, gloo) on 405 tokens of real human DNA (GRCh37 chr22, its N run masked out of the loss), 2
processes spawned with torch.multiprocessing, zigzag and contiguous, the whole window and the chunk-recurrent step
(chunks of 170 and 135 tokens: the chunk cache's state and convolution tail cross ranks' heads and pieces), and with
per-layer recompute. 405 is
no multiple of any piece count, so pieces differ in length and the all-to-all pads. "Equal" is each gradient within
1e-4 of its own size (relative L2); a head or piece placed wrongly gives 1e-2 or more. Also: a head count that the
ranks do not divide is refused before any layer is patched.
"""

from __future__ import annotations

import contextlib
import dataclasses

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from genolc.train.loss import LossTerms, micro_batch_loss
from conftest import chr22_window, shared_file, tiny_model_with_skewed_routing
from process_group import free_port

WINDOW = 405
# (layout, chunk of the chunk-recurrent step or None, per-layer recompute: the exchanges run again in backward)
CASES = [("zigzag", None, False), ("contiguous", None, False), ("zigzag", 170, False), ("contiguous", 135, False),
         ("zigzag", None, True)]


def _dna_window(path: str) -> tuple[torch.Tensor, torch.Tensor]:
    return chr22_window(path, WINDOW, 200)


def _terms(weights):
    return LossTerms(total_weight=float(weights.sum()), grad_accum=1, moe_balance_coef=0.05, indexer_kl_coef=1.0,
                     indexer_mode="sparse")


def _three_head_model():
    from genolc.model import build_model, preset
    from genolc.tokenize import CharTokenizer

    return build_model(dataclasses.replace(preset("tiny", vocab_size=CharTokenizer().vocab_size), linear_num_heads=3))


def _worker(rank: int, world: int, port: int, path: str, results: str) -> None:
    from genolc.errors import ConfigError
    from genolc.parallel.apply import apply_context_parallel
    from genolc.parallel.step import all_reduce_gradients, context_parallel_forward_backward
    from genolc.train.apply import apply_recompute
    from genolc.train.chunked import chunked_forward_backward

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    ids, weights = _dna_window(path)
    out = {}
    for case in CASES:
        layout, chunk, recompute = case
        model = tiny_model_with_skewed_routing()
        if recompute:
            apply_recompute(model)
        context = apply_context_parallel(model, dist.group.WORLD, layout, kda="heads")
        if chunk is None:
            result = context_parallel_forward_backward(model, context, ids, weights, _terms(weights),
                                                       contextlib.nullcontext, lambda loss: loss)
        else:
            result = chunked_forward_backward(model, ids, weights, _terms(weights), chunk,
                                              contextlib.nullcontext, lambda loss: loss, shard=context)
        all_reduce_gradients(model)
        lm = torch.tensor([float(result.lm)], dtype=torch.float64)
        dist.all_reduce(lm)
        out[case] = (float(lm), {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None})
    model = _three_head_model()
    forwards = [m.forward for m in model.modules()]
    try:
        apply_context_parallel(model, dist.group.WORLD, "zigzag", kda="heads")
        out["refused"] = None
    except ConfigError as error:
        out["refused"] = (str(error), [m.forward for m in model.modules()] == forwards)
    if rank == 0:
        torch.save(out, results)
    dist.destroy_process_group()


@pytest.fixture(scope="module")
def heads_results(tmp_path_factory):
    path = str(shared_file("human/GRCh37_chr22_20000001-21000000.fa.gz"))
    results = tmp_path_factory.mktemp("cp-kda-heads") / "cp.pt"
    mp.spawn(_worker, args=(2, free_port(), path, str(results)), nprocs=2, join=True)
    return torch.load(results)


def test_kda_by_heads_equals_one_process(heads_results, one_thread):
    ids, weights = _dna_window(str(shared_file("human/GRCh37_chr22_20000001-21000000.fa.gz")))
    model = tiny_model_with_skewed_routing()
    out = model(ids[:, :-1], indexer_loss="sparse")
    parts = micro_batch_loss(out, ids[:, 1:], weights, _terms(weights))
    parts.loss.backward()
    expected = {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}
    assert any(name.endswith("forget_gate.A_log") for name in expected), "the tiny preset should have KDA"
    for case in CASES:
        got_lm, got = heads_results[case]
        assert got_lm == pytest.approx(float(parts.lm), rel=1e-6), case
        assert set(got) == set(expected), case
        errors = {name: float((got[name] - expected[name]).norm() / expected[name].norm().clamp_min(1e-30))
                  for name in expected if expected[name].norm() > 0}
        worst = max(errors.items(), key=lambda item: item[1])
        assert worst[1] < 1e-4, (case, worst)


def test_kda_by_heads_refuses_heads_the_ranks_do_not_divide(heads_results):
    message, untouched = heads_results["refused"]
    assert "--cp 2" in message and "3 heads" in message and "--cp-kda" in message
    assert untouched, "a refused model must keep its own forwards"


def test_cp_kda_option_names_the_forwards_and_refuses_others(tmp_path):
    from genolc.errors import ConfigError
    from genolc.parallel.apply import KDA_FORWARDS
    from genolc.train.config import CP_KDA_MODES, TrainConfig

    assert CP_KDA_MODES == tuple(KDA_FORWARDS)
    assert TrainConfig(data=tmp_path, out=tmp_path / "run", seq_len=64).cp_kda == "state"
    with pytest.raises(ConfigError, match="--cp-kda"):
        TrainConfig(data=tmp_path, out=tmp_path / "run", seq_len=64, cp_kda="rows")
