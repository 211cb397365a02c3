"""The numba BPE encoder (genolc/tokenize/bpe_encode.py) gives the ``tokenizers`` library's ids: on real DNA at odd
lengths and offsets, lower case and N runs, every piece size, one or several threads, small and large vocabularies,
and the runs of one base where merges overlap."""

from __future__ import annotations

import gzip
from pathlib import Path

import numpy as np
import pytest

from genolc.errors import ConfigError
from genolc.tokenize.bpe import BPETokenizer
from genolc.tokenize import bpe_encode

pytest.importorskip("numba")


@pytest.fixture(scope="module")
def dna() -> np.ndarray:
    # The packaged 200 kb piece of GRCh37 chr22 (genolc/sample/PROVENANCE.md), soft-masked, with its case kept.
    path = Path(__file__).parents[2] / "genolc" / "sample" / "GRCh37_chr22_20480001-20680000.fa.gz"
    lines = gzip.open(path).read().split(b"\n")
    return np.frombuffer(b"".join(line for line in lines if not line.startswith(b">")), dtype=np.uint8)


@pytest.fixture(scope="module")
def tokenizers(dna) -> dict[int, BPETokenizer]:
    return {size: BPETokenizer.train([dna[:120_000]], size) for size in (16, 300, 4096)}


def both(tok: BPETokenizer, bases: np.ndarray, monkeypatch, threads: str = "2") -> tuple[np.ndarray, np.ndarray]:
    monkeypatch.setenv("RAYON_NUM_THREADS", threads)
    monkeypatch.setenv(bpe_encode.ENCODER_ENV, "tokenizers")
    reference = tok.encode(bases)
    monkeypatch.setenv(bpe_encode.ENCODER_ENV, "numba")
    return tok.encode(bases), reference


@pytest.mark.parametrize("size", [16, 300, 4096])
@pytest.mark.parametrize("start,length", [(0, 199_999), (123_457, 54_321), (7, 1)])
def test_real_dna_equals_tokenizers(tokenizers, dna, monkeypatch, size, start, length):
    bases = dna[start:start + length]
    ids, reference = both(tokenizers[size], bases, monkeypatch)
    assert ids.dtype == reference.dtype == np.int32
    np.testing.assert_array_equal(ids, reference)


@pytest.mark.parametrize("threads", ["1", "3"])
@pytest.mark.parametrize("piece", [64, 1024, 1 << 15])
def test_piece_sizes_and_threads(tokenizers, dna, monkeypatch, threads, piece):
    tok = tokenizers[4096]
    tok = BPETokenizer(tok.tokens, tok.merges, piece_bases=piece)
    ids, reference = both(tok, dna[1000:181_001], monkeypatch, threads)
    np.testing.assert_array_equal(ids, reference)


def test_lower_case_n_runs_and_iupac(tokenizers, dna, monkeypatch):
    bases = dna[50_000:90_013].copy()
    bases[100:5000] = ord("N")
    bases[9000:9003] = np.frombuffer(b"RYK", dtype=np.uint8)
    bases[20_000:30_000] = np.char.lower(bases[20_000:30_000].view("S1")).view(np.uint8)
    ids, reference = both(tokenizers[4096], bases, monkeypatch)
    np.testing.assert_array_equal(ids, reference)


@pytest.mark.parametrize("text", [b"A" * 4097, b"AC" * 999 + b"A", b"AAAC" * 500, b"N" * 50, b"", b"G",
                                  b"TTTTNTTTTTNNAAAAAAA"])
def test_runs_where_merges_overlap(tokenizers, monkeypatch, text):
    for size in (16, 4096):
        ids, reference = both(tokenizers[size], np.frombuffer(text, dtype=np.uint8), monkeypatch)
        np.testing.assert_array_equal(ids, reference)


def test_encoder_choice(monkeypatch):
    monkeypatch.delenv(bpe_encode.ENCODER_ENV, raising=False)
    assert bpe_encode.encoder_choice() == "numba"
    monkeypatch.setenv(bpe_encode.ENCODER_ENV, "tokenizers")
    assert bpe_encode.encoder_choice() == "tokenizers"
    monkeypatch.setenv(bpe_encode.ENCODER_ENV, "fast")
    with pytest.raises(ConfigError, match="GENOLC_BPE_ENCODER"):
        bpe_encode.encoder_choice()
    # An installed numba that fails on import (say, one older than the installed NumPy): auto takes the library's
    # encoder; asking for numba says why it cannot.
    monkeypatch.setattr(bpe_encode, "_numba_problem", lambda: "ImportError: Numba needs NumPy 2.2 or less")
    monkeypatch.setenv(bpe_encode.ENCODER_ENV, "auto")
    assert bpe_encode.encoder_choice() == "tokenizers"
    monkeypatch.setenv(bpe_encode.ENCODER_ENV, "numba")
    with pytest.raises(ConfigError, match="numba cannot be used .ImportError: Numba needs NumPy"):
        bpe_encode.encoder_choice()


def test_several_blocks_encoded_in_parallel_equal_one_after_another(tokenizers, dna, monkeypatch):
    """Inputs longer than one encode block (4 Mbp) go block by block over threads; the ids stay the library's."""
    bases = np.tile(dna, 4_300_000 // dna.shape[0] + 1)[:4_300_001]
    ids, reference = both(tokenizers[300], bases, monkeypatch, threads="2")
    np.testing.assert_array_equal(ids, reference)


@pytest.mark.parametrize("merges", [
    [("AC", "G"), ("A", "C")],                   # a merge before the merge that makes one of its tokens
    [("A", "C"), ("C", "G"), ("A", "C")],        # a pair listed twice (the library keeps its last rank)
])
def test_merge_orders_the_sweep_cannot_take_use_the_library(merges, monkeypatch):
    """A hand-written tokenizer file may list merges in an order the numba sweep would encode differently: auto
    takes the library's encoder for it, and forcing numba is refused with one message."""
    from genolc.tokenize.base import SPECIAL_TOKENS

    assert not bpe_encode.sweepable(merges)
    assert bpe_encode.sweepable([("A", "C"), ("AC", "G"), ("C", "G")])
    tok = BPETokenizer(list(SPECIAL_TOKENS) + ["A", "C", "G", "T", "N", "AC", "CG", "ACG"], merges)
    bases = np.frombuffer(b"ACGTTACGACGGACG", dtype=np.uint8)
    monkeypatch.setenv(bpe_encode.ENCODER_ENV, "tokenizers")
    reference = tok.encode(bases)
    monkeypatch.setenv(bpe_encode.ENCODER_ENV, "auto")
    np.testing.assert_array_equal(tok.encode(bases), reference)
    monkeypatch.setenv(bpe_encode.ENCODER_ENV, "numba")
    with pytest.raises(ConfigError, match="unset GENOLC_BPE_ENCODER"):
        tok.encode(bases)
