"""The fast prepare path (ISA-L inflate in a read-ahead thread, md5 and writes in a background thread, the
two-bases-at-a-time lookup table, the '>'-only header search) writes byte for byte what the reference path writes
(zlib, everything inline in one thread, one lookup per base) on real DNA; and prepare never imports torch."""

from __future__ import annotations

import gzip
import hashlib
import json
import subprocess
import sys
import zlib
from pathlib import Path

import numpy as np
import pytest

from conftest import REPO_ROOT
from genolc.data import _fasta, prepare_record
from genolc.data.prepare import PrepareConfig, prepare


class _InlineWorker:
    """The reference path: every call runs at once, in the caller's thread."""

    def submit(self, call, *args):
        call(*args)

    def wait(self):
        pass

    def shutdown(self):
        pass


def _reference_path(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_fasta, "_inflate_lib", zlib)
    monkeypatch.setattr(_fasta, "_read_ahead", lambda blocks: blocks)
    monkeypatch.setattr(_fasta, "_next_header_line", lambda buf, pos: buf.find(b"\n>", pos))
    monkeypatch.setattr(prepare_record, "_pair_table", lambda table: None)
    monkeypatch.setattr(prepare_record, "_SerialWorker", _InlineWorker)


def _dataset_files(root: Path) -> dict[str, str]:
    """md5 of every file of a dataset but its run records (which hold times), by relative path."""
    return {str(p.relative_to(root)): hashlib.md5(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file() and "runs" not in p.relative_to(root).parts}


@pytest.mark.parametrize("tokenizer", ["char", "kmer:6", "bpe:256"])
def test_fast_path_writes_what_the_reference_path_writes(tokenizer, shared_file, tmp_path, monkeypatch):
    # Yeast: 16 soft-masked records; chr22 piece: long N runs, cut at a held-out region; odd-length records and
    # a chunk size that is not a multiple of the line width exercise every carry across chunk edges. BPE encodes
    # ~1 Mbp/s here, so it gets the small genomes only.
    first = "other/lambda_phage_NC_001416.1.fa.gz" if tokenizer.startswith("bpe") \
        else "other/Scerevisiae_S288C_R64_16chr.fa.gz"
    genomes = (shared_file(first), shared_file("human/GRCh37_chr22_20000001-21000000.fa.gz"))
    options = dict(genomes=genomes, train="all", heldout=("chr22:20200001-20400000",), tokenizer=tokenizer,
                   all_records=True, force=True, chunk_bases=(1 << 20) + 8, bpe_sample_bases=200_000,
                   progress=False)
    assert _fasta.INFLATE_LIBRARY == "isal"
    fast = prepare(PrepareConfig(out=tmp_path / "fast", **options))
    _reference_path(monkeypatch)
    reference = prepare(PrepareConfig(out=tmp_path / "reference", **options))

    fast_files, reference_files = _dataset_files(fast), _dataset_files(reference)
    assert len(fast_files) > 3 * 3 and fast_files == reference_files
    fast_manifest = json.loads((fast / "manifest.json").read_text())
    assert fast_manifest == json.loads((reference / "manifest.json").read_text())
    # An independent check of one record: its tokens are the tokenizer's encoding of the upper-cased sequence.
    from Bio import SeqIO

    with gzip.open(genomes[0], "rt") as fh:
        first = next(SeqIO.parse(fh, "fasta"))
    bases = np.frombuffer(str(first.seq).upper().encode(), dtype=np.uint8)
    record = fast_manifest["records"][0]
    assert record["md5_upper"] == hashlib.md5(bases.tobytes()).hexdigest()
    from genolc.tokenize import load_tokenizer

    expected = np.asarray(load_tokenizer(fast / "tokenizer.json").encode(bases))
    written = np.fromfile(fast / record["tokens"], dtype=fast_manifest["token_dtype"])
    np.testing.assert_array_equal(written, expected)


def test_pair_table_lookup_equals_one_lookup_per_base():
    table = (np.arange(256, dtype=np.uint16) * 7 + 3) % 1000
    pairs = prepare_record._pair_table(table.astype("<u2"))
    rng = np.random.default_rng(0)
    for n in (0, 1, 2, 3, (1 << 17) + 1):
        seq = rng.integers(0, 256, n, dtype=np.uint8)
        ids = np.empty(n, dtype="<u2")
        even = n // 2 * 2
        if even:
            np.take(pairs, seq[:even].view("<u2"), out=ids[:even].view("<u4"))
        ids[even:] = table[seq[even:]]
        np.testing.assert_array_equal(ids, table[seq])


def test_read_ahead_raises_the_inflate_error_and_stops_when_closed(tmp_path):
    whole = tmp_path / "whole.fa.gz"
    whole.write_bytes(gzip.compress(b">a\n" + b"ACGT\n" * 3_000_000))
    blocks = _fasta.gzip_blocks(whole)
    assert next(blocks)
    blocks.close()
    cut = tmp_path / "cut.fa.gz"
    cut.write_bytes(whole.read_bytes()[:-4096])
    with pytest.raises(_fasta.InputError, match="truncated"):
        for _ in _fasta.gzip_blocks(cut):
            pass


def test_prepare_does_not_import_torch(shared_file, tmp_path):
    genome = shared_file("other/lambda_phage_NC_001416.1.fa.gz")
    script = ("import sys; from genolc.cli import main\n"
              "try:\n    main([" + ", ".join(repr(a) for a in [
                  "prepare", str(genome), "-o", str(tmp_path / "ds"), "--train", "all", "--heldout", "none",
                  "--no-progress"]) + "])\n"
              "except SystemExit as exit:\n    assert not exit.code, exit.code\n"
              "print('torch' in sys.modules)\n")
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=tmp_path,
                            env={"PYTHONPATH": str(REPO_ROOT), "PATH": "/usr/bin:/bin"}, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip().splitlines()[-1] == "False"
    run = json.loads(next((tmp_path / "ds" / "runs").glob("*.json")).read_text())
    assert run["host"]["torch"]


def test_without_isal_inflate_falls_back_to_zlib(shared_file):
    genome = shared_file("other/lambda_phage_NC_001416.1.fa.gz")
    script = ("import sys; sys.modules['isal'] = None\n"
              "from genolc.data import _fasta, genome\n"
              f"stream = next(genome.open_genome({str(genome)!r}).records())\n"
              "print(_fasta.INFLATE_LIBRARY, sum(len(c) for c in stream.chunks(1 << 16)))\n")
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                            env={"PYTHONPATH": str(REPO_ROOT), "PATH": "/usr/bin:/bin"}, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["zlib", "48502"]
