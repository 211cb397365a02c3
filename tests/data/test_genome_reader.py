"""Genome reader on the real DNA in ../shared/data: README figures, pyfaidx/Biopython agreement, format variants
(CRLF, line widths, gzip members, GenBank, 2bit), chunk-boundary invariance and every bad-input error."""

from __future__ import annotations

import gzip
import hashlib
import os
import re
import struct
from pathlib import Path

import numpy as np
import pytest

from genolc.data import genome
from genolc.data.genome import merge_intervals, n_intervals, open_genome, softmask_flags
from genolc.errors import InputError

SHARED_DATA = Path(os.environ.get("GENOLC_SHARED_DATA", Path(__file__).resolve().parents[2].parent / "shared" / "data"))
README = SHARED_DATA / "README.md"


def _readme_rows() -> list[dict]:
    """Rows of the README's file table, keyed by its own column names."""
    if not README.exists():
        return []
    lines = [line for line in README.read_text().splitlines() if line.startswith("|")]
    columns = [c.strip() for c in lines[0].strip("|").split("|")]
    rows = []
    for line in lines[2:]:
        cells = [c.strip() for c in line.strip("|").split("|")]
        rows.append(dict(zip(columns, cells)))
    return rows


ROWS = _readme_rows()


def _number(text: str) -> float:
    return float(text.replace(",", ""))


def _read_all(path: Path, size: int = genome.DEFAULT_CHUNK):
    """(infos, lengths, joined bytes, merged N runs per record, soft-masked count) of a genome file."""
    infos, lengths, parts, runs, masked = [], [], [], [], 0
    for stream in open_genome(path).records():
        offset, record_runs = 0, []
        for chunk in stream.chunks(size):
            assert chunk.dtype == np.uint8 and chunk.ndim == 1 and 0 < chunk.size <= size
            genome.check_characters(chunk, stream.info, offset)
            record_runs.append(n_intervals(chunk, offset))
            masked += int(softmask_flags(chunk).sum())
            parts.append(chunk.tobytes())
            offset += chunk.size
        assert stream.length == offset
        infos.append(stream.info)
        lengths.append(offset)
        runs.append(merge_intervals(record_runs))
    return infos, lengths, b"".join(parts), runs, masked


def test_readme_lists_every_file(shared_data):
    on_disk = {
        f"{p.parent.name}/{p.name}"
        for folder in ("human", "other")
        for p in (shared_data / folder).iterdir()
        if p.name.endswith((".fa.gz", ".fa", ".fasta", ".fasta.gz"))
    }
    assert on_disk and on_disk == {row["file"] for row in ROWS}


@pytest.mark.parametrize("row", ROWS, ids=[row["file"] for row in ROWS])
def test_real_file_matches_readme(row, shared_file):
    infos, lengths, seq, runs, masked = _read_all(shared_file(row["file"]))
    total = sum(lengths)
    assert total == _number(row["length bp"])
    assert hashlib.md5(seq.upper()).hexdigest() == row["md5_seq"]
    n_bases = sum(int((r[:, 1] - r[:, 0]).sum()) for r in runs)
    assert n_bases == seq.upper().count(b"N")
    assert abs(100 * n_bases / total - _number(row["N %"])) <= 0.05
    assert abs(100 * masked / total - _number(row["soft-masked %"])) <= 0.05
    # Chromosomes the README names for a human file are the records' chromosomes, in file order.
    named = re.findall(r"\b(chr[0-9XYM]+)\b", row["sequence"])
    if row["file"].startswith("human/"):
        assert [i.chrom for i in infos] == named
    # A single 'chrN:a-b' region whose size matches the record gives the record's 1-based start.
    regions = re.findall(r"\b(chr[0-9XYM]+):([0-9,]+)-([0-9,]+)", row["sequence"])
    if len(regions) == 1 and len(infos) == 1 and _number(regions[0][2]) - _number(regions[0][1]) + 1 == total:
        assert infos[0].start == _number(regions[0][1])


def test_formats_sniffed(shared_file, tmp_path):
    assert open_genome(shared_file("human/hg38_chr2_1-2333275.fa.gz")).format == "fasta.bgz"
    assert open_genome(shared_file("other/lambda_phage_NC_001416.1.fa.gz")).format == "fasta.gz"
    plain = tmp_path / "lambda.fa"
    plain.write_bytes(gzip.decompress(shared_file("other/lambda_phage_NC_001416.1.fa.gz").read_bytes()))
    assert open_genome(plain).format == "fasta"


def test_agrees_with_pyfaidx(shared_file, tmp_path):
    pyfaidx = pytest.importorskip("pyfaidx")
    bgzip = shared_file("human/hg38_chr2_1-2333275.fa.gz")
    infos, lengths, seq, _, _ = _read_all(bgzip)
    with pyfaidx.Fasta(str(bgzip), sequence_always_upper=False, rebuild=False, build_index=False) as fa:
        assert list(fa.keys()) == [i.name for i in infos]
        assert str(fa["chr2"][:]).encode() == seq
    for relative in ("human/hg38_chr13_chr4_blat_pieces.fa.gz", "human/GRCh37_chr22_20000001-21000000.fa.gz"):
        copy = tmp_path / Path(relative).name.removesuffix(".gz")
        copy.write_bytes(gzip.decompress(shared_file(relative).read_bytes()))
        infos, lengths, seq, _, _ = _read_all(copy)
        with pyfaidx.Fasta(str(copy), sequence_always_upper=False) as fa:
            assert list(fa.keys()) == [i.name.split()[0] for i in infos]
            assert b"".join(str(fa[k][:]).encode() for k in fa.keys()) == seq
            assert [len(fa[k]) for k in fa.keys()] == lengths


def test_agrees_with_biopython(shared_file):
    from Bio import SeqIO

    for relative in (
        "human/hg38_chr13_chr4_blat_pieces.fa.gz",
        "human/hg38_chr16_186964-397118.fa.gz",
        "human/GRCh38p12_chr19_NT_011295.12_18775270-19883859.fa.gz",
        "other/lambda_phage_NC_001416.1.fa.gz",
    ):
        path = shared_file(relative)
        infos, lengths, seq, _, _ = _read_all(path)
        with gzip.open(path, "rt") as handle:
            records = list(SeqIO.parse(handle, "fasta"))
        assert [r.id for r in records] == [i.name for i in infos]
        assert [r.description for r in records] == [i.description for i in infos]
        assert "".join(str(r.seq) for r in records).encode() == seq


def _fasta_text(records: list[tuple[str, bytes]], width: int, newline: bytes = b"\n", blank_lines: bool = False) -> bytes:
    out = []
    for header, seq in records:
        out.append(b">" + header.encode() + newline)
        for i in range(0, len(seq), width):
            out.append(seq[i : i + width] + newline)
            if blank_lines and i % (width * 50) == 0:
                out.append(newline)
    return b"".join(out)


@pytest.fixture(scope="module")
def real_records() -> list[tuple[str, bytes]]:
    """Two real records: soft-masked hg38 chr16 and the N-heavy start of GRCh37 chr1."""
    from conftest import shared_file

    out = []
    for relative in ("human/hg38_chr16_186964-397118.fa.gz", "human/GRCh37_chr1_truncated_240kb.fa.gz"):
        stream = next(open_genome(shared_file(relative)).records())
        out.append((stream.info.description, b"".join(c.tobytes() for c in stream.chunks())))
    return out


@pytest.mark.parametrize(
    "width, newline, blank_lines",
    [(60, b"\n", False), (1, b"\n", False), (7, b"\r\n", False), (1000, b"\r\n", True), (10**7, b"\n", True)],
)
def test_line_width_and_line_end_variants(real_records, tmp_path, width, newline, blank_lines):
    path = tmp_path / "variant.fa"
    path.write_bytes(_fasta_text(real_records, width, newline, blank_lines))
    infos, lengths, seq, _, _ = _read_all(path, size=100_003)
    assert [i.description for i in infos] == [h for h, _ in real_records]
    assert lengths == [len(s) for _, s in real_records]
    assert seq == b"".join(s for _, s in real_records)


def test_header_spacing_and_gzip_members(real_records, tmp_path):
    """'> chr22' with a leading space, and a file gzipped as many members split mid-line (like bgzip)."""
    text = _fasta_text([(" chr22", real_records[0][1]), ("MT", real_records[1][1])], 61)
    cuts = [0, 5, 70_001, 123_457, len(text) // 2, len(text)]
    path = tmp_path / "members.fa.gz"
    path.write_bytes(b"".join(gzip.compress(text[a:b]) for a, b in zip(cuts, cuts[1:])))
    infos, lengths, seq, _, _ = _read_all(path)
    assert [(i.name, i.chrom, i.start) for i in infos] == [("chr22", "chr22", 1), ("MT", "chrM", 1)]
    assert seq == real_records[0][1] + real_records[1][1]


@pytest.mark.parametrize("size", [7, 1000, 65_536])
def test_chunk_size_does_not_change_sequence_or_n_runs(shared_file, size):
    path = shared_file("human/GRCh37_chr1_truncated_240kb.fa.gz" if size == 7 else "human/GRCh37_chr22_20000001-21000000.fa.gz")
    reference = _read_all(path)
    chunked = _read_all(path, size=size)
    assert chunked[1] == reference[1] and chunked[2] == reference[2]
    assert all(np.array_equal(a, b) for a, b in zip(chunked[3], reference[3]))
    assert len(reference[3][0]) > 0


def test_genbank(real_records, tmp_path):
    from Bio import SeqIO
    from Bio.Seq import Seq
    from Bio.SeqFeature import SeqFeature, SimpleLocation
    from Bio.SeqRecord import SeqRecord

    chr16, chr1 = real_records[0][1], real_records[1][1]
    records = [
        SeqRecord(Seq(chr16.decode()), id="NC_000022.11", name="NC_000022", description="test record",
                  annotations={"molecule_type": "DNA"}),
        SeqRecord(Seq(chr1.decode()), id="NT_011295.12", name="NT_011295", description="scaffold",
                  annotations={"molecule_type": "DNA"},
                  features=[SeqFeature(SimpleLocation(0, len(chr1)), type="source",
                                       qualifiers={"organism": ["Homo sapiens"], "chromosome": ["19"]})]),
    ]
    path = tmp_path / "two.gbk"
    SeqIO.write(records, path, "genbank")
    packed = tmp_path / "two.gb.gz"
    packed.write_bytes(gzip.compress(path.read_bytes()))
    for candidate in (path, packed):
        reader = open_genome(candidate)
        assert reader.format == "genbank"
        infos, lengths, seq, _, _ = _read_all(candidate, size=50_000)
        assert [(i.name, i.chrom) for i in infos] == [("NC_000022.11", "chr22"), ("NT_011295.12", "chr19")]
        assert seq == (chr16 + chr1).upper()


def _write_2bit(path: Path, records: list[tuple[str, bytes]]) -> None:
    """Minimal UCSC .2bit writer (py2bit only reads): N blocks, soft-mask blocks, 2-bit packed TCAG."""

    def blocks(mask: np.ndarray) -> tuple[list[int], list[int]]:
        runs = n_intervals(np.where(mask, ord("N"), ord("A")).astype(np.uint8))
        return runs[:, 0].tolist(), (runs[:, 1] - runs[:, 0]).tolist()

    code = np.zeros(256, dtype=np.uint8)
    for letter, value in zip(b"TCAG", range(4)):
        code[letter] = code[letter | 0x20] = value
    bodies = []
    for _, seq in records:
        arr = np.frombuffer(seq, dtype=np.uint8)
        n_starts, n_sizes = blocks((arr | 0x20) == ord("n"))
        m_starts, m_sizes = blocks(arr >= ord("a"))
        packed = np.zeros((len(arr) + 3) // 4 * 4, dtype=np.uint8)
        packed[: len(arr)] = code[arr]
        quads = packed.reshape(-1, 4)
        dna = (quads[:, 0] << 6 | quads[:, 1] << 4 | quads[:, 2] << 2 | quads[:, 3]).astype(np.uint8).tobytes()
        ints = [len(arr), len(n_starts), *n_starts, *n_sizes, len(m_starts), *m_starts, *m_sizes, 0]
        bodies.append(struct.pack(f"<{len(ints)}I", *ints) + dna)
    index_size = sum(1 + len(name) + 4 for name, _ in records)
    offset = 16 + index_size
    index = b""
    for (name, _), body in zip(records, bodies):
        index += bytes([len(name)]) + name.encode() + struct.pack("<I", offset)
        offset += len(body)
    path.write_bytes(struct.pack("<4I", 0x1A412743, 0, len(records), 0) + index + b"".join(bodies))


def test_twobit(real_records, tmp_path):
    pytest.importorskip("py2bit")
    path = tmp_path / "two.2bit"
    _write_2bit(path, [("chr16", real_records[0][1]), ("1", real_records[1][1])])
    reader = open_genome(path)
    assert reader.format == "2bit"
    infos, lengths, seq, runs, masked = _read_all(path, size=77_777)
    assert [(i.name, i.chrom) for i in infos] == [("chr16", "chr16"), ("1", "chr1")]
    assert seq == real_records[0][1] + real_records[1][1]
    assert masked == sum(s.count(c) for _, s in real_records for c in (b"a", b"c", b"g", b"t"))


def test_stream_protocol(shared_file):
    reader = open_genome(shared_file("human/hg38_chr13_chr4_blat_pieces.fa.gz"))
    streams = reader.records()
    first = next(streams)
    chunks = first.chunks(1000)
    next(chunks)
    with pytest.raises(RuntimeError):
        first.chunks()
    second = next(streams)  # skipping the rest of the first record is allowed
    assert first.length == 55_989 and second.info.chrom == "chr4"
    data = np.concatenate(list(second.chunks()))
    data[0] = ord("A")  # chunks are writable arrays
    assert second.length == 5_685
    with pytest.raises(StopIteration):
        next(streams)
    # records() restarts from the beginning
    assert [s.info.name for s in reader.records()] == ["chr13:75549820-75605809", "chr4:41257605-41263290"]


def _consume(path: Path) -> None:
    for stream in open_genome(path).records():
        offset = 0
        for chunk in stream.chunks():
            genome.check_characters(chunk, stream.info, offset)
            offset += chunk.size


def _error(path: Path) -> InputError:
    with pytest.raises(InputError) as err:
        _consume(path)
    assert err.value.where and err.value.fix, "every error says where and what to do"
    return err.value


def test_missing_file_and_directory(tmp_path):
    assert "not found" in str(_error(tmp_path / "nope.fa"))
    assert "directory" in str(_error(tmp_path))


@pytest.mark.parametrize(
    "content, expected",
    [
        (b"", "empty"),
        (b"\n\n  \r\n", "empty"),
        (bytes(range(256)) * 64, "binary"),
        (b"<!DOCTYPE html>\n<html><body>404 Not Found</body></html>\n", "HTML"),
        (b"ACGTACGT\nACGT\n>chr1\nACGT\n", "sequence before the first '>' header"),
        (b"track name=x\nchr1\t0\t10\n", "not a FASTA"),
        (b">chr1\nACGT\n>chr2\n>chr3\nACGT\n", "empty record"),
        (b">chr1\nACGT\n>chr2\n\n", "empty record"),
        (b">chr1\nACGT\n>chr2\nAC\n>chr1\nGG\n", "duplicate record name 'chr1'"),
        (b">\nACGT\n", "no name"),
        (b"BZh91AY&SY" + bytes(40), "bzip2"),
    ],
)
def test_bad_files(tmp_path, content, expected):
    path = tmp_path / "bad.fa"
    path.write_bytes(content)
    err = _error(path)
    assert expected in str(err) and str(path) in str(err)


def test_bad_content_inside_gzip(tmp_path):
    path = tmp_path / "html.fa.gz"
    path.write_bytes(gzip.compress(b"<html><head><title>Error</title></head></html>"))
    assert "HTML" in str(_error(path))
    path.write_bytes(gzip.compress(b""))
    assert "empty" in str(_error(path))


def test_truncated_gzip(shared_file, tmp_path):
    original = shared_file("human/GRCh37_chr22_20000001-21000000.fa.gz").read_bytes()
    cut = tmp_path / "cut.fa.gz"
    cut.write_bytes(original[: len(original) // 2])
    assert "truncated" in str(_error(cut))
    bgzf = shared_file("human/hg38_chr2_1-2333275.fa.gz").read_bytes()
    cut.write_bytes(bgzf[: len(bgzf) // 2])
    assert "cut short" in str(_error(cut))


def test_bgzip_cut_exactly_at_a_block_boundary_is_refused(shared_file, tmp_path):
    bgzf = shared_file("human/hg38_chr2_1-2333275.fa.gz").read_bytes()
    # Walk the BGZF blocks (each header stores its total size minus one at bytes 16-17) and stop halfway.
    offset, boundaries = 0, []
    while offset < len(bgzf):
        offset += int.from_bytes(bgzf[offset + 16: offset + 18], "little") + 1
        boundaries.append(offset)
    cut = tmp_path / "cut.fa.gz"
    cut.write_bytes(bgzf[: boundaries[len(boundaries) // 2]])
    assert gzip.decompress(cut.read_bytes())  # inflates cleanly: only the missing end-of-file block shows the cut
    assert "no end-of-file block" in str(_error(cut))


def test_corrupt_gzip(shared_file, tmp_path):
    data = bytearray(shared_file("other/lambda_phage_NC_001416.1.fa.gz").read_bytes())
    data[len(data) // 2 : len(data) // 2 + 64] = bytes(64)
    bad = tmp_path / "corrupt.fa.gz"
    bad.write_bytes(bytes(data))
    assert "corrupt gzip" in str(_error(bad))
    bad.write_bytes(gzip.compress(b">chr1\nACGT\n") + b"garbage after the end")
    assert "after the end" in str(_error(bad))
    bad.write_bytes(gzip.compress(b">chr1\nACGT\n") + bytes(100))  # zero padding is tolerated
    _consume(bad)


@pytest.mark.parametrize(
    "sequence, char, count, position",
    [
        (b"ACGTACGT1ACGT23", "'1'", 3, 9),
        (b"ACGT*", "'*'", 1, 5),
        (b"AC-GT-", "'-'", 2, 3),
        (b"ACGT.NNNN.", "'.'", 2, 5),
        (b"ACGUUACG", "'U'", 2, 4),
        (b"ACGTX", "'X'", 1, 5),
    ],
)
def test_invalid_characters_report_count_and_first_position(tmp_path, sequence, char, count, position):
    path = tmp_path / "bad.fa"
    path.write_bytes(b">ok\nACGTRYKMSWBDHVN\nacgtrykmswbdhvn\n>bad one\n" + sequence[:3] + b"\n" + sequence[3:] + b"\n")
    err = _error(path)
    message = str(err)
    assert f"{count} invalid character(s)" in message and f"the first is {char} at position {position}" in message
    assert "record #2 'bad'" in message
    if char == "'U'":
        assert "RNA" in message


def test_invalid_character_position_counts_across_chunks(shared_file):
    info = genome.RecordInfo(0, "chrZ", "chrZ", "chrZ", 1, "/x.fa")
    chunk = np.frombuffer(b"ACGTN" * 10 + b"#", dtype=np.uint8)
    with pytest.raises(InputError, match=r"at position 1,000,051 "):
        genome.check_characters(chunk, info, 1_000_000)


def test_memory_stays_bounded_on_a_highly_compressible_record(tmp_path):
    """96 Mbp of N gzips to ~100 kB; reading it must never hold the record (or a 4x inflation of a read) whole."""
    import tracemalloc

    path = tmp_path / "gap.fa.gz"
    body = (b"N" * 999 + b"\n") * 96_000
    path.write_bytes(gzip.compress(b">chrUn_gap\n" + body + b">chrM\nACGT\n", compresslevel=1))
    del body
    tracemalloc.start()
    try:
        runs, total = [], 0
        for stream in open_genome(path).records():
            for chunk in stream.chunks(1 << 20):
                runs.append(n_intervals(chunk, total))
                total += chunk.size
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert total == 95_904_000 + 4
    assert merge_intervals(runs).tolist() == [[0, 95_904_000]]
    assert peak < 32 << 20, f"peak {peak / 2**20:.0f} MiB"


def test_chunk_helpers():
    chunk = np.frombuffer(b"NNacgRYsw-NnnACGTbdhvKMN", dtype=np.uint8)
    assert softmask_flags(chunk).tolist() == [c >= ord("a") for c in chunk.tobytes()]
    assert n_intervals(chunk, 100).tolist() == [[100, 102], [110, 113], [123, 124]]
    assert n_intervals(chunk, 0, include_iupac=True).tolist() == [[0, 2], [5, 9], [10, 13], [17, 24]]
    assert n_intervals(np.frombuffer(b"ACGT", np.uint8)).shape == (0, 2)
    assert n_intervals(np.frombuffer(b"nnnn", np.uint8), 5).tolist() == [[5, 9]]
    flags = np.array([1, 1, 0, 1, 0, 0, 1], dtype=bool)
    assert genome.true_runs(flags).tolist() == [[0, 2], [3, 4], [6, 7]]
    assert genome.true_runs(~flags).tolist() == [[2, 3], [4, 6]]
    counts = genome.iupac_counts(chunk)
    assert counts == {"R": 1, "Y": 1, "S": 1, "W": 1, "K": 1, "M": 1, "B": 1, "D": 1, "H": 1, "V": 1}
    assert genome.iupac_counts(np.frombuffer(b"ACGTN", np.uint8)) == dict.fromkeys("RYSWKMBDHV", 0)


def test_damaged_twobit_and_misnamed_files(real_records, tmp_path):
    pytest.importorskip("py2bit")
    good = tmp_path / "good.2bit"
    _write_2bit(good, [("chr16", real_records[0][1])])
    cut = tmp_path / "cut.2bit"
    cut.write_bytes(good.read_bytes()[: good.stat().st_size // 2])
    assert "2bit file is truncated" in str(_error(cut))
    fake = tmp_path / "fake.2bit"
    fake.write_bytes(b">chr1\nACGT\n")
    assert "2bit signature" in str(_error(fake))
    gb = tmp_path / "fake.gb"
    gb.write_bytes(b"ID   X; SV 1; linear; DNA\n")
    assert "LOCUS" in str(_error(gb))
