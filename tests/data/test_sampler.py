"""Training-window sampler and evaluation tiling (genolc/data/sampler.py)."""

from __future__ import annotations

import numpy as np
import pytest

from pathlib import Path

from genolc.data.dataset import PreparedDataset
from genolc.data.prepare import PrepareConfig, prepare
from genolc.data.sampler import EvalWindow, TrainSampler, Window, tile_for_eval
from genolc.errors import ConfigError
from genolc.sample import sample_files


def _random_dna(rng: np.random.Generator, n: int) -> str:
    return "".join(rng.choice(list("ACGT"), size=n))


def _prepared(tmp: Path, records: dict[str, str], train: str, heldout: str) -> PreparedDataset:
    fasta = tmp / "genome.fa"
    fasta.write_text("".join(f">{header}\n{seq}\n" for header, seq in records.items()))
    out = prepare(PrepareConfig(genomes=(fasta,), out=tmp / "prepared", train=tuple(train.split(",")),
                                heldout=tuple(heldout.split(",")), progress=False))
    return PreparedDataset(out)


@pytest.fixture(scope="module")
def dataset(tmp_path_factory) -> PreparedDataset:
    """Laid out for exact answers: chr1 clean 3000 bases; chr2 1500 with a 400-N run; chr3 too short for a
    1025-token window; held-out chr22 (a region header: first base chr22:20,000,001) with a 1500-N gap."""
    rng = np.random.default_rng(7)
    return _prepared(tmp_path_factory.mktemp("sampler"), {
        "chr1": _random_dna(rng, 3000),
        "chr2": _random_dna(rng, 600) + "N" * 400 + _random_dna(rng, 500),
        "chr3": _random_dna(rng, 700),
        "22:20000001-20005200": _random_dna(rng, 2000) + "N" * 1500 + _random_dna(rng, 1700),
    }, train="chr1,chr2,chr3", heldout="chr22")


@pytest.fixture(scope="module")
def bundled(tmp_path_factory) -> PreparedDataset:
    """The real human sample shipped in the package: hg38 chr2:1-600000 (train), GRCh37 chr22:20480001-20680000."""
    out = prepare(PrepareConfig(genomes=tuple(sample_files()), out=tmp_path_factory.mktemp("bundled") / "data",
                                train=("chr2",), heldout=("chr22",), progress=False))
    return PreparedDataset(out)


def test_windows_are_deterministic_and_well_formed(dataset):
    a = TrainSampler(dataset, 256, seed=3)
    b = TrainSampler(dataset, "256", seed=3)
    other_seed = TrainSampler(dataset, 256, seed=4)
    wins = [a.window(s, m) for s in range(20) for m in range(2)]
    assert wins == [b.window(s, m) for s in range(20) for m in range(2)]
    assert wins != [other_seed.window(s, m) for s in range(20) for m in range(2)]
    assert len(set(wins)) > 30  # steps and micro-batches draw different windows
    for w in wins:
        assert isinstance(w, Window) and len(w) == 257 and w.key in ("chr1", "chr2", "chr3")
        assert 0 <= w.start and w.stop <= dataset.record(w.key)["length_tokens"]
        assert not w.reverse_complement
    # call order does not matter: no hidden state
    assert a.window(5, 1) == wins[11]
    batch = a.batch(5, 1)
    assert batch.dtype == np.int64 and batch.shape == (257,)
    assert np.array_equal(batch, dataset.tokens(wins[11].key)[wins[11].start:wins[11].stop])


def test_seq_len_accepts_suffixes(dataset):
    assert TrainSampler(dataset, "1k").seq_len == 1024
    with pytest.raises(ConfigError):
        TrainSampler(dataset, "1.5q")


def test_resume_via_state_dict_reproduces_the_stream(dataset):
    first = TrainSampler(dataset, 128, seed=11, reverse_complement=True)
    state = first.state_dict()
    resumed = TrainSampler(dataset, 128, seed=0, reverse_complement=True)
    resumed.load_state_dict(state)
    assert [resumed.window(s) for s in range(50, 60)] == [first.window(s) for s in range(50, 60)]
    for s in range(50, 53):
        assert np.array_equal(resumed.batch(s), first.batch(s))
    with pytest.raises(ConfigError, match="seq_len: saved 128, now 256"):
        TrainSampler(dataset, 256).load_state_dict(state)
    with pytest.raises(ConfigError, match="dp_size"):
        TrainSampler(dataset, 128, reverse_complement=True, dp_size=2).load_state_dict(state)


def test_data_parallel_ranks_differ(dataset):
    dp_size = 3
    for step in range(30):
        per_rank = [TrainSampler(dataset, 200, seed=1, dp_rank=r, dp_size=dp_size).window(step) for r in range(dp_size)]
        spans = sorted((w.key, w.start, w.stop) for w in per_rank)
        for (k1, s1, e1), (k2, s2, e2) in zip(spans, spans[1:]):
            assert k1 != k2 or e1 <= s2, f"DP ranks overlap at step {step}: {spans}"


def test_the_sampler_takes_no_context_parallel_rank(dataset):
    """A CP group's ranks share one window: each builds the sampler of its DP rank, so a CP rank is no argument
    (it used to be accepted and ignored)."""
    with pytest.raises(TypeError, match="cp_rank"):
        TrainSampler(dataset, 200, dp_rank=1, dp_size=2, cp_rank=1, cp_size=2)


def test_windows_follow_valid_start_counts(dataset):
    sampler = TrainSampler(dataset, 256, seed=0, max_n_fraction=1.0)
    keys = [sampler.window(s).key for s in range(600)]
    # valid starts: chr1 3000-256, chr2 1500-256, chr3 700-256: shares 0.59, 0.27, 0.10
    share = {k: keys.count(k) / len(keys) for k in ("chr1", "chr2", "chr3")}
    assert share["chr1"] > share["chr2"] > share["chr3"] > 0.03


def test_n_heavy_windows_are_rejected(dataset):
    sampler = TrainSampler(dataset, 256, seed=2, max_n_fraction=0.05)
    n_seen = 0
    for s in range(200):
        w = sampler.window(s)
        amb = dataset.token_ambiguous(w.key, w.start, w.stop)
        assert amb.mean() <= 0.05
        n_seen += int(amb.any())
    loose = TrainSampler(dataset, 256, seed=2, max_n_fraction=1.0)
    assert any(dataset.token_ambiguous(w.key, w.start, w.stop).mean() > 0.05
               for w in (loose.window(s) for s in range(200)))


def test_reverse_complement_windows(dataset):
    sampler = TrainSampler(dataset, 300, seed=5, reverse_complement=True)
    flags = [sampler.window(s).reverse_complement for s in range(200)]
    assert 60 < sum(flags) < 140
    step = flags.index(True)
    w = sampler.window(step)
    tok = dataset.tokenizer
    forward = tok.decode(np.asarray(dataset.tokens(w.key)[w.start:w.stop])).tobytes().decode()
    reverse = tok.decode(sampler.batch(step)).tobytes().decode()
    assert reverse == forward[::-1].translate(str.maketrans("ACGTN", "TGCAN"))


def test_window_longer_than_every_train_chromosome(dataset):
    with pytest.raises(ConfigError, match=r"longer than every train chromosome; the longest, chr1, has 3000 tokens"):
        TrainSampler(dataset, 3000)
    TrainSampler(dataset, 2999)  # exactly fits: 3000 tokens


def test_no_window_passes_the_n_filter(tmp_path):
    rng = np.random.default_rng(0)
    ds = _prepared(tmp_path, {"chr1": "N" * 900 + _random_dna(rng, 100), "chr22": _random_dna(rng, 50)},
                   train="chr1", heldout="chr22")
    with pytest.raises(ConfigError, match=r"no training window of 501 tokens passed the N filter .*in 64 draws"):
        TrainSampler(ds, 500, max_n_fraction=0.1).window(0)


def test_bad_ranks_and_fractions(dataset):
    with pytest.raises(ConfigError, match="rank 2 is outside a group of size 2"):
        TrainSampler(dataset, 100, dp_rank=2, dp_size=2)
    with pytest.raises(ConfigError, match="max_n_fraction"):
        TrainSampler(dataset, 100, max_n_fraction=1.5)


def test_tiling_covers_segments_with_absolute_coordinates(dataset):
    wins = tile_for_eval(dataset, ["chr22"], 511, max_n_fraction=0.5)
    assert all(isinstance(w, EvalWindow) for w in wins)
    # segment 1: tokens [0, 2000) -> 3 full windows of 512 + a 464-token partial (>= 256 kept);
    # gap [2000, 3500) skipped; segment 2: [3500, 5200) -> 3 full + a 164-token remainder, dropped (< 256)
    spans = [(w.start, w.stop, w.partial) for w in wins]
    assert spans == [(0, 512, False), (512, 1024, False), (1024, 1536, False), (1536, 2000, True),
                     (3500, 4012, False), (4012, 4524, False), (4524, 5036, False)]
    first, partial = wins[0], wins[3]
    assert (first.chrom_start, first.chrom_end) == (20_000_001, 20_000_512)
    assert first.region == "chr22:20000001-20000512"
    assert (partial.base_start, partial.base_stop) == (1536, 2000)
    assert partial.chrom_end == 20_000_000 + 2000
    assert wins[4].chrom_start == 20_000_001 + 3500
    assert all(w.n_fraction == 0.0 for w in wins)
    # non-overlapping and in order
    assert all(a.stop <= b.start for a, b in zip(wins, wins[1:]))


def test_tiling_partial_rule_and_defaults(dataset):
    keep_all = tile_for_eval(dataset, None, 511, min_partial_fraction=0.0)
    assert [w.key for w in keep_all] == ["chr22"] * 8 and keep_all[-1].partial
    assert (keep_all[-1].start, keep_all[-1].stop) == (5036, 5200)
    full_only = tile_for_eval(dataset, None, 511, min_partial_fraction=1.0)
    assert not any(w.partial for w in full_only) and len(full_only) == 6


def test_tiling_keeps_short_n_runs_within_the_limit(tmp_path):
    rng = np.random.default_rng(1)
    seq = _random_dna(rng, 100) + "N" * 30 + _random_dna(rng, 70) + "N" * 80 + _random_dna(rng, 120)
    ds = _prepared(tmp_path, {"chr1": seq, "chr2": _random_dna(rng, 300)}, train="chr2", heldout="chr1")
    wins = tile_for_eval(ds, ["chr1"], 99, max_n_fraction=0.5)
    # gaps are runs over 50 tokens: the 80-N run at [200, 280) cuts the record; the 30-N run stays inside
    # [100, 200), kept with its 0.3 share; [280, 380) is full and the 20-token remainder is dropped.
    assert [(w.start, w.stop) for w in wins] == [(0, 100), (100, 200), (280, 380)]
    assert wins[1].n_fraction == pytest.approx(0.3)
    # at 0.2 the 30-N run is a gap too: [130, 200) becomes a 70-token partial window
    strict = tile_for_eval(ds, ["chr1"], 99, max_n_fraction=0.2)
    assert [(w.start, w.stop) for w in strict] == [(0, 100), (130, 200), (280, 380)]
    assert strict[1].partial


def test_tiling_errors(dataset):
    with pytest.raises(ConfigError, match="chrQ"):
        tile_for_eval(dataset, ["chrQ"], 100)


def test_real_human_sample(bundled):
    """The bundled hg38 chr2 piece starts with a 10 kb N run; the GRCh37 chr22 piece has a 100 kb gap."""
    sampler = TrainSampler(bundled, "4k", seed=0, reverse_complement=True)
    for step in range(20):
        w = sampler.window(step)
        assert w.key == "chr2" and len(w) == 4097
        assert bundled.token_ambiguous("chr2", w.start, w.stop).mean() <= 0.1
    wins = tile_for_eval(bundled, ["chr22"], "4k")
    chrom_gap = (20_509_432, 20_609_431)  # the N run, 1-based inclusive, from the FASTA
    assert all(w.chrom_end < chrom_gap[0] or w.chrom_start > chrom_gap[1] for w in wins)
    assert wins[0].region == "chr22:20480001-20484097"
    after = [w for w in wins if w.chrom_start > chrom_gap[1]]
    assert after[0].chrom_start == chrom_gap[1] + 1  # tiling restarts at the gap's end
    covered = sum(w.base_stop - w.base_start for w in wins)
    assert covered >= 100_000 - 2 * 4097  # at most one dropped remainder per segment
    assert [w.partial for w in wins].count(True) <= 2
