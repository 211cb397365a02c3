"""genolc score / embed on real DNA (a 40 kb stretch of GRCh37 chr22 behind a region header) with a tiny model:
VCF reading (plain, bgzip), allele splitting and skips, reference checks, strand symmetry, embeddings, determinism."""

from __future__ import annotations

import gzip
import json

import numpy as np
import pytest
from click.testing import CliRunner

from genolc.cli import main
from genolc.errors import InputError
from genolc.tokenize.base import reverse_complement_bases

CHR22 = "human/GRCh37_chr22_20000001-21000000.fa.gz"
REGION_START = 20000001
LENGTH = 40_000
SKIP = 100_000          # start inside the piece, past any leading N run

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def bases(tmp_path_factory) -> bytes:
    from tests.conftest import shared_file

    with gzip.open(shared_file(CHR22), "rb") as fh:
        body = b"".join(line.strip() for line in fh if not line.startswith(b">"))
    piece = body[SKIP:SKIP + LENGTH]
    assert piece.upper().count(b"N") == 0
    return piece


def _write_fasta(path, header: str, seq: bytes, bgzip: bool = False):
    text = f">{header}\n".encode() + b"\n".join(seq[i:i + 60] for i in range(0, len(seq), 60)) + b"\n"
    if bgzip:
        from Bio import bgzf

        with bgzf.BgzfWriter(str(path), "wb") as fh:
            fh.write(text)
    else:
        path.write_bytes(text)
    return path


@pytest.fixture(scope="module")
def genome(bases, tmp_path_factory):
    """A plain FASTA whose header places it at chr22:20,100,001 (GRCh37), named '22' as Ensembl does."""
    folder = tmp_path_factory.mktemp("genome")
    start = REGION_START + SKIP
    return _write_fasta(folder / "chr22_piece.fa", f"22:{start}-{start + LENGTH - 1}", bases)


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    import torch

    from genolc.model import build_model, preset, save_pretrained
    from genolc.tokenize import CharTokenizer

    torch.manual_seed(0)
    tok = CharTokenizer()
    path = tmp_path_factory.mktemp("ckpt") / "tiny"
    save_pretrained(build_model(preset("tiny", vocab_size=tok.vocab_size)), path, tokenizer=tok)
    return path


def _pos(offset: int) -> int:
    """VCF position (chromosome coordinate) of the piece's base at 0-based ``offset``."""
    return REGION_START + SKIP + offset


def _vcf_text(bases: bytes) -> str:
    def base(o):
        return chr(bases[o]).upper()

    other = {"A": "C", "C": "G", "G": "T", "T": "A"}
    rows = [
        ("chr22", _pos(5000), "rs1", base(5000), other[base(5000)]),                       # SNV
        ("22", _pos(6000), "rs2", base(6000), f"{other[base(6000)]},{other[other[base(6000)]]},<DEL>"),  # split 3
        ("chr22", _pos(7000), "ins", base(7000), base(7000) + "ACGT"),                   # insertion
        ("chr22", _pos(8000), "del", base(8000) + base(8001) + base(8002), base(8000)),  # deletion
        ("chr22", _pos(9000), "bad_ref", other[base(9000)], base(9000)),                  # REF mismatch
        ("chr22", _pos(9500), "bnd", base(9500), f"{base(9500)}[chr1:12345["),             # breakend
        ("chr7", 1000, "elsewhere", "A", "G"),                                            # unknown chromosome
        ("chr22", _pos(LENGTH + 10), "beyond", "A", "G"),                                 # outside the reference
    ]
    head = "##fileformat=VCFv4.2\n#CHROM\tPOS\tID\tREF\tALT\tQUAL\tFILTER\tINFO\n"
    return head + "".join(f"{c}\t{p}\t{i}\t{r}\t{a}\t.\tPASS\tDP=10\n" for c, p, i, r, a in rows)


@pytest.fixture(scope="module")
def vcf(bases, tmp_path_factory):
    path = tmp_path_factory.mktemp("vcf") / "variants.vcf"
    path.write_text(_vcf_text(bases))
    return path


def _score(args, expect=0):
    result = CliRunner().invoke(main, ["score", "--no-progress", "--window", "128", *map(str, args)])
    assert result.exit_code == expect, result.output + repr(result.exception)
    return result


def _rows(path):
    lines = path.read_text().splitlines()
    header = lines[0].split("\t")
    return [dict(zip(header, line.split("\t"))) for line in lines[1:]]


def test_statuses_split_and_counts(genome, vcf, checkpoint, tmp_path):
    out = tmp_path / "scores.tsv"
    result = _score(["--vcf", vcf, "--genome", genome, "--checkpoint", checkpoint, "--out", out])
    rows = _rows(out)
    assert [r["ID"] for r in rows] == ["rs1", "rs2", "rs2", "rs2", "ins", "del", "bad_ref", "bnd", "elsewhere",
                                       "beyond"]
    assert [r["ALT_INDEX"] for r in rows[1:4]] == ["1", "2", "3"]
    assert [r["status"] for r in rows] == ["ok", "ok", "ok", "symbolic", "ok", "ok", "ref_mismatch", "symbolic",
                                           "unknown_chrom", "outside"]
    for r in rows:
        assert (r["score"] != "") == (r["status"] == "ok")
        assert r["INFO"] == "DP=10"
    scored = [float(r["score"]) for r in rows if r["status"] == "ok"]
    assert len(set(scored)) == len(scored)      # different variants, different scores
    assert "5 ok" in result.output and "1 ref_mismatch" in result.output and "2 symbolic" in result.output
    assert "chr7" in result.output
    record = json.loads(next((tmp_path / "runs").glob("*score.json")).read_text())
    assert record["status"] == "ok" and record["outputs"]["by_status"]["ok"] == 5
    assert record["outputs"]["forwards"]["shared_ref_windows"] == 1       # rs2's two scored alleles share a REF
    assert record["outputs"]["forwards"]["saved_forward_tokens"] > 0 and "saved by sharing" in result.output


def test_alt_equal_to_ref_is_skipped_with_its_own_status_and_counted(genome, bases, checkpoint, tmp_path):
    """An ALT that is the REF (any case) changes nothing: not scored 0 with status ok, but skipped like the
    other unscorable alleles, in the TSV, the printed counts, the run record and the Python API."""
    import pandas as pd

    from genolc.score.api import load

    ref, other = chr(bases[5000]).upper(), {"A": "C", "C": "G", "G": "T", "T": "A"}[chr(bases[5000]).upper()]
    indel = bytes(bases[7000:7003]).decode().upper()
    same = tmp_path / "same.vcf"
    same.write_text(f"chr22\t{_pos(5000)}\tsnv\t{ref}\t{ref.lower()}\t.\t.\t.\n"
                    f"chr22\t{_pos(5000)}\tmulti\t{ref}\t{other},{ref}\t.\t.\t.\n"
                    f"chr22\t{_pos(7000)}\tmnv\t{indel}\t{indel}\t.\t.\t.\n")
    out = tmp_path / "scores.tsv"
    result = _score(["--vcf", same, "--genome", genome, "--checkpoint", checkpoint, "--out", out])
    rows = _rows(out)
    assert [r["status"] for r in rows] == ["alt_equals_ref", "ok", "alt_equals_ref", "alt_equals_ref"]
    assert [r["score"] == "" for r in rows] == [True, False, True, True]
    assert "3 alt_equals_ref" in result.output and "1 ok" in result.output
    record = json.loads(next((tmp_path / "runs").glob("*score.json")).read_text())
    assert record["outputs"]["by_status"] == {"alt_equals_ref": 3, "ok": 1}

    table = pd.DataFrame({"chrom": ["chr22", "chr22"], "pos": [_pos(5000)] * 2, "ref": [ref, ref],
                          "alt": [ref, other]})
    scored = load(checkpoint, device="cpu").score_variants(table, genome, windows=(128,))
    assert scored["status"].tolist() == ["alt_equals_ref", "ok"]
    assert np.isnan(scored["score"][0]) and np.isfinite(scored["score"][1])


def test_bgzip_vcf_and_bgzip_genome_give_the_same_scores_deterministically(genome, vcf, bases, checkpoint, tmp_path):
    from Bio import bgzf

    plain = tmp_path / "plain.tsv"
    _score(["--vcf", vcf, "--genome", genome, "--checkpoint", checkpoint, "--out", plain])
    packed = tmp_path / "variants.vcf.gz"
    with bgzf.BgzfWriter(str(packed), "wb") as fh:
        fh.write(vcf.read_bytes())
    bgz_genome = _write_fasta(tmp_path / "piece.fa.gz", genome.read_text().split("\n", 1)[0][1:], bases, bgzip=True)
    other = tmp_path / "bgzip.tsv"
    _score(["--vcf", packed, "--genome", bgz_genome, "--checkpoint", checkpoint, "--out", other])
    assert other.read_bytes() == plain.read_bytes()
    again = tmp_path / "again.tsv"
    _score(["--vcf", vcf, "--genome", genome, "--checkpoint", checkpoint, "--out", again])
    assert again.read_bytes() == plain.read_bytes()


def test_vcf_output_carries_the_score_in_info(genome, vcf, checkpoint, tmp_path):
    out, vcf_out = tmp_path / "s.tsv", tmp_path / "s.vcf"
    _score(["--vcf", vcf, "--genome", genome, "--checkpoint", checkpoint, "--out", out, "--vcf-out", vcf_out,
            "--windows", "64,128"])
    rows = _rows(out)
    lines = [line for line in vcf_out.read_text().splitlines() if not line.startswith("#")]
    assert len(lines) == len(rows)
    assert '##INFO=<ID=GENOLC_LLR_64,' in vcf_out.read_text()
    first = lines[0].split("\t")[7]
    assert first == f"DP=10;GENOLC_LLR_64={rows[0]['score_64']};GENOLC_LLR_128={rows[0]['score_128']}"
    assert lines[6].split("\t")[7] == "DP=10;GENOLC_STATUS=ref_mismatch"
    assert rows[0]["score_64"] != rows[0]["score_128"]


def _disk_full_when_placing(monkeypatch, suffix: str) -> None:
    """Make genolc.fsutil's rename of a finished file whose name ends with ``suffix`` fail as on a full disk
    (``monkeypatch.undo()`` puts it back)."""
    import os

    import genolc.fsutil

    real_replace = os.replace

    def disk_full(source, destination):
        if str(destination).endswith(suffix):
            raise OSError(28, "No space left on device")
        return real_replace(source, destination)

    monkeypatch.setattr(genolc.fsutil.os, "replace", disk_full)


def test_score_failed_write_leaves_neither_output_and_a_rerun_works(genome, vcf, checkpoint, tmp_path, monkeypatch):
    """The TSV and the VCF are written together: a run whose VCF cannot be placed is one message (no traceback)
    and leaves no TSV behind (which would make the re-run refuse its output path), nor temporaries."""
    folder = tmp_path / "out"
    folder.mkdir()
    out, vcf_out = folder / "s.tsv", folder / "s.vcf"
    args = ["--vcf", vcf, "--genome", genome, "--checkpoint", checkpoint, "--out", out, "--vcf-out", vcf_out]
    _disk_full_when_placing(monkeypatch, "s.vcf")
    result = _score(args, expect=2)
    assert result.output.count("genolc: error:") == 1 and "cannot write the scores" in result.output
    assert [p.name for p in folder.iterdir()] == []
    monkeypatch.undo()
    _score(args)
    assert sorted(p.name for p in folder.iterdir()) == ["runs", "s.tsv", "s.vcf"]


def test_malformed_line_is_one_message_with_its_line_number_and_no_output(genome, vcf, checkpoint, tmp_path):
    broken = tmp_path / "broken.vcf"
    lines = vcf.read_text().splitlines()
    lines[4] = lines[4].replace("\t", " ", 1).split("\t")[0]          # the 3rd record loses its columns
    broken.write_text("\n".join(lines) + "\n")
    out = tmp_path / "scores.tsv"
    result = _score(["--vcf", broken, "--genome", genome, "--checkpoint", checkpoint, "--out", out], expect=2)
    assert "line 5" in result.output and "Traceback" not in result.output
    assert not out.exists() and not (tmp_path / "runs").exists()      # no run record beside --out either
    result = _score(["--vcf", vcf, "--genome", genome, "--checkpoint", checkpoint, "--out", vcf], expect=2)
    assert "would overwrite the input" in result.output
    bad_pos = tmp_path / "bad_pos.vcf"
    bad_pos.write_text("chr22\tten\t.\tA\tG\t.\t.\t.\n")
    result = _score(["--vcf", bad_pos, "--genome", genome, "--checkpoint", checkpoint, "--out", out], expect=2)
    assert "line 1" in result.output and "POS must be a positive integer" in result.output and not out.exists()


def test_genome_of_other_chromosomes_and_plain_gzip_genome_are_clear_errors(genome, bases, checkpoint, tmp_path):
    elsewhere = tmp_path / "chr7.vcf"
    elsewhere.write_text("chr7\t100\t.\tA\tG\t.\t.\t.\n")
    out = tmp_path / "s.tsv"
    result = _score(["--vcf", elsewhere, "--genome", genome, "--checkpoint", checkpoint, "--out", out], expect=2)
    assert "none of the VCF's chromosomes (chr7) is in the genome" in result.output and not out.exists()
    gz = tmp_path / "piece.fa.gz"
    gz.write_bytes(gzip.compress(genome.read_bytes()))
    ok = tmp_path / "ok.vcf"
    ok.write_text(f"chr22\t{_pos(100)}\t.\t{chr(bases[100]).upper()}\tN\t.\t.\t.\n")
    result = _score(["--vcf", ok, "--genome", gz, "--checkpoint", checkpoint, "--out", out], expect=2)
    assert "not with bgzip" in result.output and "bgzip" in result.output and not out.exists()


def test_score_and_embed_read_the_bundled_sample(checkpoint, tmp_path):
    """The sample genome the demo and the docs use is bgzip with its indexes shipped: score and embed read it as
    it is installed, writing nothing beside it."""
    from genolc.sample import SAMPLE_DIR, sample_files

    shipped = {p.name: p.stat().st_size for p in SAMPLE_DIR.iterdir() if p.name != "__pycache__"}
    for n, path in enumerate(sample_files()):
        with gzip.open(path, "rt") as fh:
            header, *lines = fh.read().splitlines()
        chrom, span = header[1:].split(":")
        first = int(span.split("-")[0])
        sequence = "".join(lines)
        offset = 20_000                                  # past the chr2 piece's leading N run
        ref = sequence[offset].upper()
        alt = {"A": "C", "C": "G", "G": "T", "T": "A"}[ref]
        vcf = tmp_path / f"sample{n}.vcf"
        vcf.write_text(f"{chrom}\t{first + offset}\t.\t{ref}\t{alt}\t.\t.\t.\n")
        out = tmp_path / f"scores{n}.tsv"
        result = _score(["--vcf", vcf, "--genome", path, "--checkpoint", checkpoint, "--out", out])
        assert [r["status"] for r in _rows(out)] == ["ok"], result.output
        bed = tmp_path / f"sample{n}.bed"
        bed.write_text(f"{chrom}\t{first - 1 + offset}\t{first - 1 + offset + 100}\n")
        npy = tmp_path / f"sample{n}.npy"
        result = CliRunner().invoke(main, ["embed", "--no-progress", "--bed", str(bed), "--genome", str(path),
                                           "--checkpoint", str(checkpoint), "--out", str(npy)])
        assert result.exit_code == 0, result.output
        assert np.load(npy).shape[0] == 1
    assert {p.name: p.stat().st_size for p in SAMPLE_DIR.iterdir() if p.name != "__pycache__"} == shipped


@pytest.mark.parametrize("placement", ["center", "causal-end"])
def test_rc_average_is_strand_symmetric(bases, checkpoint, tmp_path, placement):
    """The reverse-complement variant on the reverse-complement genome gets the same --rc-average score."""
    from genolc.score.api import load
    import pandas as pd

    fwd = _write_fasta(tmp_path / "fwd.fa", "chr22", bases)
    rc_bases = reverse_complement_bases(np.frombuffer(bases, dtype=np.uint8)).tobytes()
    rev = _write_fasta(tmp_path / "rev.fa", "chr22", rc_bases)
    offsets = [3000, 12345, 20000, 30001]
    comp = {"A": "T", "C": "G", "G": "C", "T": "A"}
    alt_of = {"A": "G", "C": "T", "G": "A", "T": "C"}
    ref = [chr(bases[o]).upper() for o in offsets]
    forward = pd.DataFrame({"chrom": "chr22", "pos": [o + 1 for o in offsets], "ref": ref,
                            "alt": [alt_of[r] for r in ref]})
    reverse = pd.DataFrame({"chrom": "chr22", "pos": [LENGTH - o for o in offsets], "ref": [comp[r] for r in ref],
                            "alt": [comp[alt_of[r]] for r in ref]})
    model = load(checkpoint, device="cpu")
    kwargs = dict(windows=(151,), placement=placement)
    a = model.score_variants(forward, fwd, rc_average=True, **kwargs)
    b = model.score_variants(reverse, rev, rc_average=True, **kwargs)
    assert list(a.status) == ["ok"] * 4 and list(b.status) == ["ok"] * 4
    np.testing.assert_allclose(a.score, b.score, rtol=1e-5, atol=1e-5)
    one_strand_a = model.score_variants(forward, fwd, rc_average=False, **kwargs).score
    one_strand_b = model.score_variants(reverse, rev, rc_average=False, **kwargs).score
    assert np.max(np.abs(one_strand_a.to_numpy() - one_strand_b.to_numpy())) > 1e-3   # a strand alone differs


def test_score_definition_matches_a_direct_computation(bases, genome, checkpoint):
    """center: flanks of (W - r) // 2 bases; score = sum log p(ALT window) - sum log p(REF window)."""
    import pandas as pd
    import torch

    from genolc.score.api import load

    model = load(checkpoint, device="cpu")
    o, w = 5000, 101
    ref = chr(bases[o]).upper()
    alt = "A" if ref != "A" else "C"
    table = pd.DataFrame({"chrom": ["chr22"], "pos": [_pos(o)], "ref": [ref], "alt": [alt]})
    got = model.score_variants(table, genome, windows=(w,))
    flank = (w - 1) // 2

    def total(seq: bytes) -> float:
        ids = torch.from_numpy(model.tokenizer.encode(np.frombuffer(seq, dtype=np.uint8)).astype(np.int64))[None]
        with torch.no_grad():
            logp = torch.log_softmax(model.model(ids).logits.float(), -1)[0, :-1].gather(-1, ids[0, 1:, None])
        return float(logp.sum())

    left, right = bases[o - flank:o], bases[o + 1:o + 1 + flank]
    expected = total(left + alt.encode() + right) - total(left + ref.encode() + right)
    assert got.score[0] == pytest.approx(expected, abs=1e-4)
    mean = model.score_variants(table, genome, windows=(w,), reduce="mean")
    assert mean.score[0] == pytest.approx(expected / (w - 1), abs=1e-6)


def _bed(tmp_path, lines):
    path = tmp_path / "regions.bed"
    path.write_text("".join(lines))
    return path


def test_embed_shapes_names_layers_and_determinism(genome, checkpoint, tmp_path):
    start = REGION_START + SKIP - 1                                          # BED is 0-based
    bed = _bed(tmp_path, ["track name=x\n", f"chr22\t{start + 100}\t{start + 300}\tpromoter\n",
                          f"22\t{start + 1000}\t{start + 1050}\n"])
    runner = CliRunner()
    base = ["embed", "--no-progress", "--bed", str(bed), "--genome", str(genome), "--checkpoint", str(checkpoint)]
    mean, per_token, layer0, again = (tmp_path / n for n in ("mean.npy", "tok.npy", "l0.npy", "again.npy"))
    for out, extra in ((mean, []), (per_token, ["--pool", "none"]), (layer0, ["--layer", "0"]), (again, [])):
        result = runner.invoke(main, base + ["--out", str(out), *extra])
        assert result.exit_code == 0, result.output + repr(result.exception)
    from genolc.model import load_pretrained

    dim = load_pretrained(checkpoint).config.hidden_size
    assert np.load(mean).shape == (2, dim)
    assert np.load(per_token).shape == (250, dim)
    names = (tmp_path / "tok.npy.names.tsv").read_text().splitlines()
    assert names[1].split("\t")[0] == "promoter" and names[1].endswith("\t0\t200")
    assert names[2].split("\t")[0] == f"22:{start + 1001}-{start + 1050}" and names[2].endswith("\t200\t250")
    np.testing.assert_allclose(np.load(per_token)[:200].mean(axis=0), np.load(mean)[0], rtol=1e-5, atol=1e-6)
    assert np.array_equal(np.load(mean), np.load(again))
    assert not np.allclose(np.load(layer0), np.load(mean))


def test_embed_failed_write_leaves_neither_file_and_a_rerun_works(genome, checkpoint, tmp_path, monkeypatch):
    """The .npy and its names file appear together or not at all: a write that fails after the names file was
    done leaves no names file behind to block the next run, and no temporaries."""
    start = REGION_START + SKIP - 1
    bed = _bed(tmp_path, [f"chr22\t{start + 100}\t{start + 300}\tpromoter\n"])
    folder = tmp_path / "out"
    folder.mkdir()
    out = folder / "regions.npy"
    args = ["embed", "--no-progress", "--bed", str(bed), "--genome", str(genome), "--checkpoint", str(checkpoint),
            "--out", str(out)]
    _disk_full_when_placing(monkeypatch, ".npy")
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 2, result.output + repr(result.exception)
    assert result.output.count("genolc: error:") == 1 and "No space left on device" in result.output
    assert [p.name for p in folder.iterdir()] == []
    monkeypatch.undo()
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 0, result.output + repr(result.exception)
    assert sorted(p.name for p in folder.iterdir()) == ["regions.npy", "regions.npy.names.tsv", "runs"]


def test_embed_long_region_in_chunks_matches_one_forward(genome, checkpoint, tmp_path):
    from genolc.score.api import load
    from genolc.score.embed import HiddenStates

    model = load(checkpoint, device="cpu")
    ids = model.tokenizer.encode(np.frombuffer(genome.read_bytes().split(b"\n", 1)[1].replace(b"\n", b"")[:300],
                                               dtype=np.uint8))[None]
    whole = HiddenStates(model.model, 1, None)(ids)
    chunked = HiddenStates(model.model, 1, 64)(ids)
    np.testing.assert_allclose(chunked, whole, rtol=1e-4, atol=1e-4)


def test_embed_interval_outside_the_chromosome_is_a_clear_error(genome, checkpoint, tmp_path):
    start = REGION_START + SKIP - 1
    bed = _bed(tmp_path, [f"chr22\t{start + 10}\t{start + 20}\n", f"chr22\t{start + LENGTH - 5}\t{start + LENGTH + 5}\n"])
    out = tmp_path / "e.npy"
    result = CliRunner().invoke(main, ["embed", "--no-progress", "--bed", str(bed), "--genome", str(genome),
                                       "--checkpoint", str(checkpoint), "--out", str(out)])
    assert result.exit_code == 2 and f"{bed}:2" in result.output and "outside the reference" in result.output
    assert not out.exists() and not (tmp_path / "e.npy.names.tsv").exists() and not (tmp_path / "runs").exists()


@pytest.mark.parametrize("line", ["chr22\t100\n", "chr22\tabc\t200\n", "chr22\t1_000\t2000\n", "chr22\t\u0663\t9\n",
                                  "chr22\t-5\t10\n", "chr22\t300\t200\n"])
def test_embed_reads_bed_with_the_bed_reader_and_its_messages(tmp_path, line):
    """embed's regions come from genolc.data.bed.bed_lines: each bad line gets read_bed's message and file:line."""
    from genolc.data.bed import read_bed
    from genolc.score.embed import read_regions

    path = _bed(tmp_path, ["track name=x\n", "chr22\t0\t10\tfirst\n", line])
    with pytest.raises(InputError) as from_bed:
        read_bed(path)
    with pytest.raises(InputError) as from_embed:
        read_regions(path)
    assert str(from_embed.value) == str(from_bed.value) and from_embed.value.where == f"{path}:3"
    empty = _bed(tmp_path, ["chr22\t5\t5\n"])
    with pytest.raises(InputError, match="is empty") as err:
        read_regions(empty)
    assert err.value.where == f"{empty}:1"


def test_reference_resolves_aliases_and_region_offsets(genome, bases):
    from genolc.score.reference import Reference

    with Reference(genome) as reference:
        record = reference.locate("NC_000022.10", _pos(0), _pos(9))
        assert record is not None and record.chrom == "chr22" and record.start == _pos(0)
        assert reference.fetch(record, 0, 10).tobytes() == bases[:10]
        assert reference.locate("chr22", _pos(LENGTH - 1), _pos(LENGTH)) is None


@pytest.mark.parametrize("pos,ref,alt,message", [
    (5.7, "A", "G", "POS must be a positive integer, got 5.7"),
    (0, "A", "G", "POS must be a positive integer, got 0"),
    (100, "AX", "G", "REF must be bases (A, C, G, T, N), got 'AX'"),
    (100, "A", "G,T", "ALT allele 1 must be bases, a symbolic allele"),
])
def test_dataframe_rows_get_the_checks_and_messages_of_vcf_lines(tmp_path, pos, ref, alt, message):
    """One set of variant checks: a DataFrame row is refused for what a VCF line is, with the same words."""
    import pandas as pd

    from genolc.score.api import LoadedModel

    vcf = tmp_path / "one.vcf"
    vcf.write_text(f"chr22\t{pos}\t.\t{ref}\t{alt.split(',')[0] + 'X' if ',' in alt else alt}\t.\t.\t.\n")
    table = pd.DataFrame({"chrom": ["chr22"], "pos": [pos], "ref": [ref], "alt": [alt]})
    with pytest.raises(InputError) as from_table:
        LoadedModel(scorer=None, tokenizer=None, checkpoint=tmp_path).score_variants(table, tmp_path / "unused.fa")
    assert message in from_table.value.message and "DataFrame row 0" in from_table.value.message
    from genolc.score.vcf import read_vcf

    with pytest.raises(InputError) as from_vcf:
        read_vcf(vcf)
    assert from_vcf.value.what.split(", got")[0] == from_table.value.what.split(", got")[0]


def test_unreadable_vcf_is_an_input_error(tmp_path):
    from genolc.score.vcf import read_vcf

    empty = tmp_path / "empty.vcf"
    empty.write_text("##fileformat=VCFv4.2\n")
    with pytest.raises(InputError, match="no variant records"):
        read_vcf(empty)


def test_window_cut_at_the_record_start(genome, bases, checkpoint):
    """A variant on the record's first base: causal-end has no upstream (status 'edge'); center keeps one flank."""
    import pandas as pd

    from genolc.score.api import load

    model = load(checkpoint, device="cpu")
    ref = chr(bases[0]).upper()
    table = pd.DataFrame({"chrom": ["chr22"], "pos": [_pos(0)], "ref": [ref], "alt": ["A" if ref != "A" else "C"]})
    causal = model.score_variants(table, genome, windows=(64,), placement="causal-end")
    assert list(causal.status) == ["edge"] and np.isnan(causal.score[0])
    center = model.score_variants(table, genome, windows=(64,), placement="center")
    assert list(center.status) == ["ok"] and np.isfinite(center.score[0])


def test_outputs_never_replace_an_existing_file_or_land_in_the_checkpoint(tmp_path):
    from genolc.errors import ConfigError
    from genolc.score.run import _refuse_overwriting_inputs

    checkpoint = tmp_path / "ckpt"
    checkpoint.mkdir()
    existing = tmp_path / "scores.tsv"
    existing.write_text("MY PRECIOUS")
    with pytest.raises(ConfigError, match="already exists"):
        _refuse_overwriting_inputs([existing], [], checkpoint)
    with pytest.raises(ConfigError, match="into the checkpoint"):
        _refuse_overwriting_inputs([checkpoint / "model.safetensors"], [], checkpoint)
    assert existing.read_text() == "MY PRECIOUS"
    _refuse_overwriting_inputs([tmp_path / "new.tsv"], [], checkpoint)
