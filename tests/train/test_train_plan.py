"""Memory estimate and the option suggested on out-of-memory."""

from __future__ import annotations

from genolc.model.presets import parameter_counts, preset
from genolc.train.plan import (GIB, estimate_memory, estimate_step_seconds, fitting_option, oom_error,
                               required_seq_multiple)


def test_memory_components_add_up_and_scale():
    cfg = preset("small")
    p = estimate_memory(cfg, seq_len=4096)
    assert p.parameters == parameter_counts(cfg).total
    assert p.weights == 4 * p.parameters and p.optimizer == 8 * p.parameters
    assert p.total == int((p.weights + p.gradients + p.optimizer + p.activations + p.logits) * 1.10)
    double = estimate_memory(cfg, seq_len=8192)
    assert 1.9 < double.activations / p.activations < 2.2       # ~linear in T (sparse attention, pooled indexer)
    rc = estimate_memory(cfg, seq_len=8192, recompute=True)
    assert rc.activations < double.activations / 3
    assert set(p.per_token_per_layer) == {"linear_attention", "indexed_attention"}


def test_fitting_option_names_something_that_fits():
    cfg = preset("small")
    budget = 140 * GIB
    big = estimate_memory(cfg, seq_len=4 * 1024 * 1024, windows=2)
    assert big.total > budget
    option = fitting_option(cfg, seq_len=4 * 1024 * 1024, micro_batch=2, grad_accum=1, recompute=False, bf16=True,
                            budget_bytes=budget)
    assert option is not None and option.startswith("--")
    err = oom_error(cfg, seq_len=4 * 1024 * 1024, micro_batch=2, grad_accum=1, recompute=False, bf16=True,
                    budget_bytes=budget, where="step 1")
    assert "estimated" in err.message and option in err.message


def test_option_order_and_nothing_fits():
    cfg = preset("small")
    # batch split first when it suffices
    one = estimate_memory(cfg, seq_len=65536, windows=1).total
    opt = fitting_option(cfg, seq_len=65536, micro_batch=4, grad_accum=1, recompute=False, bf16=True,
                         budget_bytes=one + 1)
    assert opt == "--micro-batch 1 --grad-accum 4"
    assert fitting_option(cfg, seq_len=1024, micro_batch=1, grad_accum=1, recompute=True, bf16=True,
                          budget_bytes=GIB) is None     # the optimizer state alone exceeds 1 GiB


def test_time_and_multiple():
    cfg = preset("small")
    assert estimate_step_seconds(cfg, seq_len=1 << 19, tokens_per_step=1 << 19) > 0
    assert required_seq_multiple("cpu") == 1 and required_seq_multiple("cuda") == 64


def test_activation_estimate_matches_what_autograd_saves_on_the_tiny_model():
    import torch

    from genolc.model.model import build_model
    from genolc.train.plan import activation_bytes_per_token

    cfg = preset("tiny")
    model = build_model(cfg)
    param_storages = {p.untyped_storage().data_ptr() for p in model.parameters()}
    saved: dict[int, int] = {}

    def pack(t):
        ptr = t.untyped_storage().data_ptr()
        if ptr not in param_storages:
            saved[ptr] = t.untyped_storage().nbytes()
        return t

    seq = 128
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            model(torch.randint(0, 16, (1, seq)))
    finally:
        torch.set_num_threads(threads)
    measured = sum(saved.values()) / seq
    estimated = sum(activation_bytes_per_token(cfg, seq, bf16=False))
    assert 0.8 < estimated / measured < 1.2, (estimated, measured)
