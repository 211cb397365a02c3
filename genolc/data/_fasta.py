"""Low-level FASTA streaming: raw byte blocks from plain, gzip and bgzip files, and a record parser over them.

Memory stays bounded by the block sizes below, never by a record's length: compressed input is read
``_READ_SIZE`` bytes at a time and inflated at most ``_BLOCK_MAX`` bytes at a time, so even a 100 Mbp run of N that
compresses a thousandfold never lands in memory whole. Multi-member gzip (which is what bgzip writes) is handled by
starting a new decompressor at each member boundary, so a .fai/.gzi index is never needed.

Inflating is most of the cost of reading a .fa.gz, so it uses ISA-L (the ``isal`` package, about twice zlib's
speed) when it is installed, zlib otherwise; both give the same bytes. It runs in a thread of its own, a few blocks
ahead of the parser (both libraries release the GIL), so on two cores inflating overlaps the rest of the work.
"""

from __future__ import annotations

import queue
import re
import threading
import zlib
from pathlib import Path
from typing import BinaryIO, Iterator

from genolc.errors import InputError
from genolc.fsutil import GZIP_MAGIC

try:
    from isal import isal_zlib as _inflate_lib

    INFLATE_ERRORS: tuple[type[Exception], ...] = (_inflate_lib.error, zlib.error)
except ImportError:
    _inflate_lib = zlib
    INFLATE_ERRORS = (zlib.error,)
INFLATE_LIBRARY = "isal" if _inflate_lib is not zlib else "zlib"
# Inflated blocks waiting for the parser: bounds the read-ahead's memory at this many times _BLOCK_MAX.
_READ_AHEAD_BLOCKS = 2

_READ_SIZE = 1 << 20
_BLOCK_MAX = 1 << 22
_HEADER_MAX = 1 << 20
# Deleted from sequence lines: line ends (LF, CRLF) and stray blanks; Biopython's FASTA parser drops them too.
LINE_JUNK = b" \t\r\n\v\f"
_NON_SPACE = re.compile(rb"\S")


def is_bgzf(head: bytes) -> bool:
    """True for a gzip member with the BGZF 'BC' extra subfield (what bgzip and samtools write)."""
    return len(head) >= 18 and head[:2] == GZIP_MAGIC and bool(head[3] & 4) and head[12:14] == b"BC"


def plain_blocks(path: Path) -> Iterator[bytes]:
    with open(path, "rb") as fh:
        while block := fh.read(_BLOCK_MAX):
            yield block


# The empty block every BGZF file ends with (SAM/BAM specification, section 4.1.2).
BGZF_EOF = bytes.fromhex("1f8b08040000000000ff0600424302001b0003000000000000000000")


def gzip_blocks(path: Path, read_ahead: bool = True) -> Iterator[bytes]:
    """Inflate every gzip member of ``path`` in turn, yielding pieces of at most ``_BLOCK_MAX`` bytes.

    ``read_ahead``: inflate in a background thread, a few blocks ahead of the caller.
    """
    with open(path, "rb") as fh:
        check_bgzf_complete(fh, path)
        members = _inflate_members(fh, path)
        yield from _read_ahead(members) if read_ahead else members


_DONE = object()


def _read_ahead(blocks: Iterator[bytes]) -> Iterator[bytes]:
    """``blocks``, produced by a background thread up to ``_READ_AHEAD_BLOCKS`` ahead; its errors are raised here.

    Closing this generator early stops the thread and closes ``blocks`` before returning, so the file under it may
    be closed right after.
    """
    pending: queue.Queue = queue.Queue(maxsize=_READ_AHEAD_BLOCKS)
    stop = threading.Event()

    def produce() -> None:
        try:
            for block in blocks:
                while not stop.is_set():
                    try:
                        pending.put(block, timeout=0.05)
                        break
                    except queue.Full:
                        continue
                if stop.is_set():
                    return
            pending.put((_DONE, None))
        except BaseException as exc:  # noqa: BLE001 - handed to the consumer, which raises it in its own thread
            pending.put((_DONE, exc))
        finally:
            blocks.close()

    worker = threading.Thread(target=produce, name="genolc-inflate", daemon=True)
    worker.start()
    try:
        while True:
            item = pending.get()
            if isinstance(item, tuple):
                error = item[1]
                if error is not None:
                    raise error
                return
            yield item
    finally:
        stop.set()
        while worker.is_alive():
            try:
                pending.get(timeout=0.05)
            except queue.Empty:
                pass
        worker.join()


def check_bgzf_complete(fh: BinaryIO, path: Path) -> None:
    """A BGZF file cut at a block boundary inflates cleanly to a shorter sequence; only its missing end-of-file
    block shows the cut, so a BGZF file without one is refused (samtools merely warns)."""
    head = fh.read(18)
    if is_bgzf(head):
        fh.seek(-len(BGZF_EOF), 2)
        if fh.read(len(BGZF_EOF)) != BGZF_EOF:
            raise InputError(
                "the bgzip file has no end-of-file block: it was probably cut short at a block boundary",
                where=str(path),
                fix="fetch the file again; if it is complete but written by an old tool, recompress it "
                    "(bgzip -dc FILE | bgzip > NEW)",
            )
    fh.seek(0)


def _corrupt(path: Path, detail: str) -> InputError:
    return InputError(
        f"corrupt gzip data: {detail}",
        where=str(path),
        fix="download or compress the file again (gzip -t FILE checks it)",
    )


def _inflate_members(fh: BinaryIO, path: Path) -> Iterator[bytes]:
    decomp = None
    saw_padding = False
    while data := fh.read(_READ_SIZE):
        while True:
            if decomp is None:
                if not data:
                    break
                if len(data) < 2:
                    data += fh.read(1)
                if not data.startswith(GZIP_MAGIC):
                    # Some tools pad a gzip file with zero bytes; anything else after the last member is damage.
                    if data.strip(b"\x00"):
                        raise _corrupt(path, "unexpected bytes after the end of the compressed data")
                    saw_padding = True
                    break
                if saw_padding:
                    raise _corrupt(path, "a gzip member follows zero padding")
                decomp = _inflate_lib.decompressobj(31)
            try:
                out = decomp.decompress(data, _BLOCK_MAX)
            except INFLATE_ERRORS as exc:
                raise _corrupt(path, str(exc)) from None
            if out:
                yield out
            if decomp.eof:
                data = decomp.unused_data
                decomp = None
                continue
            data = decomp.unconsumed_tail
            # A full output block may leave inflated bytes pending inside zlib even with no input left.
            if not data and len(out) < _BLOCK_MAX:
                break
    if decomp is not None:
        raise InputError(
            "the gzip file is truncated: it ends in the middle of compressed data",
            where=str(path),
            fix="the download or copy was probably cut short; fetch the file again (gzip -t FILE checks it)",
        )


def read_head(path: Path, compressed: bool, size: int = 1 << 16) -> bytes:
    """Up to ``size`` bytes of the (decompressed) start of the file, for sniffing its format."""
    blocks = gzip_blocks(path, read_ahead=False) if compressed else plain_blocks(path)
    head = bytearray()
    try:
        for block in blocks:
            head += block
            if len(head) >= size:
                break
    except InputError:
        # A damaged file still gets sniffed from what could be read; the damage is reported when streaming.
        if not head:
            raise
    finally:
        blocks.close()
    return bytes(head[:size])


class FastaParser:
    """Splits a stream of raw FASTA bytes into header lines and cleaned sequence pieces.

    A header is a '>' at the start of a line. Sequence pieces are the bytes between headers with line ends and
    blanks removed, as ``bytes`` or ``bytearray``s of at most one input block each.
    """

    def __init__(self, blocks: Iterator[bytes], path: Path):
        self._blocks = blocks
        self._path = path
        self._buf = b""
        self._pos = 0
        self._line_start = True

    def close(self) -> None:
        self._blocks.close()

    def _fill(self) -> bool:
        while self._pos >= len(self._buf):
            block = next(self._blocks, None)
            if block is None:
                return False
            self._buf, self._pos = block, 0
        return True

    def first_header(self) -> str:
        """The first header line; InputError for an empty file or sequence before any header."""
        while self._fill():
            found = _NON_SPACE.search(self._buf, self._pos)
            if found is None:
                self._pos = len(self._buf)
                continue
            self._pos = found.start()
            if self._buf[self._pos] != 0x3E:
                line = self._buf[self._pos : self._pos + 60].split(b"\n")[0].decode("latin-1").strip()
                raise InputError(
                    f"sequence before the first '>' header line (the file starts with '{line}')",
                    where=str(self._path),
                    fix="add a header line such as '>chr1' before the sequence",
                )
            return self._read_header()
        raise InputError("the file is empty (no FASTA records)", where=str(self._path), fix="check the path and the download")

    def next_header(self) -> str | None:
        """Skip what is left of the current record's sequence; the next header, or None at the end."""
        for _ in self.sequence_pieces():
            pass
        return self._read_header() if self._fill() else None

    def _read_header(self) -> str:
        self._pos += 1
        parts = []
        size = 0
        while self._fill():
            end = self._buf.find(b"\n", self._pos)
            stop = len(self._buf) if end < 0 else end
            parts.append(self._buf[self._pos : stop])
            size += stop - self._pos
            self._pos = stop if end < 0 else end + 1
            if end >= 0:
                break
            if size > _HEADER_MAX:
                raise InputError(
                    f"a header line longer than {_HEADER_MAX:,} bytes", where=str(self._path), fix="is this really FASTA?"
                )
        self._line_start = True
        return b"".join(parts).decode("utf-8", errors="replace").strip()

    def sequence_pieces(self) -> Iterator[bytes | bytearray]:
        """Cleaned sequence of the current record, piece by piece, stopping before the next header."""
        while self._fill():
            buf, pos = self._buf, self._pos
            if self._line_start and buf[pos] == 0x3E:
                return
            boundary = _next_header_line(buf, pos)
            if boundary < 0:
                end = len(buf)
                self._line_start = buf[-1] == 0x0A
            else:
                end = boundary + 1
                self._line_start = True
            self._pos = end
            # A whole block (the common case) is cleaned without first copying it out.
            source = buf if pos == 0 and end == len(buf) else bytearray(memoryview(buf)[pos:end])
            piece = source.translate(None, LINE_JUNK)
            if piece:
                yield piece


def _next_header_line(buf: bytes, pos: int) -> int:
    """Index of the first b"\n>" in ``buf`` at or after ``pos``, or -1: found by looking for '>' alone, which is
    rare in a FASTA body, since a two-byte search is several times slower than memchr over the many line ends."""
    at = buf.find(b">", pos + 1)
    while at >= 0 and buf[at - 1] != 0x0A:
        at = buf.find(b">", at + 1)
    return at - 1 if at >= 0 else -1


def check_twobit_complete(path: Path) -> None:
    """InputError when a .2bit file ends before its last record's packed bases (py2bit reads past it silently)."""
    import struct

    size = path.stat().st_size
    with open(path, "rb") as fh:

        def read(fmt: str, at: int | None = None) -> tuple:
            if at is not None:
                fh.seek(at)
            raw = fh.read(struct.calcsize(fmt))
            if len(raw) < struct.calcsize(fmt):
                raise EOFError
            return struct.unpack(fmt, raw)

        try:
            endian = "<" if fh.read(4) == b"\x43\x27\x41\x1a" else ">"
            version, count, _ = read(endian + "3I", 4)
            offset_fmt = endian + ("Q" if version == 1 else "I")
            offsets = []
            for _ in range(count):
                (name_size,) = read("B")
                fh.seek(name_size, 1)
                offsets.append(read(offset_fmt)[0])
            end = fh.tell()
            for offset in offsets:
                dna_size, n_blocks = read(endian + "2I", offset)
                (mask_blocks,) = read(endian + "I", offset + 8 + 8 * n_blocks)
                end = max(end, offset + 8 + 8 * n_blocks + 4 + 8 * mask_blocks + 4 + (dna_size + 3) // 4)
        except EOFError:
            end = size + 1
    if end > size:
        raise InputError(
            "the 2bit file is truncated: it ends before the data its index points to",
            where=str(path),
            fix="the download or copy was probably cut short; fetch or convert the file again",
        )
