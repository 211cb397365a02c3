"""Position buckets, bits-per-base normalisation and the block bootstrap on hand-made and synthetic data."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from eval_helpers import TokenScorer, plain_window

from genolc.eval.buckets import (
    BlockBootstrap,
    BlockTable,
    block_ids,
    bootstrap_paired,
    bootstrap_ratio,
    bucket_edges,
    bucket_index,
    bucket_labels,
    bits_per_base,
)
from genolc.eval.positions import score_windows, summarise
from genolc.eval.report import _clean
from genolc.tokenize import make_tokenizer


def test_bucket_edges_log2_with_closed_last_bucket():
    assert bucket_edges(4096).tolist() == [0, 1024, 2048, 4097]
    assert bucket_edges(4095).tolist() == [0, 1024, 2048, 4096]
    assert bucket_edges(524288).tolist()[-3:] == [131072, 262144, 524289]
    assert bucket_edges(1024).tolist() == [0, 1025]          # one bucket: window of 1025 tokens
    assert bucket_edges(300, first_edge=64).tolist() == [0, 64, 128, 256, 301]
    edges = bucket_edges(4096)
    positions = np.array([0, 1, 1023, 1024, 2047, 2048, 4095, 4096])
    assert bucket_index(positions, edges).tolist() == [0, 0, 0, 1, 1, 2, 2, 2]
    assert bucket_labels(edges) == ["[0,1k)", "[1k,2k)", "[2k,4k]"]
    assert bucket_labels(bucket_edges(524288))[-1] == "[256k,512k]"
    with pytest.raises(ValueError):
        bucket_index(np.array([4097]), edges)


def test_bits_per_base_is_tokenizer_independent():
    # a 6-mer at p = 4^-6 and a single base at p = 1/4 both cost 2 bits per base
    assert bits_per_base(np.array([math.log(4.0 ** -6), math.log(0.25)]), np.array([6, 1])).tolist() == \
        pytest.approx([2.0, 2.0])
    with pytest.raises(ValueError):
        bits_per_base(np.array([-1.0]), np.array([0]))


def test_bucket_mean_is_total_bits_over_total_bases_for_multibase_tokens():
    """Hand-made: a 3-mer tokenizer window; bucket means weight each target by its bases."""
    tok = make_tokenizer("kmer:3")
    bases = np.frombuffer(b"ACGTTGCAAGGCNNNCCA" + b"AC", dtype=np.uint8)   # 6 whole 3-mers + 2 single bases
    ids = np.asarray(tok.encode(bases), dtype=np.int64)
    window = plain_window(ids, tok)
    assert window.token_bases.tolist() == [3, 3, 3, 3, 3, 3, 1, 1]
    assert window.ambiguous.tolist() == [False, False, False, False, True, False, False, False]
    edges = np.array([0, 2, 8])
    tables = score_windows([window], {"model": TokenScorer()}, edges)
    rows, _ = summarise(tables, n_boot=20)
    by_bucket = {r["bucket"]: r for r in rows if r["subset"] == "all"}
    logp = -(1.0 + ids.astype(np.float64)) / 100.0
    bits = -logp / math.log(2)
    # bucket [0,2): target 1 (3 bases); bucket [2,7]: targets 2,3,5,6,7 (target 4 is ambiguous)
    first = bits[1] / 3
    rest = [2, 3, 5, 6, 7]
    expected = bits[rest].sum() / window.token_bases[rest].sum()
    assert by_bucket["[0,2)"]["bits_per_base"] == pytest.approx(first)
    assert by_bucket["[2,7]"]["bits_per_base"] == pytest.approx(expected)
    assert by_bucket["[2,7]"]["tokens"] == 5 and by_bucket["[2,7]"]["bases"] == 11
    assert by_bucket["all"]["tokens"] == 6


def test_empty_buckets_are_reported_empty_not_nan():
    tok = make_tokenizer("char")
    ids = np.asarray(tok.encode(np.frombuffer(b"ACGT" * 10, dtype=np.uint8)), dtype=np.int64)
    window = plain_window(ids, tok)            # no soft-masked token at all
    tables = score_windows([window], {"model": TokenScorer(), "baseline": TokenScorer()}, bucket_edges(39, 8),
                           contexts=(4,))
    rows, cmp = summarise(tables, n_boot=50)
    soft = [r for r in rows if r["subset"] == "softmasked"]
    assert soft and all(r["empty"] and r["bits_per_base"] is None and r["ci_low"] is None for r in soft)
    assert all(not r["empty"] and r["bits_per_base"] is not None for r in rows if r["subset"] == "all")
    text = json.dumps(_clean({"rows": rows, "cmp": cmp}), allow_nan=False)
    assert "NaN" not in text


def test_block_ids_follow_base_offsets():
    offsets = np.array([0, 16383, 16384, 40000, 49151, 49152])
    assert block_ids(offsets).tolist() == [0, 0, 1, 2, 2, 3]


def _synthetic(rng, n_windows=30, blocks_per_window=6, tokens=64, mean=1.9, block_sd=0.25, token_sd=0.5,
               delta=0.05):
    """Two paired series with block-level random effects (autocorrelated loss) and a known true mean/delta."""
    table = BlockTable(n_buckets=1, names=("a", "b"))
    for _ in range(n_windows):
        blocks = np.repeat(np.arange(blocks_per_window), tokens)
        effect = rng.normal(0, block_sd, blocks_per_window)[blocks]
        a = mean + effect + rng.normal(0, token_sd, len(blocks))
        b = a + delta + rng.normal(0, 0.05, len(blocks)) + rng.normal(0, 0.03, blocks_per_window)[blocks]
        table.add_window(np.zeros(len(blocks), dtype=np.int64), blocks, np.ones(len(blocks)), {"a": a, "b": b})
    return table.arrays()


def test_block_bootstrap_coverage_on_synthetic_data_with_known_mean():
    rng = np.random.default_rng(1)
    covered_mean = covered_delta = 0
    n_sims = 120
    widths_single, widths_paired = [], []
    for sim in range(n_sims):
        bases, _, bits, stratum = _synthetic(rng)
        boot = BlockBootstrap(stratum, n_replicates=200, seed=sim)
        iv = bootstrap_ratio(bits["a"], bases, boot)[0]
        covered_mean += iv.low <= 1.9 <= iv.high
        pd_iv = bootstrap_paired(bits["b"], bits["a"], bases, boot)[0]
        covered_delta += pd_iv.low <= 0.05 <= pd_iv.high
        widths_single.append(iv.high - iv.low)
        widths_paired.append(pd_iv.high - pd_iv.low)
    # nominal 95%; with 120 simulations a correct interval lands in [0.88, 0.995] with high probability
    assert 0.88 <= covered_mean / n_sims <= 0.995
    assert 0.88 <= covered_delta / n_sims <= 0.995
    # pairing removes the shared block effects: far narrower than either series alone
    assert np.mean(widths_paired) < 0.3 * np.mean(widths_single)


def test_block_bootstrap_is_stratified_seeded_and_pools_single_block_windows():
    stratum = np.array([0, 0, 0, 1, 1, 2, 3])
    a = BlockBootstrap(stratum, n_replicates=50, seed=7, max_cells=20).counts()
    b = BlockBootstrap(stratum, n_replicates=50, seed=7).counts()
    assert a.shape == (50, 7)
    assert np.array_equal(a[:, :3].sum(1), np.full(50, 3))      # window 0 redraws its own 3 blocks
    assert np.array_equal(a[:, 3:5].sum(1), np.full(50, 2))
    assert np.array_equal(a[:, 5:].sum(1), np.full(50, 2))      # single-block windows 2 and 3 pooled
    assert a[:, 5].std() > 0
    assert not np.array_equal(BlockBootstrap(stratum, 50, seed=8).counts(), b)
    # chunked and unchunked generation agree in total draws per stratum, and each is reproducible
    assert np.array_equal(a, BlockBootstrap(stratum, n_replicates=50, seed=7, max_cells=20).counts())
