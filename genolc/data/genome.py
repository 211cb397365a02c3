"""Genome input: FASTA (plain, gzip, bgzip), GenBank and 2bit read as streams of records and base chunks.

``open_genome(path).records()`` yields one :class:`RecordStream` per record in file order; ``stream.chunks(size)``
yields the record's bases as uint8 ASCII arrays of ``size`` bases (the last one shorter), case kept, line ends
removed. Memory is bounded by the chunk size, never by a record's length. Chromosome names are resolved here too
(``chr22``/``22``/``NC_000022.11`` all mean ``chr22``), and vectorised per-chunk helpers count soft-mask, N runs
and IUPAC codes and reject characters that are not bases.

Decisions (documented in docs/internals.md):
- 'U' is invalid: a genome is DNA; an RNA file must be converted first.
- GenBank sequence is upper-cased (lower case there is a display convention, not soft-masking).
- A region header on a contig accession (``gi|..|ref|NT_011295.12|:18775270-19883859 ... chromosome 19``) is
  contig-relative: the record gets ``chrom`` from the 'Homo sapiens chromosome N' text and ``start`` 1.
"""

from __future__ import annotations

import difflib
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Iterator

import numpy as np

from genolc.data import _fasta
from genolc.errors import InputError

DEFAULT_CHUNK = 1 << 24
FORMATS = ("fasta", "fasta.gz", "fasta.bgz", "genbank", "2bit")
IUPAC_CODES = "RYSWKMBDHV"
VALID_BASES = b"ACGTNacgtn" + IUPAC_CODES.encode() + IUPAC_CODES.lower().encode()
_GENBANK_SUFFIXES = (".gb", ".gbk", ".genbank", ".gbff")
_TWOBIT_MAGICS = (b"\x43\x27\x41\x1a", b"\x1a\x41\x27\x43")

_VALID_LUT = np.zeros(256, dtype=bool)
_VALID_LUT[np.frombuffer(VALID_BASES, dtype=np.uint8)] = True
_AMBIGUOUS_LUT = np.zeros(256, dtype=bool)
_AMBIGUOUS_LUT[np.frombuffer(b"Nn" + IUPAC_CODES.encode() + IUPAC_CODES.lower().encode(), dtype=np.uint8)] = True


@dataclass(frozen=True)
class RecordInfo:
    index: int  # position of the record in its file, from 0
    name: str  # first word of the header line, without '>'
    description: str  # the whole header line after '>' (stripped)
    chrom: str  # canonical UCSC-style name ('chr1'..'chr22', 'chrX', 'chrY', 'chrM'); otherwise the name
    start: int  # 1-based chromosome coordinate of the record's first base (1 when the header has no region)
    source: str  # path of the file it came from

    @property
    def label(self) -> str:
        """How errors name the record: file, record number and name."""
        return f"{self.source}, record #{self.index + 1} '{self.name}'"


_CHROM_RE = re.compile(r"(?:chr)?([1-9][0-9]?|X|Y|M|MT)", re.IGNORECASE)
_REFSEQ_HUMAN_RE = re.compile(r"NC_0000([0-9]{2})(?:\.[0-9]+)?")
_REFSEQ_MITO_RE = re.compile(r"NC_(?:012920|001807)(?:\.[0-9]+)?")
_ACCESSION_RE = re.compile(r"[A-Z]{1,2}_?[0-9]{5,}(?:\.[0-9]+)?")
_NCBI_DBS = {"ref", "gb", "emb", "dbj", "tpg", "tpe", "tpd"}
_REGION_RE = re.compile(r"(.+?):([0-9][0-9,]*)-([0-9][0-9,]*)")
_HUMAN_CHROMOSOME_TEXT_RE = re.compile(r"\bHomo sapiens\b.*?\bchromosome ([1-9][0-9]?|X|Y)\b")
# NCBI titles of sequences that belong to a chromosome without being (a placed piece of) it.
_NOT_PLACED_TEXT_RE = re.compile(r"unlocalized|unplaced|alternate locus|ALT_REF_LOCI|patch", re.IGNORECASE)
_ENSEMBL_REGION_RE = re.compile(r"\b(?:chromosome|primary_assembly):[^:\s]+:([^:\s]+):([0-9]+):([0-9]+)")
_UNPLACED_CONTIG_RE = re.compile(r"(?:GL|KI|JH|KN|KZ|KQ|KV|ML|MU|JTFH|NT_|NW_)[0-9]+(?:[.v][0-9]+)?", re.IGNORECASE)


def _ncbi_accession(name: str) -> str | None:
    """The accession inside an NCBI pipe id (``gi|224589822|ref|NC_000023.10|`` -> ``NC_000023.10``)."""
    if "|" not in name:
        return None
    fields = name.split("|")
    for i, field in enumerate(fields[:-1]):
        if field in _NCBI_DBS and fields[i + 1]:
            return fields[i + 1]
    candidates = [f for f in fields if _ACCESSION_RE.fullmatch(f)]
    return candidates[-1] if candidates else None


def canonical_chrom(name: str) -> str:
    """UCSC-style name for a chromosome alias: 'chr22', '22', 'CHR22', 'NC_000022.11' -> 'chr22'; 'MT'/'M' -> 'chrM'.

    Names that are not a numbered or sex/mitochondrial chromosome come back unchanged, except that an NCBI pipe id
    comes back as the accession inside it. Zero-padded numbers ('chr01', as some yeast assemblies use) are kept
    as they are: they are not human-style names.
    """
    text = name.strip()
    text = _ncbi_accession(text) or text
    m = _CHROM_RE.fullmatch(text)
    if m:
        value = m.group(1).upper()
        return "chrM" if value in ("M", "MT") else f"chr{value}"
    m = _REFSEQ_HUMAN_RE.fullmatch(text)
    if m and 1 <= int(m.group(1)) <= 24:
        number = int(m.group(1))
        return {23: "chrX", 24: "chrY"}.get(number, f"chr{number}")
    if _REFSEQ_MITO_RE.fullmatch(text):
        return "chrM"
    return text


def _is_chromosome_name(chrom: str) -> bool:
    return _CHROM_RE.fullmatch(chrom) is not None and chrom.startswith("chr")


def is_primary(chrom: str) -> bool:
    """False for alternate haplotypes, patches, unplaced/unlocalised contigs, EBV, HLA and decoy sequences."""
    low = chrom.lower()
    if any(tag in low for tag in ("_alt", "_random", "_fix", "_hap", "_decoy")):
        return False
    if low.startswith(("chrun", "un_", "hla-", "hla_")) or low in ("chrebv", "ebv", "hs37d5", "hs38d1"):
        return False
    return _UNPLACED_CONTIG_RE.fullmatch(chrom) is None


def resolve_chroms(queries: Iterable[str] | str, available: Iterable[str]) -> list[str]:
    """Map user-given chromosome names to entries of ``available`` (aliases allowed), in query order, no repeats.

    ``queries`` may be a comma-separated string. InputError listing close matches for a name that is not there.
    """
    if isinstance(queries, str):
        queries = [q for q in queries.split(",") if q.strip()]
    available = list(available)
    by_alias: dict[str, str] = {}
    for entry in available:
        by_alias.setdefault(entry, entry)
    for entry in available:
        by_alias.setdefault(canonical_chrom(entry), entry)
    resolved: list[str] = []
    for query in queries:
        query = query.strip()
        hit = by_alias.get(query) or by_alias.get(canonical_chrom(query))
        if hit is None:
            close = difflib.get_close_matches(canonical_chrom(query), available, n=5, cutoff=0.5)
            shown = ", ".join(available[:20]) + (f" … ({len(available)} in all)" if len(available) > 20 else "")
            raise InputError(
                f"unknown chromosome '{query}'" + (f"; close matches: {', '.join(close)}" if close else ""),
                where=f"records found: {shown or 'none'}",
                fix="use one of the names listed (aliases such as 22/chr22/NC_000022.11 work)",
            )
        if hit not in resolved:
            resolved.append(hit)
    return resolved


def _parse_int(text: str) -> int:
    return int(text.replace(",", ""))


def parse_header(index: int, header: str, source: str) -> RecordInfo:
    """RecordInfo from a header line (without '>'): chromosome alias and region start resolved."""
    description = header.strip()
    words = description.split()
    name = words[0] if words else ""
    base, region_start = name, None
    m = _REGION_RE.fullmatch(name)
    if m and 1 <= _parse_int(m.group(2)) <= _parse_int(m.group(3)):
        base, region_start = m.group(1), _parse_int(m.group(2))
    elif len(words) >= 3 and words[1].isdigit() and words[2].isdigit() and int(words[1]) <= int(words[2]):
        # 'chr3 42000000 44000000': 1-based inclusive (the record holds end - start + 1 bases); 0 means 1.
        region_start = max(int(words[1]), 1)
    else:
        ensembl = _ENSEMBL_REGION_RE.search(description)
        if ensembl and canonical_chrom(ensembl.group(1)) == canonical_chrom(name):
            region_start = int(ensembl.group(2))
    chrom = canonical_chrom(base)
    if not _is_chromosome_name(chrom):
        from_text = _HUMAN_CHROMOSOME_TEXT_RE.search(description)
        placed = not _NOT_PLACED_TEXT_RE.search(description)
        if from_text and placed and (_ncbi_accession(base) or _ACCESSION_RE.fullmatch(base)):
            # The region (if any) counts from the contig's start, not the chromosome's: keep the record's own frame.
            return RecordInfo(index, name, description, canonical_chrom(from_text.group(1)), 1, source)
    return RecordInfo(index, name, description, chrom, region_start or 1, source)


def softmask_flags(chunk: np.ndarray) -> np.ndarray:
    """bool[n]: True where the base is lower case (soft-masked). Assumes characters were checked."""
    return chunk >= 0x61


def n_intervals(chunk: np.ndarray, offset: int = 0, *, include_iupac: bool = False) -> np.ndarray:
    """int64[k, 2] runs of N/n (also IUPAC codes with ``include_iupac``), 0-based half-open, shifted by ``offset``.

    Runs touching the chunk's edges are cut there; join chunks' runs with :func:`merge_intervals`.
    """
    chunk = np.asarray(chunk, dtype=np.uint8)
    if not include_iupac:
        # memchr over a copy is far cheaper than building the mask for the common chunk without N.
        raw = chunk.tobytes()
        if b"N" not in raw and b"n" not in raw:
            return np.empty((0, 2), dtype=np.int64)
    mask = _AMBIGUOUS_LUT[chunk] if include_iupac else (chunk | 0x20) == 0x6E
    return true_runs(mask) + offset


def true_runs(mask: np.ndarray) -> np.ndarray:
    """int64[k, 2] [start, stop) runs of True in a 1-D bool array."""
    if not mask.any():
        return np.empty((0, 2), dtype=np.int64)
    bounds = np.concatenate(([0], np.flatnonzero(mask[1:] != mask[:-1]) + 1, [mask.size])).astype(np.int64)
    first = 0 if mask[0] else 1
    return np.stack([bounds[first:-1:2], bounds[first + 1 :: 2]], axis=1)


def merge_intervals(parts: Iterable[np.ndarray] | np.ndarray) -> np.ndarray:
    """Union of int64[k, 2] half-open intervals (one array or many), overlapping or touching ones joined, sorted."""
    if isinstance(parts, np.ndarray):
        parts = [parts]
    arrays = [np.asarray(p, dtype=np.int64).reshape(-1, 2) for p in parts]
    iv = np.concatenate(arrays) if arrays else np.empty((0, 2), dtype=np.int64)
    iv = iv[iv[:, 1] > iv[:, 0]]
    if len(iv) == 0:
        return np.empty((0, 2), dtype=np.int64)
    iv = iv[np.lexsort((iv[:, 1], iv[:, 0]))]
    reach = np.maximum.accumulate(iv[:, 1])
    new_group = np.ones(len(iv), dtype=bool)
    new_group[1:] = iv[1:, 0] > reach[:-1]
    starts = iv[new_group, 0]
    group_ids = np.cumsum(new_group) - 1
    ends = np.zeros(len(starts), dtype=np.int64)
    np.maximum.at(ends, group_ids, iv[:, 1])
    return np.stack([starts, ends], axis=1)


def iupac_counts(chunk: np.ndarray) -> dict[str, int]:
    """Count of each IUPAC ambiguity code (R Y S W K M B D H V, either case folded to upper) in the chunk."""
    rest = np.asarray(chunk, dtype=np.uint8).tobytes().translate(None, b"ACGTNacgtn").upper()
    return {code: rest.count(code.encode()) for code in IUPAC_CODES}


def check_characters(chunk: np.ndarray, info: RecordInfo, offset: int = 0) -> None:
    """InputError naming the count and first 1-based position of characters that are not bases or IUPAC codes.

    ``offset`` is the 0-based position of the chunk's first base in the record. The count covers this chunk.
    """
    chunk = np.asarray(chunk, dtype=np.uint8)
    bad = chunk.tobytes().translate(None, VALID_BASES)
    if not bad:
        return
    first = int(np.argmin(_VALID_LUT[chunk]))
    char = chr(chunk[first])
    shown = repr(char) if char.isprintable() else f"byte 0x{ord(char):02x}"
    stretch = f"bases {offset + 1:,}-{offset + chunk.size:,}"
    if char in "Uu":
        fix = "this looks like RNA; convert U to T before using it as a genome"
    elif char == ">":
        fix = "a '>' must start a header line; check for a header glued to the end of a sequence line"
    else:
        fix = "a genome may hold only A, C, G, T, N and the IUPAC codes RYSWKMBDHV (either case); fix or remove the rest"
    raise InputError(
        f"{len(bad):,} invalid character(s) in {stretch} of the record; the first is {shown} at position "
        f"{offset + first + 1:,} (1-based)",
        where=info.label,
        fix=fix,
    )


class RecordStream:
    """One record: its :class:`RecordInfo` and its bases, readable once, before the reader moves on.

    After the record has been read to its end (or skipped by advancing the reader), ``length`` holds its base count.
    """

    def __init__(self, info: RecordInfo, pieces: Iterator[bytearray | bytes]):
        self.info = info
        self.length: int | None = None
        self._pieces = pieces
        self._seen = 0
        self._started = False
        self._stale = False

    def __repr__(self) -> str:
        return f"RecordStream({self.info.name!r}, chrom={self.info.chrom!r}, start={self.info.start})"

    def chunks(self, size: int = DEFAULT_CHUNK, *, exact: bool = True) -> Iterator[np.ndarray]:
        """uint8 ASCII arrays of exactly ``size`` bases (the last may be shorter), as in the file minus line ends.

        ``exact=False``: arrays of at most ``size`` bases, cut where the reader's blocks end, so no piece is
        copied to fill a chunk (what a consumer that carries state across chunk edges wants). The arrays may be
        read-only. Consume them before asking the reader for the next record.
        """
        if int(size) < 1:
            raise ValueError(f"chunk size must be >= 1, got {size}")
        if self._started or self._stale:
            raise RuntimeError(f"record {self.info.name!r} was already read; open the genome again to re-read it")
        self._started = True
        return self._sized_chunks(int(size)) if exact else self._cut_chunks(int(size))

    def _cut_chunks(self, size: int) -> Iterator[np.ndarray]:
        for arr in self._counted():
            for start in range(0, arr.size, size):
                yield arr[start:start + size]
        if self._stale:
            raise RuntimeError(f"record {self.info.name!r} was read after the reader moved past it")
        self._finish()

    def _counted(self) -> Iterator[np.ndarray]:
        for piece in self._pieces:
            self._seen += len(piece)
            yield np.frombuffer(piece, dtype=np.uint8)

    def _sized_chunks(self, size: int) -> Iterator[np.ndarray]:
        parts: list[np.ndarray] = []
        filled = 0
        for arr in self._counted():
            while arr.size:
                if not parts and arr.size >= size:
                    yield arr[:size]
                    arr = arr[size:]
                    continue
                take = arr[: size - filled]
                arr = arr[take.size :]
                parts.append(take)
                filled += take.size
                if filled == size:
                    yield np.concatenate(parts)
                    parts, filled = [], 0
        if self._stale:
            raise RuntimeError(f"record {self.info.name!r} was read after the reader moved past it")
        if parts:
            yield np.concatenate(parts)
        self._finish()

    def _finish(self) -> None:
        if self._seen == 0:
            raise InputError(
                "empty record: a header with no sequence after it",
                where=self.info.label,
                fix="remove the header line or add the record's sequence",
            )
        self.length = self._seen

    def _skip_rest(self) -> None:
        """Called by the reader before the next record: reads what the caller left, checks the record."""
        if self.length is not None:
            return
        for _ in self._counted():
            pass
        self._stale = True
        self._finish()


class GenomeReader:
    """A genome file whose format was sniffed; ``records()`` streams it from the start each time it is called."""

    def __init__(self, path: Path, format: str):
        if format not in FORMATS:
            raise ValueError(f"unknown genome format {format!r}; expected one of {FORMATS}")
        self.path = path
        self.format = format

    def __repr__(self) -> str:
        return f"GenomeReader({str(self.path)!r}, format={self.format!r})"

    def __iter__(self) -> Iterator[RecordStream]:
        return self.records()

    def records(self) -> Iterator[RecordStream]:
        """Records in file order, one at a time; each must be read (or skipped) before the next is produced."""
        source = {"genbank": self._genbank_records, "2bit": self._twobit_records}.get(self.format, self._fasta_records)
        names: dict[str, int] = {}
        for stream in source():
            info = stream.info
            if not info.name:
                raise InputError("a record with no name", where=info.label, fix="give every record a name after '>'")
            if info.name in names:
                raise InputError(
                    f"duplicate record name '{info.name}'",
                    where=f"{self.path}, records #{names[info.name] + 1} and #{info.index + 1}",
                    fix="rename or remove one of them; names must be unique within a file",
                )
            names[info.name] = info.index
            yield stream
            stream._skip_rest()

    def _fasta_records(self) -> Iterator[RecordStream]:
        compressed = self.format in ("fasta.gz", "fasta.bgz")
        blocks = _fasta.gzip_blocks(self.path) if compressed else _fasta.plain_blocks(self.path)
        parser = _fasta.FastaParser(blocks, self.path)
        try:
            header = parser.first_header()
            index = 0
            while header is not None:
                yield RecordStream(parse_header(index, header, str(self.path)), parser.sequence_pieces())
                header = parser.next_header()
                index += 1
        finally:
            parser.close()

    def _genbank_records(self) -> Iterator[RecordStream]:
        from Bio import SeqIO
        from Bio.Seq import UndefinedSequenceError

        from genolc.fsutil import open_maybe_gzip

        count = 0
        with open_maybe_gzip(self.path, "rt", encoding="utf-8", errors="replace") as handle:
            parsed = SeqIO.parse(handle, "genbank")
            while True:
                try:
                    record = next(parsed, None)
                except (ValueError, EOFError, OSError) as exc:
                    raise InputError(f"cannot parse GenBank: {exc}", where=str(self.path), fix="check the file") from None
                if record is None:
                    break
                name = record.id if record.id and record.id != "<unknown id>" else record.name
                info = parse_header(count, f"{name} {record.description}", str(self.path))
                info = _chrom_from_genbank_source(info, record)
                try:
                    # Lower case in GenBank is a display convention, not soft-masking.
                    seq = bytes(record.seq).upper()
                except UndefinedSequenceError:
                    seq = b""
                yield RecordStream(info, _slices(seq))
                count += 1
        if count == 0:
            raise InputError("no GenBank records found", where=str(self.path), fix="check the file is GenBank (LOCUS ... //)")

    def _twobit_records(self) -> Iterator[RecordStream]:
        try:
            import py2bit
        except ImportError:
            raise InputError(
                "reading 2bit files needs the py2bit package", where=str(self.path), fix="pip install 'genolc[twobit]'"
            ) from None
        try:
            twobit = py2bit.open(str(self.path), True)
        except RuntimeError:
            raise InputError("cannot read the 2bit file (damaged or truncated)", where=str(self.path), fix="fetch it again") from None
        try:
            for index, (name, length) in enumerate(twobit.chroms().items()):
                yield RecordStream(parse_header(index, name, str(self.path)), self._twobit_pieces(twobit, name, length))
        finally:
            twobit.close()


    def _twobit_pieces(self, twobit, name: str, length: int) -> Iterator[bytearray]:
        for start in range(0, length, _fasta._BLOCK_MAX):
            try:
                text = twobit.sequence(name, start, min(start + _fasta._BLOCK_MAX, length))
            except RuntimeError:
                raise InputError(
                    f"cannot read record '{name}' of the 2bit file (damaged or truncated)",
                    where=str(self.path),
                    fix="fetch or convert the file again",
                ) from None
            yield bytearray(text, "ascii")


def _slices(seq: bytes) -> Iterator[bytearray]:
    view = memoryview(seq)
    for start in range(0, len(seq), _fasta._BLOCK_MAX):
        yield bytearray(view[start : start + _fasta._BLOCK_MAX])


def _chrom_from_genbank_source(info: RecordInfo, record) -> RecordInfo:
    """A human record whose id is an accession takes its chromosome from the source feature's /chromosome."""
    if _is_chromosome_name(info.chrom):
        return info
    for feature in record.features:
        if feature.type != "source":
            continue
        organism = feature.qualifiers.get("organism", [""])[0]
        chromosome = feature.qualifiers.get("chromosome", [""])[0]
        if organism == "Homo sapiens" and _is_chromosome_name(canonical_chrom(chromosome)):
            return RecordInfo(info.index, info.name, info.description, canonical_chrom(chromosome), 1, info.source)
    return info


_OTHER_COMPRESSION = {
    b"BZh": "bzip2",
    b"\xfd7zXZ\x00": "xz",
    b"\x28\xb5\x2f\xfd": "zstd",
    b"PK\x03\x04": "zip",
}
_CONTROL_BYTES = bytes(range(0, 9)) + bytes(range(14, 32)) + b"\x7f"
_SEQUENCE_LINE = re.compile(rb"[A-Za-z*\-.]+")


def open_genome(path: str | Path) -> GenomeReader:
    """Sniff a genome file's format from its content: FASTA (plain/gzip/bgzip), GenBank or 2bit; InputError if none."""
    p = Path(path)
    what_to_give = "give a FASTA (.fa, .fa.gz), GenBank (.gb) or 2bit genome file"
    if not p.exists():
        raise InputError("genome file not found", where=str(p), fix="check the path")
    if p.is_dir():
        raise InputError("expected a genome file but got a directory", where=str(p), fix=what_to_give)
    try:
        with open(p, "rb") as fh:
            magic = fh.read(64)
    except OSError as exc:
        raise InputError(f"cannot read the genome file ({exc.strerror})", where=str(p), fix="check its permissions") from None
    if not magic:
        raise InputError("the file is empty", where=str(p), fix="check the path and the download")
    if magic[:4] in _TWOBIT_MAGICS:
        _fasta.check_twobit_complete(p)
        return GenomeReader(p, "2bit")
    for prefix, name in _OTHER_COMPRESSION.items():
        if magic.startswith(prefix):
            raise InputError(
                f"the file is {name}-compressed, which genolc does not read",
                where=str(p),
                fix="decompress it, or recompress it with gzip or bgzip",
            )
    if p.suffix.lower() == ".2bit":
        raise InputError("named .2bit but lacks the 2bit signature", where=str(p), fix="fetch or convert the file again")
    compressed = magic[:2] == _fasta.GZIP_MAGIC
    head = _fasta.read_head(p, compressed)
    if _sniff_text(head, p, what_to_give) == "genbank":
        return GenomeReader(p, "genbank")
    if compressed:
        return GenomeReader(p, "fasta.bgz" if _fasta.is_bgzf(magic) else "fasta.gz")
    return GenomeReader(p, "fasta")


def _sniff_text(head: bytes, path: Path, what_to_give: str) -> str:
    text = head.lstrip()
    if not text:
        raise InputError("the file is empty (no records)", where=str(path), fix="check the path and the download")
    controls = len(head) - len(head.translate(None, _CONTROL_BYTES))
    if b"\x00" in head or controls > len(head) // 100:
        raise InputError("not a genome file: it holds binary data", where=str(path), fix=what_to_give)
    if text.startswith(b"<"):
        raise InputError(
            "not a genome file: it looks like an HTML/XML page (an error page saved by a failed download?)",
            where=str(path),
            fix=what_to_give,
        )
    if text.startswith(b">"):
        return "fasta"
    if text.startswith(b"LOCUS"):
        return "genbank"
    first_line = text.split(b"\n", 1)[0].strip()
    shown = first_line[:60].decode("utf-8", errors="replace")
    if path.suffix.lower() in _GENBANK_SUFFIXES:
        raise InputError(f"named like GenBank but does not start with 'LOCUS' (it starts with '{shown}')",
                         where=str(path), fix=what_to_give)
    if _SEQUENCE_LINE.fullmatch(first_line):
        raise InputError(
            f"sequence before the first '>' header line (the file starts with '{shown}')",
            where=str(path),
            fix="add a header line such as '>chr1' before the sequence",
        )
    raise InputError(f"not a FASTA, GenBank or 2bit file (it starts with '{shown}')", where=str(path), fix=what_to_give)
