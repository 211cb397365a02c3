"""Shared forwards for overlapping variant windows (genolc.score.shared) give the scores of scoring every REF and ALT
window on its own, on real DNA (GRCh37 chr22) with a tiny model, and run fewer forward tokens."""

from __future__ import annotations

import gzip

import numpy as np
import pytest

from genolc.score.shared import ForwardCount
from genolc.score.variants import ScoreSettings, score_variants, window_sequences
from genolc.score.vcf import Variant

CHR22 = "human/GRCh37_chr22_20000001-21000000.fa.gz"
SKIP, LENGTH = 100_000, 6_000
OTHER = {"A": "C", "C": "G", "G": "T", "T": "A"}

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    import torch

    from genolc.eval.scorer import ModelScorer
    from genolc.model import build_model, preset
    from genolc.score.reference import Reference
    from genolc.tokenize import CharTokenizer
    from tests.conftest import shared_file

    with gzip.open(shared_file(CHR22), "rb") as fh:
        body = b"".join(line.strip() for line in fh if not line.startswith(b">"))[SKIP:SKIP + LENGTH]
    assert body.upper().count(b"N") == 0
    fasta = tmp_path_factory.mktemp("shared") / "piece.fa"
    fasta.write_bytes(b">chr22\n" + body + b"\n")
    torch.manual_seed(0)
    tokenizer = CharTokenizer()
    model = build_model(preset("tiny", vocab_size=tokenizer.vocab_size))
    # window_chunk 48 < the windows below: prefixes and suffixes themselves run in several chunks.
    scorer = ModelScorer(model, device="cpu", batch_tokens=1024, window_chunk=48)
    reference = Reference(fasta)
    yield body.upper().decode(), scorer, tokenizer, reference
    reference.close()


def _variants(seq: str) -> list[Variant]:
    """Overlapping windows: SNVs a few bases apart, a 3-allele site, an MNV, insertions and deletions."""
    def snv(o, alt=None):
        return (o, seq[o], alt or OTHER[seq[o]])

    sites = [snv(2000), snv(2003), snv(2003, OTHER[OTHER[seq[2003]]]), snv(2003, OTHER[OTHER[OTHER[seq[2003]]]]),
             snv(2010), (2020, seq[2020:2022], OTHER[seq[2020]] + OTHER[seq[2021]]),
             (2030, seq[2030], seq[2030] + "ACGT"), (2030, seq[2030], seq[2030] + "G"),
             (2040, seq[2040:2043], seq[2040]), (2050, seq[2050:2052], seq[2050]), snv(4000)]
    return [Variant(n + 1, ("chr22", str(o + 1), ".", ref, alt, ".", ".", "."), "chr22", o + 1, ref, alt, 1, "ok")
            for n, (o, ref, alt) in enumerate(sites)]


def _unshared(scorer, tokenizer, reference, variant, window, placement, strands, reduce):
    """The score from its definition, every REF and ALT window in its own forward."""
    from genolc.eval.scorer import score_rows

    diffs = []
    for ref_bases, alt_bases in window_sequences(reference, variant, window, placement, strands):
        ref_logp, alt_logp = (score_rows(scorer, [tokenizer.encode(b)])[0] for b in (ref_bases, alt_bases))
        total = (lambda x: x.sum() / len(x)) if reduce == "mean" else np.sum
        diffs.append(total(alt_logp) - total(ref_logp))
    return float(np.mean(diffs))


@pytest.mark.parametrize("placement, rc_average, reduce, windows",
                         [("center", False, "sum", (101, 160)), ("center", True, "mean", (101,)),
                          ("causal-end", True, "sum", (133,))])
def test_shared_scores_equal_unshared_scores(setup, placement, rc_average, reduce, windows):
    seq, scorer, tokenizer, reference = setup
    variants = _variants(seq)
    settings = ScoreSettings(windows=windows, placement=placement, rc_average=rc_average, reduce=reduce)
    count = ForwardCount()
    statuses, scores = score_variants(scorer, tokenizer, reference, variants, settings, count=count)
    assert statuses == ["ok"] * len(variants)
    strands = 2 if rc_average else 1
    expected = np.array([[_unshared(scorer, tokenizer, reference, v, w, placement, strands, reduce)
                          for w in settings.windows] for v in variants])
    # Sums of ~100 fp32 log-probabilities, the shared ones computed in other chunks: fp32 rounding.
    np.testing.assert_allclose(scores, expected, rtol=1e-5, atol=5e-5 if reduce == "sum" else 5e-7)
    assert len({float(s) for s in scores[:, 0]}) == len(variants)   # no score was copied to another
    # The 3-allele site and the 2-insertion site run their REF window once per strand and window, not 3 and 2 times.
    assert count.shared_ref_rows == (2 + 1) * strands * len(settings.windows)
    assert count.prefix_rows > 0
    assert count.tokens + count.saved_tokens == count.unshared_tokens
    assert count.saved_tokens > 0.3 * count.unshared_tokens


def test_prefix_sharing_refused_when_the_indexer_pool_count_differs(setup):
    """An insertion that changes the window's pool count (T // index_kpool) runs on its own; one that keeps it
    continues from the REF prefix."""
    from genolc.score.shared import score_ref_alt

    seq, scorer, tokenizer, _ = setup
    kpool = scorer.model.config.index_kpool
    ref = tokenizer.encode(np.frombuffer(seq[:64].encode(), dtype=np.uint8))
    same_pools = np.concatenate([ref[:40], ref[41:42], ref[40:63]])           # an SNV-like change, same length
    more_pools = np.concatenate([ref[:40], ref[40:40 + kpool], ref[40:]])     # kpool more tokens
    count = ForwardCount()
    ref_logp, alt_logp = score_ref_alt(scorer, [ref], [[same_pools, more_pools]], count)
    assert count.prefix_rows == 1
    from genolc.eval.scorer import score_rows

    for got, row in zip([ref_logp[0], *alt_logp[0]], [ref, same_pools, more_pools]):
        np.testing.assert_allclose(got, score_rows(scorer, [row])[0], rtol=1e-5, atol=1e-5)
