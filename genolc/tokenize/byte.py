"""Byte-level tokenizer: the id of a base is its byte value; lossless, case kept.

Layout (vocab_size 264, fixed):

    0..255 the byte with that value      256 <pad>  257 <bos>  258 <eos>  259 <mask>  260..263 reserved

It exists to be lossless, so unlike the other tokenizers it keeps case and every byte as given: ``decode``
returns the original bytes (not upper case -- the one documented exception to the ``decode`` contract).
``n_id`` is the id of ``N`` (78). ``ambiguous_mask`` is False only for A, C, G, T in either case. The reverse
complement works id by id and complements A/C/G/T/N and IUPAC codes in both cases (R<->Y, K<->M, B<->V,
D<->H; S, W, N fixed); other bytes map to themselves.
"""

from __future__ import annotations

import numpy as np

from genolc.errors import InputError
from genolc.tokenize.base import ASCII_COMPLEMENT, Tokenizer, as_bases, check_format

BYTE_VOCAB_SIZE = 264
FIRST_SPECIAL_ID = 256


class ByteTokenizer(Tokenizer):
    kind = "byte"
    format_version = 1

    def __init__(self) -> None:
        self.pad_id, self.bos_id, self.eos_id, self.mask_id = range(FIRST_SPECIAL_ID, FIRST_SPECIAL_ID + 4)
        self.n_id = ord("N")
        self.fixed_bases_per_token = 1
        self.stream_granularity = 1
        token_bases = [bytes([b]) for b in range(256)] + [b""] * (BYTE_VOCAB_SIZE - 256)
        ambiguous = np.ones(BYTE_VOCAB_SIZE, dtype=bool)
        ambiguous[list(b"ACGTacgt")] = False
        rc_ids = np.arange(BYTE_VOCAB_SIZE, dtype=np.int32)
        rc_ids[:256] = ASCII_COMPLEMENT
        self._set_tables(token_bases, ambiguous, rc_ids, plain_range=(0, 255))

    def encode(self, bases: np.ndarray) -> np.ndarray:
        return as_bases(bases).astype(np.int32)

    def to_dict(self) -> dict:
        return {"kind": self.kind, "version": self.format_version, "vocab_size": self.vocab_size,
                "special_ids": self.special_ids(), "n_id": self.n_id}

    @classmethod
    def from_dict(cls, d: dict, where: str | None = None) -> "ByteTokenizer":
        check_format(d, cls.kind, cls.format_version, where)
        tok = cls()
        expected = tok.to_dict()
        for key in ("vocab_size", "special_ids", "n_id"):
            if key in d and d[key] != expected[key]:
                raise InputError(f"byte tokenizer field {key!r} is {d[key]!r}, expected {expected[key]!r}",
                                 where=where, fix="pass a file written by genolc's save_tokenizer")
        return tok
