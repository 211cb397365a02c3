"""Scoring REF/ALT windows with shared forwards, exactly.

Two things are shared, and both give the same log-probabilities as scoring every row on its own (up to fp32
summation order):

* **identical REF windows** — alleles of one site (a split multi-allelic record, or the same REF listed twice) have
  the same REF window on each strand; it is run once and its log-likelihood reused for every ALT.
* **the REF's prefix** — every layer is causal (genolc/model/cache.py), so the tokens before the first token where
  ALT differs from REF get the same hidden states in both windows. The REF window runs as a prefix chunk
  ``0 .. s-1`` plus its suffix; each ALT continues from a copy of the prefix's cache
  (:meth:`genolc.model.cache.WindowCache.fork`) and runs only ``s .. T_alt-1``. With ``s`` one less than the common
  prefix, the ALT's targets ``1 .. s`` are the REF's (same tokens, same logits). An ALT of another length shares the
  prefix only when it has the same number of indexer pools as the REF (``T // index_kpool``): the indexer's choice
  among tied pools depends on that count, so the prefix's cache would not be exactly the ALT's own otherwise.

Prefix sharing needs a GenomeLM behind a :class:`genolc.eval.scorer.ModelScorer`; any other scorer still gets the
REF dedup, and its rows go through :func:`genolc.eval.scorer.score_rows` unchanged.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np


@dataclass
class ForwardCount:
    """Tokens run through the model, against what scoring every REF and ALT row on its own would run."""

    tokens: int = 0
    unshared_tokens: int = 0
    shared_ref_rows: int = 0     # REF rows not run again because an identical one was
    prefix_rows: int = 0         # ALT rows continued from their REF's cached prefix

    @property
    def saved_tokens(self) -> int:
        return self.unshared_tokens - self.tokens

    def to_dict(self) -> dict[str, int]:
        return {"forward_tokens": self.tokens, "unshared_forward_tokens": self.unshared_tokens,
                "saved_forward_tokens": self.saved_tokens, "shared_ref_windows": self.shared_ref_rows,
                "alt_rows_from_ref_prefix": self.prefix_rows}


def common_prefix(a: np.ndarray, b: np.ndarray) -> int:
    n = min(len(a), len(b))
    differ = np.flatnonzero(np.asarray(a[:n]) != np.asarray(b[:n]))
    return int(differ[0]) if len(differ) else n


def _prefix_model(scorer: Any) -> Any | None:
    """The GenomeLM behind ``scorer`` when prefix sharing is exact for it, else None."""
    from genolc.eval.scorer import ModelScorer
    from genolc.model import GenomeLM

    if not isinstance(scorer, ModelScorer) or not isinstance(scorer.model, GenomeLM):
        return None
    return None if callable(getattr(scorer.model, "target_logprobs", None)) else scorer.model


def score_ref_alt(scorer: Any, refs: Sequence[np.ndarray], alts: Sequence[Sequence[np.ndarray]],
                  count: ForwardCount | None = None) -> tuple[list[np.ndarray], list[list[np.ndarray]]]:
    """Target log-probabilities (``[T-1]`` each, as :func:`genolc.eval.scorer.score_rows`) of each distinct REF row
    ``refs[i]`` and of the ALT rows ``alts[i]`` that go with it."""
    from genolc.eval.scorer import score_rows

    count = count if count is not None else ForwardCount()
    model = _prefix_model(scorer)
    kpool = int(getattr(getattr(model, "config", None), "index_kpool", 1) or 1)
    ref_out: list[np.ndarray | None] = [None] * len(refs)
    alt_out: list[list[np.ndarray | None]] = [[None] * len(a) for a in alts]
    plain: list[tuple[int, int]] = []          # (ref, -1) or (ref, alt) run on their own
    by_split: dict[tuple[int, int], list[tuple[int, list[int]]]] = {}
    for i, (ref, group) in enumerate(zip(refs, alts)):
        count.unshared_tokens += len(ref) * max(1, len(group)) + sum(len(a) for a in group)
        count.shared_ref_rows += max(0, len(group) - 1)
        shareable = [j for j, alt in enumerate(group)
                     if model is not None and len(alt) // kpool == len(ref) // kpool
                     and common_prefix(ref, alt) >= 2]
        if not shareable:
            plain.append((i, -1))
            plain.extend((i, j) for j in range(len(group)))
            continue
        split = min(common_prefix(ref, group[j]) for j in shareable) - 1
        by_split.setdefault((len(ref), split), []).append((i, shareable))
        plain.extend((i, j) for j in range(len(group)) if j not in shareable)

    if plain:
        rows = [refs[i] if j < 0 else alts[i][j] for i, j in plain]
        count.tokens += sum(len(r) for r in rows)
        for (i, j), logp in zip(plain, score_rows(scorer, rows)):
            if j < 0:
                ref_out[i] = logp
            else:
                alt_out[i][j] = logp
    for (length, split), members in by_split.items():
        per_call = max(1, int(scorer.batch_tokens) // length)
        for start in range(0, len(members), per_call):
            batch = members[start:start + per_call]
            _score_from_prefix(scorer, model, refs, alts, batch, split, ref_out, alt_out, count)
    return ref_out, alt_out  # type: ignore[return-value]


def _score_from_prefix(scorer: Any, model: Any, refs, alts, batch: list[tuple[int, list[int]]], split: int,
                       ref_out: list, alt_out: list, count: ForwardCount) -> None:
    """One forward over the REF rows' prefix ``0 .. split-1``, then the REF and ALT suffixes from copies of it."""
    import torch

    from genolc.model.cache import WindowCache

    device = scorer.device
    ref_ids = torch.from_numpy(np.stack([np.asarray(refs[i], dtype=np.int64) for i, _ in batch])).to(device)
    prefix = WindowCache(model.config.num_hidden_layers, ref_ids.shape[1])
    with torch.no_grad():
        head_logp = _run_span(scorer, model, prefix, ref_ids, 0, split).double().cpu().numpy()
    if not (np.all(np.isfinite(head_logp)) and np.all(head_logp <= 1e-6)):
        raise ValueError("the model returned non-finite or positive log-probabilities")
    count.tokens += split * len(batch)
    # Suffix rows: (batch row whose prefix they continue, ids of the whole row, where the result goes).
    suffixes: dict[int, list[tuple[int, np.ndarray, tuple[int, int]]]] = {}
    for b, (i, shareable) in enumerate(batch):
        suffixes.setdefault(len(refs[i]), []).append((b, refs[i], (i, -1)))
        for j in shareable:
            suffixes.setdefault(len(alts[i][j]), []).append((b, alts[i][j], (i, j)))
            count.prefix_rows += 1
    for length, rows in suffixes.items():
        per_call = max(1, int(scorer.batch_tokens) // max(1, length - split))
        for start in range(0, len(rows), per_call):
            group = rows[start:start + per_call]
            ids = torch.from_numpy(np.stack([np.asarray(r, dtype=np.int64) for _, r, _ in group])).to(device)
            source = torch.tensor([b for b, _, _ in group], dtype=torch.long)
            with torch.no_grad():
                tail = _run_span(scorer, model, prefix.fork(source, length), ids, split, length)
            tail = tail.double().cpu().numpy()
            count.tokens += (length - split) * len(group)
            if not (np.all(np.isfinite(tail)) and np.all(tail <= 1e-6)):
                raise ValueError("the model returned non-finite or positive log-probabilities")
            for (b, _, (i, j)), row_tail in zip(group, tail):
                logp = np.minimum(np.concatenate([head_logp[b], row_tail]), 0.0)
                if j < 0:
                    ref_out[i] = logp
                else:
                    alt_out[i][j] = logp


def _run_span(scorer: Any, model: Any, window: Any, ids: Any, start: int, stop: int) -> Any:
    """Positions ``start .. stop-1`` of the rows ``ids [B, L]`` continuing ``window``, in the scorer's chunks and
    with its head bypass; float32 ``[B, n]``: the log-probabilities of targets ``start+1 .. min(stop, L-1)``."""
    from genolc.eval.scorer import span_target_logprobs

    return span_target_logprobs(model, window, ids, start, stop, scorer.window_chunk, scorer.logits_chunk,
                                scorer._head_bypass())
