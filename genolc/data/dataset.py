"""Reading a dataset written by `genolc prepare`: manifest, tokenizer, memory-mapped tokens and per-token masks.

Token arrays are opened as read-only memmaps on first use, so opening a dataset costs nothing per chromosome and
slices read only what they touch. Per-token views (base offsets, soft-mask, ambiguity) take a token range
``[start, stop)`` and work on that range alone.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from genolc.data.prepare import FORMAT_VERSION
from genolc.errors import InputError
from genolc.tokenize import Tokenizer, load_tokenizer

_DTYPES = {"uint16": np.dtype("<u2"), "int32": np.dtype("<i4")}
SPLITS = ("train", "heldout", "unused")


class PreparedDataset:
    """A prepared dataset directory (see docs/internals.md, "Prepared dataset")."""

    def __init__(self, path: str | Path):
        self.path = Path(path).expanduser().absolute()
        manifest_path = self.path / "manifest.json"
        if not self.path.exists():
            raise InputError("prepared dataset not found", where=str(self.path),
                             fix="run `genolc prepare GENOME --out DIR` first, or check the path")
        if not manifest_path.is_file():
            raise InputError("not a genolc dataset: no manifest.json", where=str(self.path),
                             fix="point at the directory written by `genolc prepare`")
        try:
            manifest = json.loads(manifest_path.read_text())
        except (OSError, UnicodeDecodeError, ValueError) as exc:
            raise InputError(f"manifest.json cannot be read ({exc})", where=str(manifest_path),
                             fix="prepare the dataset again") from None
        version = manifest.get("format_version") if isinstance(manifest, dict) else None
        if not isinstance(version, int) or "records" not in manifest or "tokenizer" not in manifest:
            raise InputError("not a genolc dataset: manifest.json lacks format_version/records/tokenizer",
                             where=str(manifest_path), fix="point at the directory written by `genolc prepare`")
        if version > FORMAT_VERSION:
            raise InputError(
                f"dataset format version {version} is newer than this genolc reads (up to {FORMAT_VERSION})",
                where=str(self.path), fix="upgrade genolc, or prepare the dataset again with this version",
            )
        dtype_name = manifest.get("token_dtype")
        if dtype_name not in _DTYPES:
            raise InputError(f"unknown token_dtype {dtype_name!r} in manifest.json", where=str(manifest_path),
                             fix="prepare the dataset again")
        self.manifest: dict = manifest
        self.token_dtype = _DTYPES[dtype_name]
        self.tokenizer: Tokenizer = load_tokenizer(self.path / "tokenizer.json")
        self._records = {r["key"]: r for r in manifest["records"]}
        self._tokens: dict[str, np.memmap] = {}
        self._offsets: dict[str, np.ndarray] = {}
        self._softmask: dict[str, np.memmap] = {}

    def __repr__(self) -> str:
        return f"PreparedDataset({str(self.path)!r}, train={self.keys('train')}, heldout={self.keys('heldout')})"

    def keys(self, split: str | None = None) -> list[str]:
        """Record keys in manifest order; with ``split``, only those of that split (train/heldout/unused)."""
        if split is not None and split not in SPLITS:
            raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
        return [k for k, r in self._records.items() if split is None or r["split"] == split]

    def record(self, key: str) -> dict:
        try:
            return self._records[key]
        except KeyError:
            raise InputError(f"no record {key!r} in the dataset", where=str(self.path),
                             fix=f"records: {', '.join(self._records) or 'none'}") from None

    def _file(self, key: str, part: str) -> Path:
        rec = self.record(key)
        if not rec.get(part):
            raise InputError(f"record {key!r} was not tokenized (split {rec['split']!r})", where=str(self.path),
                             fix="select it with --train or --heldout when running genolc prepare")
        path = self.path / rec[part]
        if not path.is_file():
            raise InputError(f"dataset file missing: {rec[part]}", where=str(self.path),
                             fix="the dataset is incomplete; prepare it again")
        return path

    def tokens(self, key: str) -> np.memmap:
        """Read-only memmap of the record's token ids (dtype from the manifest)."""
        if key not in self._tokens:
            path = self._file(key, "tokens")
            expected = int(self.record(key)["length_tokens"])
            size = path.stat().st_size
            if size != expected * self.token_dtype.itemsize:
                raise InputError(f"{path.name} holds {size} bytes, expected {expected} tokens",
                                 where=str(path), fix="the dataset is damaged; prepare it again")
            if expected == 0:
                self._tokens[key] = np.zeros(0, dtype=self.token_dtype)  # type: ignore[assignment]
            else:
                self._tokens[key] = np.memmap(path, dtype=self.token_dtype, mode="r", shape=(expected,))
        return self._tokens[key]

    def _range(self, key: str, start: int, stop: int) -> tuple[int, int]:
        n = int(self.record(key)["length_tokens"] or 0)
        start, stop = int(start), int(stop)
        if not 0 <= start <= stop <= n:
            raise ValueError(f"token range [{start}, {stop}) is outside record {key!r} of {n} tokens")
        return start, stop

    def token_base_offsets(self, key: str, start: int, stop: int) -> np.ndarray:
        """int64[stop - start + 1]: base offset of each token ``start..stop`` inclusive.

        The last entry is where token ``stop - 1`` ends (the record length when ``stop`` is the last token).
        """
        start, stop = self._range(key, start, stop)
        rec = self.record(key)
        index = np.arange(start, stop + 1, dtype=np.int64)
        k = self.tokenizer.fixed_bases_per_token
        if k is not None:
            # k-mer layout: length // k whole k-mers, then the remainder as single-base tokens.
            full = int(rec["length_bases"]) // k
            return np.where(index <= full, index * k, full * k + (index - full))
        stride = int(self.manifest["offset_stride"])
        if key not in self._offsets:
            self._offsets[key] = np.load(self.path / rec["token_offsets"])
        anchor = start // stride
        base0 = int(self._offsets[key][anchor])
        lengths = self.tokenizer.token_lengths(np.asarray(self.tokens(key)[anchor * stride:stop]))
        cum = np.concatenate([[0], np.cumsum(lengths, dtype=np.int64)]) + base0
        return cum[start - anchor * stride:]

    def token_softmask(self, key: str, start: int, stop: int) -> np.ndarray:
        """bool[stop - start]: the majority of the token's bases are lower case (soft-masked)."""
        offsets = self.token_base_offsets(key, start, stop)
        if stop == start:
            return np.zeros(0, dtype=bool)
        lo, hi = int(offsets[0]), int(offsets[-1])
        flags = self._softmask_bits(key, lo, hi)
        counts = np.add.reduceat(np.r_[flags, False].astype(np.int32), offsets[:-1] - lo)
        lengths = np.diff(offsets)
        counts = np.where(lengths > 0, counts, 0)
        return counts * 2 > lengths

    def _softmask_bits(self, key: str, lo: int, hi: int) -> np.ndarray:
        if key not in self._softmask:
            self._softmask[key] = np.memmap(self._file(key, "softmask"), dtype=np.uint8, mode="r")
        bits = self._softmask[key]
        byte_lo, byte_hi = lo // 8, -(-hi // 8)
        flags = np.unpackbits(np.asarray(bits[byte_lo:byte_hi]), bitorder="little").view(bool)
        return flags[lo - byte_lo * 8: hi - byte_lo * 8]

    def token_ambiguous(self, key: str, start: int, stop: int) -> np.ndarray:
        """bool[stop - start]: the token holds N/IUPAC/BED-excluded bases (never a loss target)."""
        start, stop = self._range(key, start, stop)
        return self.tokenizer.ambiguous_mask(np.asarray(self.tokens(key)[start:stop]))

    def nruns(self, key: str) -> np.ndarray:
        """int64[k, 2] runs of N and IUPAC codes plus BED-excluded intervals (record base coordinates, merged)."""
        return np.load(self._file(key, "nruns"))
