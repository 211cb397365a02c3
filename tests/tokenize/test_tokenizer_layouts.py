"""Tokenizer id layouts, k-mer remainders, N/IUPAC handling, masks, lengths, and every bad spec or file."""

from __future__ import annotations

import json
from itertools import product

import numpy as np
import pytest

from genolc.errors import ConfigError, InputError
from genolc.tokenize import (BPETokenizer, ByteTokenizer, CharTokenizer, KmerTokenizer, load_tokenizer,
                             make_tokenizer, reverse_complement_bases, tokenizer_from_dict)

IUPAC = "RYKMSWBDHVN"


def _b(text: str) -> np.ndarray:
    return np.frombuffer(text.encode(), dtype=np.uint8)


def _s(arr: np.ndarray) -> str:
    return arr.tobytes().decode()


def _naive_kmer_ids(text: str, k: int) -> list[int]:
    """Reference k-mer encoding written the slow, obvious way."""
    digit = {"A": "0", "C": "1", "G": "2", "T": "3"}
    text = text.upper()
    n_full = len(text) // k
    ids = []
    for i in range(n_full):
        kmer = text[i * k : (i + 1) * k]
        ids.append(15 if any(b not in digit for b in kmer) else 16 + int("".join(digit[b] for b in kmer), 4))
    ids += [4 + "ACGT".index(b) if b in "ACGT" else 8 for b in text[n_full * k :]]
    return ids


def test_char_layout_is_small_and_fixed():
    tok = CharTokenizer()
    assert tok.vocab_size == 16 and tok.fixed_bases_per_token == 1
    assert (tok.pad_id, tok.bos_id, tok.eos_id, tok.mask_id, tok.n_id) == (0, 1, 2, 3, 8)
    assert tok.encode(_b("ACGTN")).tolist() == [4, 5, 6, 7, 8]
    assert [tok.id_to_token(i) for i in range(10)] == ["<pad>", "<bos>", "<eos>", "<mask>", "A", "C", "G", "T",
                                                       "N", "<reserved:9>"]


def test_char_is_case_insensitive_and_maps_every_non_acgt_byte_to_n():
    tok = CharTokenizer()
    np.testing.assert_array_equal(tok.encode(_b("acgtACGT")), tok.encode(_b("ACGTACGT")))
    odd = IUPAC + IUPAC.lower() + "-*.X0 \x00\xff"
    ids = tok.encode(np.frombuffer(odd.encode("latin-1"), dtype=np.uint8))
    assert (ids == tok.n_id).all()
    assert _s(tok.decode(tok.encode(_b("acgtRyn")))) == "ACGTNNN"


def test_decode_drops_special_ids_and_rejects_out_of_range_ids():
    for tok in (CharTokenizer(), KmerTokenizer(3), ByteTokenizer()):
        core = tok.encode(_b("ACGTACG"))
        with_specials = np.concatenate(([tok.bos_id], core, [tok.eos_id, tok.pad_id, tok.mask_id]))
        np.testing.assert_array_equal(tok.decode(with_specials), tok.decode(core))
        assert tok.token_lengths(np.array([tok.pad_id, tok.bos_id, tok.eos_id, tok.mask_id])).tolist() == [0] * 4
        rc = tok.reverse_complement(with_specials)
        assert rc[0] == tok.mask_id and rc[-1] == tok.bos_id
        with pytest.raises(ValueError, match="outside"):
            tok.decode(np.array([tok.vocab_size]))
        with pytest.raises(ValueError, match="outside"):
            tok.reverse_complement(np.array([-1]))
        with pytest.raises(TypeError):
            tok.encode(np.array([65, 67], dtype=np.int64))
        with pytest.raises(TypeError):
            tok.decode(np.array([4.0]))
        assert tok.encode(np.zeros(0, np.uint8)).shape == (0,)
        assert tok.decode(np.zeros(0, np.int32)).shape == (0,)
        assert tok.reverse_complement(np.zeros(0, np.int32)).shape == (0,)


@pytest.mark.parametrize("k", [1, 2, 3, 5, 6, 8])
def test_kmer_remainders_for_every_length_up_to_2k_plus_1(k):
    tok = KmerTokenizer(k)
    rng = np.random.default_rng(k)
    for n in range(0, 2 * k + 2):
        text = "".join(rng.choice(list("ACGTacgt"), size=n))
        ids = tok.encode(_b(text))
        assert ids.tolist() == _naive_kmer_ids(text, k)
        assert ids.shape[0] == n // k + n % k
        assert _s(tok.decode(ids)) == text.upper()
        assert tok.token_lengths(ids).tolist() == [k] * (n // k) + [1] * (n % k)
        rc = tok.reverse_complement(ids)
        np.testing.assert_array_equal(tok.reverse_complement(rc), ids)
        assert _s(tok.decode(rc)) == _s(reverse_complement_bases(_b(text.upper())))
        # The remainder tokens lead the reversed ids instead of trailing them.
        assert tok.token_lengths(rc).tolist() == [1] * (n % k) + [k] * (n // k)


def test_kmer_layout_and_n_kmers():
    tok = KmerTokenizer(2)
    assert tok.vocab_size == 16 + 16 and tok.fixed_bases_per_token == 2
    assert tok.id_to_token(16) == "AA" and tok.id_to_token(17) == "AC" and tok.id_to_token(31) == "TT"
    assert tok.id_to_token(tok.n_id) == "NN"
    ids = tok.encode(_b("ACNTGRyyA"))
    assert ids.tolist() == [17, 15, 15, 15, 4]
    assert _s(tok.decode(ids)) == "ACNNNNNNA"  # an N k-mer decodes to N * k
    assert tok.ambiguous_mask(ids).tolist() == [False, True, True, True, False]
    assert tok.encode(_b("ACGTn")).tolist() == [17, 16 + 0b1011, 8]  # remainder N -> single-base N
    assert tok.ambiguous_mask(np.array([8])).tolist() == [True]
    for kmer in map("".join, product("ACGT", repeat=2)):
        (kid,) = tok.encode(_b(kmer))
        (rid,) = tok.reverse_complement(np.array([kid]))
        assert tok.id_to_token(int(rid)) == _s(reverse_complement_bases(_b(kmer)))


def test_byte_tokenizer_is_lossless_and_complements_iupac_in_both_cases():
    tok = ByteTokenizer()
    text = "ACGTNacgtn" + "RYKMSWBDHV" + "rykmswbdhv" + "-X"
    ids = tok.encode(_b(text))
    assert ids.tolist() == list(text.encode())
    assert _s(tok.decode(ids)) == text
    rc = tok.reverse_complement(ids)
    assert _s(tok.decode(rc)) == "X-" + "bdhvwskmry" + "BDHVWSKMRY" + "nacgt" + "NACGT"
    np.testing.assert_array_equal(tok.reverse_complement(rc), ids)
    assert tok.n_id == ord("N") and tok.pad_id == 256 and tok.vocab_size == 264
    mask = tok.ambiguous_mask(tok.encode(_b("ACGTacgtNnR")))
    assert mask.tolist() == [False] * 8 + [True] * 3


def test_ambiguous_mask_and_token_lengths_keep_shape():
    tok = CharTokenizer()
    ids = tok.encode(_b("ACGTNRAC")).reshape(2, 4)
    assert tok.ambiguous_mask(ids).tolist() == [[False] * 4, [True, True, False, False]]
    assert tok.token_lengths(ids).shape == (2, 4)
    assert tok.ambiguous_mask(np.array([0, 1, 2, 3])).all()


def test_bpe_on_a_small_hand_made_corpus():
    corpus = [_b("ACGTACGTACGTAAAATTTTACGT" * 40), _b("GGGGCCCCACGTNNNNACGTACGT" * 20)]
    tok = BPETokenizer.train(corpus, 24)
    assert tok.vocab_size <= 24 and "ACGT" in tok.tokens
    assert tok.fixed_bases_per_token is None and tok.n_id == tok.tokens.index("N")
    ids = tok.encode(_b("acgtacgtNRacgt"))
    assert _s(tok.decode(ids)) == "ACGTACGTNNACGT"
    assert tok.token_lengths(ids).sum() == 14
    assert tok.ambiguous_mask(ids).sum() == 2
    assert (tok.token_lengths(ids) > 1).any()


@pytest.mark.parametrize("spec, error, match", [
    ("kmer:0", ConfigError, "from 1 to 8"),
    ("kmer:9", ConfigError, "from 1 to 8"),
    ("kmer", ConfigError, "whole number"),
    ("kmer:six", ConfigError, "whole number"),
    ("bpe:8", ConfigError, "from 16"),
    ("bpe", ConfigError, "whole number"),
    ("char:2", ConfigError, "no argument"),
    ("wordpiece", ConfigError, "unknown tokenizer spec"),
    ("", ConfigError, "non-empty"),
    ("no/such/tokenizer.json", InputError, "not found"),
])
def test_bad_specs_give_one_clear_error(spec, error, match):
    with pytest.raises(error, match=match) as info:
        make_tokenizer(spec)
    assert info.value.fix and "use use" not in info.value.message


def test_bpe_spec_without_training_sequences_says_what_to_do():
    with pytest.raises(ConfigError, match="no training sequences") as info:
        make_tokenizer("bpe:4096")
    assert "tokenizer.json" in info.value.fix
    with pytest.raises(ConfigError, match="nothing|no stretch"):
        make_tokenizer("bpe:64", [_b("NNNNRN"), _b("A")])


def test_specs_are_case_and_space_tolerant():
    assert make_tokenizer(" CHAR ") == CharTokenizer()
    assert make_tokenizer("Kmer:4") == KmerTokenizer(4)


def test_newer_or_unknown_versions_and_kinds_are_refused(tmp_path):
    d = KmerTokenizer(4).to_dict()
    with pytest.raises(InputError, match="newer than this genolc reads") as info:
        tokenizer_from_dict({**d, "version": 99})
    assert "upgrade genolc" in info.value.fix
    with pytest.raises(InputError, match="no integer 'version'"):
        tokenizer_from_dict({k: v for k, v in d.items() if k != "version"})
    with pytest.raises(InputError, match="unknown tokenizer kind 'sentencepiece'"):
        tokenizer_from_dict({**d, "kind": "sentencepiece"})
    with pytest.raises(InputError, match="from 1 to 8"):
        tokenizer_from_dict({**d, "k": 12})
    with pytest.raises(InputError, match="of kind 'kmer', not 'char'"):
        CharTokenizer.from_dict(d)
    with pytest.raises(InputError, match="vocab_size"):
        tokenizer_from_dict({**CharTokenizer().to_dict(), "vocab_size": 17})
    path = tmp_path / "tokenizer.json"
    path.write_text(json.dumps({**ByteTokenizer().to_dict(), "version": 2}))
    with pytest.raises(InputError, match="newer") as info:
        load_tokenizer(path)
    assert str(path) in info.value.message
    path.write_text("{not json")
    with pytest.raises(InputError, match="not valid JSON"):
        load_tokenizer(path)
    path.write_text("[1, 2]")
    with pytest.raises(InputError, match="not a JSON object"):
        load_tokenizer(path)


def test_corrupted_bpe_vocabularies_are_refused():
    tok = BPETokenizer.train([_b("ACGTACGTTTGACCA" * 50)], 20)
    d = tok.to_dict()
    bad_tokens = list(d["tokens"])
    bad_tokens[5] = "AXG"
    with pytest.raises(InputError, match="not A/C/G/T/N"):
        tokenizer_from_dict({**d, "tokens": bad_tokens})
    with pytest.raises(InputError, match="special tokens"):
        tokenizer_from_dict({**d, "tokens": d["tokens"][4:]})
    with pytest.raises(InputError, match="merges"):
        tokenizer_from_dict({**d, "merges": [["A", "Q"]]})
    with pytest.raises(InputError, match="single bases"):
        tokenizer_from_dict({**d, "tokens": [t for t in d["tokens"] if t != "G"], "merges": []})
    with pytest.raises(InputError, match="piece_bases"):
        tokenizer_from_dict({**d, "piece_bases": 1000})
