"""`genolc prepare` on the real DNA in ../shared/data: every file's lengths, md5 of the upper-cased sequence and
N / soft-mask shares match ../shared/data/README.md (parsed here, nothing copied), and the default recipe with
chr22 held out runs end to end."""

from __future__ import annotations

import hashlib
import json

import numpy as np
import pytest
from click.testing import CliRunner

from conftest import SHARED_DATA
from genolc.cli import main
from genolc.data.dataset import PreparedDataset


def readme_rows() -> list[dict[str, str]]:
    """The README's file table as dicts keyed by its column headers."""
    readme = SHARED_DATA / "README.md"
    if not readme.is_file():
        return []
    header: list[str] | None = None
    rows = []
    for line in readme.read_text().splitlines():
        if not line.startswith("|"):
            header = None if not rows else header
            continue
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if header is None:
            header = cells
        elif not set("".join(cells)) <= set("-: "):
            rows.append(dict(zip(header, cells)))
    return [r for r in rows if r.get("file", "").startswith(("human/", "other/"))]


ROWS = readme_rows()


def _number(text: str) -> float:
    return float(text.replace(",", "").replace("%", ""))


def test_readme_lists_files(shared_data):
    assert len(ROWS) >= 10, "README.md table not found or not parsed"
    for column in ("file", "length bp", "N %", "soft-masked %", "md5_seq"):
        assert column in ROWS[0]


@pytest.mark.parametrize("row", ROWS, ids=[r["file"] for r in ROWS])
def test_prepare_matches_readme(row, shared_file, tmp_path):
    genome = shared_file(row["file"])
    out = tmp_path / "ds"
    result = CliRunner().invoke(main, ["prepare", str(genome), "--out", str(out), "--train", "all",
                                       "--heldout", "none", "--all-records", "--no-progress"])
    assert result.exit_code == 0, result.output
    ds = PreparedDataset(out)
    records = ds.manifest["records"]
    assert all(r["split"] == "train" for r in records)
    length = sum(r["length_bases"] for r in records)
    assert length == int(_number(row["length bp"]))
    if len(records) == 1:
        assert records[0]["md5_upper"] == row["md5_seq"]
    # Records joined in file order, read back from the token files: checks the tokens, not only the manifest.
    assert not any(sum(r["iupac"].values()) for r in records), "IUPAC codes decode as N; md5 would not apply"
    digest = hashlib.md5()
    for r in records:
        ids = np.asarray(ds.tokens(r["key"]))
        assert len(ids) == r["length_tokens"] == r["length_bases"]
        digest.update(ds.tokenizer.decode(ids).tobytes())
    assert digest.hexdigest() == row["md5_seq"]
    n_pct = 100.0 * sum(r["n_bases"] for r in records) / length
    soft_pct = 100.0 * sum(r["softmask_bases"] for r in records) / length
    assert abs(n_pct - _number(row["N %"])) <= 0.05
    assert abs(soft_pct - _number(row["soft-masked %"])) <= 0.05


def test_default_recipe_chr22_heldout(shared_file, tmp_path):
    chr22 = shared_file("human/GRCh37_chr22_20000001-21000000.fa.gz")
    chrx = shared_file("human/GRCh37_chrX_1-69999930.fa.gz")
    chr2 = shared_file("human/hg38_chr2_1-2333275.fa.gz")
    out = tmp_path / "ds"
    args = ["prepare", str(chrx), str(chr2), str(chr22), "--out", str(out), "--train", "X,chr2", "--no-progress"]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 0, result.output
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["splits"] == {"train": ["chrX", "chr2"], "heldout": ["chr22"]}
    assert [s["format"] for s in manifest["sources"]] == ["fasta.gz", "fasta.bgz", "fasta.gz"]
    for source, path in zip(manifest["sources"], (chrx, chr2, chr22)):
        assert source["path"] == str(path) and source["size"] == path.stat().st_size and len(source["md5"]) == 32
    rec = {r["key"]: r for r in manifest["records"]}
    assert rec["chr22"]["start"] == 20_000_001 and rec["chr22"]["name"] == "22:20000001-21000000"
    assert rec["chrX"]["description"].startswith("X  gi|") and rec["chr2"]["source"] == 1
    dup = manifest["duplication"]
    # 10% of the chr22 piece is N, so 900 of its 1000 blocks are eligible; none occurs in chrX or chr2.
    assert dup["block_bases"] == 1000 and 850 <= dup["heldout_blocks"] <= 900 and dup["found_in_train"] == 0
    assert manifest["tokenizer"]["kind"] == "char" and (out / "tokenizer.json").is_file()
    for r in rec.values():
        assert set(r) >= {"key", "name", "description", "chrom", "start", "source", "split", "length_bases",
                          "length_tokens", "md5_upper", "n_bases", "softmask_bases", "iupac", "tokens",
                          "softmask", "nruns"}
        assert (out / r["tokens"]).stat().st_size == 2 * r["length_tokens"]
        assert (out / r["softmask"]).stat().st_size == -(-r["length_bases"] // 8)
        nruns = np.load(out / r["nruns"])
        assert int((nruns[:, 1] - nruns[:, 0]).sum()) == r["n_bases"]
    assert rec["chr2"]["softmask_bases"] > 0
    ds = PreparedDataset(out)
    assert ds.token_softmask("chr2", 0, rec["chr2"]["length_tokens"]).sum() == rec["chr2"]["softmask_bases"]

    again = CliRunner().invoke(main, args)
    assert again.exit_code == 0 and "nothing to do" in again.output


LAMBDA = "other/lambda_phage_NC_001416.1.fa.gz"
LAMBDA_MD5 = "509bdb356475a21077713babc47a4a35"     # ../shared/data/README.md


def _lambda_bases(path) -> bytes:
    import gzip

    with gzip.open(path, "rb") as fh:
        return b"".join(line.strip() for line in fh if not line.startswith(b">"))


def test_the_same_chromosome_in_two_files_is_kept_once_with_a_warning(shared_file, tmp_path):
    lam = shared_file(LAMBDA)
    # The same sequence in another file and format (plain FASTA, 70 bases a line): equal by content, not by bytes.
    bases = _lambda_bases(lam)
    copy = tmp_path / "lambda_copy.fa"
    copy.write_bytes(b">NC_001416.1 copy\n" + b"\n".join(bases[i:i + 70] for i in range(0, len(bases), 70)) + b"\n")
    out = tmp_path / "ds"
    result = CliRunner().invoke(main, ["prepare", str(lam), str(copy), "--out", str(out), "--train", "all",
                                       "--heldout", "none", "--no-progress"])
    assert result.exit_code == 0, result.output
    assert "given twice with identical sequence" in result.output
    assert str(lam) in result.output and str(copy) in result.output and "kept once as NC_001416.1" in result.output
    ds = PreparedDataset(out)
    (record,) = ds.manifest["records"]
    assert record["key"] == "NC_001416.1" and record["md5_upper"] == LAMBDA_MD5 and record["source"] == 0
    assert record["also_in"] == [{"source": 1, "name": "NC_001416.1"}]
    assert ds.manifest["splits"]["train"] == ["NC_001416.1"] and len(ds.manifest["sources"]) == 2
    assert sorted(p.name for p in (out / "tokens").iterdir()) == ["NC_001416.1.bin"]


def test_the_same_chromosome_name_with_another_sequence_is_kept_under_a_new_key(shared_file, tmp_path):
    lam = shared_file(LAMBDA)
    half = tmp_path / "lambda_second_half.fa"
    bases = _lambda_bases(lam)
    half.write_bytes(b">NC_001416.1\n" + bases[len(bases) // 2:] + b"\n")
    out = tmp_path / "ds"
    result = CliRunner().invoke(main, ["prepare", str(lam), str(half), "--out", str(out), "--train", "all",
                                       "--heldout", "none", "--no-progress"])
    assert result.exit_code == 0, result.output
    assert "name a chromosome already read, with a different sequence" in result.output
    assert f"'NC_001416.1' in {half} is kept as NC_001416.1_2" in result.output and str(lam) in result.output
    ds = PreparedDataset(out)
    assert ds.manifest["splits"]["train"] == ["NC_001416.1", "NC_001416.1_2"]
    assert ds.record("NC_001416.1")["md5_upper"] == LAMBDA_MD5
    assert ds.record("NC_001416.1_2")["length_bases"] == len(bases) - len(bases) // 2
    assert "also_in" not in ds.record("NC_001416.1")


def test_distinct_chromosomes_give_no_repeat_warning(shared_file, tmp_path):
    out = tmp_path / "ds"
    result = CliRunner().invoke(main, ["prepare", str(shared_file(LAMBDA)),
                                       str(shared_file("human/hg38_chr13_chr4_blat_pieces.fa.gz")), "--out", str(out),
                                       "--train", "all", "--heldout", "none", "--no-progress"])
    assert result.exit_code == 0, result.output
    assert "warning" not in result.output


def test_a_chromosome_cut_at_a_heldout_region_given_twice_is_kept_once_piece_by_piece(shared_file, tmp_path):
    lam = shared_file(LAMBDA)
    bases = _lambda_bases(lam)
    copy = tmp_path / "lambda_copy.fa"
    copy.write_bytes(b">NC_001416.1 copy\n" + bases + b"\n")
    other = tmp_path / "lambda_mutated.fa"
    mutated = bytearray(bases)
    mutated[40_000] = ord("A") if mutated[40_000] != ord("A") else ord("C")     # outside the region: one piece differs
    other.write_bytes(b">NC_001416.1\n" + bytes(mutated) + b"\n")
    out = tmp_path / "ds"
    result = CliRunner().invoke(main, ["prepare", str(lam), str(copy), str(other), "--out", str(out),
                                       "--train", "all", "--heldout", "NC_001416.1:10001-20000", "--no-progress"])
    assert result.exit_code == 0, result.output
    pieces = ["NC_001416.1_1-10000", "NC_001416.1_10001-20000", f"NC_001416.1_20001-{len(bases)}"]
    assert f"kept once as {', '.join(pieces)}" in result.output and str(copy) in result.output
    ds = PreparedDataset(out)
    kept = [r for r in ds.manifest["records"] if r["source"] == 0]
    assert [r["key"] for r in kept] == pieces
    assert all(r["also_in"] == [{"source": 1, "name": "NC_001416.1"}] for r in kept)
    # a copy that differs in one piece is kept whole, under new keys, with the other warning
    renamed = [r for r in ds.manifest["records"] if r["source"] == 2]
    assert [r["key"] for r in renamed] == [f"{k}_2" for k in pieces] and not any("also_in" in r for r in renamed)
    assert f"'NC_001416.1' in {other} is kept as {', '.join(f'{k}_2' for k in pieces)}" in result.output
    assert not any(r["source"] == 1 for r in ds.manifest["records"])
    written = sorted(p.name for p in (out / "tokens").iterdir())
    assert written == sorted(f"{k}{suffix}.bin" for k in pieces for suffix in ("", "_2"))
    assert ds.manifest["splits"]["heldout"] == [pieces[1], f"{pieces[1]}_2"]
