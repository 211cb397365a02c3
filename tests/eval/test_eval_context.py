"""Truncated-context scoring, reverse-complement averaging, and the known-answer test with a copying oracle."""

from __future__ import annotations

import numpy as np
import pytest
from eval_helpers import CHR22, CopyOracle, TokenScorer, VisibleContextScorer, plain_window, read_fasta_bases

from genolc.errors import ConfigError
from genolc.eval.buckets import bucket_edges
from genolc.eval.positions import score_windows, summarise
from genolc.eval.scorer import rc_check, score_full, score_truncated, score_window
from genolc.tokenize import make_tokenizer


@pytest.mark.parametrize("length,context,block", [(50, 8, 2), (50, 8, 1), (37, 10, 4), (12, 20, 3)])
def test_truncated_context_sees_between_k_and_k_plus_block_tokens(length, context, block):
    scorer = VisibleContextScorer()
    ids = np.arange(length) % 4 + 4
    full = score_full(scorer, ids)
    visible = np.rint(-score_truncated(scorer, ids, context, full, block) * 1e6 - 1).astype(int)
    for i in range(1, length):                              # target i has i tokens before it in the window
        seen = visible[i - 1]
        if i <= context:
            assert seen == i
        else:
            assert context <= seen <= context + block - 1
    if block == 1:
        assert np.all(visible[context - 1:] == context)


def test_rc_average_maps_reverse_strand_scores_onto_forward_targets():
    tok = make_tokenizer("char")
    ids = np.asarray(tok.encode(np.frombuffer(b"ACGGTTACNGCA", dtype=np.uint8)), dtype=np.int64)
    got = score_window(TokenScorer(), ids, rc_tokenizer=tok)["full"]
    complement = np.asarray(tok.reverse_complement(ids), dtype=np.int64)[::-1]   # complement of each token, in place
    fwd = -(1.0 + ids[1:]) / 100.0
    rev = -(1.0 + complement[1:]) / 100.0
    assert np.isnan(got[-1])                                # last target: no reverse-strand prediction
    assert got[:-1] == pytest.approx(((fwd + rev) / 2)[:-1])


def test_rc_average_refuses_a_tokenizer_that_resegments_the_reverse_strand():
    class Resegmenting:
        kind = "bpe"

        def reverse_complement(self, ids):
            return ids[::-1][:-1]

        def token_lengths(self, ids):
            return np.ones(len(ids), dtype=np.int32)

    with pytest.raises(ConfigError, match="--rc-average"):
        rc_check(Resegmenting(), np.arange(6))


def _planted_window(bases: np.ndarray, tok, start: int, length: int, first: int, distance: int, size: int):
    """A real chr22 window with its own segment at ``first`` copied to ``first + distance``."""
    piece = bases[start:start + length].copy()
    piece[first + distance:first + distance + size] = piece[first:first + size]
    ids = np.asarray(tok.encode(piece), dtype=np.int64)
    return plain_window(ids, tok, start=start, chrom_start=20000001 + start)


def test_known_answer_truncated_context_loses_only_beyond_the_copy_distance(shared_file):
    """A 400-base repeat planted 5000 tokens apart in real chr22; an oracle that copies what it can see.

    With context K = 2048 < D the truncated model cannot see the first copy from the second, so its loss is higher
    exactly in the bucket holding the second copy ([4k, 8k]); every bucket below is identical. With K = 6000 > D
    nothing is lost anywhere. A context-free baseline is worse than the copying model only there too.
    """
    tok = make_tokenizer("char")
    bases = read_fasta_bases(shared_file(CHR22))
    length, first, distance, size = 8193, 1200, 5000, 400
    starts = [100_000, 140_000, 180_000]
    windows = [_planted_window(bases, tok, s, length, first, distance, size) for s in starts]
    alphabet = np.unique(np.concatenate([w.ids for w in windows]))
    scorers = {"model": CopyOracle(alphabet), "baseline": CopyOracle(alphabet, copy=False)}
    edges = bucket_edges(length - 1)
    tables = score_windows(windows, scorers, edges, contexts=(2048, 6000), context_block=256)
    _, cmp = summarise(tables, n_boot=300, seed=3)
    gap = {(r["comparison"], r["bucket"]): r for r in cmp if r["subset"] == "all"}
    labels = tables.labels
    assert labels == ["[0,1k)", "[1k,2k)", "[2k,4k)", "[4k,8k]"]
    for label, hi in zip(labels, edges[1:]):
        short = gap[("context:2048 - model", label)]
        if hi <= distance:                                  # every target in the bucket sits before the copy distance
            assert short["delta_bits_per_base"] == 0.0
        else:
            assert short["delta_bits_per_base"] > 0.1 and short["ci_low"] > 0.0
        assert gap[("context:6000 - model", label)]["delta_bits_per_base"] == 0.0
        vs_base = gap[("model - baseline", label)]
        if label == "[4k,8k]":
            assert vs_base["delta_bits_per_base"] < -0.1 and vs_base["ci_high"] < 0.0
        else:
            assert vs_base["delta_bits_per_base"] == 0.0

    # the same windows without the plant: nothing to copy, no gap anywhere (the control has no false positives)
    plain = [_planted_window(bases, tok, s, length, first, distance, 0) for s in starts]
    tables = score_windows(plain, scorers, edges, contexts=(2048,), context_block=256)
    _, cmp = summarise(tables, n_boot=50)
    assert all(r["delta_bits_per_base"] == 0.0 for r in cmp if r["subset"] == "all")
