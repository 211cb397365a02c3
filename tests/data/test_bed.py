"""BED reading: 0-based half-open intervals, skipped header/comment lines, aliases, merging, and bad lines."""

from __future__ import annotations

import gzip

import numpy as np
import pytest

from genolc.data import genome
from genolc.data.bed import read_bed
from genolc.errors import InputError


def test_read_bed_skips_headers_resolves_aliases_and_merges(tmp_path):
    path = tmp_path / "regions.bed"
    path.write_text(
        "browser position chr22:1-1000\n"
        'track name="gaps" description="test"\n'
        "# a comment\n"
        "\n"
        "chr22\t100\t200\tgap1\t0\t+\n"
        "22\t150\t250\n"
        "NC_000022.11\t250\t300\n"  # touches the previous one: merged
        "chr22\t400\t500\n"
        "X\t0\t10\n"
        "chrX 20 30\n"  # space-separated also accepted
        "chr1_KI270706v1_random\t5\t6\n"
        "chrX\t10\t10\n"  # zero-length: contributes nothing
    )
    bed = read_bed(path)
    assert set(bed) == {"chr22", "chrX", "chr1_KI270706v1_random"}
    assert bed["chr22"].dtype == np.int64 and bed["chr22"].shape == (2, 2)
    assert bed["chr22"].tolist() == [[100, 300], [400, 500]]
    assert bed["chrX"].tolist() == [[0, 10], [20, 30]]
    assert bed["chr1_KI270706v1_random"].tolist() == [[5, 6]]


def test_read_bed_gzip_and_empty(tmp_path):
    path = tmp_path / "x.bed.gz"
    path.write_bytes(gzip.compress(b"chr2\t5\t9\nchr2\t0\t3\n"))
    assert read_bed(path)["chr2"].tolist() == [[0, 3], [5, 9]]
    empty = tmp_path / "empty.bed"
    empty.write_text("# nothing here\n")
    assert read_bed(empty) == {}


def test_bed_of_real_n_runs_round_trips(shared_file, tmp_path):
    """N runs of the real chr22 piece written as BED (record coordinates) come back unchanged."""
    stream = next(genome.open_genome(shared_file("human/GRCh37_chr22_20000001-21000000.fa.gz")).records())
    offset, parts = 0, []
    for chunk in stream.chunks(100_000):
        parts.append(genome.n_intervals(chunk, offset))
        offset += chunk.size
    runs = genome.merge_intervals(parts)
    path = tmp_path / "nruns.bed"
    path.write_text("".join(f"{stream.info.name.split(':')[0]}\t{a}\t{b}\n" for a, b in runs))
    assert np.array_equal(read_bed(path)["chr22"], runs)


@pytest.mark.parametrize(
    "line, expected",
    [
        ("chr1\t100\n", "needs at least 3"),
        ("chr1\tabc\t200\n", "not whole numbers"),
        ("chr1\t100\t2e5\n", "not whole numbers"),
        ("chr1\t-5\t10\n", "invalid"),
        ("chr1\t300\t200\n", "invalid"),
    ],
)
def test_bad_bed_line_names_file_and_line(tmp_path, line, expected):
    path = tmp_path / "bad.bed"
    path.write_text("track name=x\nchr1\t0\t10\n" + line)
    with pytest.raises(InputError) as err:
        read_bed(path)
    assert expected in str(err.value)
    assert err.value.where == f"{path}:3"
    assert err.value.fix


def test_bed_missing_directory_binary(tmp_path):
    with pytest.raises(InputError, match="not found"):
        read_bed(tmp_path / "missing.bed")
    with pytest.raises(InputError, match="directory"):
        read_bed(tmp_path)
    binary = tmp_path / "binary.bed"
    binary.write_bytes(b"chr1\t0\t10\n\x00\x01\x02")
    with pytest.raises(InputError, match="binary"):
        read_bed(binary)


def test_merge_intervals_unsorted_overlapping():
    parts = [np.array([[50, 60], [0, 10]]), np.array([[5, 20], [20, 25], [70, 71]]), np.empty((0, 2), np.int64)]
    assert genome.merge_intervals(parts).tolist() == [[0, 25], [50, 60], [70, 71]]
    assert genome.merge_intervals([]).shape == (0, 2)
    assert genome.merge_intervals(np.array([[0, 100], [10, 20], [30, 40]])).tolist() == [[0, 100]]
