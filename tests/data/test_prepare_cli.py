"""`genolc prepare` through the CLI: splits, manifest, rerun no-op, BED masks, tokenizers, and every bad input
(one clear message, exit code 2, nothing half-written)."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from genolc.cli import main
from genolc.data.dataset import PreparedDataset
from genolc.tokenize import make_tokenizer

RNG = np.random.default_rng(7)


def random_bases(n: int, rng: np.random.Generator = RNG) -> bytes:
    return np.frombuffer(b"ACGT", dtype=np.uint8)[rng.integers(0, 4, n)].tobytes()


def write_fasta(path: Path, records: list[tuple[str, bytes]], width: int = 60, gz: bool = False) -> Path:
    lines = []
    for header, seq in records:
        lines.append(b">" + header.encode())
        lines.extend(seq[i:i + width] for i in range(0, len(seq), width))
    data = b"\n".join(lines) + b"\n"
    path.write_bytes(gzip.compress(data) if gz else data)
    return path


def run(*args: str | Path):
    result = CliRunner().invoke(main, ["prepare", "--no-progress", *map(str, args)])
    return result


def assert_clean_failure(result, out: Path, *phrases: str) -> None:
    """Exit 2, one 'genolc: error:' line naming the problem, no traceback, no output or temporary left."""
    assert result.exit_code == 2, result.output
    assert "genolc: error:" in result.output and "Traceback" not in result.output
    for phrase in phrases:
        assert phrase.lower() in result.output.lower(), result.output
    assert not out.exists()
    assert not [p for p in out.parent.iterdir() if p.name.startswith(f".{out.name}.")]


@pytest.fixture
def genome_pair(tmp_path: Path) -> tuple[Path, dict[str, bytes]]:
    """chr1, chr2 (train by default) and chr22 (held out by default), soft-mask and N runs included."""
    chr1 = random_bases(90_000)
    chr1 = chr1[:1000] + b"N" * 5000 + chr1[6000:20_000].lower() + chr1[20_000:]
    seqs = {"chr1": chr1, "chr2": random_bases(50_001), "chr22": random_bases(30_000)}
    path = write_fasta(tmp_path / "g.fa.gz", [(k, v) for k, v in seqs.items()], gz=True)
    return path, seqs


def test_default_splits_manifest_files_and_rerun_noop(genome_pair, tmp_path):
    path, seqs = genome_pair
    out = tmp_path / "ds"
    result = run(path, "--out", out)
    assert result.exit_code == 0, result.output
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["splits"] == {"train": ["chr1", "chr2"], "heldout": ["chr22"]}
    assert manifest["format_version"] == 1 and manifest["token_dtype"] == "uint16"
    assert manifest["sources"][0]["path"] == str(path) and manifest["sources"][0]["format"] == "fasta.gz"
    assert manifest["duplication"]["heldout_blocks"] == 30 and manifest["duplication"]["found_in_train"] == 0
    rec = {r["key"]: r for r in manifest["records"]}
    assert rec["chr1"]["length_bases"] == 90_000 and rec["chr1"]["n_bases"] == 5000
    assert rec["chr1"]["softmask_bases"] == 14_000
    import hashlib

    assert rec["chr1"]["md5_upper"] == hashlib.md5(seqs["chr1"].upper()).hexdigest()
    ds = PreparedDataset(out)
    tok = ds.tokenizer
    for key, seq in seqs.items():
        assert bytes(tok.decode(np.asarray(ds.tokens(key)))) == seq.upper()
    assert np.array_equal(ds.nruns("chr1"), [[1000, 6000]])
    soft = ds.token_softmask("chr1", 0, 90_000)
    assert soft.sum() == 14_000 and soft[6000:20_000].all()
    runs = sorted((out / "runs").iterdir())
    assert len(runs) == 1 and json.loads(runs[0].read_text())["status"] == "ok"
    assert str(path.resolve()) in json.loads(runs[0].read_text())["inputs"]

    before = (out / "tokens" / "chr1.bin").stat().st_mtime_ns
    again = run(path, "--out", out)
    assert again.exit_code == 0 and "nothing to do" in again.output
    assert (out / "tokens" / "chr1.bin").stat().st_mtime_ns == before
    # The no-op run is recorded too (run records are named per second, so it may replace the first one).
    assert any(json.loads(r.read_text())["args"].get("no_op") for r in (out / "runs").iterdir())

    # A different option rebuilds in place, keeping earlier run records.
    third = run(path, "--out", out, "--train", "chr1", "--heldout", "none")
    assert third.exit_code == 0, third.output
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["splits"] == {"train": ["chr1"], "heldout": []} and manifest["duplication"] is None
    assert {r["key"]: r["split"] for r in manifest["records"]} == {"chr1": "train", "chr2": "unused", "chr22": "unused"}
    assert not (out / "tokens" / "chr2.bin").exists()
    assert (out / "runs").is_dir() and any((out / "runs").iterdir())


def test_region_headers_aliases_and_train_all(tmp_path):
    a = write_fasta(tmp_path / "a.fa", [("X  gi|224589822|ref|NC_000023.10|", random_bases(3000))])
    b = write_fasta(tmp_path / "b.fa", [("22:20000001-20004000", random_bases(4000)),
                                        ("chr3 42000000 42002999", random_bases(3000)),
                                        ("chrUn_gl000220", random_bases(2000))])
    out = tmp_path / "ds"
    result = run(a, b, "--out", out, "--train", "all", "--heldout", "22")
    assert result.exit_code == 0, result.output
    m = json.loads((out / "manifest.json").read_text())
    rec = {r["key"]: r for r in m["records"]}
    assert m["splits"] == {"train": ["chrX", "chr3"], "heldout": ["chr22"]}
    assert rec["chr22"]["start"] == 20_000_001 and rec["chr22"]["name"] == "22:20000001-20004000"
    assert rec["chr3"]["start"] == 42_000_000 and rec["chrX"]["source"] == 0 and rec["chr3"]["source"] == 1
    assert rec["chrUn_gl000220"]["split"] == "unused" and rec["chrUn_gl000220"]["tokens"] is None
    out2 = tmp_path / "ds2"
    result = run(a, b, "--out", out2, "--train", "all", "--heldout", "none", "--all-records")
    assert result.exit_code == 0, result.output
    assert "chrUn_gl000220" in json.loads((out2 / "manifest.json").read_text())["splits"]["train"]


def test_same_chromosome_in_two_files_gets_unique_keys(tmp_path):
    a = write_fasta(tmp_path / "a.fa", [("chr3", random_bases(2000))])
    b = write_fasta(tmp_path / "b.fa", [("3", random_bases(2000))])
    out = tmp_path / "ds"
    result = run(a, b, "--out", out, "--train", "chr3", "--heldout", "none")
    assert result.exit_code == 0, result.output
    assert PreparedDataset(out).keys("train") == ["chr3", "chr3_2"]


def test_exclude_and_include_bed_tokenized_as_n(tmp_path):
    seq = random_bases(10_000)
    fa = write_fasta(tmp_path / "g.fa", [("chr3 1001 11000", seq)])
    bed = tmp_path / "x.bed"
    bed.write_text("track name=x\nchr3\t2000\t2500\n3\t10900\t20000\n")  # chromosome coordinates, alias '3'
    out = tmp_path / "ds"
    result = run(fa, "--out", out, "--train", "chr3", "--heldout", "none", "--exclude-bed", bed)
    assert result.exit_code == 0, result.output
    ds = PreparedDataset(out)
    rec = ds.record("chr3")
    # Record base 0 is chromosome base 1001 (1-based) = 1000 (0-based).
    assert np.array_equal(ds.nruns("chr3"), [[1000, 1500], [9900, 10_000]])
    assert rec["excluded_bases"] == 600 and rec["n_bases"] == 0
    amb = ds.token_ambiguous("chr3", 0, 10_000)
    assert amb[1000:1500].all() and amb[9900:].all() and amb.sum() == 600
    assert rec["md5_upper"] == __import__("hashlib").md5(seq).hexdigest()  # describes the sequence as read

    inc = tmp_path / "i.bed"
    inc.write_text("chr3\t1100\t1200\n")
    out2 = tmp_path / "ds2"
    result = run(fa, "--out", out2, "--train", "chr3", "--heldout", "none", "--include-bed", inc)
    assert result.exit_code == 0, result.output
    amb = PreparedDataset(out2).token_ambiguous("chr3", 0, 10_000)
    assert not amb[100:200].any() and amb.sum() == 9_900


def test_bpe_learns_from_the_whole_bpe_sample(tmp_path):
    # --bpe-sample used to bound only what prepare read; BPE then kept its own 4 Mbp default, so raising the
    # option past 4 Mbp changed nothing. The option must set BPE's training cap too.
    fa = write_fasta(tmp_path / "g.fa", [("chr1", random_bases(60_000)), ("chr2", random_bases(20_000))])
    result = run(fa, "--out", tmp_path / "ds", "--train", "chr1", "--heldout", "chr2", "--tokenizer", "bpe:64",
                 "--bpe-sample", "30000")
    assert result.exit_code == 0, result.output
    training = json.loads((tmp_path / "ds" / "manifest.json").read_text())["tokenizer"]["training"]
    assert training["max_training_bases"] == 30_000
    assert 29_000 < training["bases_used"] <= 30_000


@pytest.mark.parametrize("spec", ["kmer:3", "bpe:64"])
def test_multi_base_tokenizers_stream_across_chunks(tmp_path, spec):
    from genolc.data.prepare import PrepareConfig, prepare

    seq = random_bases(200_003)
    seq = seq[:70_000] + b"NNNNN" + seq[70_005:150_000].lower() + seq[150_000:]
    fa = write_fasta(tmp_path / "g.fa", [("chr1", seq)])
    out = prepare(PrepareConfig(genomes=(fa,), out=tmp_path / "ds", train=("chr1",), heldout=(), tokenizer=spec,
                                chunk_bases=65_544, progress=False, bpe_sample_bases=100_000))
    ds = PreparedDataset(out)
    ids = np.asarray(ds.tokens("chr1"))
    assert np.array_equal(ids, ds.tokenizer.encode(np.frombuffer(seq, dtype=np.uint8)))
    decoded = bytes(ds.tokenizer.decode(ids))
    # A k-mer holding an N decodes as k Ns; elsewhere the sequence comes back exactly.
    assert len(decoded) == len(seq) and decoded[69_990:70_020].count(b"N") >= 5
    assert decoded[:69_990] + decoded[70_020:] == seq.upper()[:69_990] + seq.upper()[70_020:]
    offsets = ds.token_base_offsets("chr1", 0, len(ids))
    assert offsets[-1] == len(seq) and np.array_equal(np.diff(offsets), ds.tokenizer.token_lengths(ids))
    mid = ds.token_base_offsets("chr1", 5000, 9000)
    assert np.array_equal(mid, offsets[5000:9001])
    soft = ds.token_softmask("chr1", 0, len(ids))
    starts = offsets[:-1]
    assert soft[(starts >= 70_010) & (offsets[1:] <= 149_990)].all() and not soft[starts >= 150_100].any()


def test_duplicated_heldout_refused_unless_forced(tmp_path):
    train = random_bases(60_000)
    held = random_bases(3333) + train[12_345:52_345]  # shifted copy, as from another assembly
    fa = write_fasta(tmp_path / "g.fa", [("chr1", train), ("chr22", held)])
    out = tmp_path / "ds"
    result = run(fa, "--out", out)
    assert_clean_failure(result, out, "held-out 1 kb blocks", "verbatim", "--force")
    forced = run(fa, "--out", out, "--force")
    assert forced.exit_code == 0, forced.output
    dup = json.loads((out / "manifest.json").read_text())["duplication"]
    assert dup["forced"] and dup["heldout_blocks"] == 43 and 0.85 < dup["fraction"] <= 40 / 43


def test_missing_file(tmp_path):
    out = tmp_path / "ds"
    assert_clean_failure(run(tmp_path / "nope.fa.gz", "--out", out), out, "not found", "nope.fa.gz")


@pytest.mark.parametrize("content, phrase", [(bytes(range(256)) * 40, "binary data"),
                                             (b"<!DOCTYPE html>\n<html><body>404</body></html>\n", "HTML")])
def test_not_fasta(tmp_path, content, phrase):
    bad = tmp_path / "genome.fa"
    bad.write_bytes(content)
    out = tmp_path / "ds"
    assert_clean_failure(run(bad, "--out", out), out, "not a genome file", phrase, "genome.fa")


def test_truncated_gzip(tmp_path):
    full = write_fasta(tmp_path / "full.fa.gz", [("chr1", random_bases(200_000))], gz=True)
    cut = tmp_path / "cut.fa.gz"
    cut.write_bytes(full.read_bytes()[: full.stat().st_size // 2])
    out = tmp_path / "ds"
    assert_clean_failure(run(cut, "--out", out, "--train", "all", "--heldout", "none"), out, "truncated")


def test_empty_record(tmp_path):
    fa = tmp_path / "g.fa"
    fa.write_bytes(b">chr1\nACGT\n>chr2\n>chr3\nACGT\n")
    out = tmp_path / "ds"
    assert_clean_failure(run(fa, "--out", out, "--train", "all", "--heldout", "none"), out, "empty", "chr2")


def test_duplicate_names(tmp_path):
    fa = write_fasta(tmp_path / "g.fa", [("chr1", b"ACGT" * 10), ("chr1", b"ACGT" * 10)])
    out = tmp_path / "ds"
    assert_clean_failure(run(fa, "--out", out, "--train", "all", "--heldout", "none"), out, "duplicate", "chr1")


def test_unknown_chromosome_lists_close_matches(tmp_path):
    fa = write_fasta(tmp_path / "g.fa", [("chr21", random_bases(2000)), ("chr22", random_bases(2000))])
    out = tmp_path / "ds"
    result = run(fa, "--out", out, "--train", "chr2l", "--heldout", "chr22")
    assert_clean_failure(result, out, "--train: unknown chromosome", "chr2l", "close matches", "chr21")


def test_defaults_absent_lists_records_found(tmp_path):
    fa = write_fasta(tmp_path / "g.fa", [("K-12-MG1655", random_bases(2000))])
    out = tmp_path / "ds"
    assert_clean_failure(run(fa, "--out", out), out, "chr1,chr2", "K-12-MG1655", "--train")


def test_unwritable_output_dir(tmp_path):
    fa = write_fasta(tmp_path / "g.fa", [("chr1", random_bases(2000))])
    blocker = tmp_path / "a_file"
    blocker.write_text("not a directory")
    result = run(fa, "--out", blocker / "ds", "--train", "all", "--heldout", "none")
    assert result.exit_code == 2 and "genolc: error:" in result.output and "Traceback" not in result.output
    assert "dataset directory" in result.output and blocker.read_text() == "not a directory"


@pytest.mark.skipif(not Path("/proc/self").is_dir(), reason="needs Linux /proc")
def test_output_dir_on_a_file_system_that_refuses_writes(tmp_path):
    # /proc passes a permission check for root yet refuses new directories: still one clean error.
    fa = write_fasta(tmp_path / "g.fa", [("chr1", random_bases(2000))])
    result = run(fa, "--out", "/proc/genolc-test-ds", "--train", "all", "--heldout", "none")
    assert result.exit_code == 2 and "genolc: error:" in result.output and "Traceback" not in result.output
    assert "dataset directory" in result.output and "/proc" in result.output


def test_bed_naming_no_used_record(tmp_path):
    fa = write_fasta(tmp_path / "g.fa", [("chr1", random_bases(3000))])
    other_build = tmp_path / "other.bed"
    other_build.write_text("chrZ\t0\t100\n")
    out = tmp_path / "ds"
    result = run(fa, "--out", out, "--train", "all", "--heldout", "none", "--include-bed", other_build)
    assert_clean_failure(result, out, "--include-bed names none of the records", "chrZ", "every base would be masked")
    empty = tmp_path / "empty.bed"
    empty.write_text("# nothing\n")
    result = run(fa, "--out", out, "--train", "all", "--heldout", "none", "--include-bed", empty)
    assert_clean_failure(result, out, "the file is empty")
    result = run(fa, "--out", out, "--train", "all", "--heldout", "none", "--exclude-bed", other_build)
    assert result.exit_code == 0 and "warning: --exclude-bed names none of the records" in result.output
    assert PreparedDataset(out).record("chr1")["excluded_bases"] == 0


def test_existing_non_dataset_directory_is_not_replaced(tmp_path):
    fa = write_fasta(tmp_path / "g.fa", [("chr1", random_bases(2000))])
    out = tmp_path / "mine"
    out.mkdir()
    (out / "notes.txt").write_text("keep me")
    result = run(fa, "--out", out, "--train", "all", "--heldout", "none")
    assert result.exit_code == 2 and "holds files genolc did not write (notes.txt)" in result.output
    assert [p.name for p in out.iterdir()] == ["notes.txt"] and (out / "notes.txt").read_text() == "keep me"


def test_the_working_directory_is_never_replaced(tmp_path, monkeypatch):
    fa = write_fasta(tmp_path / "g.fa", [("chr1", random_bases(2000))])
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    result = run(fa, "--out", ".", "--train", "all", "--heldout", "none")
    assert result.exit_code == 2 and "the current directory" in result.output
    assert not any(work.iterdir()) and sorted(p.name for p in tmp_path.iterdir()) == ["g.fa", "work"]


def test_a_failed_prepare_removes_the_folders_it_created(tmp_path, monkeypatch):
    fa = write_fasta(tmp_path / "g.fa", [("chr1", random_bases(2000))])
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    result = run(fa, "--train", "chrZ", "--heldout", "none")           # default --out: ./prepared/g
    assert result.exit_code == 2 and "chrZ" in result.output
    assert not any(work.iterdir())
    (work / "mine").mkdir()
    result = run(fa, "--train", "chrZ", "--heldout", "none", "--out", "mine/a/b")
    assert result.exit_code == 2 and "chrZ" in result.output
    assert [p.name for p in work.iterdir()] == ["mine"] and not any((work / "mine").iterdir())


def test_invalid_characters_count_and_first_position(tmp_path):
    seq = bytearray(random_bases(5000))
    seq[1233] = ord("X")
    seq[4000] = ord("*")
    fa = write_fasta(tmp_path / "g.fa", [("chr1", bytes(seq))])
    out = tmp_path / "ds"
    result = run(fa, "--out", out, "--train", "all", "--heldout", "none")
    assert_clean_failure(result, out, "2 invalid character", "1,234")


@pytest.mark.parametrize("train, heldout", [("chr22", "chr22"), ("X,chr1", "chrX"), ("chr1,22", "NC_000022.11")])
def test_heldout_also_in_train(tmp_path, train, heldout):
    fa = write_fasta(tmp_path / "g.fa", [("chr1", random_bases(2000)), ("chr22", random_bases(2000))])
    out = tmp_path / "ds"
    assert_clean_failure(run(fa, "--out", out, "--train", train, "--heldout", heldout), out, "train", "held")


def test_defaults_never_take_what_the_other_option_names(tmp_path):
    fa = write_fasta(tmp_path / "g.fa", [("chr1", random_bases(2000)), ("chr2", random_bases(2000)),
                                         ("chr22", random_bases(2000))])
    out = tmp_path / "ds"
    result = run(fa, "--out", out, "--heldout", "chr2")
    assert result.exit_code == 0, result.output
    assert json.loads((out / "manifest.json").read_text())["splits"] == {"train": ["chr1"], "heldout": ["chr2"]}
    out2 = tmp_path / "ds2"
    assert_clean_failure(run(fa, "--out", out2, "--train", "chr1,chr22"), out2, "default held-out", "--heldout none")


def test_tokenizer_dtype_int32_for_large_vocab(tmp_path):
    fa = write_fasta(tmp_path / "g.fa", [("chr1", random_bases(30_001))])
    out = tmp_path / "ds"
    result = run(fa, "--out", out, "--train", "all", "--heldout", "none", "--tokenizer", "kmer:8")
    assert result.exit_code == 0, result.output
    ds = PreparedDataset(out)
    assert ds.manifest["token_dtype"] == "int32" and ds.tokens("chr1").dtype == np.dtype("<i4")
    assert ds.tokenizer == make_tokenizer("kmer:8")
    assert len(ds.tokens("chr1")) == 30_001 // 8 + 30_001 % 8


def test_iupac_codes_counted_and_masked(tmp_path):
    seq = bytearray(random_bases(4000))
    seq[100], seq[2000], seq[2001] = ord("R"), ord("y"), ord("Y")
    fa = write_fasta(tmp_path / "g.fa", [("chr1", bytes(seq)), ("chr5", b"ACGTRN" * 10)])
    out = tmp_path / "ds"
    result = run(fa, "--out", out, "--train", "chr1", "--heldout", "none")
    assert result.exit_code == 0, result.output
    ds = PreparedDataset(out)
    rec = ds.record("chr1")
    assert rec["iupac"]["R"] == 1 and rec["iupac"]["Y"] == 2 and rec["n_bases"] == 0 and rec["softmask_bases"] == 1
    assert np.array_equal(ds.nruns("chr1"), [[100, 101], [2000, 2002]])
    assert np.array_equal(np.flatnonzero(ds.token_ambiguous("chr1", 0, 4000)), [100, 2000, 2001])
    assert ds.record("chr5")["split"] == "unused" and ds.record("chr5")["iupac"]["R"] == 10


def test_invalid_character_in_an_unused_record(tmp_path):
    fa = write_fasta(tmp_path / "g.fa", [("chr1", random_bases(3000)), ("chr5", b"ACGU" * 10)])
    out = tmp_path / "ds"
    result = run(fa, "--out", out, "--train", "chr1", "--heldout", "none")
    assert_clean_failure(result, out, "10 invalid character", "position 4", "RNA")
