"""The whole model on CUDA: the dispatched fast kernels against the pure-torch references, same weights. Needs CUDA.

Each op is checked alone in the other files here; this one checks they compose inside the layers (dtypes under
bf16 autocast, layouts, the indexer's row format feeding the sparse kernel, MoE chunking) on a shape where the DSA
layer really selects (T well above index_topk).
"""

from __future__ import annotations

import pytest
import torch

if not torch.cuda.is_available():
    pytest.skip("needs a CUDA device", allow_module_level=True)

import genolc.model.layers.moe as moe_layer  # noqa: E402
from genolc.model import build_model  # noqa: E402
from genolc.model.layers.dsa import DSAAttention  # noqa: E402
from genolc.model.layers.kda import KimiDeltaAttention  # noqa: E402
from genolc.model.ops.dsa import reference as dsa_reference  # noqa: E402
from genolc.model.ops.indexer import reference as indexer_reference  # noqa: E402
from genolc.model.ops.kda import reference as kda_reference  # noqa: E402
from genolc.model.ops.moe import reference as moe_reference  # noqa: E402
from genolc.model.presets import _genome_preset  # noqa: E402

pytestmark = pytest.mark.gpu


def _config():
    # The small preset's head shapes (what the kernels are built for) at 4 layers and a short top-k, so T = 2111
    # exercises selection while the reference path still fits comfortably.
    return _genome_preset(hidden=512, layers=4, kda_heads=12, kda_head_dim=128, mla_heads=4, q_lora=256, kv_lora=128,
                          qk_nope=128, v_dim=128, index_heads=4, index_head_dim=64, kpool=4, topk=256, experts=8,
                          experts_per_tok=2, moe_inter=256, dense_inter=1024, vocab_size=16)


def _reference_select(*args, out_dtype=None, **kwargs):
    """The reference selection; the layer asks for int32 rows on CUDA, the reference returns int64 (the sparse
    ops take either)."""
    return indexer_reference.select_indices(*args, **kwargs)


def _use_reference_ops(model, monkeypatch):
    for module in model.modules():
        if isinstance(module, KimiDeltaAttention):
            module.kda_op = kda_reference.chunk_kda
        if isinstance(module, DSAAttention):
            module.select_op = _reference_select
            module.sparse_attention_op = dsa_reference.sparse_latent_attention
    monkeypatch.setattr(moe_layer, "routed_experts", moe_reference.routed_experts)


def _loss_and_grads(model, ids):
    with torch.autocast("cuda", dtype=torch.bfloat16):
        logits = model(ids[:, :-1]).logits
    loss = torch.nn.functional.cross_entropy(logits.float().flatten(0, 1), ids[:, 1:].flatten())
    grads = torch.autograd.grad(loss, [p for p in model.parameters() if p.requires_grad], allow_unused=True)
    return logits.float(), loss, grads


@pytest.mark.parametrize("length", [2111, 4096])
def test_fast_model_matches_reference_model(length, poison, rel_err, monkeypatch):
    torch.manual_seed(length)
    model = build_model(_config()).cuda()
    ids = torch.randint(4, 8, (1, length + 1), device="cuda")
    poison()
    fast_logits, fast_loss, fast_grads = _loss_and_grads(model, ids)
    _use_reference_ops(model, monkeypatch)
    ref_logits, ref_loss, ref_grads = _loss_and_grads(model, ids)
    assert rel_err(fast_logits, ref_logits) < 2e-2
    assert abs(float(fast_loss) - float(ref_loss)) < 2e-2 * abs(float(ref_loss))
    names = [n for n, p in model.named_parameters() if p.requires_grad]
    for name, mine, theirs in zip(names, fast_grads, ref_grads):
        if theirs is None or ".indexer." in name:
            continue
        assert mine is not None, name
        assert rel_err(mine, theirs) < 5e-2, name
