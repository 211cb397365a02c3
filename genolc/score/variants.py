"""Variant scores: the log-likelihood ratio of the ALT versus the REF sequence in a window around a variant.

Definition (``W`` = the window in bases, ``r`` = len(REF), sequences are bases before tokenization):

* ``center`` placement (the default): both flanks hold ``f = (W - r) // 2`` reference bases, so the window is
  ``left(f) + allele + right(f)`` — ``W`` bases, or ``W - 1`` when ``W - r`` is odd, which keeps it the same window
  on both strands. The REF sequence uses REF as the allele, the ALT sequence ALT (an indel's ALT sequence is longer
  or shorter; the flanks are the same bases).
* ``causal-end`` placement: the window ends with the allele: ``left(W - r) + allele``. Everything the model sees
  before the allele is identical for REF and ALT, so the score is the causal ``log p(ALT | upstream) - log p(REF |
  upstream)`` (summed over the allele's tokens); on the reverse strand the upstream is the reverse complement of
  the right flank, and the allele is again at the window's end.

Near a record's end a flank is cut where the reference ends (it is not padded).

For a tokenized sequence ``x_0 … x_{T-1}``, ``S(x) = sum_{t=1}^{T-1} log p(x_t | x_0 … x_{t-1})`` (natural log; the
first token has no prediction and is not counted). The score is ``S(ALT sequence) - S(REF sequence)``: negative means
the model finds the ALT less likely. With ``reduce="mean"`` each ``S`` is divided by its ``T - 1`` first (Evo 2's
``score_sequences`` default, used in its BRCA1 zero-shot example with an 8,192-base centred window; for an SNV the
mean score is the sum score divided by ``T - 1``). With ``rc_average`` the same is computed for the reverse
complement of both sequences and the two strands' scores are averaged.

Reference checks (statuses, counted and not scored): ``unknown_chrom`` (no reference record for the chromosome,
aliases resolved as in ``genolc prepare``), ``outside`` (REF does not lie inside a reference record),
``ref_mismatch`` (REF differs from the genome, case ignored), ``edge`` (a window too short to score: fewer than two
tokens).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Iterator, Sequence

import numpy as np

from genolc.data.genome import canonical_chrom
from genolc.score.reference import Reference
from genolc.score.shared import ForwardCount, score_ref_alt
from genolc.score.vcf import Variant
from genolc.tokenize.base import reverse_complement_bases

PLACEMENTS = ("center", "causal-end")
REDUCTIONS = ("sum", "mean")


@dataclass(frozen=True)
class ScoreSettings:
    windows: tuple[int, ...] = (8192,)  # window lengths in bases
    placement: str = "center"
    rc_average: bool = False
    reduce: str = "sum"

    def __post_init__(self) -> None:
        if self.placement not in PLACEMENTS:
            raise ValueError(f"placement must be one of {PLACEMENTS}, got {self.placement!r}")
        if self.reduce not in REDUCTIONS:
            raise ValueError(f"reduce must be one of {REDUCTIONS}, got {self.reduce!r}")
        if not self.windows or min(self.windows) < 2:
            raise ValueError(f"windows must be at least 2 bases, got {self.windows}")


def check_variant(reference: Reference, variant: Variant) -> str:
    """The variant's status after the reference checks ('ok' when it can be scored)."""
    if variant.status != "ok":
        return variant.status
    if not reference.has_chrom(variant.chrom):
        return "unknown_chrom"
    end = variant.pos + len(variant.ref) - 1
    record = reference.locate(variant.chrom, variant.pos, end)
    if record is None:
        return "outside"
    genome = reference.fetch(record, variant.pos - record.start, end - record.start + 1)
    if genome.tobytes().upper().decode("ascii") != variant.ref:
        return "ref_mismatch"
    return "ok"


def window_sequences(reference: Reference, variant: Variant, window: int, placement: str,
                     strands: int) -> list[tuple[np.ndarray, np.ndarray]]:
    """``[(ref_bases, alt_bases)]`` for the forward strand and, with ``strands == 2``, the reverse strand."""
    record = reference.locate(variant.chrom, variant.pos, variant.pos + len(variant.ref) - 1)
    assert record is not None
    offset = variant.pos - record.start
    r = len(variant.ref)
    ref = np.frombuffer(variant.ref.encode(), dtype=np.uint8)
    alt = np.frombuffer(variant.alt.encode(), dtype=np.uint8)
    out = []
    if placement == "center":
        flank = max(0, (window - r) // 2)
        left = reference.fetch(record, offset - flank, offset)
        right = reference.fetch(record, offset + r, offset + r + flank)
        fwd = (np.concatenate([left, ref, right]), np.concatenate([left, alt, right]))
        out.append(fwd)
        if strands == 2:
            out.append((reverse_complement_bases(fwd[0]), reverse_complement_bases(fwd[1])))
        return out
    flank = max(0, window - r)
    left = reference.fetch(record, offset - flank, offset)
    out.append((np.concatenate([left, ref]), np.concatenate([left, alt])))
    if strands == 2:
        right = reference.fetch(record, offset + r, offset + r + flank)
        out.append((reverse_complement_bases(np.concatenate([ref, right])),
                    reverse_complement_bases(np.concatenate([alt, right]))))
    return out


def score_variants(scorer: Any, tokenizer: Any, reference: Reference, variants: Sequence[Variant],
                   settings: ScoreSettings, progress: Callable[[int], None] | None = None,
                   count: ForwardCount | None = None) -> tuple[list[str], np.ndarray]:
    """Statuses (one per variant) and scores ``float64 [n_variants, n_windows]`` (NaN where not scored).

    REF and ALT rows (and both strands) of a block of variants go to the scorer together, through
    :func:`genolc.score.shared.score_ref_alt`: alleles of one site share their REF window's forward, each ALT
    continues from its REF's cached prefix (a GenomeLM scorer), and rows of equal token length share a batch.
    ``count`` (optional) receives the forward tokens run and saved.
    """
    statuses = [check_variant(reference, v) for v in variants]
    scores = np.full((len(variants), len(settings.windows)), np.nan)
    strands = 2 if settings.rc_average else 1
    todo = [i for i, s in enumerate(statuses) if s == "ok"]
    if progress is not None:
        progress((len(variants) - len(todo)) * len(settings.windows))
    for w, window in enumerate(settings.windows):
        # Enough variants per block to fill every forward: each gives 2 * strands rows of about `window` tokens.
        block = max(1, int(scorer.batch_tokens) // max(window, 1))
        for members in _blocks(todo, variants, block):
            refs: list[np.ndarray] = []
            alts: list[list[np.ndarray]] = []
            ref_index: dict[bytes, int] = {}
            pairs: dict[int, list[tuple[int, int]]] = {}   # variant -> [(ref row, its alt slot)] per strand
            for i in members:
                encoded = []
                for ref_bases, alt_bases in window_sequences(reference, variants[i], window, settings.placement,
                                                             strands):
                    ref_ids, alt_ids = tokenizer.encode(ref_bases), tokenizer.encode(alt_bases)
                    if len(ref_ids) < 2 or len(alt_ids) < 2:
                        statuses[i] = "edge"
                        break
                    encoded.append((ref_ids, alt_ids))
                else:
                    pairs[i] = []
                    for ref_ids, alt_ids in encoded:
                        key = np.asarray(ref_ids, dtype=np.int64).tobytes()
                        if key not in ref_index:
                            ref_index[key] = len(refs)
                            refs.append(ref_ids)
                            alts.append([])
                        r = ref_index[key]
                        pairs[i].append((r, len(alts[r])))
                        alts[r].append(alt_ids)
            ref_logp, alt_logp = score_ref_alt(scorer, refs, alts, count) if refs else ([], [])

            def total(logp: np.ndarray) -> float:
                value = float(np.sum(logp))
                return value / len(logp) if settings.reduce == "mean" else value

            for i, strand_pairs in pairs.items():
                scores[i, w] = float(np.mean([total(alt_logp[r][a]) - total(ref_logp[r]) for r, a in strand_pairs]))
            if progress is not None:
                progress(len(members))
    for i, status in enumerate(statuses):
        if status != "ok":
            scores[i] = np.nan
    return statuses, scores


def _blocks(todo: list[int], variants: Sequence[Variant], size: int) -> Iterator[list[int]]:
    """``todo`` in runs of about ``size`` variants; alleles of one site (same chromosome, position and REF) stay in
    one run, so that they share their REF window."""
    members: list[int] = []
    for i in todo:
        if len(members) >= size and _site(variants[i]) != _site(variants[members[-1]]):
            yield members
            members = []
        members.append(i)
    if members:
        yield members


def _site(variant: Variant) -> tuple[str, int, str]:
    return canonical_chrom(variant.chrom), variant.pos, variant.ref
