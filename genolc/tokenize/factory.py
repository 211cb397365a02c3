"""Build tokenizers from specs, and save/load them as versioned JSON (``tokenizer.json``)."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any, Iterable

import numpy as np

from genolc.errors import ConfigError, InputError
from genolc.fsutil import atomic_write_json
from genolc.tokenize.base import Tokenizer
from genolc.tokenize.bpe import BPETokenizer
from genolc.tokenize.byte import ByteTokenizer
from genolc.tokenize.char import CharTokenizer
from genolc.tokenize.kmer import KmerTokenizer

TOKENIZER_KINDS: dict[str, type[Tokenizer]] = {
    "char": CharTokenizer, "kmer": KmerTokenizer, "bpe": BPETokenizer, "byte": ByteTokenizer,
}
SPEC_HELP = "use 'char', 'kmer:K' (K from 1 to 8), 'bpe:VOCAB' (e.g. 'bpe:4096'), 'byte', or the path of a tokenizer.json"
_SPEC = re.compile(r"^(char|byte|kmer|bpe)(?::(.*))?$")


def tokenizer_from_dict(d: Any, where: str | None = None) -> Tokenizer:
    """Rebuild a tokenizer from ``to_dict`` output; InputError for an unknown kind or a newer version."""
    if not isinstance(d, dict):
        raise InputError("tokenizer description is not a JSON object", where=where,
                         fix="pass a file written by genolc's save_tokenizer")
    kind = d.get("kind")
    if kind not in TOKENIZER_KINDS:
        raise InputError(f"unknown tokenizer kind {kind!r} (this genolc knows {sorted(TOKENIZER_KINDS)})",
                         where=where, fix="upgrade genolc, or pass a file written by genolc's save_tokenizer")
    return TOKENIZER_KINDS[kind].from_dict(d, where=where)


def save_tokenizer(tok: Tokenizer, path: str | os.PathLike) -> None:
    """Write ``tok.to_dict()`` to ``path`` atomically."""
    atomic_write_json(path, tok.to_dict())


def load_tokenizer(path: str | os.PathLike) -> Tokenizer:
    p = Path(path)
    if not p.is_file():
        raise InputError("tokenizer file not found", where=str(p), fix="check the path, or " + SPEC_HELP)
    try:
        d = json.loads(p.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise InputError(f"tokenizer file is not valid JSON ({exc})", where=str(p),
                         fix="pass a file written by genolc's save_tokenizer") from None
    return tokenizer_from_dict(d, where=str(p))


def make_tokenizer(spec: str, training_sequences: Iterable[np.ndarray] | None = None, *,
                   max_training_bases: int | None = None) -> Tokenizer:
    """A tokenizer from ``'char'``, ``'kmer:6'``, ``'bpe:4096'``, ``'byte'`` or a tokenizer.json path.

    ``training_sequences`` (uint8 ASCII arrays, e.g. the training chromosomes' chunks) is read only for
    ``bpe:N``, which is trained on it; the other kinds ignore it. ``max_training_bases`` caps the bases BPE
    learns from (None: :data:`genolc.tokenize.bpe.DEFAULT_MAX_TRAINING_BASES`).
    """
    if not isinstance(spec, str) or not spec.strip():
        raise ConfigError(f"tokenizer spec must be a non-empty string (got {spec!r})", where="--tokenizer",
                          fix=SPEC_HELP)
    spec = spec.strip()
    match = _SPEC.match(spec.lower())
    if match is None:
        if spec.endswith(".json") or os.sep in spec or Path(spec).exists():
            return load_tokenizer(spec)
        raise ConfigError(f"unknown tokenizer spec {spec!r}", where="--tokenizer", fix=SPEC_HELP)
    kind, arg = match.group(1), match.group(2)
    if kind in ("char", "byte"):
        if arg is not None:
            raise ConfigError(f"tokenizer spec {spec!r}: '{kind}' takes no argument", where="--tokenizer",
                              fix=SPEC_HELP)
        return CharTokenizer() if kind == "char" else ByteTokenizer()
    if arg is None or not re.fullmatch(r"\d+", arg):
        example = "kmer:6" if kind == "kmer" else "bpe:4096"
        raise ConfigError(f"tokenizer spec {spec!r} needs a whole number after '{kind}:'", where="--tokenizer",
                          fix=f"use e.g. '{example}'")
    if kind == "kmer":
        return KmerTokenizer(int(arg))
    if max_training_bases is None:
        return BPETokenizer.train(training_sequences, int(arg))
    return BPETokenizer.train(training_sequences, int(arg), max_training_bases=max_training_bases)
