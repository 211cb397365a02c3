"""DSA forwards kept from the chunked step's first pass for its second, on the GPU (genolc/train/kept_attention.py).

- The store's round trip through page-locked host memory gives the forwards back bit for bit, on the current stream,
  forwards larger than one block of its arena included, with its blocks made on demand or page-locked beforehand in
  a thread (``reserve``, as the trainer does from the run's start).
- The TileLang op handed its own forward (``kept=``) returns it and has its gradients (the same backward kernel;
  only the order of its fp32 atomics differs).
- `small`'s chunked step at 64k in 16k chunks, bf16, eager: with the forwards kept, the loss and the gradients against
  the step that computes them again, beside that step's own run-to-run spread.
"""

from __future__ import annotations

import pytest
import torch

from genolc.model import build_model, preset
from genolc.model.ops import dispatch
from genolc.train.chunked import chunked_forward_backward
from genolc.train.kept_attention import KeptAttention
from genolc.train.loss import LossTerms

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]


@pytest.mark.parametrize("reserved", [False, True], ids=["blocks-on-demand", "blocks-reserved-in-a-thread"])
def test_the_host_round_trip_gives_the_forwards_back(reserved):
    store = KeptAttention()
    device = torch.device("cuda")
    forwards = {(start, layer): (torch.randn(1, 70000, 8, 256, device=device, dtype=torch.bfloat16),
                                 torch.randn(1, 70000, 8, device=device))
                for start in (0, 1000) for layer in (3, 7)}
    expected = {key: (out.clone(), lse.clone()) for key, (out, lse) in forwards.items()}
    if reserved:
        # As the trainer does from the run's start: the thread page-locks the blocks while the forwards are put.
        store.reserve(sum(out.nbytes + lse.nbytes for out, lse in forwards.values()))
    for (start, layer), (out, lse) in forwards.items():
        store.put(start, layer, out, lse)
    store.close()
    assert store._arena.blocks and all(block.is_pinned() for block in store._arena.blocks)
    # As in the first pass, the sources are let go at once and their memory handed out again: the copies must have
    # read them first.
    del forwards, out, lse
    scribbles = [torch.full((1, 70000, 8, 256), 7.0, device=device, dtype=torch.bfloat16) for _ in range(4)]
    store.prefetch(0, device)
    for (start, layer), (out, lse) in sorted(expected.items(), reverse=True):
        got = store.take(start, layer, device)
        assert got[0].is_cuda and torch.equal(got[0], out) and torch.equal(got[1], lse)
    del scribbles
    assert store.take(0, 3, device) is None and not store._kept and not store._fetched


def test_the_tilelang_op_handed_its_forward_has_its_gradients():
    pytest.importorskip("tilelang")
    torch.manual_seed(0)
    batch, seq_len, keys, heads, rank, width = 1, 3000, 40000, 12, 384, 2051
    q_lat = torch.randn(batch, seq_len, heads, rank, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    latent = torch.randn(batch, keys, rank, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    indices = torch.stack([torch.randperm(keys, device="cuda")[:width] for _ in range(seq_len)])[None].int()
    indices[0, 5] = -1
    grad = torch.randn(batch, seq_len, heads, rank, device="cuda", dtype=torch.bfloat16)
    out = dispatch.sparse_latent_attention(q_lat, latent, indices, 0.1)
    expected = torch.autograd.grad(out, (q_lat, latent), grad)
    kept = dispatch.sparse_latent_attention_forward(q_lat.detach(), latent.detach(), indices, 0.1)
    assert torch.equal(kept[0], out.detach())
    reused = dispatch.sparse_latent_attention(q_lat, latent, indices, 0.1, kept=kept)
    assert reused.data_ptr() == kept[0].data_ptr()
    got = torch.autograd.grad(reused, (q_lat, latent), grad)
    for g, e in zip(got, expected):
        error = float((g.float() - e.float()).norm() / e.float().norm())
        assert error < 1e-3, error


def _step(model, ids, weights, terms, kept: KeptAttention | None):
    model.zero_grad(set_to_none=True)
    result = chunked_forward_backward(model, ids, weights, terms, 16384,
                                      lambda: torch.autocast("cuda", dtype=torch.bfloat16), kept_attention=kept)
    grads = {name: p.grad.detach().float().clone() for name, p in model.named_parameters() if p.grad is not None}
    return float(result.lm), grads


def _spread(a: dict, b: dict) -> float:
    return float(sum((a[n] - b[n]).norm() ** 2 for n in a) ** 0.5 / sum(b[n].norm() ** 2 for n in b) ** 0.5)


def test_the_chunked_step_with_kept_forwards_small_64k():
    torch.manual_seed(0)
    model = build_model(preset("small"), device="cuda")
    generator = torch.Generator().manual_seed(0)
    ids = torch.randint(0, 4, (1, 65537), generator=generator).cuda()
    weights = torch.ones(1, 65536, device="cuda")
    terms = LossTerms(total_weight=65536.0, grad_accum=1, moe_balance_coef=0.01, indexer_kl_coef=1.0,
                      indexer_mode="sparse")
    lm, expected = _step(model, ids, weights, terms, None)
    lm_again, again = _step(model, ids, weights, terms, None)
    store = KeptAttention()
    lm_kept, kept = _step(model, ids, weights, terms, store)
    assert store._arena.used > 0, "the forwards went through host memory"
    lm_kept_again, kept_again = _step(model, ids, weights, terms, store)
    spread, error, error_again = _spread(again, expected), _spread(kept, expected), _spread(kept_again, expected)
    print(f"loss {lm:.6f} / kept {lm_kept:.6f}; gradients: computed twice {spread:.2e}, kept {error:.2e}, "
          f"kept with the buffers reused {error_again:.2e}", flush=True)
    assert lm_kept == pytest.approx(lm, rel=1e-5) and lm_kept_again == pytest.approx(lm, rel=1e-5)
    assert max(error, error_again) < max(3 * spread, 2e-3)
