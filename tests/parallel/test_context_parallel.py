"""Context parallelism equals one process: loss, auxiliary losses and every parameter gradient.

`tiny` preset (fp32, CPU reference ops, gloo) on a window of real human DNA (GRCh37 chr22, char tokenizer, its N run
masked out of the loss) with the MoE balance loss and the indexer KL on, CP = 2 and 4 processes spawned with
torch.multiprocessing, contiguous and zigzag layouts, with per-layer recompute (the layers' collectives then run
again in backward, in the same order on every rank) and under the chunk-recurrent step (each chunk split over the
ranks; chunk lengths that are not multiples of the pool size either). The window has 405 tokens: not a multiple of the pool size
(4) nor of any rank or piece count, so pieces have unequal lengths and k-pools and the short convolution's window
straddle piece boundaries (and ranks). "Equal" is fp32 rounding, as in tests/train/test_chunked_step.py: each
gradient within 1e-4 of its own size (relative L2); a boundary handled wrongly gives 1e-2 or more.
"""

from __future__ import annotations

import contextlib

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from genolc.train.loss import LossTerms, micro_batch_loss
from conftest import chr22_window, shared_file, tiny_model_with_skewed_routing
from process_group import free_port

WINDOW = 405
# (layout, indexer mode, per-layer recompute, chunk of the chunk-recurrent step or None) per world size.
CASES = {2: [("zigzag", "sparse", False, None), ("contiguous", "sparse", False, None), ("zigzag", "dense", True, None),
             ("zigzag", "sparse", False, 170), ("contiguous", "dense", True, 135)],
         4: [("contiguous", "dense", False, None), ("zigzag", "sparse", False, 203)]}
_SINGLE: dict[str, tuple] = {}


def _dna_window(path: str) -> tuple[torch.Tensor, torch.Tensor]:
    """A window ending 200 bases into chr22's 100 kbp N run (weight 0)."""
    return chr22_window(path, WINDOW, 200)


def _model():
    return tiny_model_with_skewed_routing()


def _terms(weights, mode):
    return LossTerms(total_weight=float(weights.sum()), grad_accum=1, moe_balance_coef=0.05, indexer_kl_coef=1.0,
                     indexer_mode=mode)


def _single(ids, weights, mode):
    if mode not in _SINGLE:
        _SINGLE[mode] = _single_run(ids, weights, mode)
    return _SINGLE[mode]


def _single_run(ids, weights, mode):
    model = _model()
    out = model(ids[:, :-1], indexer_loss=mode)
    parts = micro_batch_loss(out, ids[:, 1:], weights, _terms(weights, mode))
    parts.loss.backward()
    grads = {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}
    return float(parts.lm), {k: float(v) for k, v in parts.aux.items()}, grads, \
        {k: v.tolist() for k, v in out.tokens_per_expert.items()}


def _worker(rank: int, world: int, port: int, path: str, results: str) -> None:
    from genolc.parallel.apply import apply_context_parallel
    from genolc.parallel.collectives import all_reduce_counts
    from genolc.parallel.step import all_reduce_gradients, context_parallel_forward_backward
    from genolc.train.apply import apply_recompute
    from genolc.train.chunked import chunked_forward_backward

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    ids, weights = _dna_window(path)
    out = {}
    for case in CASES[world]:
        layout, mode, recompute, chunk = case
        model = _model()
        if recompute:
            apply_recompute(model)
        context = apply_context_parallel(model, dist.group.WORLD, layout)
        if chunk is None:
            result = context_parallel_forward_backward(model, context, ids, weights, _terms(weights, mode),
                                                       contextlib.nullcontext, lambda loss: loss)
        else:
            result = chunked_forward_backward(model, ids, weights, _terms(weights, mode), chunk,
                                              contextlib.nullcontext, lambda loss: loss, shard=context)
        all_reduce_gradients(model)
        lm = torch.tensor([float(result.lm)], dtype=torch.float64)
        dist.all_reduce(lm)
        aux = {}
        for name, value in sorted(result.aux.items()):
            total = torch.tensor([float(value)], dtype=torch.float64)
            dist.all_reduce(total)
            aux[name] = float(total)
        counts = all_reduce_counts(result.tokens_per_expert)
        out[case] = (float(lm), aux,
                               {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None},
                               {k: v.tolist() for k, v in counts.items()})
    out["pools"] = _pools_under_cp(dist.group.WORLD)
    if rank == 0:
        torch.save(out, results)
    dist.destroy_process_group()


def _hidden(model) -> torch.Tensor:
    generator = torch.Generator().manual_seed(1)
    return torch.randn(1, WINDOW, model.config.hidden_size, generator=generator)


def _pools_under_cp(group) -> torch.Tensor:
    """The last DSA layer's pooled indexer keys as the zigzag ranks form them from their own pieces."""
    from genolc.parallel.apply import apply_context_parallel
    from genolc.parallel.dsa_cp import window_rows

    model = _model()
    context = apply_context_parallel(model, group, "zigzag")
    context.set_window(WINDOW)
    layer = model.layers[3].self_attn
    with torch.no_grad():
        return window_rows(layer, context, context.local(_hidden(model)), None).pooled


def _spawn(world: int, tmp_path_factory) -> dict:
    path = str(shared_file("human/GRCh37_chr22_20000001-21000000.fa.gz"))
    results = tmp_path_factory.mktemp(f"cp{world}") / "cp.pt"
    mp.spawn(_worker, args=(world, free_port(), path, str(results)), nprocs=world, join=True)
    return torch.load(results)


@pytest.fixture(scope="module")
def cp_results_2(tmp_path_factory):
    return _spawn(2, tmp_path_factory)


@pytest.fixture(scope="module")
def cp_results_4(tmp_path_factory):
    return _spawn(4, tmp_path_factory)


@pytest.mark.parametrize("world", [2, 4])
def test_context_parallel_equals_one_process(world, request, one_thread):
    path = str(shared_file("human/GRCh37_chr22_20000001-21000000.fa.gz"))
    got_all = request.getfixturevalue(f"cp_results_{world}")
    ids, weights = _dna_window(path)
    assert 0 < float(weights.sum()) < WINDOW, "the window should hold real bases and some N"
    for case in CASES[world]:
        layout, mode = case[:2]
        lm, aux, expected, counts = _single(ids, weights, mode)
        got_lm, got_aux, got, got_counts = got_all[case]
        assert got_lm == pytest.approx(lm, rel=1e-6), case
        assert set(got_aux) == set(aux) == {"moe_balance", "indexer_kl"}
        for name, value in aux.items():
            # The indexer KL (~1e-5) is a sum of O(1) terms that nearly cancel: fp32 rounding shows at ~1e-9.
            assert got_aux[name] == pytest.approx(value, rel=1e-5, abs=1e-8), (case, name)
        assert got_counts == counts, case
        assert set(got) == set(expected), case
        errors = {name: float((got[name] - expected[name]).norm() / expected[name].norm().clamp_min(1e-30))
                  for name in expected if expected[name].norm() > 0}
        worst = max(errors.items(), key=lambda item: item[1])
        assert worst[1] < 1e-4, (case, worst)
        assert any("indexer" in name for name in got)


def test_pools_straddling_a_zigzag_boundary_equal_one_process(cp_results_2):
    """The k-pool over positions 148..151 spans zigzag pieces 0 (rank 0) and 1 (rank 1): pools must be formed in
    absolute positions, not from each shard's start (the public recipe's misalignment)."""
    from genolc.parallel.layout import Layout

    model = _model()
    layer = model.layers[3].self_attn
    with torch.no_grad():
        features = layer.indexer.features(_hidden(model), torch.zeros(1, WINDOW, model.config.q_lora_rank))
    expected = features.pooled
    got = cp_results_2["pools"]
    kpool = model.config.index_kpool
    boundary = Layout(WINDOW, 2, "zigzag").pieces[1].start
    assert boundary % kpool, "the test needs a piece boundary inside a pool"
    straddling = boundary // kpool
    assert got.shape == expected.shape
    torch.testing.assert_close(got[:, straddling], expected[:, straddling], rtol=0, atol=0)
    torch.testing.assert_close(got, expected, rtol=0, atol=0)
    # Pools counted from the shard's own start would differ: the check above can fail.
    with torch.no_grad():
        shard = layer.indexer.features(_hidden(model)[:, boundary:], torch.zeros(1, WINDOW - boundary,
                                                                                 model.config.q_lora_rank)).pooled
    assert not torch.allclose(shard[:, 0], expected[:, straddling + 1])
