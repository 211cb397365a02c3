"""PreparedDataset (reading what `genolc prepare` wrote) and the 1 kb duplication hashing behind prepare."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from genolc.data.dataset import PreparedDataset
from genolc.data.duplication import (BLOCK_BASES, TrainBlockIndex, block_hashes, heldout_coverage,
                                     rolling_block_hashes)
from genolc.data.prepare import PrepareConfig, prepare
from genolc.errors import InputError

RNG = np.random.default_rng(11)


def bases(n: int) -> np.ndarray:
    return np.frombuffer(b"ACGT", dtype=np.uint8)[RNG.integers(0, 4, n)]


@pytest.fixture(scope="module")
def dataset_dir(tmp_path_factory) -> Path:
    tmp = tmp_path_factory.mktemp("ds")
    seq = bases(20_000).tobytes()
    seq = seq[:3000] + seq[3000:4000].lower() + b"N" * 500 + seq[4500:]
    fa = tmp / "g.fa"
    fa.write_bytes(b">chr1\n" + seq + b"\n>chr22\n" + bases(5000).tobytes() + b"\n>chrM\n" + bases(100).tobytes() + b"\n")
    return prepare(PrepareConfig(genomes=(fa,), out=tmp / "out", train=("chr1",), heldout=("chr22",),
                                 progress=False))


def test_keys_records_tokens(dataset_dir):
    ds = PreparedDataset(dataset_dir)
    assert ds.keys() == ["chr1", "chr22", "chrM"]
    assert ds.keys("train") == ["chr1"] and ds.keys("heldout") == ["chr22"] and ds.keys("unused") == ["chrM"]
    tokens = ds.tokens("chr1")
    assert isinstance(tokens, np.memmap) and not tokens.flags.writeable and len(tokens) == 20_000
    assert ds.record("chr1")["n_bases"] == 500
    amb = ds.token_ambiguous("chr1", 4000, 4600)
    assert amb[:500].all() and not amb[500:].any()
    soft = ds.token_softmask("chr1", 2990, 4010)
    assert not soft[:10].any() and soft[10:1010].all() and not soft[1010:].any()
    assert np.array_equal(ds.token_base_offsets("chr1", 10, 13), [10, 11, 12, 13])
    with pytest.raises(ValueError):
        ds.token_ambiguous("chr1", 19_000, 20_001)
    with pytest.raises(InputError, match="not tokenized"):
        ds.tokens("chrM")
    with pytest.raises(InputError, match="no record 'chr9'"):
        ds.record("chr9")


def test_missing_foreign_newer_and_damaged(dataset_dir, tmp_path):
    with pytest.raises(InputError, match="not found"):
        PreparedDataset(tmp_path / "nothing")
    (tmp_path / "foreign").mkdir()
    (tmp_path / "foreign" / "manifest.json").write_text(json.dumps({"name": "some other tool"}))
    with pytest.raises(InputError, match="not a genolc dataset"):
        PreparedDataset(tmp_path / "foreign")
    (tmp_path / "empty").mkdir()
    with pytest.raises(InputError, match="no manifest"):
        PreparedDataset(tmp_path / "empty")
    newer = tmp_path / "newer"
    shutil.copytree(dataset_dir, newer)
    manifest = json.loads((newer / "manifest.json").read_text())
    (newer / "manifest.json").write_text(json.dumps(manifest | {"format_version": 99}))
    with pytest.raises(InputError, match="newer"):
        PreparedDataset(newer)
    damaged = tmp_path / "damaged"
    shutil.copytree(dataset_dir, damaged)
    with open(damaged / "tokens" / "chr1.bin", "r+b") as fh:
        fh.truncate(100)
    with pytest.raises(InputError, match="damaged"):
        PreparedDataset(damaged).tokens("chr1")


def test_rolling_hash_equals_block_hash_at_every_offset():
    seq = bases(3000 + 17)
    rolled = rolling_block_hashes(seq)
    assert len(rolled) == len(seq) - BLOCK_BASES + 1
    for offset in (0, 1, 7, 8, 9, 1000, 2017):
        assert rolled[offset] == block_hashes(seq[offset:offset + BLOCK_BASES].reshape(1, -1))[0]
    assert len(np.unique(rolled)) == len(rolled)


def test_coverage_finds_shifted_copy_and_ignores_n_blocks():
    train = bases(200_000)
    index = TrainBlockIndex()
    index.start_record()
    bad = np.array([[50_000, 51_500]])  # N'd in training: those blocks are not kept
    for lo in range(0, len(train), 65_536):
        chunk_bad = np.clip(bad - lo, 0, 65_536)
        index.add(train[lo:lo + 65_536], chunk_bad[chunk_bad[:, 1] > chunk_bad[:, 0]])
    assert len(index) == 200 - 2
    held = np.concatenate([bases(2500), train[100_123:160_123], np.full(2000, ord("N"), np.uint8)])
    eligible, found = heldout_coverage(lambda lo, hi: held[lo:hi], len(held), index, step=7000)
    assert eligible == len(held) // 1000 - 2
    # The copy spans held-out bases 2500..62500; matches tile it from the first whole training block on.
    assert 57 <= found <= 59
    unrelated = bases(30_000)
    assert heldout_coverage(lambda lo, hi: unrelated[lo:hi], len(unrelated), index) == (30, 0)
