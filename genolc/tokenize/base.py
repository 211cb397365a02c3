"""The tokenizer interface shared by every genome tokenizer, and the vectorised helpers they are built from.

A tokenizer turns uint8 ASCII bases (any case) into int32 ids and back. Everything runs on numpy lookup
tables applied block by block (a block stays in cache; no per-base Python loops). Each tokenizer is described
by a table per id: the bases it stands for (``_token_bases``, a ``[V, width]`` uint8 table plus a length), whether
it is ambiguous, and -- for tokenizers whose reverse complement works id by id -- its complement id.

Special tokens (pad, bos, eos, mask) and reserved ids cover no bases: ``token_lengths`` is 0 for them,
``decode`` drops them, ``ambiguous_mask`` is True for them (they are never a loss target), and an id-level
reverse complement maps each of them to itself.
"""

from __future__ import annotations

import abc
from typing import Any, ClassVar, Iterable, Iterator

import numpy as np

from genolc.errors import InputError

SPECIAL_TOKENS: tuple[str, ...] = ("<pad>", "<bos>", "<eos>", "<mask>")

# Lookups run over blocks of this many elements so the temporaries stay in cache.
_BLOCK = 1 << 18


def _build_ascii_complement() -> np.ndarray:
    table = np.arange(256, dtype=np.uint8)
    # IUPAC complements; S, W and N are their own complement. Every other byte maps to itself, so the
    # table is an involution on all 256 values.
    for a, b in ("AT", "CG", "RY", "KM", "BV", "DH"):
        for x, y in ((a, b), (a.lower(), b.lower())):
            table[ord(x)] = ord(y)
            table[ord(y)] = ord(x)
    return table


def _build_base_codes() -> np.ndarray:
    table = np.full(256, 4, dtype=np.uint8)
    for code, base in enumerate("ACGT"):
        table[ord(base)] = code
        table[ord(base.lower())] = code
    return table


ASCII_COMPLEMENT: np.ndarray = _build_ascii_complement()
"""uint8[256]: complement of each ASCII byte (A<->T, C<->G, IUPAC pairs, both cases); others unchanged."""

BASE_CODES: np.ndarray = _build_base_codes()
"""uint8[256]: A/a->0, C/c->1, G/g->2, T/t->3, every other byte (N, IUPAC, anything) -> 4."""

CODE_ASCII: np.ndarray = np.frombuffer(b"ACGTN", dtype=np.uint8).copy()
"""uint8[5]: the upper-case base for each code of BASE_CODES."""


def lookup(table: np.ndarray, index: np.ndarray, dtype: np.dtype | type | None = None) -> np.ndarray:
    """``table[index]`` for a 1-D index array, done block by block; the result has ``dtype`` (default table's).

    Indices must already be known to lie in range (callers check); out-of-range indices are clipped.
    """
    out_dtype = np.dtype(dtype) if dtype is not None else table.dtype
    out = np.empty(index.shape[0], dtype=out_dtype)
    same = out_dtype == table.dtype
    for start in range(0, index.shape[0], _BLOCK):
        stop = min(start + _BLOCK, index.shape[0])
        if same:
            np.take(table, index[start:stop], out=out[start:stop], mode="clip")
        else:
            out[start:stop] = np.take(table, index[start:stop], mode="clip")
    return out


def as_bases(bases: Any) -> np.ndarray:
    """A 1-D uint8 view of ``bases``: a uint8 array, bytes/bytearray/memoryview, or an ASCII str."""
    if isinstance(bases, str):
        return np.frombuffer(bases.encode("ascii"), dtype=np.uint8)
    if isinstance(bases, (bytes, bytearray, memoryview)):
        return np.frombuffer(bases, dtype=np.uint8)
    arr = np.asarray(bases)
    if arr.dtype == np.dtype("S1") or arr.dtype == np.int8:
        arr = arr.view(np.uint8)
    if arr.dtype != np.uint8:
        raise TypeError(f"bases must be uint8 ASCII (got dtype {arr.dtype})")
    if arr.ndim != 1:
        raise ValueError(f"bases must be 1-D [n] (got shape {arr.shape})")
    return arr


def reverse_complement_bases(bases: Any) -> np.ndarray:
    """Reverse complement of ASCII bases, case and IUPAC codes kept (uint8 in, uint8 out)."""
    return lookup(ASCII_COMPLEMENT, as_bases(bases)[::-1])


def check_format(d: Any, kind: str, version: int, where: str | None) -> None:
    """Raise InputError unless ``d`` is a tokenizer dict of ``kind`` with a format version this genolc reads."""
    if not isinstance(d, dict):
        raise InputError("tokenizer description is not a JSON object", where=where,
                         fix="pass a file written by genolc's save_tokenizer")
    if d.get("kind") != kind:
        raise InputError(f"tokenizer description is of kind {d.get('kind')!r}, not {kind!r}", where=where,
                         fix="load it with genolc.tokenize.load_tokenizer, which picks the kind itself")
    found = d.get("version")
    if not isinstance(found, int) or isinstance(found, bool):
        raise InputError(f"{kind} tokenizer description has no integer 'version' field (found {found!r})",
                         where=where, fix="pass a file written by genolc's save_tokenizer")
    if found > version:
        raise InputError(f"{kind} tokenizer format version {found} is newer than this genolc reads "
                         f"(up to {version})", where=where, fix="upgrade genolc to read this tokenizer")
    if found < 1:
        raise InputError(f"{kind} tokenizer format version {found} is not valid", where=where,
                         fix="pass a file written by genolc's save_tokenizer")


class Tokenizer(abc.ABC):
    """Base class: encode uint8 ASCII bases to int32 ids, decode, reverse-complement ids, describe ids.

    Subclasses build their per-id tables in ``__init__`` through :meth:`_set_tables` and implement
    :meth:`encode` and :meth:`to_dict`.
    """

    kind: ClassVar[str]
    format_version: ClassVar[int] = 1

    vocab_size: int
    pad_id: int
    bos_id: int
    eos_id: int
    mask_id: int
    n_id: int
    fixed_bases_per_token: int | None
    stream_granularity: int
    """encode_chunks feeds encode whole multiples of this many bases (k for k-mers, the piece for BPE)."""

    _token_bases: np.ndarray   # uint8[V, width]: the bases of each id, left-aligned
    _lengths: np.ndarray       # int32[V]: bases covered by each id (0 for specials/reserved)
    _ambiguous: np.ndarray     # bool[V]
    _rc_ids: np.ndarray | None  # [V] complement id of each id, for id-level reverse complement
    _plain_range: tuple[int, int]  # ids lo..hi (inclusive) all cover exactly `width` bases: fast decode

    def _set_tables(self, token_bases: list[bytes], ambiguous: np.ndarray, rc_ids: np.ndarray | None,
                    plain_range: tuple[int, int]) -> None:
        width = max(1, max(len(t) for t in token_bases))
        table = np.zeros((len(token_bases), width), dtype=np.uint8)
        lengths = np.zeros(len(token_bases), dtype=np.int32)
        for i, t in enumerate(token_bases):
            table[i, : len(t)] = np.frombuffer(t, dtype=np.uint8)
            lengths[i] = len(t)
        self._install_tables(table, lengths, ambiguous, rc_ids, plain_range)

    def _install_tables(self, table: np.ndarray, lengths: np.ndarray, ambiguous: np.ndarray,
                        rc_ids: np.ndarray | None, plain_range: tuple[int, int]) -> None:
        self.vocab_size = int(table.shape[0])
        self._token_bases = table
        self._lengths = lengths.astype(np.int32)
        self._ambiguous = ambiguous.astype(bool)
        self._ambiguous_u8 = self._ambiguous.astype(np.uint8)
        self._rc_ids = rc_ids
        self._plain_range = plain_range
        self._width = int(table.shape[1])

    @abc.abstractmethod
    def encode(self, bases: np.ndarray) -> np.ndarray:
        """uint8 ASCII bases ``[n]`` (any case) -> int32 ids ``[m]``."""

    @abc.abstractmethod
    def to_dict(self) -> dict:
        """JSON-able description, ``{'kind', 'version', ...}``; ``tokenizer_from_dict`` inverts it."""

    def decode(self, ids: np.ndarray) -> np.ndarray:
        """ids ``[m]`` -> uint8 ASCII bases; special and reserved ids decode to nothing."""
        ids, lo, hi = self._checked_ids(ids)
        plain_lo, plain_hi = self._plain_range
        if lo >= plain_lo and hi <= plain_hi:
            if self._width == 1:
                return lookup(self._token_bases[:, 0], ids)
            return self._token_bases[ids].reshape(-1)
        parts = []
        keep_prefix = np.arange(self._width, dtype=np.int32)
        for start in range(0, ids.shape[0], _BLOCK):
            block = ids[start : start + _BLOCK]
            rows = self._token_bases[block]
            parts.append(rows[keep_prefix[None, :] < self._lengths[block][:, None]])
        return np.concatenate(parts) if parts else np.zeros(0, dtype=np.uint8)

    def reverse_complement(self, ids: np.ndarray) -> np.ndarray:
        """Ids of the reverse-complement strand: ``decode(rc(ids)) == revcomp(decode(ids))``.

        This default works id by id (reverse the order, complement each id), so it is an involution on ids.
        """
        ids, _, _ = self._checked_ids(ids)
        assert self._rc_ids is not None, f"{type(self).__name__} must override reverse_complement"
        return lookup(self._rc_ids, ids[::-1], np.int32)

    def token_lengths(self, ids: np.ndarray) -> np.ndarray:
        """Bases covered by each id (int32, same shape as ``ids``); 0 for special ids."""
        flat, shape = self._checked_any_shape(ids)
        return lookup(self._lengths, flat).reshape(shape)

    def ambiguous_mask(self, ids: np.ndarray) -> np.ndarray:
        """True where an id holds N/IUPAC/unknown bases or is a special id: not a loss target."""
        flat, shape = self._checked_any_shape(ids)
        return lookup(self._ambiguous_u8, flat).view(bool).reshape(shape)

    def encode_chunks(self, chunks: Iterable[np.ndarray]) -> Iterator[np.ndarray]:
        """Encode a record streamed in chunks; the concatenated output equals ``encode`` of the whole record.

        Chunks are regrouped so ``encode`` always sees whole multiples of ``stream_granularity`` bases
        (the last piece excepted); the tail is carried into the next chunk.
        """
        carry = np.zeros(0, dtype=np.uint8)
        step = self.stream_granularity
        for chunk in chunks:
            chunk = as_bases(chunk)
            buf = np.concatenate([carry, chunk]) if carry.size else chunk
            cut = buf.shape[0] - buf.shape[0] % step
            if cut:
                yield self.encode(buf[:cut])
            carry = buf[cut:].copy()
        if carry.size:
            yield self.encode(carry)

    def special_ids(self) -> dict[str, int]:
        return {"<pad>": self.pad_id, "<bos>": self.bos_id, "<eos>": self.eos_id, "<mask>": self.mask_id}

    def id_to_token(self, token_id: int) -> str:
        """A readable name for one id: its bases, a special token's name, or ``<reserved:i>``."""
        if not 0 <= token_id < self.vocab_size:
            raise ValueError(f"token id {token_id} is outside the vocabulary [0, {self.vocab_size})")
        for name, sid in self.special_ids().items():
            if sid == token_id:
                return name
        n = int(self._lengths[token_id])
        if n == 0:
            return f"<reserved:{token_id}>"
        return self._token_bases[token_id, :n].tobytes().decode("ascii")

    def _checked_ids(self, ids: Any) -> tuple[np.ndarray, int, int]:
        arr = np.asarray(ids)
        if arr.ndim != 1:
            raise ValueError(f"ids must be 1-D [m] (got shape {arr.shape})")
        if arr.dtype.kind not in "iu":
            raise TypeError(f"ids must be an integer array (got dtype {arr.dtype})")
        if arr.shape[0] == 0:
            return arr.astype(np.int32), 0, 0
        lo, hi = int(arr.min()), int(arr.max())
        if lo < 0 or hi >= self.vocab_size:
            bad = lo if lo < 0 else hi
            raise ValueError(f"token id {bad} is outside the {self.kind} vocabulary [0, {self.vocab_size})")
        return arr, lo, hi

    def _checked_any_shape(self, ids: Any) -> tuple[np.ndarray, tuple[int, ...]]:
        arr = np.asarray(ids)
        flat, _, _ = self._checked_ids(arr.reshape(-1))
        return flat, arr.shape

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Tokenizer):
            return NotImplemented
        return type(self) is type(other) and self.to_dict() == other.to_dict()

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"{type(self).__name__}(vocab_size={self.vocab_size})"
