"""Byte-pair-encoding tokenizer trained on DNA with the ``tokenizers`` library.

Layout: ``0 <pad>  1 <bos>  2 <eos>  3 <mask>``, then the single bases ``A C G N T`` (so every sequence can be
encoded), then the learned merges in the order they were learned. ``n_id`` is the id of ``N``.

Training (:meth:`BPETokenizer.train`): each training sequence is upper-cased, split at every non-ACGT base
(merges never cross an N run, and no learned token holds an N) and cut into pieces of ``TRAIN_PIECE_BASES``;
at most ``max_training_bases`` worth of pieces are kept by seeded reservoir sampling, so training on a whole
chromosome set stays a matter of seconds. Training on the same pieces gives the same vocabulary.

Encoding: bases are upper-cased, every non-ACGT base (N, IUPAC, anything else) becomes one ``N`` token, and
the ACGT runs are cut at absolute multiples of ``piece_bases`` (4096 by default) counted from the first base
given to ``encode``. Each piece is encoded on its own (in parallel, by the Rust library), so no token spans an
N or a piece boundary; this costs a token or so per 4 kb and makes encode of a long record equal the
concatenation of encode on its ``piece_bases``-aligned chunks (what ``encode_chunks`` relies on).

Reverse complement is sequence-level: decode, reverse-complement the bases, encode again. Decoding the result
twice gives the original sequence back (an involution on sequences), but the ids can differ from the
original ones because BPE segments the two strands differently; special ids are dropped.
"""

from __future__ import annotations

import itertools
import json
from typing import Any, Iterable

import numpy as np
from tokenizers import Tokenizer as HFTokenizer
from tokenizers import models, trainers

from genolc.errors import ConfigError, InputError
from genolc.tokenize.bpe_encode import (MergeTables, encode_pieces, encoder_choice, encoder_threads,
                                       sweepable)
from genolc.tokenize.base import (BASE_CODES, CODE_ASCII, SPECIAL_TOKENS, Tokenizer, as_bases, check_format,
                                  lookup, reverse_complement_bases)

TRAIN_PIECE_BASES = 1000
DEFAULT_PIECE_BASES = 4096
DEFAULT_MAX_TRAINING_BASES = 4_000_000
MAX_TOKEN_BASES = 32
MIN_VOCAB_SIZE = 16
MAX_VOCAB_SIZE = 1 << 20
_ALPHABET = "ACGNT"
# Bases handed to the Rust encoder per call: a multiple of every allowed piece size (bounds the memory its
# Encoding objects take).
_ENCODE_BLOCK = 1 << 22


def acgt_pieces(is_acgt: np.ndarray, piece: int) -> tuple[np.ndarray, np.ndarray]:
    """Start and stop (int64, half-open) of the ACGT runs in ``is_acgt``, cut at every multiple of ``piece``."""
    edges = np.diff(np.concatenate(([False], is_acgt, [False])).view(np.int8))
    run_starts = np.flatnonzero(edges == 1).astype(np.int64)
    run_stops = np.flatnonzero(edges == -1).astype(np.int64)
    first_cut = (run_starts // piece + 1) * piece
    n_cuts = np.maximum(0, (run_stops - 1 - first_cut) // piece + 1)
    cut_run = np.repeat(np.arange(run_starts.shape[0]), n_cuts)
    cut_rank = np.arange(cut_run.shape[0]) - np.repeat(np.cumsum(n_cuts) - n_cuts, n_cuts)
    cuts = first_cut[cut_run] + cut_rank * piece
    # Cuts lie strictly inside disjoint runs, so sorting starts and stops separately keeps them paired.
    starts = np.sort(np.concatenate((run_starts, cuts)))
    stops = np.sort(np.concatenate((cuts, run_stops)))
    return starts, stops


def _merges_from_model_json(model_json: dict) -> list[tuple[str, str]]:
    merges = []
    for m in model_json.get("merges", []):
        # tokenizers writes a merge as [a, b] (>= 0.20) or as the string "a b" (older releases).
        a, b = m if isinstance(m, (list, tuple)) else m.split(" ")
        merges.append((a, b))
    return merges


class BPETokenizer(Tokenizer):
    kind = "bpe"
    format_version = 1

    def __init__(self, tokens: list[str], merges: list[tuple[str, str]], *,
                 piece_bases: int = DEFAULT_PIECE_BASES, training: dict | None = None,
                 where: str | None = None) -> None:
        self._validate(tokens, merges, piece_bases, where)
        self.tokens = list(tokens)
        self.merges = [tuple(m) for m in merges]
        self.piece_bases = int(piece_bases)
        self.training = dict(training or {})
        self.pad_id, self.bos_id, self.eos_id, self.mask_id = range(len(SPECIAL_TOKENS))
        vocab = {t: i for i, t in enumerate(self.tokens)}
        self.n_id = vocab["N"]
        self.fixed_bases_per_token = None
        self.stream_granularity = self.piece_bases
        token_bases = [b""] * len(SPECIAL_TOKENS) + [t.encode("ascii") for t in self.tokens[len(SPECIAL_TOKENS):]]
        ambiguous = np.array([i < len(SPECIAL_TOKENS) or "N" in t for i, t in enumerate(self.tokens)], dtype=bool)
        # No id range has one fixed token length, so decode always takes the general path.
        self._set_tables(token_bases, ambiguous, rc_ids=None, plain_range=(1, 0))
        self._hf = HFTokenizer(models.BPE(vocab=vocab, merges=self.merges, unk_token=None))
        self._encode_batch = getattr(self._hf, "encode_batch_fast", self._hf.encode_batch)
        self._merge_tables = None           # built on the first encode by genolc/tokenize/bpe_encode.py
        self._sweepable: bool | None = None
        # Single-base ids by base code (A C G T; every other code is an ambiguous base, N).
        self._base_ids = np.array([vocab[b] for b in "ACGT"] + [self.n_id], dtype=np.int64)

    @staticmethod
    def _validate(tokens: Any, merges: Any, piece_bases: Any, where: str | None) -> None:
        fix = "pass a file written by genolc's save_tokenizer"
        if not isinstance(tokens, list) or list(tokens[: len(SPECIAL_TOKENS)]) != list(SPECIAL_TOKENS):
            raise InputError(f"BPE vocabulary must start with the special tokens {list(SPECIAL_TOKENS)}",
                             where=where, fix=fix)
        body = tokens[len(SPECIAL_TOKENS):]
        bad = [t for t in body if not isinstance(t, str) or not t or set(t) - set(_ALPHABET)]
        if bad:
            raise InputError(f"BPE vocabulary holds {len(bad)} tokens that are not A/C/G/T/N strings "
                             f"(first: {bad[0]!r})", where=where, fix=fix)
        if len(set(tokens)) != len(tokens):
            raise InputError("BPE vocabulary holds duplicate tokens", where=where, fix=fix)
        missing = sorted(set(_ALPHABET) - set(body))
        if missing:
            raise InputError(f"BPE vocabulary lacks the single bases {missing}", where=where, fix=fix)
        known = set(tokens)
        if not isinstance(merges, list) or any(
                not isinstance(m, (list, tuple)) or len(m) != 2 or m[0] not in known or m[1] not in known
                or m[0] + m[1] not in known for m in merges):
            raise InputError("BPE merges must be pairs of vocabulary tokens whose join is a token",
                             where=where, fix=fix)
        if isinstance(piece_bases, bool) or not isinstance(piece_bases, int) or not 64 <= piece_bases <= _ENCODE_BLOCK \
                or _ENCODE_BLOCK % piece_bases:
            raise InputError(f"BPE piece_bases must be a power of two from 64 to {_ENCODE_BLOCK} "
                             f"(got {piece_bases!r})", where=where, fix=fix)

    @classmethod
    def train(cls, training_sequences: Iterable[np.ndarray] | None, vocab_size: int, *,
              max_training_bases: int = DEFAULT_MAX_TRAINING_BASES, piece_bases: int = DEFAULT_PIECE_BASES,
              seed: int = 0) -> "BPETokenizer":
        """Learn a vocabulary of at most ``vocab_size`` ids (specials and single bases included)."""
        if isinstance(vocab_size, bool) or not isinstance(vocab_size, int) \
                or not MIN_VOCAB_SIZE <= vocab_size <= MAX_VOCAB_SIZE:
            raise ConfigError(f"BPE vocabulary size must be an integer from {MIN_VOCAB_SIZE} to {MAX_VOCAB_SIZE} "
                              f"(got {vocab_size!r})", where="tokenizer spec", fix="use e.g. 'bpe:4096'")
        if training_sequences is None:
            raise ConfigError("a BPE tokenizer must be trained, but no training sequences were given",
                              where="tokenizer spec", fix="pass training sequences to make_tokenizer, "
                              "or pass the path of a saved tokenizer.json instead of 'bpe:N'")
        pieces, seen_pieces, seen_bases = cls._sample_pieces(training_sequences, max_training_bases, seed)
        if not pieces:
            raise ConfigError("the training sequences hold no stretch of two or more A/C/G/T bases to learn from",
                              where="BPE training", fix="train on real DNA")
        hf = HFTokenizer(models.BPE(unk_token=None))
        trainer = trainers.BpeTrainer(vocab_size=vocab_size, min_frequency=2, show_progress=False,
                                      special_tokens=list(SPECIAL_TOKENS), initial_alphabet=list(_ALPHABET),
                                      max_token_length=MAX_TOKEN_BASES)
        hf.train_from_iterator(pieces, trainer, length=len(pieces))
        vocab = hf.get_vocab()
        tokens = sorted(vocab, key=vocab.__getitem__)
        merges = _merges_from_model_json(json.loads(hf.to_str())["model"])
        training = {"vocab_size_requested": vocab_size, "max_training_bases": max_training_bases, "seed": seed,
                    "train_piece_bases": TRAIN_PIECE_BASES, "max_token_bases": MAX_TOKEN_BASES,
                    "pieces_seen": seen_pieces, "bases_seen": seen_bases, "pieces_used": len(pieces),
                    "bases_used": int(sum(len(p) for p in pieces))}
        return cls(tokens, merges, piece_bases=piece_bases, training=training)

    @staticmethod
    def _sample_pieces(training_sequences: Iterable[Any], max_training_bases: int,
                       seed: int) -> tuple[list[str], int, int]:
        """Reservoir-sample up to max_training_bases // TRAIN_PIECE_BASES ACGT pieces (seeded, one pass)."""
        capacity = max(1, int(max_training_bases) // TRAIN_PIECE_BASES)
        rng = np.random.default_rng(seed)
        reservoir: list[str] = []
        seen = 0
        seen_bases = 0
        for sequence in training_sequences:
            codes = lookup(BASE_CODES, as_bases(sequence))
            starts, stops = acgt_pieces(codes < 4, TRAIN_PIECE_BASES)
            long_enough = stops - starts >= 2
            starts, stops = starts[long_enough], stops[long_enough]
            if starts.shape[0] == 0:
                continue
            text = lookup(CODE_ASCII, codes).tobytes().decode("ascii")
            seen_bases += int((stops - starts).sum())
            n_fill = min(capacity - len(reservoir), starts.shape[0])
            for s, e in zip(starts[:n_fill].tolist(), stops[:n_fill].tolist()):
                reservoir.append(text[s:e])
            rest = np.arange(n_fill, starts.shape[0])
            if rest.size:
                # Piece number seen+i replaces a random slot with probability capacity / (seen+i+1).
                slots = rng.integers(0, seen + rest + 1)
                for i, slot in zip(rest[slots < capacity].tolist(), slots[slots < capacity].tolist()):
                    reservoir[slot] = text[starts[i]:stops[i]]
            seen += starts.shape[0]
        return reservoir, seen, seen_bases

    def encode(self, bases: np.ndarray) -> np.ndarray:
        bases = as_bases(bases)
        starts = range(0, bases.shape[0], _ENCODE_BLOCK)
        threads = encoder_threads()
        if self._numba_encoder() and len(starts) > 1 and threads > 1:
            from concurrent.futures import ThreadPoolExecutor

            self._tables()
            # Whole blocks in parallel, each on one thread: their numpy steps overlap too, not only the merges.
            with ThreadPoolExecutor(min(threads, len(starts))) as pool:
                parts = list(pool.map(lambda start: self._encode_block(bases[start: start + _ENCODE_BLOCK], 1),
                                      starts))
        else:
            parts = [self._encode_block(bases[start: start + _ENCODE_BLOCK]) for start in starts]
        return np.concatenate(parts) if parts else np.zeros(0, dtype=np.int32)

    def _encode_block(self, bases: np.ndarray, threads: int | None = None) -> np.ndarray:
        codes = lookup(BASE_CODES, bases)
        is_acgt = codes < 4
        starts, stops = acgt_pieces(is_acgt, self.piece_bases)
        if self._numba_encoder():
            flat, counts = encode_pieces(self._tables(), self._base_ids[codes], starts, stops, threads)
        else:
            flat, counts = self._encode_pieces_tokenizers(codes, starts, stops)
        n_piece_tokens = int(counts.sum())
        ambiguous_before = np.cumsum(~is_acgt, dtype=np.int64)
        n_ambiguous = int(ambiguous_before[-1]) if ambiguous_before.size else 0
        # Each ambiguous base is one N token; a piece's tokens start after the N tokens and piece tokens
        # that precede it. Positions not written below are exactly the N tokens.
        out = np.full(n_piece_tokens + n_ambiguous, self.n_id, dtype=np.int32)
        n_before = np.where(starts > 0, ambiguous_before[np.maximum(starts - 1, 0)], 0)
        out[np.repeat(n_before, counts) + np.arange(n_piece_tokens)] = flat
        return out

    def _numba_encoder(self) -> bool:
        """Whether this encode runs the numba encoder (``bpe_encode.encoder_choice``)."""
        return encoder_choice(self._merges_sweepable) == "numba"

    def _merges_sweepable(self) -> bool:
        if self._sweepable is None:
            self._sweepable = sweepable(self.merges)
        return self._sweepable

    def _tables(self) -> MergeTables:
        if self._merge_tables is None:
            self._merge_tables = MergeTables.build(self.tokens, self.merges)
        return self._merge_tables

    def _encode_pieces_tokenizers(self, codes: np.ndarray, starts: np.ndarray, stops: np.ndarray
                                  ) -> tuple[np.ndarray, np.ndarray]:
        """The reference encoder: the ``tokenizers`` library's BPE model on each piece (in parallel, in Rust)."""
        text = lookup(CODE_ASCII, codes).tobytes().decode("ascii")
        encodings = self._encode_batch([text[s:e] for s, e in zip(starts.tolist(), stops.tolist())],
                                       add_special_tokens=False)
        counts = np.fromiter((len(e.ids) for e in encodings), dtype=np.int64, count=len(encodings))
        flat = np.fromiter(itertools.chain.from_iterable(e.ids for e in encodings), dtype=np.int32,
                           count=int(counts.sum()))
        return flat, counts

    def reverse_complement(self, ids: np.ndarray) -> np.ndarray:
        """Sequence-level: ``encode(revcomp(decode(ids)))``; specials are dropped (see the module docstring)."""
        return self.encode(reverse_complement_bases(self.decode(ids)))

    def to_dict(self) -> dict:
        return {"kind": self.kind, "version": self.format_version, "vocab_size": self.vocab_size,
                "special_ids": self.special_ids(), "n_id": self.n_id, "piece_bases": self.piece_bases,
                "tokens": list(self.tokens), "merges": [list(m) for m in self.merges], "training": self.training}

    @classmethod
    def from_dict(cls, d: dict, where: str | None = None) -> "BPETokenizer":
        check_format(d, cls.kind, cls.format_version, where)
        for key in ("tokens", "merges"):
            if key not in d:
                raise InputError(f"BPE tokenizer description has no {key!r} field", where=where,
                                 fix="pass a file written by genolc's save_tokenizer")
        tok = cls(d["tokens"], d["merges"], piece_bases=d.get("piece_bases", DEFAULT_PIECE_BASES),
                  training=d.get("training"), where=where)
        expected = tok.to_dict()
        for key in ("vocab_size", "special_ids", "n_id"):
            if key in d and d[key] != expected[key]:
                raise InputError(f"BPE tokenizer field {key!r} is {d[key]!r}, expected {expected[key]!r}",
                                 where=where, fix="pass a file written by genolc's save_tokenizer")
        return tok
