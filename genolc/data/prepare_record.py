"""One record's trip through `genolc prepare`: chunks in, token/soft-mask/N-run files and statistics out.

Everything here is per chunk and vectorised; the only state carried between chunks is small (a k-mer remainder,
fewer than 8 soft-mask bits, interval lists), so memory is bounded by the chunk size, not the record length.
Each chunk is first scanned on its own (soft-mask flags, upper case, N count and runs, the character check and,
for one-token-per-base tokenizers, the token ids) in a small pool of threads, so consecutive chunks are scanned at
once on several cores (numpy releases the GIL); the scans are then taken in order, and the md5 and the file
writes run in one background thread (hashlib and file writes release the GIL too), in submission order, at most
a few calls behind.
"""

from __future__ import annotations

import collections
import hashlib
import os
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO, Callable

import numpy as np

from genolc.data import genome
from genolc.data.duplication import TrainBlockIndex
from genolc.data.genome import merge_intervals
from genolc.tokenize import Tokenizer

# For tokenizers without a fixed number of bases per token (BPE), the base offset of every OFFSET_STRIDE-th token
# is stored so a token's base position is found without summing the whole record.
OFFSET_STRIDE = 4096
_N = ord("N")
_PLAIN_BASES = b"ACGTNacgtn"
_LUT_BLOCK = 1 << 16
_EMPTY = np.empty((0, 2), dtype=np.int64)
# Token id of a byte that is not A/C/G/T/N in the checking table (see _checking_table).
_UNUSUAL = 0xFFFF
# Calls the background writer may have queued before add() waits for it: two chunks' worth at most.
_WRITES_IN_FLIGHT = 8
# Chunks being scanned ahead of the one add() commits: bounds memory at a few chunks whatever the record's length.
_SCANS_IN_FLIGHT = 4
# Upper-cases a letter (clears its lower-case bit); other bytes change too, but those are refused as invalid.
_UPPER_MASK = np.uint8(0xDF)
_scan_pool: ThreadPoolExecutor | None = None
_scan_pool_lock = threading.Lock()


def _scanner() -> ThreadPoolExecutor:
    """The threads chunks are scanned in, shared by every record (created on first use)."""
    global _scan_pool
    with _scan_pool_lock:
        if _scan_pool is None:
            _scan_pool = ThreadPoolExecutor(max_workers=max(2, min(4, os.cpu_count() or 1)),
                                            thread_name_prefix="genolc-prepare-scan")
        return _scan_pool


class _SerialWorker:
    """Runs calls one after another, in order, in one background thread; ``wait`` raises the first error."""

    def __init__(self) -> None:
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="genolc-prepare-write")
        self._pending: collections.deque[Future] = collections.deque()

    def submit(self, call: Callable[..., Any], *args: Any) -> None:
        self._pending.append(self._pool.submit(call, *args))
        while len(self._pending) > _WRITES_IN_FLIGHT:
            self._pending.popleft().result()

    def wait(self) -> None:
        while self._pending:
            self._pending.popleft().result()

    def shutdown(self) -> None:
        """Stop without raising: what was queued still runs (files are closed after it), errors are dropped."""
        self._pool.shutdown(wait=True)
        self._pending.clear()


def _clip(iv: np.ndarray, lo: int, hi: int) -> np.ndarray:
    if not len(iv):
        return _EMPTY
    clipped = np.clip(iv, lo, hi)
    return clipped[clipped[:, 1] > clipped[:, 0]]


class RegionMask:
    """BED include/exclude intervals for one record, in record coordinates (0-based from its first base).

    BED files use chromosome coordinates; a record whose header carries a region starts at chromosome base
    ``start`` (1-based), so a BED interval [a, b) lands at [a - start + 1, b - start + 1) in the record. With an
    include BED, a record whose chromosome has no include interval is masked entirely.
    """

    def __init__(self, include: dict[str, np.ndarray] | None, exclude: dict[str, np.ndarray] | None,
                 chrom: str, start: int):
        shift = start - 1
        self._include = None if include is None else merge_intervals(include.get(chrom, _EMPTY)) - shift
        self._exclude = _EMPTY if exclude is None else merge_intervals(exclude.get(chrom, _EMPTY)) - shift

    @property
    def active(self) -> bool:
        return self._include is not None or len(self._exclude) > 0

    def masked(self, lo: int, hi: int) -> np.ndarray:
        """Masked intervals inside [lo, hi), record coordinates, merged."""
        parts = [_clip(self._exclude, lo, hi)]
        if self._include is not None:
            inc = _clip(self._include, lo, hi)
            edges = np.r_[lo, inc.ravel(), hi].reshape(-1, 2)
            parts.append(edges)
        return merge_intervals(parts)


def _byte_table(tokenizer: Tokenizer, dtype: np.dtype) -> np.ndarray | None:
    """For one-token-per-base tokenizers that encode base by base (char, byte): id of every byte value, in ``dtype``.

    Encoding is then one table lookup straight into the output dtype, without the int32 intermediate.
    """
    if tokenizer.fixed_bases_per_token != 1 or getattr(tokenizer, "stream_granularity", None) != 1:
        return None
    every_byte = np.arange(256, dtype=np.uint8)
    table = np.asarray(tokenizer.encode(every_byte))
    if table.shape != (256,):
        return None
    probe = np.frombuffer(b"ACGTNacgtnRYKMSWBDHV", dtype=np.uint8)
    if not np.array_equal(tokenizer.encode(probe), table[probe]):
        return None
    return table.astype(dtype)


def _pair_table(table: np.ndarray) -> np.ndarray | None:
    """For a uint16 byte table: the ids of every two-byte pair, packed little-endian in one uint32, so one lookup
    of the bases viewed as uint16 yields two tokens (about twice as fast as one lookup per base)."""
    if table.dtype != np.dtype("<u2"):
        return None
    pairs = np.arange(1 << 16, dtype=np.uint32)
    return table[pairs & 0xFF].astype("<u4") | (table[pairs >> 8].astype("<u4") << np.uint32(16))


def _checking_table(table: np.ndarray, n_id: int) -> np.ndarray | None:
    """For an ACGT-or-N uint16 table: the same ids for ACGTN (either case), the dtype's largest value for every other
    byte (IUPAC codes and invalid characters), so one ``max`` over a chunk's ids finds a chunk that needs the slow
    checks, and the ids it holds are put back to ``n_id`` there. None when an id could collide with the marker."""
    if table.dtype != np.dtype("<u2") or int(table.max()) >= _UNUSUAL or not _only_acgt_escape_n(table, n_id):
        return None
    checking = np.full(256, _UNUSUAL, dtype=table.dtype)
    plain = np.frombuffer(_PLAIN_BASES, dtype=np.uint8)
    checking[plain] = table[plain]
    return checking


def _only_acgt_escape_n(table: np.ndarray, n_id: int) -> bool:
    """True when every byte except A/C/G/T (either case) is encoded as ``n_id`` (and those four are not)."""
    sinks = table == n_id
    acgt = np.frombuffer(b"ACGTacgt", dtype=np.uint8)
    others = np.ones(256, dtype=bool)
    others[acgt] = False
    return bool(sinks[others].all()) and not sinks[acgt].any()


class _BitPacker:
    """np.packbits(bitorder='little') over a stream of bool chunks of any length."""

    def __init__(self, fh: BinaryIO):
        self._fh = fh
        self._carry = np.empty(0, dtype=bool)

    def add(self, flags: np.ndarray) -> None:
        if len(self._carry):
            fill = min(8 - len(self._carry), len(flags))
            self._carry = np.concatenate([self._carry, flags[:fill]])
            flags = flags[fill:]
            if len(self._carry) < 8:
                return
            self._fh.write(np.packbits(self._carry, bitorder="little").tobytes())
        full = len(flags) // 8 * 8
        self._fh.write(np.packbits(flags[:full], bitorder="little").tobytes())
        self._carry = flags[full:].copy()

    def finish(self) -> None:
        if len(self._carry):
            self._fh.write(np.packbits(self._carry, bitorder="little").tobytes())
        self._carry = np.empty(0, dtype=bool)


class RecordWriter:
    """Consumes one record's chunks; writes its files under ``out_dir`` when ``write`` is set.

    Statistics (length, md5 of the upper-cased sequence, N / IUPAC / soft-mask counts) are always gathered, so an
    unused record is still described in the manifest. ``train_index`` collects 1 kb block hashes of a training
    record; ``heldout_copy`` receives the upper-cased (BED-masked) bases of a held-out record for the duplication
    check, which reads them back after training blocks are all known. ``record_offset``: where this piece starts in
    the file's record when a record is written as several pieces (only error messages count from the record start).
    """

    def __init__(self, out_dir: Path, key: str, info: genome.RecordInfo, tokenizer: Tokenizer, dtype: np.dtype,
                 *, write: bool, mask: RegionMask, train_index: TrainBlockIndex | None = None,
                 heldout_copy: Path | None = None, record_offset: int = 0):
        self.key, self.info, self.tokenizer, self.dtype = key, info, tokenizer, dtype
        self.record_offset = record_offset
        self.out_dir, self.write, self.mask = out_dir, write, mask
        self.train_index, self.heldout_copy = train_index, heldout_copy
        self.length = 0
        self.n_tokens = 0
        self.n_bases = 0
        self.softmask_bases = 0
        self.excluded_bases = 0
        self.iupac: dict[str, int] = {code: 0 for code in genome.IUPAC_CODES}
        self._md5 = hashlib.md5()
        self._runs: list[np.ndarray] = []
        self._k = tokenizer.fixed_bases_per_token
        self._granularity = int(getattr(tokenizer, "stream_granularity", 1))
        self._carry = np.empty(0, dtype=np.uint8)
        self._checkpoints: list[np.ndarray] = []
        self._byte_table = _byte_table(tokenizer, dtype)
        self._pair_table = None if self._byte_table is None else _pair_table(self._byte_table)
        checking = None if self._byte_table is None else _checking_table(self._byte_table, tokenizer.n_id)
        self._checking_pairs = None if checking is None else _pair_table(checking)
        self._worker = _SerialWorker()
        # The md5 has a thread of its own: with the writes in one thread, the two made the longest serial chain.
        self._hasher = _SerialWorker()
        self._scans: collections.deque[tuple[Future, np.ndarray]] = collections.deque()
        self.length_committed = 0
        self._bases_tokenized = 0
        self._files: dict[str, BinaryIO] = {}
        if write:
            for part, suffix in (("tokens", ".bin"), ("softmask", ".bits")):
                (out_dir / part).mkdir(exist_ok=True)
                self._files[part] = open(out_dir / part / f"{key}{suffix}", "wb")
            self._bits = _BitPacker(self._files["softmask"])
            if train_index is not None:
                train_index.start_record()
            if heldout_copy is not None:
                self._files["heldout"] = open(heldout_copy, "wb")

    def add(self, chunk: np.ndarray) -> None:
        """Take the record's next chunk (uint8 ASCII, any length; read-only is fine): scanned in the background,
        committed in order once a few more chunks are under way (:meth:`finish` commits the rest)."""
        n = len(chunk)
        if n == 0:
            return
        lo = self.length
        self.length += n
        masked = self.mask.masked(lo, lo + n) if self.write and self.mask.active else _EMPTY
        with_ids = self.write and self._checking_pairs is not None and not len(masked)
        self._scans.append((_scanner().submit(self._scan, chunk, lo, with_ids), masked))
        while len(self._scans) > _SCANS_IN_FLIGHT:
            self._commit(*self._scans.popleft())

    def _scan(self, chunk: np.ndarray, lo: int, with_ids: bool) -> "_Scan":
        """What can be learnt of one chunk on its own; runs in a scan thread, touches no state of the writer."""
        flags = genome.softmask_flags(chunk)
        # Valid characters are letters, which the mask upper-cases; any other byte is refused below before use.
        upper = np.bitwise_and(chunk, _UPPER_MASK)
        is_n = upper == _N
        n_here = int(np.count_nonzero(is_n))
        ids = None
        if with_ids:
            ids = self._lookup(upper, self._checking_pairs)
            unusual = int(ids.max()) == _UNUSUAL
            if unusual:
                ids[ids == _UNUSUAL] = self.tokenizer.n_id
        else:
            unusual = bool(chunk.tobytes().translate(None, _PLAIN_BASES))
        iupac = None
        if unusual:
            genome.check_characters(chunk, self.info, self.record_offset + lo)
            iupac = genome.iupac_counts(chunk)
        n_runs = _EMPTY
        if self.write:
            if unusual:
                n_runs = genome.n_intervals(chunk, lo, include_iupac=True)
            elif n_here:
                n_runs = genome.true_runs(is_n) + lo
        return _Scan(flags, int(np.count_nonzero(flags)), upper, n_here, iupac, n_runs, ids)

    def _commit(self, scanned: Future, masked: np.ndarray) -> None:
        scan: _Scan = scanned.result()
        lo = self.length_committed
        self.length_committed += len(scan.upper)
        if scan.iupac is not None:
            for letter, count in scan.iupac.items():
                self.iupac[letter] = self.iupac.get(letter, 0) + int(count)
        self._hasher.submit(self._md5.update, scan.upper.data)
        self.n_bases += scan.n_here
        self.softmask_bases += scan.soft
        if not self.write:
            return
        if len(scan.n_runs):
            self._runs.append(scan.n_runs)
        seq = scan.upper
        if len(masked):
            self._runs.append(masked)
            self.excluded_bases += int((masked[:, 1] - masked[:, 0]).sum())
            seq = scan.upper.copy()
            for a, b in masked - lo:
                seq[a:b] = _N
        if scan.ids is not None:
            self._worker.submit(self._files["tokens"].write, scan.ids.data)
            self.n_tokens += len(scan.ids)
        else:
            self._write_tokens(seq)
        self._worker.submit(self._bits.add, scan.flags)
        if self.train_index is not None:
            bad = merge_intervals([scan.n_runs, masked]) - lo
            self.train_index.add(seq, bad)
        if "heldout" in self._files:
            self._worker.submit(self._files["heldout"].write, seq.data)

    def _drain(self) -> None:
        while self._scans:
            self._commit(*self._scans.popleft())

    def _lookup(self, seq: np.ndarray, pair_table: np.ndarray | None = None) -> np.ndarray:
        """Ids of ``seq`` from the byte table (or, given ``pair_table``, from that pair table: the checking one)."""
        assert self._byte_table is not None
        pair_table = self._pair_table if pair_table is None else pair_table
        ids = np.empty(len(seq), dtype=self.dtype)
        if pair_table is not None and seq.flags.c_contiguous:
            even = len(seq) // 2 * 2
            pairs, out = seq[:even].view("<u2"), ids[:even].view("<u4")
            for start in range(0, len(pairs), _LUT_BLOCK):
                np.take(pair_table, pairs[start:start + _LUT_BLOCK], out=out[start:start + _LUT_BLOCK])
            if even < len(seq):
                ids[even:] = (pair_table[int(seq[-1])] & np.uint32(0xFFFF)).astype(self.dtype)
            return ids
        for start in range(0, len(seq), _LUT_BLOCK):
            np.take(self._byte_table, seq[start:start + _LUT_BLOCK], out=ids[start:start + _LUT_BLOCK])
        return ids

    def _write_tokens(self, seq: np.ndarray, final: bool = False) -> None:
        if self._granularity > 1:
            # k-mers (and BPE pieces) must not restart at chunk edges: encode only whole multiples of the
            # tokenizer's granularity and carry the rest, so the ids equal encode() of the whole record.
            buf = np.concatenate([self._carry, seq]) if len(self._carry) else seq
            full = len(buf) if final else len(buf) // self._granularity * self._granularity
            self._carry = buf[full:].copy()
            seq = buf[:full]
        if not len(seq):
            return
        if self._byte_table is not None:
            ids = self._lookup(seq)
        else:
            ids = np.asarray(self.tokenizer.encode(seq))
        if self._k is None:
            lengths = np.asarray(self.tokenizer.token_lengths(ids), dtype=np.int64)
            base_at = np.empty(len(ids) + 1, dtype=np.int64)
            base_at[0] = self._bases_tokenized
            np.cumsum(lengths, out=base_at[1:])
            base_at[1:] += self._bases_tokenized
            first = -(-self.n_tokens // OFFSET_STRIDE) * OFFSET_STRIDE
            picks = np.arange(first, self.n_tokens + len(ids), OFFSET_STRIDE) - self.n_tokens
            self._checkpoints.append(base_at[picks])
            self._bases_tokenized = int(base_at[-1])
        self._worker.submit(self._files["tokens"].write, ids.astype(self.dtype, copy=False).data)
        self.n_tokens += len(ids)

    def finish(self) -> dict:
        """Close the files and return the record's manifest fields (paths relative to the dataset)."""
        try:
            self._drain()
            self._hasher.wait()
            self._worker.wait()
            # Empty records never get here: RecordStream refuses them when their (absent) sequence ends.
            fields: dict = {
                "length_bases": self.length,
                "length_tokens": None,
                "md5_upper": self._md5.hexdigest(),
                "n_bases": self.n_bases,
                "softmask_bases": self.softmask_bases,
                "iupac": self.iupac,
                "excluded_bases": self.excluded_bases,
                "tokens": None,
                "softmask": None,
                "nruns": None,
            }
            if self.write:
                self._write_tokens(np.empty(0, dtype=np.uint8), final=True)
                self._worker.submit(self._bits.finish)
                self._worker.wait()
                (self.out_dir / "nruns").mkdir(exist_ok=True)
                np.save(self.out_dir / "nruns" / f"{self.key}.npy", merge_intervals(self._runs))
                fields.update(
                    length_tokens=self.n_tokens,
                    tokens=f"tokens/{self.key}.bin",
                    softmask=f"softmask/{self.key}.bits",
                    nruns=f"nruns/{self.key}.npy",
                )
                if self._k is None:
                    if self._bases_tokenized != self.length:
                        raise RuntimeError(
                            f"tokenizer covered {self._bases_tokenized} of {self.length} bases of {self.key}"
                        )
                    (self.out_dir / "offsets").mkdir(exist_ok=True)
                    checkpoints = np.concatenate(self._checkpoints) if self._checkpoints else np.zeros(1, np.int64)
                    np.save(self.out_dir / "offsets" / f"{self.key}.npy", checkpoints)
                    fields["token_offsets"] = f"offsets/{self.key}.npy"
            return fields
        finally:
            self.close()

    def close(self) -> None:
        for scanned, _ in self._scans:
            scanned.cancel()
        self._scans.clear()
        self._hasher.shutdown()
        self._worker.shutdown()
        for fh in self._files.values():
            fh.close()
        self._files = {}


@dataclass(frozen=True)
class _Scan:
    """One chunk scanned on its own (see :meth:`RecordWriter._scan`); ``ids`` None when tokens are made at commit."""

    flags: np.ndarray
    soft: int
    upper: np.ndarray
    n_here: int
    iupac: dict[str, int] | None
    n_runs: np.ndarray
    ids: np.ndarray | None
