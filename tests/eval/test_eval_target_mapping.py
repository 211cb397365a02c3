"""Adversarial checks of which target gets which score, bucket, base count and chromosome position.

Every expectation here is computed independently of genolc/eval: from the FASTA text, from base offsets, or by
brute force over replicates.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
from eval_helpers import CHR22, CopyOracle, TokenScorer, plain_window, read_fasta_bases

from genolc.data.dataset import PreparedDataset
from genolc.data.prepare import PrepareConfig, prepare
from genolc.data.sampler import tile_for_eval
from genolc.eval.buckets import (
    BLOCK_BASES,
    FEW_BLOCKS_FOR_CI,
    BlockBootstrap,
    BlockTable,
    bootstrap_paired,
    bootstrap_ratio,
    bucket_edges,
)
from genolc.eval.by_position import window_data
from genolc.eval.positions import score_windows, summarise
from genolc.eval.report import bucket_report
from genolc.eval.scorer import score_full, score_truncated, score_window
from genolc.tokenize import make_tokenizer

REGION_START = 20_000_001


class WhoIsVisibleScorer:
    """Row ids are window indices: log p(target) encodes the row's first token and the target token itself."""

    batch_tokens = 1 << 12

    def __call__(self, ids: np.ndarray) -> np.ndarray:
        first = ids[:, :1].astype(np.float64)
        return -(first * 1e3 + ids[:, 1:].astype(np.float64) + 1.0) * 1e-9


@pytest.mark.parametrize("length,context,block", [(40, 6, 3), (41, 7, 1), (23, 5, 7)])
def test_truncated_context_scores_the_right_target_with_exactly_the_preceding_tokens(length, context, block):
    scorer = WhoIsVisibleScorer()
    ids = np.arange(length, dtype=np.int64)                 # token id == window index
    full = score_full(scorer, ids)
    code = np.rint(-score_truncated(scorer, ids, context, full, block) * 1e9 - 1.0).astype(np.int64)
    first_visible, target = np.divmod(code, 1000)
    for i in range(1, length):
        assert target[i - 1] == i                           # the score of target i is about token i
        visible = i - first_visible[i - 1]                  # tokens first_visible .. i-1 are in the row
        if i <= context:
            assert visible == i
        else:
            assert context <= visible <= context + block - 1   # never more, so nothing long-range leaks in


def _rc_position_scorer():
    class RowPosition:
        """log p depends on the target id and its index in the row, so a mis-mapped strand shows."""

        batch_tokens = 1 << 12

        def __call__(self, ids: np.ndarray) -> np.ndarray:
            t = np.arange(1, ids.shape[1], dtype=np.float64)
            return -(ids[:, 1:].astype(np.float64) * 1e-3 + t * 1e-6)

    return RowPosition()


@pytest.mark.parametrize("spec,text", [("kmer:3", b"ACGTTGCAAGGCTTACAGTCA"),      # 7 three-mers, no rest
                                       ("kmer:3", b"ACGTTGCAAGGCTTACAGTCAGT"),    # + 2 remainder bases
                                       ("kmer:2", b"ACGGTNACCA" + b"T"),          # N-kmer + 1 remainder
                                       ("char", b"ACGGTTACNGCA")])
def test_rc_average_pairs_each_target_with_the_reverse_token_over_the_same_bases(spec, text):
    tok = make_tokenizer(spec)
    ids = np.asarray(tok.encode(np.frombuffer(text, dtype=np.uint8)), dtype=np.int64)
    scorer = _rc_position_scorer()
    got = score_window(scorer, ids, rc_tokenizer=tok)["full"]
    rc = np.asarray(tok.reverse_complement(ids), dtype=np.int64)
    lengths = np.asarray(tok.token_lengths(ids), dtype=np.int64)
    rc_lengths = np.asarray(tok.token_lengths(rc), dtype=np.int64)
    total = int(lengths.sum())
    fwd_start = np.concatenate([[0], np.cumsum(lengths)[:-1]])
    rc_start = np.concatenate([[0], np.cumsum(rc_lengths)[:-1]])
    for i in range(1, len(ids)):
        # forward bases [s, s + n) are reverse-strand bases [total - s - n, total - s)
        j = int(np.flatnonzero(rc_start == total - fwd_start[i] - lengths[i])[0])
        forward = -(ids[i] * 1e-3 + i * 1e-6)
        if j == 0:
            assert np.isnan(got[i - 1])                      # the reverse strand's first token has no prediction
            continue
        reverse = -(rc[j] * 1e-3 + j * 1e-6)
        assert got[i - 1] == pytest.approx((forward + reverse) / 2, abs=1e-12), i


@pytest.fixture(scope="module")
def kmer_region(tmp_path_factory):
    """A 3-mer dataset; held-out chr22:20000001-20001022 with an N run and 2 remainder bases at its end."""
    rng = np.random.default_rng(5)
    seq = "".join(rng.choice(list("ACGTacgt"), size=700)) + "N" * 20 + "".join(rng.choice(list("ACGTacgt"), 302))
    tmp = Path(tmp_path_factory.mktemp("kmer_region"))
    fasta = tmp / "g.fa"
    fasta.write_text(f">chr1\n{''.join(rng.choice(list('ACGT'), 3000))}\n>22:20000001-20001022\n{seq}\n")
    ds = PreparedDataset(prepare(PrepareConfig(genomes=(fasta,), out=tmp / "p", train=("chr1",),
                                               heldout=("chr22",), tokenizer="kmer:3", progress=False)))
    return ds, seq


def test_tiling_and_targets_on_a_kmer_region_match_the_fasta(kmer_region):
    ds, seq = kmer_region
    n_tokens = ds.record("chr22")["length_tokens"]
    assert n_tokens == 1022 // 3 + 1022 % 3
    # base of token t, straight from the layout: 340 three-mers, then 2 single bases
    token_base = [3 * t if t <= 340 else 1020 + (t - 340) for t in range(n_tokens + 1)]
    windows = tile_for_eval(ds, ["chr22"], 30, min_partial_fraction=0.0)
    assert any(w.start < 340 < w.stop < n_tokens for w in windows)    # one window ends among the remainder
    for w in windows:
        assert (w.base_start, w.base_stop) == (token_base[w.start], token_base[w.stop])
        assert (w.chrom_start, w.chrom_end) == (REGION_START + token_base[w.start],
                                                REGION_START + token_base[w.stop] - 1)
    data = [window_data(ds, w) for w in windows]
    tables = score_windows(data, {"model": TokenScorer()}, bucket_edges(30, 4), keep_targets=True)
    targets = {k: np.concatenate(v) for k, v in tables.targets.items()}
    # every kept target: its first base's chromosome position, its base count and its score from the FASTA text
    index = np.concatenate([np.arange(w.start + 1, w.stop)[~ds.token_ambiguous("chr22", w.start + 1, w.stop)]
                            for w in windows])
    assert len(index) == len(targets["position"]) > 0
    for t, pos, chrom_pos, nb, bits, soft in zip(index, targets["position"], targets["chrom_pos"],
                                                 targets["bases"], targets["model"], targets["softmask"]):
        first, stop = token_base[t], token_base[t + 1]
        piece = seq[first:stop]
        assert "N" not in piece.upper()                      # N-containing k-mers are never targets
        assert soft == (2 * sum(c.islower() for c in piece) > len(piece))
        assert chrom_pos == REGION_START + first and nb == len(piece)
        tid = int(ds.tokens("chr22")[t])
        assert bits == pytest.approx((1.0 + tid) / 100.0 / math.log(2) / len(piece))
    window_of = np.searchsorted([w.start for w in windows], index, side="right") - 1
    assert np.array_equal(targets["position"], index - np.array([windows[k].start for k in window_of]))
    assert set(np.asarray(targets["bases"]).tolist()) == {1, 3}  # remainder tokens count one base each


def _table(rng, windows=5, blocks=3, buckets=2):
    table = BlockTable(n_buckets=buckets, names=("a", "b"))
    for _ in range(windows):
        n = rng.integers(1, blocks + 1)
        blk = np.repeat(np.arange(n), 7)
        bkt = rng.integers(0, buckets, len(blk))
        bases = rng.integers(1, 7, len(blk)).astype(float)
        a = rng.gamma(2.0, 1.0, len(blk)) * bases
        table.add_window(bkt, blk, bases, {"a": a, "b": a * rng.uniform(0.8, 1.2, len(blk))})
    return table.arrays()


def test_bootstrap_interval_is_the_percentile_of_the_replicate_ratio_estimator():
    bases, _, bits, stratum = _table(np.random.default_rng(3))
    boot = BlockBootstrap(stratum, n_replicates=300, seed=11)
    counts = boot.counts()
    for b in range(bases.shape[1]):
        reps, paired = [], []
        for row in counts:                                  # brute force, one replicate at a time
            den = sum(c * bases[j, b] for j, c in enumerate(row))
            if den > 0:
                reps.append(sum(c * bits["a"][j, b] for j, c in enumerate(row)) / den)
                paired.append(sum(c * (bits["a"][j, b] - bits["b"][j, b]) for j, c in enumerate(row)) / den)
        iv = bootstrap_ratio(bits["a"], bases, boot)[b]
        assert iv.value == pytest.approx(bits["a"][:, b].sum() / bases[:, b].sum())
        assert (iv.low, iv.high) == pytest.approx(tuple(np.percentile(reps, [2.5, 97.5])))
        pv = bootstrap_paired(bits["a"], bits["b"], bases, boot)[b]
        assert pv.value == pytest.approx((bits["a"][:, b] - bits["b"][:, b]).sum() / bases[:, b].sum())
        assert (pv.low, pv.high) == pytest.approx(tuple(np.percentile(paired, [2.5, 97.5])))


def test_comparisons_are_paired_over_the_same_targets_even_when_one_series_lacks_some():
    """Under --rc-average the last target has no score; it must leave every series, not just one."""
    tok = make_tokenizer("char")
    ids = np.asarray(tok.encode(np.frombuffer(b"ACGTTGCANNACGTAGGCTA", dtype=np.uint8)), dtype=np.int64)
    window = plain_window(ids, tok)
    scorers = {"model": TokenScorer(), "baseline": _rc_position_scorer()}
    tables = score_windows([window], scorers, bucket_edges(19, 4), contexts=(3,), rc_tokenizer=tok,
                           keep_targets=True)
    rows, compare = summarise(tables, n_boot=30)
    targets = {k: np.concatenate(v) for k, v in tables.targets.items()}
    kept = targets["position"]
    expected = [i for i in range(1, 19) if not window.ambiguous[i]]   # not the last (19), not N
    assert kept.tolist() == expected
    model, baseline = targets["model"], targets["baseline"]
    total = next(r for r in compare if r["comparison"] == "model - baseline" and r["subset"] == "all"
                 and r["bucket"] == "all")
    assert total["delta_bits_per_base"] == pytest.approx((model - baseline).sum() / len(kept))
    assert total["tokens"] == len(kept)


def test_needle_segment_is_whole_kmers_so_no_remainder_token_lands_mid_window():
    from genolc.eval.needle import random_segment

    tok = make_tokenizer("kmer:6")
    rng = np.random.default_rng(0)
    for n_bases, tokens in ((256, 42), (6, 1), (5, 1), (300, 50)):
        segment = random_segment(tok, n_bases, rng)
        assert len(segment) == tokens and set(tok.token_lengths(segment).tolist()) == {6}
    assert len(random_segment(make_tokenizer("char"), 257, rng)) == 257


def test_a_bucket_inside_one_block_gets_no_interval_instead_of_a_zero_width_one():
    """One 40k-token window: [0,1k) … [8k,16k) share block 0, so redrawing blocks cannot vary them."""
    tok = make_tokenizer("char")
    rng = np.random.default_rng(0)
    ids = tok.encode(rng.choice(np.frombuffer(b"ACGT", dtype=np.uint8), 40_000))

    class Noisy:
        batch_tokens = 1 << 20

        def __call__(self, batch):
            return -rng.gamma(2.0, 0.7, size=(batch.shape[0], batch.shape[1] - 1))

    tables = score_windows([plain_window(ids, tok)], {"model": Noisy(), "baseline": Noisy()},
                           bucket_edges(39_999))
    rows, compare = summarise(tables, n_boot=100)
    spans_blocks = {"[0,1k)": 1, "[8k,16k)": 1, "[16k,32k)": 1, "[32k,39999]": 1, "all": 3}
    for row in rows + compare:
        if row["subset"] == "all" and row["bucket"] in spans_blocks:
            assert row["blocks"] == spans_blocks[row["bucket"]]
            if spans_blocks[row["bucket"]] == 1:
                assert row["ci_low"] is None and row["ci_high"] is None
            else:
                assert row["ci_low"] < row["ci_high"]


def test_every_statistic_carries_its_block_count_and_intervals_from_few_blocks_are_marked(shared_file):
    """Three 200k windows of real chr22: buckets below 64k lie in 3 or 6 blocks, later ones in 12 or more.

    The block count of each bucket is counted here from the kept targets' base offsets; the printed table marks
    exactly the intervals resting on fewer than FEW_BLOCKS_FOR_CI blocks, and says once what the mark means.
    """
    tok = make_tokenizer("char")
    bases = read_fasta_bases(shared_file(CHR22))
    length = 200_001
    windows = [plain_window(tok.encode(bases[s:s + length]), tok, start=s, chrom_start=REGION_START + s)
               for s in (0, 250_000, 700_000)]
    alphabet = np.unique(np.concatenate([w.ids for w in windows]))
    edges = bucket_edges(length - 1)
    tables = score_windows(windows, {"model": TokenScorer(), "baseline": CopyOracle(alphabet, copy=False)}, edges)
    rows, compare = summarise(tables, n_boot=50)
    labels = tables.labels + ["all"]
    expected = {}
    for b, label in enumerate(labels):
        lo, hi = (edges[b], edges[b + 1]) if label != "all" else (edges[0], edges[-1])
        expected[label] = sum(len(np.unique(w.base_offsets[p] // BLOCK_BASES)) for w in windows
                              for p in [np.arange(max(lo, 1), hi)[~w.ambiguous[max(lo, 1):hi]]])
    assert expected["[0,1k)"] == 3 and expected["[32k,64k)"] == 6 and expected["[64k,128k)"] == 12
    model = {r["bucket"]: r for r in rows if r["series"] == "model" and r["subset"] == "all"}
    delta = {r["bucket"]: r for r in compare if r["subset"] == "all"}
    assert {label: model[label]["blocks"] for label in labels} == expected
    assert {label: delta[label]["blocks"] for label in labels} == expected

    summary = {"bucket_stats": rows, "comparisons": compare}
    printed = bucket_report(summary).splitlines()
    table = {line.split()[0]: line for line in printed if line.split() and line.split()[0] in labels}
    assert list(table) == labels
    for label, line in table.items():
        ci = f"[{model[label]['ci_low']:.4f}, {model[label]['ci_high']:.4f}]"
        assert line.endswith(ci + ("*" if expected[label] < FEW_BLOCKS_FOR_CI else "")), line
    assert [line for line in printed if line.startswith("- ")] == [
        f"- model - baseline: {delta['all']['delta_bits_per_base']:+.4f} bits/base (95% CI "
        f"{delta['all']['ci_low']:+.4f} to {delta['all']['ci_high']:+.4f})"]       # 39 blocks: not marked
    notes = [line for line in printed if line.startswith("* ")]
    assert len(notes) == 1 and f"fewer than {FEW_BLOCKS_FOR_CI} bootstrap blocks" in notes[0]
    assert "not a 95% interval" in notes[0] and "--max-windows" in notes[0]
    # Intervals from 10 blocks or more only: nothing marked, no footnote.
    firm = {"bucket_stats": [r for r in rows if r["bucket"] in ("[64k,128k)", "[128k,200000]", "all")],
            "comparisons": compare}
    assert "*" not in bucket_report(firm)
