"""Character-level tokenizer: one id per base.

Layout (vocab_size 16, fixed):

    0 <pad>   1 <bos>   2 <eos>   3 <mask>   4 A   5 C   6 G   7 T   8 N   9..15 reserved

Case-insensitive: soft-masking (lower case) is kept by ``genolc prepare`` as a separate per-base mask, so
``a`` and ``A`` share an id. N, every IUPAC ambiguity code and any other non-ACGT byte become the N id; decode
gives upper-case ASCII. The reverse complement works id by id (A<->T, C<->G, N and specials fixed).
"""

from __future__ import annotations

import numpy as np

from genolc.errors import InputError
from genolc.tokenize.base import BASE_CODES, SPECIAL_TOKENS, Tokenizer, as_bases, check_format, lookup

CHAR_VOCAB_SIZE = 16
FIRST_BASE_ID = 4  # A; C, G, T, N follow


class CharTokenizer(Tokenizer):
    kind = "char"
    format_version = 1

    def __init__(self) -> None:
        self.pad_id, self.bos_id, self.eos_id, self.mask_id = range(len(SPECIAL_TOKENS))
        self.n_id = FIRST_BASE_ID + 4
        self.fixed_bases_per_token = 1
        self.stream_granularity = 1
        token_bases = [b""] * CHAR_VOCAB_SIZE
        for code, base in enumerate(b"ACGTN"):
            token_bases[FIRST_BASE_ID + code] = bytes([base])
        ambiguous = np.ones(CHAR_VOCAB_SIZE, dtype=bool)
        ambiguous[FIRST_BASE_ID : FIRST_BASE_ID + 4] = False
        rc_ids = np.arange(CHAR_VOCAB_SIZE, dtype=np.int32)
        a, c, g, t = range(FIRST_BASE_ID, FIRST_BASE_ID + 4)
        rc_ids[[a, c, g, t]] = [t, g, c, a]
        self._set_tables(token_bases, ambiguous, rc_ids, plain_range=(FIRST_BASE_ID, self.n_id))
        # BASE_CODES sends every non-ACGT byte to code 4, which lands on N.
        self._encode_table = (BASE_CODES + FIRST_BASE_ID).astype(np.uint8)

    def encode(self, bases: np.ndarray) -> np.ndarray:
        return lookup(self._encode_table, as_bases(bases), np.int32)

    def to_dict(self) -> dict:
        return {"kind": self.kind, "version": self.format_version, "vocab_size": self.vocab_size,
                "special_ids": self.special_ids(), "n_id": self.n_id}

    @classmethod
    def from_dict(cls, d: dict, where: str | None = None) -> "CharTokenizer":
        check_format(d, cls.kind, cls.format_version, where)
        tok = cls()
        for key in ("vocab_size", "special_ids", "n_id"):
            if key in d and d[key] != tok.to_dict()[key]:
                raise InputError(f"char tokenizer field {key!r} is {d[key]!r}, expected {tok.to_dict()[key]!r}",
                                 where=where, fix="pass a file written by genolc's save_tokenizer")
        return tok
