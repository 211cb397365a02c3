"""The training loss of one micro-batch (or of one chunk of it): weighted cross-entropy plus auxiliary losses.

    loss = sum(w * CE) / total_weight + sum over aux terms of coef * aux / grad_accum

``total_weight`` is the sum of target weights over the whole optimizer step (every micro-batch), so micro-batches and
chunks add up to one large batch's loss: the cross-entropy term is a sum over targets, and the model's auxiliary
losses of a chunk are already that chunk's share of its window's (genolc/model/cache.py). The indexer KL is added
only when the step trains the indexer (``indexer_mode`` set); it is still reported otherwise.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

AUX_TERMS = ("moe_balance", "indexer_kl")


@dataclass(frozen=True)
class LossTerms:
    """What turns a model output into the step's loss (fixed for one optimizer step)."""

    total_weight: float            # sum of target weights over the step's micro-batches
    grad_accum: int
    moe_balance_coef: float
    indexer_kl_coef: float
    indexer_mode: str | None       # None | "dense" | "sparse" (the model's indexer_loss argument)

    def coefficient(self, name: str) -> float:
        if name == "indexer_kl" and self.indexer_mode is None:
            return 0.0
        return {"moe_balance": self.moe_balance_coef, "indexer_kl": self.indexer_kl_coef}[name]


@dataclass
class LossParts:
    """``loss`` (with graph) and its detached parts: the LM term and each auxiliary value over ``grad_accum``."""

    loss: torch.Tensor
    lm: torch.Tensor
    aux: dict[str, torch.Tensor]


def micro_batch_loss(output, targets: torch.Tensor, weights: torch.Tensor, terms: LossTerms) -> LossParts:
    """``output`` a ModelOutput over ``targets [B, T]`` with weights ``[B, T]`` -> :class:`LossParts`."""
    logits = output.logits.float()
    ce = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1), reduction="none")
    lm = (ce * weights.reshape(-1)).sum() / terms.total_weight
    loss = lm
    aux: dict[str, torch.Tensor] = {}
    for name in AUX_TERMS:
        value = output.aux_losses.get(name) if output.aux_losses else None
        if value is None:
            continue
        aux[name] = value.detach().float() / terms.grad_accum
        coef = terms.coefficient(name)
        if coef > 0:
            loss = loss + coef * value.float() / terms.grad_accum
    return LossParts(loss=loss, lm=lm.detach(), aux=aux)
