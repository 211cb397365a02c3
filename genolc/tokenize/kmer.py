"""Non-overlapping k-mer tokenizer (k = 1..8).

Layout (vocab_size = 16 + 4**k):

    0 <pad>  1 <bos>  2 <eos>  3 <mask>
    4 A  5 C  6 G  7 T  8 N        single-base tokens, used only for the remainder (see below)
    9..14 reserved
    15 N-kmer                      any k-mer holding a non-ACGT base (n_id); decodes to 'N' * k
    16 + i                         the k-mer whose base-4 digits (A=0, C=1, G=2, T=3, first base most
                                   significant) spell i, e.g. k=2: 16 AA, 17 AC, ... 31 TT

A sequence of n bases becomes n // k k-mer tokens followed by the n % k remaining bases as single-base tokens,
so every length round-trips (N and IUPAC codes come back as N; a k-mer holding any of them comes back as k Ns).

The reverse complement works id by id: reverse the token order and complement each token. The remainder
tokens therefore move to the front of the reversed ids (they are not re-framed to the end as
``encode(revcomp(seq))`` would do); that keeps the operation an exact involution on ids and keeps
``decode(rc(ids)) == revcomp(decode(ids))`` for any sequence.
"""

from __future__ import annotations

import numpy as np

from genolc.errors import ConfigError, InputError
from genolc.tokenize.base import (BASE_CODES, CODE_ASCII, SPECIAL_TOKENS, Tokenizer, as_bases, check_format,
                                  lookup)

MIN_K, MAX_K = 1, 8
FIRST_SINGLE_ID = 4   # A C G T N single-base tokens at 4..8
N_KMER_ID = 15
FIRST_KMER_ID = 16
# k-mers per block: bounds the temporaries of encode.
_KMER_BLOCK = 1 << 18


def _kmer_digits(k: int) -> np.ndarray:
    """uint8[4**k, k]: base-4 digits of every k-mer index, most significant first."""
    index = np.arange(4**k, dtype=np.int64)
    shifts = 2 * np.arange(k - 1, -1, -1, dtype=np.int64)
    return ((index[:, None] >> shifts[None, :]) & 3).astype(np.uint8)


class KmerTokenizer(Tokenizer):
    kind = "kmer"
    format_version = 1

    def __init__(self, k: int) -> None:
        if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or not MIN_K <= int(k) <= MAX_K:
            raise ConfigError(f"k-mer size must be an integer from {MIN_K} to {MAX_K} (got {k!r})",
                              where="tokenizer spec", fix="use e.g. 'kmer:6'")
        self.k = k = int(k)
        self.pad_id, self.bos_id, self.eos_id, self.mask_id = range(len(SPECIAL_TOKENS))
        self.n_id = N_KMER_ID
        self.single_n_id = FIRST_SINGLE_ID + 4
        self.fixed_bases_per_token = k
        self.stream_granularity = k
        n_kmers = 4**k
        vocab = FIRST_KMER_ID + n_kmers

        digits = _kmer_digits(k)
        table = np.zeros((vocab, k), dtype=np.uint8)
        lengths = np.zeros(vocab, dtype=np.int32)
        table[FIRST_SINGLE_ID : FIRST_SINGLE_ID + 5, 0] = CODE_ASCII
        lengths[FIRST_SINGLE_ID : FIRST_SINGLE_ID + 5] = 1
        table[N_KMER_ID] = ord("N")
        lengths[N_KMER_ID] = k
        table[FIRST_KMER_ID:] = CODE_ASCII[digits]
        lengths[FIRST_KMER_ID:] = k

        ambiguous = np.ones(vocab, dtype=bool)
        ambiguous[FIRST_SINGLE_ID : FIRST_SINGLE_ID + 4] = False
        ambiguous[FIRST_KMER_ID:] = False

        rc_ids = np.arange(vocab, dtype=np.int32)
        rc_ids[FIRST_SINGLE_ID : FIRST_SINGLE_ID + 4] = FIRST_SINGLE_ID + np.array([3, 2, 1, 0])
        # Complementing digit d gives 3 - d; reversing moves the digit at position j to position k-1-j,
        # where its weight is 4**j.
        weights = 4 ** np.arange(k, dtype=np.int64)
        rc_index = ((3 - digits.astype(np.int64)) * weights[None, :]).sum(axis=1)
        rc_ids[FIRST_KMER_ID:] = FIRST_KMER_ID + rc_index
        self._install_tables(table, lengths, ambiguous, rc_ids, plain_range=(N_KMER_ID, vocab - 1))
        self._single_table = (FIRST_SINGLE_ID + np.arange(5)).astype(np.uint8)

    def encode(self, bases: np.ndarray) -> np.ndarray:
        bases = as_bases(bases)
        k = self.k
        n_full = bases.shape[0] // k
        remainder = bases.shape[0] - n_full * k
        out = np.empty(n_full + remainder, dtype=np.int32)
        for start in range(0, n_full, _KMER_BLOCK):
            stop = min(start + _KMER_BLOCK, n_full)
            codes = lookup(BASE_CODES, bases[start * k : stop * k]).reshape(-1, k)
            index = codes[:, 0].astype(np.int32)
            flags = codes[:, 0].copy()
            for j in range(1, k):
                column = codes[:, j]
                index <<= 2
                index |= column
                flags |= column
            # Codes are 0..3 for ACGT and 4 otherwise: bit 2 of the OR marks a k-mer holding a non-ACGT base
            # (its index bits are then meaningless and it becomes the N-kmer).
            index += FIRST_KMER_ID
            index[(flags & 4) != 0] = N_KMER_ID
            out[start:stop] = index
        if remainder:
            tail_codes = lookup(BASE_CODES, bases[n_full * k :])
            out[n_full:] = self._single_table[tail_codes]
        return out

    def to_dict(self) -> dict:
        return {"kind": self.kind, "version": self.format_version, "k": self.k, "vocab_size": self.vocab_size,
                "special_ids": self.special_ids(), "n_id": self.n_id}

    @classmethod
    def from_dict(cls, d: dict, where: str | None = None) -> "KmerTokenizer":
        check_format(d, cls.kind, cls.format_version, where)
        if "k" not in d:
            raise InputError("k-mer tokenizer description has no 'k' field", where=where,
                             fix="pass a file written by genolc's save_tokenizer")
        try:
            tok = cls(d["k"])
        except ConfigError as exc:
            raise InputError(exc.what, where=where, fix="pass a file written by genolc's save_tokenizer") from None
        expected = tok.to_dict()
        for key in ("vocab_size", "special_ids", "n_id"):
            if key in d and d[key] != expected[key]:
                raise InputError(f"k-mer tokenizer field {key!r} is {d[key]!r}, expected {expected[key]!r}",
                                 where=where, fix="pass a file written by genolc's save_tokenizer")
        return tok
