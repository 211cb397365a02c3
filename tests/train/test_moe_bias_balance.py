"""Auxiliary-loss-free MoE balancing (genolc.train.balance): the bias update on hand-made loads, the logged load
figures, and on real DNA a clearly less imbalanced routing with the update than without."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from conftest import shared_file

from genolc.data.prepare import PrepareConfig, prepare
from genolc.model import build_model, preset
from genolc.model.checkpoint import load_pretrained
from genolc.train.balance import add_expert_counts, load_balance_metrics, router_biases, update_router_bias
from genolc.train.config import TrainConfig
from genolc.train.loop import METRICS, finetune

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def lambda_data(tmp_path_factory) -> Path:
    src = shared_file("other/lambda_phage_NC_001416.1.fa.gz")
    return prepare(PrepareConfig(genomes=(src,), out=tmp_path_factory.mktemp("lambda") / "ds", train="all",
                                 heldout=(), progress=False))


def _biases(model: torch.nn.Module) -> dict[int, torch.Tensor]:
    return {layer: bias.clone() for layer, bias in router_biases(model).items()}


def test_bias_moves_overloaded_experts_down_and_underloaded_up():
    torch.manual_seed(0)
    model = build_model(preset("tiny", vocab_size=16))
    assert sorted(router_biases(model)) == [1, 2, 3]          # the tiny preset's first layer is dense
    before = _biases(model)
    # Layer 1: mean 5 -> expert 0 overloaded, the rest underloaded; layer 2: perfectly balanced; layer 3: expert 2
    # exactly at the mean (mean 4) keeps its bias.
    counts = {1: torch.tensor([14, 2, 2, 2]), 2: torch.tensor([5, 5, 5, 5]), 3: torch.tensor([0, 8, 4, 4])}
    update_router_bias(model, counts, rate=0.25)
    after = _biases(model)
    assert torch.equal(after[1] - before[1], torch.tensor([-0.25, 0.25, 0.25, 0.25]))
    assert torch.equal(after[2], before[2])
    assert torch.equal(after[3] - before[3], torch.tensor([0.25, -0.25, 0.0, 0.0]))
    # The bias steers the choice: with expert 0 of layer 1 pushed down far enough, no token picks it.
    router_biases(model)[1].copy_(torch.tensor([-2.0, 0.0, 0.0, 0.0]))
    assert not (model.layers[1].mlp.gate(torch.randn(64, 64)).expert_ids == 0).any()

    update_router_bias(model, {1: torch.tensor([9, 0, 0, 0])}, rate=0.0)       # rate 0: off
    assert torch.equal(router_biases(model)[1], torch.tensor([-2.0, 0.0, 0.0, 0.0]))
    with pytest.raises(ValueError, match="no MoE router"):
        update_router_bias(model, {0: torch.tensor([1, 1, 1, 1])}, rate=1e-3)
    with pytest.raises(ValueError, match=r"\[E=4\]"):
        update_router_bias(model, {1: torch.tensor([1, 1, 1])}, rate=1e-3)


def test_counts_sum_over_micro_batches_and_load_figures():
    total: dict[int, torch.Tensor] = {}
    add_expert_counts(total, {1: torch.tensor([3, 1, 0, 0]), 3: torch.tensor([1, 1, 1, 1])})
    add_expert_counts(total, {1: torch.tensor([1, 1, 2, 0]), 3: torch.tensor([2, 2, 0, 0])})
    assert torch.equal(total[1], torch.tensor([4, 2, 2, 0])) and torch.equal(total[3], torch.tensor([3, 3, 1, 1]))
    figures = load_balance_metrics(total)
    assert figures == {"moe_load_max_over_mean": {"1": 2.0, "3": 1.5}, "moe_load_min_over_mean": {"1": 0.0, "3": 0.5}}


def _mean_imbalance(out: Path, last: int) -> float:
    """Mean over the last ``last`` steps and over MoE layers of the busiest expert's load over the mean load."""
    lines = [json.loads(line) for line in (out / METRICS).read_text().splitlines()]
    per_step = [sum(m["moe_load_max_over_mean"].values()) / len(m["moe_load_max_over_mean"]) for m in lines[-last:]]
    return sum(per_step) / len(per_step)


def test_bias_update_reduces_routing_imbalance_on_real_dna(lambda_data, tmp_path):
    """Without the update the tiny model's routers collapse on lambda phage within ~10 steps (every token to the
    same 2 of 4 experts: max/mean load 2.0, the worst possible at top-2); with it the load stays spread.

    Measured (seeds 0/1/2, mean max/mean load over the last 10 of 30 steps): rate 3e-3 gives 1.30/1.45/1.37,
    rate 0 gives 2.00/1.92/1.89. The default rate (1e-3, DeepSeek-V3's) acts more slowly at this learning rate:
    1.58 against 2.00 over steps 31-40.
    """
    rate = 3e-3
    base = TrainConfig(data=lambda_data, out=tmp_path / "off", seq_len=128, steps=30, lr=3e-4, warmup_steps=2,
                       moe_bias_rate=0.0, progress=False)
    finetune(base)
    final = finetune(base.replace(out=tmp_path / "on", moe_bias_rate=rate))
    without, with_update = _mean_imbalance(tmp_path / "off", 10), _mean_imbalance(tmp_path / "on", 10)
    assert without > 1.8 and with_update < without - 0.3, (without, with_update)

    lines = [json.loads(line) for line in (tmp_path / "on" / METRICS).read_text().splitlines()]
    for m in lines:
        assert set(m["moe_load_max_over_mean"]) == set(m["moe_load_min_over_mean"]) == {"1", "2", "3"}
        assert all(1.0 <= v <= 2.0 for v in m["moe_load_max_over_mean"].values())
        assert all(0.0 <= v <= 1.0 for v in m["moe_load_min_over_mean"].values())
    # The checkpoint carries the moved biases: whole multiples of the rate, at most one per step.
    for layer, bias in _biases(load_pretrained(final)).items():
        steps_moved = bias / rate
        assert bias.abs().max() > 0 and steps_moved.abs().max() <= 30 + 1e-3, layer
        assert torch.allclose(steps_moved, steps_moved.round(), atol=1e-3), layer
    off_biases = _biases(load_pretrained(tmp_path / "off" / "checkpoints" / "step-000030"))
    assert all(not b.any() for b in off_biases.values())


def test_checkpoints_from_before_the_option_resume_as_rate_zero(tmp_path):
    from genolc.train.config import changed_for_resume

    current = TrainConfig(data=tmp_path / "ds", out=tmp_path / "run", seq_len=64)
    older = {k: v for k, v in current.to_dict().items() if k != "moe_bias_rate"}
    assert changed_for_resume(older, current.replace(moe_bias_rate=0.0)) == []
    assert changed_for_resume(older, current) == ["moe_bias_rate: saved 0.0, now 0.001"]
