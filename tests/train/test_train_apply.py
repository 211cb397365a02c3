"""apply_recompute: same gradients as without it, and each layer's forward really runs twice per step."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from genolc.train.apply import apply_recompute, decoder_layers

pytestmark = pytest.mark.usefixtures("one_thread")


class Block(nn.Module):
    def __init__(self, d: int) -> None:
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)
        self.calls = 0

    def forward(self, x: torch.Tensor, *, scale: float = 1.0) -> torch.Tensor:
        self.calls += 1
        return x + scale * self.fc2(torch.tanh(self.fc1(x)))


class Toy(nn.Module):
    def __init__(self, d: int = 8, n: int = 3) -> None:
        super().__init__()
        self.layers = nn.ModuleList(Block(d) for _ in range(n))
        self.head = nn.Linear(d, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = layer(x, scale=0.5)
        return self.head(x).sum()


def _grads(model: nn.Module, x: torch.Tensor) -> dict[str, torch.Tensor]:
    model.zero_grad()
    model(x).backward()
    return {n: (None if p.grad is None else p.grad.clone()) for n, p in model.named_parameters()}


def _count_flops(model: nn.Module, x: torch.Tensor) -> int:
    from torch.utils.flop_counter import FlopCounterMode

    with FlopCounterMode(display=False) as counter:
        model(x).backward()
    return counter.get_total_flops()


def test_recompute_toy_equal_grads_and_double_forward():
    torch.manual_seed(0)
    plain, rc = Toy(), Toy()
    rc.load_state_dict(plain.state_dict())
    x = torch.randn(4, 8)
    assert apply_recompute(rc) == 3 and apply_recompute(rc) == 0          # idempotent
    g_plain, g_rc = _grads(plain, x), _grads(rc, x)
    for name in g_plain:
        torch.testing.assert_close(g_rc[name], g_plain[name], rtol=0, atol=0)
    assert [layer.calls for layer in plain.layers] == [1, 1, 1]
    assert [layer.calls for layer in rc.layers] == [2, 2, 2]
    assert list(rc.state_dict()) == list(plain.state_dict())             # names unchanged
    with torch.no_grad():                                                 # eval: no recompute
        rc(x)
    assert [layer.calls for layer in rc.layers] == [3, 3, 3]


def test_recompute_tiny_model_grads_and_flops():
    from genolc.model.model import build_model
    from genolc.model.presets import preset

    torch.manual_seed(0)
    plain = build_model(preset("tiny"))
    rc = build_model(preset("tiny"))
    rc.load_state_dict(plain.state_dict())
    assert len(decoder_layers(rc)) == 4 and apply_recompute(rc) == 4
    ids = torch.randint(0, 16, (2, 48), generator=torch.Generator().manual_seed(1))

    def loss_of(model):
        class Wrap(nn.Module):
            def __init__(self):
                super().__init__()
                self.m = model

            def forward(self, x):
                return self.m(x).logits.float().logsumexp(-1).mean()
        return Wrap()

    g_plain, g_rc = _grads(loss_of(plain), ids), _grads(loss_of(rc), ids)
    assert {n for n, g in g_rc.items() if g is None} == {n for n, g in g_plain.items() if g is None}
    for name, grad in g_plain.items():
        if grad is not None:
            torch.testing.assert_close(g_rc[name], grad, rtol=1e-5, atol=1e-7)
    f_plain, f_rc = _count_flops(loss_of(plain), ids), _count_flops(loss_of(rc), ids)
    # Recompute adds one more forward of the decoder layers: strictly more FLOPs, less than forward+backward again.
    assert f_plain < f_rc < 2 * f_plain
