"""Tokenizers on real DNA: round trips, reverse-complement involution, save/load, layouts and bad specs."""

from __future__ import annotations

import hashlib

import numpy as np
import pytest

from genolc.data.genome import open_genome
from genolc.tokenize import (BPETokenizer, KmerTokenizer, load_tokenizer, make_tokenizer, reverse_complement_bases,
                             save_tokenizer, tokenizer_from_dict)

# md5 of the upper-cased sequences, from ../shared/data/README.md: guards against reading the fixtures wrong.
LAMBDA = ("other/lambda_phage_NC_001416.1.fa.gz", "509bdb356475a21077713babc47a4a35")
CHR22 = ("human/GRCh37_chr22_20000001-21000000.fa.gz", "05a352ea48c23662e7d72e1614f88da7")
SOFTMASKED = ("human/hg38_chr16_186964-397118.fa.gz", "e4cfb67b23963f8b246847c08fb571a1")
FIXED_SPECS = ["char", "byte", "kmer:1", "kmer:2", "kmer:3", "kmer:6", "kmer:8"]


_CACHE: dict[str, object] = {}


def _read(path, md5: str) -> np.ndarray:
    if str(path) not in _CACHE:
        reader = open_genome(path)
        seq = np.concatenate([np.concatenate(list(rec.chunks())) for rec in reader.records()])
        assert hashlib.md5(seq.tobytes().upper()).hexdigest() == md5
        seq.flags.writeable = False
        _CACHE[str(path)] = seq
    return _CACHE[str(path)]


@pytest.fixture
def genomes(shared_file) -> dict[str, np.ndarray]:
    # Read once per session (the fixture below is function-scoped because shared_file is).
    return {name: _read(shared_file(relative), md5)
            for name, (relative, md5) in {"lambda": LAMBDA, "chr22": CHR22, "softmasked": SOFTMASKED}.items()}


@pytest.fixture
def bpe(genomes) -> BPETokenizer:
    if "bpe" not in _CACHE:
        _CACHE["bpe"] = make_tokenizer("bpe:1024", [genomes["chr22"]])
    tok = _CACHE["bpe"]
    assert isinstance(tok, BPETokenizer)
    return tok


def _upper_n(seq: np.ndarray) -> np.ndarray:
    """What char/BPE decode should give: upper case, every non-ACGT byte as N."""
    out = np.frombuffer(seq.tobytes().upper(), dtype=np.uint8).copy()
    out[~np.isin(out, np.frombuffer(b"ACGT", np.uint8))] = ord("N")
    return out


def _kmer_expected(seq: np.ndarray, k: int) -> np.ndarray:
    """What k-mer decode should give: like _upper_n, and a whole k-mer of N where it held any non-ACGT base."""
    out = _upper_n(seq)
    n_full = out.shape[0] // k
    full = out[: n_full * k].reshape(n_full, k)
    full[(full == ord("N")).any(axis=1)] = ord("N")
    return out


def _expected_decode(spec: str, seq: np.ndarray) -> np.ndarray:
    if spec == "byte":
        return seq
    if spec.startswith("kmer:"):
        return _kmer_expected(seq, int(spec.split(":")[1]))
    return _upper_n(seq)


@pytest.mark.parametrize("spec", FIXED_SPECS)
@pytest.mark.parametrize("name", ["lambda", "chr22", "softmasked"])
def test_round_trip_and_rc_involution_on_real_dna(spec, name, genomes):
    tok = make_tokenizer(spec)
    seq = genomes[name]
    ids = tok.encode(seq)
    assert ids.dtype == np.int32 and ids.min() >= 0 and ids.max() < tok.vocab_size
    decoded = tok.decode(ids)
    np.testing.assert_array_equal(decoded, _expected_decode(spec, seq))
    assert int(tok.token_lengths(ids).sum()) == seq.shape[0]
    rc = tok.reverse_complement(ids)
    np.testing.assert_array_equal(tok.reverse_complement(rc), ids)
    np.testing.assert_array_equal(tok.decode(rc), reverse_complement_bases(decoded))


def test_char_and_kmer_round_trip_exactly_on_acgt_dna(genomes):
    lam = genomes["lambda"]  # no N: char and k-mer decode must give the upper-cased sequence back exactly
    upper = np.frombuffer(lam.tobytes().upper(), dtype=np.uint8)
    for spec in ["char", "kmer:3", "kmer:6", "kmer:7"]:
        tok = make_tokenizer(spec)
        np.testing.assert_array_equal(tok.decode(tok.encode(lam)), upper)


def test_kmer_rc_matches_encoding_the_reverse_strand_when_length_divides(genomes):
    tok = KmerTokenizer(6)
    seq = genomes["lambda"][: 6 * 5000]
    np.testing.assert_array_equal(tok.reverse_complement(tok.encode(seq)),
                                  tok.encode(reverse_complement_bases(seq)))


def test_bpe_trained_on_real_dna_compresses_and_round_trips(bpe, genomes):
    assert bpe.vocab_size == 1024
    assert bpe.training["bases_used"] > 800_000
    for name in ["lambda", "chr22", "softmasked"]:
        seq = genomes[name]
        ids = bpe.encode(seq)
        decoded = bpe.decode(ids)
        np.testing.assert_array_equal(decoded, _upper_n(seq))
        lengths = bpe.token_lengths(ids)
        assert int(lengths.sum()) == seq.shape[0]
        acgt = ~bpe.ambiguous_mask(ids)
        assert lengths[acgt].mean() > 2.5, name  # DNA BPE with 1k ids reaches ~4 bases per token
        # Sequence-level involution: the ids may differ, the sequence may not.
        rc = bpe.reverse_complement(ids)
        np.testing.assert_array_equal(bpe.decode(rc), reverse_complement_bases(decoded))
        np.testing.assert_array_equal(bpe.decode(bpe.reverse_complement(rc)), decoded)


def test_bpe_tokens_never_cross_n_and_single_bases_are_in_vocabulary(bpe, genomes):
    for base in "ACGTN":
        assert base in bpe.tokens
    assert all("N" not in t for t in bpe.tokens if t != "N")
    seq = genomes["chr22"]
    ids = bpe.encode(seq)
    # Every ambiguous base is exactly one N token, so the N count carries over.
    assert int((ids == bpe.n_id).sum()) == int((_upper_n(seq) == ord("N")).sum())


def test_bpe_training_is_deterministic_and_respects_the_budget(genomes):
    chunks = [genomes["chr22"][i : i + 300_000] for i in range(0, 1_000_000, 300_000)]
    a = BPETokenizer.train(chunks, 256, max_training_bases=200_000, seed=3)
    b = BPETokenizer.train(iter(chunks), 256, max_training_bases=200_000, seed=3)
    assert a == b
    assert a.training["pieces_used"] == 200 and a.training["bases_used"] <= 200_000
    assert a.training["pieces_seen"] > 800


@pytest.mark.parametrize("spec", FIXED_SPECS + ["bpe"])
def test_encode_chunks_equals_encode_of_whole_record(spec, bpe, genomes):
    tok = bpe if spec == "bpe" else make_tokenizer(spec)
    seq = genomes["chr22"][:300_000]
    rng = np.random.default_rng(0)
    cuts = np.sort(rng.integers(0, seq.shape[0], size=9))
    chunks = np.split(seq, cuts)
    np.testing.assert_array_equal(np.concatenate(list(tok.encode_chunks(chunks))), tok.encode(seq))


@pytest.mark.parametrize("spec", FIXED_SPECS + ["bpe"])
def test_save_load_equality(spec, bpe, genomes, tmp_path):
    tok = bpe if spec == "bpe" else make_tokenizer(spec)
    path = tmp_path / "tok" / "tokenizer.json"
    save_tokenizer(tok, path)
    loaded = load_tokenizer(path)
    assert loaded == tok and type(loaded) is type(tok)
    assert make_tokenizer(str(path)) == tok
    assert tokenizer_from_dict(tok.to_dict()) == tok
    for attr in ("kind", "vocab_size", "pad_id", "n_id", "fixed_bases_per_token"):
        assert getattr(loaded, attr) == getattr(tok, attr)
    seq = genomes["chr22"][:200_000]
    np.testing.assert_array_equal(loaded.encode(seq), tok.encode(seq))
    assert tok.to_dict()["version"] == 1 and tok.to_dict()["kind"] == tok.kind
