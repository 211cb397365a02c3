"""Seeded random ("fuzz") comparison of genome reading and `genolc prepare` against tiny reference parsers.

Every case is generated from ``np.random.default_rng(seed)``; a failure names its seed, so
``_fasta_case(seed)`` / ``_prepare_case(seed)`` / ``_duplication_case(seed)`` reproduce it alone. The references
are written to be obviously right rather than fast: FASTA by ``bytes.split(b"\\n")``, tokens k-mer by k-mer in
Python, masks and N runs from per-base boolean arrays, the duplication share by a set of training blocks and a
scan of every held-out offset.

To reach the edges that real inputs only hit at scale, the reader's block sizes (``_fasta._BLOCK_MAX``,
``_fasta._READ_SIZE``), prepare's chunk size and the BPE offset stride are shrunk to a few bytes per case. The
chunk size is set past ``PrepareConfig``'s validation (its 64 Ki minimum is a user-facing sanity bound, not
something the record pipeline relies on).
"""

from __future__ import annotations

import contextlib
import gzip
import hashlib
import io
import json
import re
from pathlib import Path

import numpy as np
import pytest
from Bio import bgzf

import genolc.data.prepare as prepare_module
import genolc.data.prepare_record as prepare_record_module
from genolc.data import _fasta, genome
from genolc.data.dataset import PreparedDataset
from genolc.data.duplication import TrainBlockIndex, heldout_coverage
from genolc.data.prepare import PrepareConfig, prepare
from genolc.errors import InputError

IUPAC = b"RYSWKMBDHV"
CONTAINERS = ("plain", "gzip", "multi-member gzip", "bgzf")
_ACGT_UPPER = np.frombuffer(b"ACGT", dtype=np.uint8)
_ACGT_LOWER = np.frombuffer(b"acgt", dtype=np.uint8)
_ANY_BASE = np.frombuffer(b"ACGTNacgtn" + IUPAC + IUPAC.lower(), dtype=np.uint8)
_AMBIGUOUS = np.zeros(256, dtype=bool)
_AMBIGUOUS[np.frombuffer(b"Nn" + IUPAC + IUPAC.lower(), dtype=np.uint8)] = True


def random_sequence(rng: np.random.Generator, n: int) -> bytes:
    """Runs of upper ACGT, lower acgt (soft-mask), N, n, single IUPAC codes (either case) and mixed soup."""
    out = bytearray()
    while len(out) < n:
        kind, run = int(rng.integers(0, 10)), int(rng.integers(1, 40))
        if kind < 4:
            out += _ACGT_UPPER[rng.integers(0, 4, run)].tobytes()
        elif kind < 6:
            out += _ACGT_LOWER[rng.integers(0, 4, run)].tobytes()
        elif kind in (6, 7):
            out += (b"N" if kind == 6 else b"n") * run
        elif kind == 8:
            code = IUPAC[int(rng.integers(0, len(IUPAC)))]
            out.append(code if rng.random() < 0.5 else code + 32)
        else:
            out += _ANY_BASE[rng.integers(0, len(_ANY_BASE), run)].tobytes()
    return bytes(out[:n])


def random_header(rng: np.random.Generator, index: int) -> str:
    forms = (
        f"chr{index + 1}",
        f"rec{index}\tdescription with\ttabs",
        f"{index + 1}:{1000 * index + 1}-{1000 * index + 50}",
        f"chr{index + 1} {5 + index} {100 + index}",
        f" seq{index} with a leading space",
        f"s{index}  gi|123|ref|NC_0000{index % 20 + 1:02d}.1| Homo sapiens",
    )
    return forms[int(rng.integers(0, len(forms)))]


def write_fasta(rng: np.random.Generator, records: list[tuple[str, bytes]]) -> bytes:
    """FASTA text with per-record fixed or per-line random widths, LF/CRLF mixed per line, blank lines and stray
    blanks at line ends; the final line may lack its line end."""
    out = bytearray()
    for r, (header, seq) in enumerate(records):
        def eol() -> bytes:
            return b"\r\n" if rng.random() < 0.3 else b"\n"

        if rng.random() < 0.2:
            out += eol()
        out += b">" + header.encode() + eol()
        fixed = rng.random() < 0.4
        width = int(rng.integers(1, 90))
        pos = 0
        while pos < len(seq):
            step = width if fixed else int(rng.integers(1, 90))
            out += seq[pos:pos + step]
            pos += step
            if rng.random() < 0.05:
                out += b" " if rng.random() < 0.5 else b"\t"
            if pos < len(seq) or r < len(records) - 1 or rng.random() < 0.8:
                out += eol()
            if rng.random() < 0.05:
                out += eol()
    return bytes(out)


def write_container(rng: np.random.Generator, data: bytes, container: str, path: Path) -> None:
    if container == "plain":
        path.write_bytes(data)
    elif container == "gzip":
        path.write_bytes(gzip.compress(data, compresslevel=int(rng.integers(1, 10))))
    elif container == "multi-member gzip":
        # Members split anywhere (inside headers, between CR and LF); an empty member now and then.
        cuts = sorted(set(rng.integers(0, len(data) + 1, int(rng.integers(1, 6))).tolist()))
        bounds = [0, *cuts, len(data)]
        path.write_bytes(b"".join(gzip.compress(data[a:b]) for a, b in zip(bounds[:-1], bounds[1:])))
    else:
        with bgzf.BgzfWriter(str(path), "wb") as writer:
            pos = 0
            while pos < len(data):
                step = int(rng.integers(1, 200))
                writer.write(data[pos:pos + step])
                pos += step
                if rng.random() < 0.1:
                    writer.flush()


def reference_parse(data: bytes) -> list[tuple[str, bytes]]:
    """(header without '>', stripped; sequence without line ends and blanks) per record."""
    records: list[list] = []
    for line in data.split(b"\n"):
        if line.startswith(b">"):
            records.append([line[1:].strip().decode(), bytearray()])
        elif line.strip():
            records[-1][1] += line.translate(None, b" \t\r")
    return [(h, bytes(s)) for h, s in records]


def true_runs(mask: np.ndarray) -> list[tuple[int, int]]:
    edges = np.diff(np.r_[0, mask.astype(np.int8), 0])
    return list(zip(np.flatnonzero(edges == 1).tolist(), np.flatnonzero(edges == -1).tolist()))


def reference_tokens_as_text(seq: bytes, spec: str) -> bytes:
    """What decode(tokens) must give: non-ACGT -> N; for k-mers a k-mer holding any non-ACGT base is k Ns."""
    upper = seq.upper()
    if not spec.startswith("kmer"):
        return bytes(b if b in b"ACGT" else ord("N") for b in upper)
    k = int(spec.split(":")[1])
    n_full = len(upper) // k
    out = bytearray()
    for i in range(n_full):
        kmer = upper[i * k:(i + 1) * k]
        out += kmer if all(b in b"ACGT" for b in kmer) else b"N" * k
    out += bytes(b if b in b"ACGT" else ord("N") for b in upper[n_full * k:])
    return bytes(out)


def bed_mask(lines: list[tuple[str, int, int]], chrom: str, length: int, start: int) -> np.ndarray:
    """bool[length]: record bases covered by BED lines of ``chrom`` (chromosome coordinates, record at ``start``)."""
    mask = np.zeros(length, dtype=bool)
    for name, a, b in lines:
        if name == chrom:
            lo, hi = a - (start - 1), b - (start - 1)
            mask[max(lo, 0):max(min(hi, length), 0)] = True
    return mask


def _fasta_case(seed: int, tmp: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    rng = np.random.default_rng(seed)
    records = [(random_header(rng, i), random_sequence(rng, int(rng.integers(1, 400))))
               for i in range(int(rng.integers(1, 5)))]
    data = write_fasta(rng, records)
    assert [s for _, s in reference_parse(data)] == [s for _, s in records], f"seed {seed}: generator"
    container = CONTAINERS[seed % len(CONTAINERS)]
    path = tmp / f"case{seed}.fa"
    write_container(rng, data, container, path)
    monkeypatch.setattr(_fasta, "_BLOCK_MAX", int(rng.integers(1, 64)))
    monkeypatch.setattr(_fasta, "_READ_SIZE", int(rng.integers(1, 64)))
    chunk_size = int(rng.integers(1, 50))
    where = f"seed {seed} ({container}, blocks {_fasta._BLOCK_MAX}/{_fasta._READ_SIZE}, chunks {chunk_size})"

    reader = genome.open_genome(path)
    assert reader.format == {"plain": "fasta", "bgzf": "fasta.bgz"}.get(container, "fasta.gz"), where
    got = []
    for stream in reader.records():
        chunks = list(stream.chunks(chunk_size))
        assert all(len(c) == chunk_size for c in chunks[:-1]), where
        offset, runs, iupac = 0, [], dict.fromkeys(genome.IUPAC_CODES, 0)
        for chunk in chunks:
            runs.append(genome.n_intervals(chunk, offset))
            for code, count in genome.iupac_counts(chunk).items():
                iupac[code] += count
            offset += len(chunk)
        soft = np.concatenate([genome.softmask_flags(c) for c in chunks])
        got.append((stream.info, b"".join(c.tobytes() for c in chunks), genome.merge_intervals(runs), iupac,
                    soft, stream.length))
    expected = reference_parse(data)
    assert len(got) == len(expected), where
    for (info, seq, runs, iupac, soft, length), (header, ref_seq) in zip(got, expected):
        assert info.description == header and info.name == header.split()[0], where
        assert seq == ref_seq and length == len(ref_seq), where
        assert hashlib.md5(seq.upper()).hexdigest() == hashlib.md5(ref_seq.upper()).hexdigest(), where
        arr = np.frombuffer(ref_seq, dtype=np.uint8)
        assert np.array_equal(soft, arr >= ord("a")), where
        assert [tuple(r) for r in runs.tolist()] == true_runs((arr | 0x20) == ord("n")), where
        assert iupac == {c: ref_seq.upper().count(c.encode()) for c in genome.IUPAC_CODES}, where


@pytest.mark.parametrize("block", range(4))
def test_fasta_reader_matches_reference_parser(block, tmp_path, monkeypatch):
    """plain/gzip/multi-member gzip/BGZF, mixed widths, CRLF, blank lines, tiny blocks and chunks: 320 files."""
    for seed in range(block * 80, block * 80 + 80):
        _fasta_case(seed, tmp_path, monkeypatch)


def _random_bed(rng: np.random.Generator, path: Path, spans: list[tuple[str, int, int]]) -> list[tuple[str, int, int]]:
    """Random intervals near each (chrom, record length, record start), some starting before the record."""
    lines = []
    for chrom, length, start in spans:
        for _ in range(int(rng.integers(0, 6))):
            a = max(0, int(rng.integers(-300, length + 10)) + start - 1)
            lines.append((chrom, a, a + int(rng.integers(0, 300))))
    path.write_text("".join(f"{c}\t{a}\t{b}\n" for c, a, b in lines))
    return lines


def _prepare_case(seed: int, tmp: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    rng = np.random.default_rng(seed)
    names = ["chr1", "chr2", "chr22", "chr5"][: int(rng.integers(3, 5))]
    records, starts = [], []
    for name in names:
        length = int(rng.integers(1, 3000))
        start = int(rng.integers(1, 5000)) if rng.random() < 0.3 else 1
        header = f"{name}:{start}-{start + length - 1}" if start > 1 else name + (" desc" if rng.random() < 0.5 else "")
        records.append((header, random_sequence(rng, length)))
        starts.append(start)
    container = CONTAINERS[seed % len(CONTAINERS)]
    spec = ("char", "kmer:3", "kmer:5", "bpe:40")[(seed // 4) % 4]
    path = tmp / f"g{seed}.fa"
    write_container(rng, write_fasta(rng, records), container, path)
    spans = [(n, len(s), st) for n, (_, s), st in zip(names, records, starts)]
    exclude = include = None
    exclude_lines: list = []
    include_lines: list = []
    if rng.random() < 0.35:
        exclude = tmp / f"exclude{seed}.bed"
        exclude_lines = _random_bed(rng, exclude, spans)
    if rng.random() < 0.25:
        include = tmp / f"include{seed}.bed"
        include_lines = _random_bed(rng, include, spans[:3])
    stride = int(rng.integers(1, 50))
    monkeypatch.setattr(prepare_module, "OFFSET_STRIDE", stride)
    monkeypatch.setattr(prepare_record_module, "OFFSET_STRIDE", stride)
    config = PrepareConfig(genomes=(path,), out=tmp / f"out{seed}", train=("chr1", "chr2"), heldout=("chr22",),
                           tokenizer=spec, include_bed=include, exclude_bed=exclude, force=True, progress=False)
    object.__setattr__(config, "chunk_bases", int(rng.integers(1, 300)))
    where = f"seed {seed} ({container}, {spec}, chunks {config.chunk_bases}, stride {stride})"
    try:
        with contextlib.redirect_stderr(io.StringIO()):
            out = prepare(config)
    except InputError as exc:
        # An include BED that happened to draw no interval on a used record is refused by design.
        assert include is not None and "names none of the records used" in str(exc), f"{where}: {exc}"
        return

    manifest = json.loads((out / "manifest.json").read_text())
    ds = PreparedDataset(out)
    k = ds.tokenizer.fixed_bases_per_token
    assert [r["key"] for r in manifest["records"]] == names, where
    for rec, (_, seq), start in zip(manifest["records"], records, starts):
        at = f"{where}, {rec['key']}"
        upper, arr = seq.upper(), np.frombuffer(seq, dtype=np.uint8)
        assert rec["start"] == start and rec["length_bases"] == len(seq), at
        assert rec["md5_upper"] == hashlib.md5(upper).hexdigest(), at
        assert rec["n_bases"] == upper.count(b"N") and rec["softmask_bases"] == int((arr >= ord("a")).sum()), at
        assert rec["iupac"] == {c: upper.count(c.encode()) for c in genome.IUPAC_CODES}, at
        assert rec["split"] == {"chr22": "heldout", "chr5": "unused"}.get(rec["key"], "train"), at
        if rec["split"] == "unused":
            assert rec["tokens"] is None, at
            continue
        masked = bed_mask(exclude_lines, rec["chrom"], len(seq), start)
        if include is not None:
            masked |= ~bed_mask(include_lines, rec["chrom"], len(seq), start)
        assert rec["excluded_bases"] == int(masked.sum()), at
        effective = np.frombuffer(upper, dtype=np.uint8).copy()
        effective[masked] = ord("N")
        ids = np.asarray(ds.tokens(rec["key"]))
        assert ds.tokenizer.decode(ids).tobytes() == reference_tokens_as_text(effective.tobytes(), spec), at
        assert rec["length_tokens"] == len(ids), at
        if k is not None:
            assert len(ids) == len(seq) // k + len(seq) % k, at
            lengths = np.array([k] * (len(seq) // k) + [1] * (len(seq) % k), dtype=np.int64)
        else:
            lengths = ds.tokenizer.token_lengths(ids).astype(np.int64)
        assert [tuple(r) for r in ds.nruns(rec["key"]).tolist()] == true_runs(_AMBIGUOUS[arr] | masked), at
        bits = np.fromfile(out / rec["softmask"], dtype=np.uint8)
        assert np.array_equal(bits, np.packbits(arr >= ord("a"), bitorder="little")), at
        offsets = np.r_[0, np.cumsum(lengths)]
        for _ in range(6):
            lo = int(rng.integers(0, len(ids) + 1))
            hi = int(rng.integers(lo, len(ids) + 1))
            assert np.array_equal(ds.token_base_offsets(rec["key"], lo, hi), offsets[lo:hi + 1]), at
            spans_ = [(int(offsets[i]), int(offsets[i + 1])) for i in range(lo, hi)]
            soft = [int((arr[a:b] >= ord("a")).sum()) * 2 > b - a for a, b in spans_]
            assert ds.token_softmask(rec["key"], lo, hi).tolist() == soft, at
            ambiguous = [bool((effective[a:b] == ord("N")).any() or _AMBIGUOUS[effective[a:b]].any()) for a, b in spans_]
            assert ds.token_ambiguous(rec["key"], lo, hi).tolist() == ambiguous, at


@pytest.mark.parametrize("block", range(2))
def test_prepare_matches_reference(block, tmp_path, monkeypatch):
    """char / kmer:3 / kmer:5 / bpe, random BED include/exclude, region headers, chunks of 1-300 bases: 80 genomes."""
    for seed in range(block * 40, block * 40 + 40):
        _prepare_case(seed, tmp_path, monkeypatch)


def test_invalid_character_position_with_tiny_chunks(tmp_path):
    """The 1-based position of the first invalid character is exact whatever the chunking; nothing is written."""
    alphabet = np.frombuffer(b"ACGTNacgtnRy", dtype=np.uint8)
    for seed in range(40):
        rng = np.random.default_rng(seed)
        seqs = [alphabet[rng.integers(0, len(alphabet), int(rng.integers(2, 500)))].copy() for _ in range(3)]
        r = int(rng.integers(0, 3))
        p = int(rng.integers(1, len(seqs[r])))
        seqs[r][p] = b"UuX*-.0>@\x01"[int(rng.integers(0, 10))]
        names = ["chr1", "chr22", "chrZ"]
        fa = tmp_path / f"bad{seed}.fa"
        fa.write_bytes(b"".join(b">%s\n%s\n" % (n.encode(), s.tobytes()) for n, s in zip(names, seqs)))
        config = PrepareConfig(genomes=(fa,), out=tmp_path / f"out{seed}", train=("chr1",), heldout=("chr22",),
                               tokenizer=("char", "kmer:3")[seed % 2], progress=False)
        object.__setattr__(config, "chunk_bases", int(rng.integers(1, 100)))
        with pytest.raises(InputError) as info:
            prepare(config)
        found = re.search(r"at position ([0-9,]+)", str(info.value))
        assert found and int(found.group(1).replace(",", "")) == p + 1 and names[r] in str(info.value), seed
        assert not (tmp_path / f"out{seed}").exists(), seed


def reference_duplication(train: list[np.ndarray], heldout: np.ndarray) -> tuple[int, int]:
    """(eligible held-out blocks, found) by the manifest's definition, brute force.

    Training blocks: grid-aligned 1000-base blocks of each train record holding only A/C/G/T (case ignored; N, IUPAC
    and BED-excluded bases, which the callers write as N, disqualify a block). Eligible held-out blocks: grid
    blocks of the held-out record holding only A/C/G/T. Found: every base of the block lies in some 1000-base
    window of the held-out record that equals a training block.
    """
    plain = np.zeros(256, dtype=bool)
    plain[_ACGT_UPPER] = True
    blocks = set()
    for record in train:
        upper = record.tobytes().upper()
        for j in range(len(upper) // 1000):
            block = upper[j * 1000:(j + 1) * 1000]
            if plain[np.frombuffer(block, dtype=np.uint8)].all():
                blocks.add(block)
    upper = heldout.tobytes().upper()
    covered = np.zeros(len(upper), dtype=bool)
    for s in range(len(upper) - 999):
        if upper[s:s + 1000] in blocks:
            covered[s:s + 1000] = True
    eligible = found = 0
    for j in range(len(upper) // 1000):
        if plain[np.frombuffer(upper[j * 1000:(j + 1) * 1000], dtype=np.uint8)].all():
            eligible += 1
            found += bool(covered[j * 1000:(j + 1) * 1000].all())
    return eligible, found


def _duplication_case(seed: int, tmp: Path) -> None:
    rng = np.random.default_rng(seed)
    t1 = _ACGT_UPPER[rng.integers(0, 4, int(rng.integers(1000, 12000)))].copy()
    t2 = _ACGT_UPPER[rng.integers(0, 4, int(rng.integers(100, 5000)))].copy()
    held = _ACGT_UPPER[rng.integers(0, 4, int(rng.integers(1000, 15000)))].copy()
    planted, free = [], 0
    for _ in range(int(rng.integers(0, 4))):
        source = t1 if rng.random() < 0.7 else t2
        if len(source) < 200 or len(held) - free < 300:
            break
        length = int(rng.integers(200, min(len(source), 6000, len(held) - free) + 1))
        a = int(rng.integers(0, len(source) - length + 1))
        o = int(rng.integers(free, len(held) - length + 1))
        held[o:o + length] = source[a:a + length]
        planted.append((a, o, length))
        free = o + length
    verbatim_blocks = sum(max(0, (o + n) // 1000 - -(-o // 1000)) for _, o, n in planted)
    decorated = rng.random() < 0.5
    if decorated:
        for arr in (t1, t2, held):
            p = int(rng.integers(0, len(arr)))
            arr[p:p + int(rng.integers(1, 300))] |= 0x20
            if rng.random() < 0.4:
                p = int(rng.integers(0, len(arr)))
                arr[p:p + int(rng.integers(1, 50))] = ord("N")
            if rng.random() < 0.4:
                arr[int(rng.integers(0, len(arr)))] = ord("R")
    exclude, masked_t1, masked_held = None, t1, held
    if rng.random() < 0.3:
        lines = []
        for chrom, arr in (("chr1", t1), ("22", held)):
            for _ in range(int(rng.integers(1, 3))):
                a = int(rng.integers(0, len(arr)))
                lines.append((chrom, a, a + int(rng.integers(1, 400))))
        exclude = tmp / f"dup{seed}.bed"
        exclude.write_text("".join(f"{c}\t{a}\t{b}\n" for c, a, b in lines))
        masked_t1, masked_held = t1.copy(), held.copy()
        for chrom, a, b in lines:
            (masked_t1 if chrom == "chr1" else masked_held)[a:b] = ord("N")
    expected = reference_duplication([masked_t1, t2], masked_held)
    where = f"seed {seed}, planted (train start, held-out start, length) {planted}"
    if not decorated and exclude is None:
        # Random sequence: found blocks are those inside planted stretches, at most one lost at each end.
        assert verbatim_blocks - 2 * len(planted) <= expected[1] <= verbatim_blocks, where

    fa = tmp / f"dup{seed}.fa"
    fa.write_bytes(b">chr1\n%s\n>chr2\n%s\n>chr22\n%s\n" % (t1.tobytes(), t2.tobytes(), held.tobytes()))
    config = PrepareConfig(genomes=(fa,), out=tmp / f"dup_out{seed}", exclude_bed=exclude, force=True, progress=False)
    object.__setattr__(config, "chunk_bases", int(rng.integers(1, 3000)))
    with contextlib.redirect_stderr(io.StringIO()):
        out = prepare(config)
    dup = json.loads((out / "manifest.json").read_text())["duplication"]
    assert (dup["heldout_blocks"], dup["found_in_train"]) == expected, where
    assert dup["fraction"] == (round(expected[1] / expected[0], 6) if expected[0] else 0.0), where

    # The same through the index directly, with uneven chunks and a small heldout_coverage step.
    index = TrainBlockIndex()
    for record in (masked_t1, t2):
        index.start_record()
        upper = np.frombuffer(record.tobytes().upper(), dtype=np.uint8)
        pos = 0
        while pos < len(upper):
            chunk = upper[pos:pos + int(rng.integers(1, 2500))]
            bad = np.array([(i, i + 1) for i in np.flatnonzero(_AMBIGUOUS[chunk])], dtype=np.int64).reshape(-1, 2)
            index.add(chunk, bad)
            pos += len(chunk)
    held_upper = np.frombuffer(masked_held.tobytes().upper(), dtype=np.uint8)
    step = 1000 * int(rng.integers(1, 6))
    assert heldout_coverage(lambda lo, hi: held_upper[lo:hi], len(held_upper), index, step=step) == expected, where


def test_duplication_fraction_matches_brute_force(tmp_path):
    """Copies of training stretches planted at random offsets/lengths; N, IUPAC, soft-mask and BED around: 60 cases."""
    for seed in range(60):
        _duplication_case(seed, tmp_path)


def test_heldout_block_with_iupac_code_is_not_eligible(tmp_path):
    """Found by the fuzz above: a held-out block with an IUPAC code counted as eligible although a training block
    with one is never indexed, so an exact copy of training scored 2/3 instead of 1."""
    rng = np.random.default_rng(5)
    train = _ACGT_UPPER[rng.integers(0, 4, 3000)].copy()
    train[1500] = ord("R")
    fa = tmp_path / "g.fa"
    fa.write_bytes(b">chr1\n%s\n>chr22\n%s\n" % (train.tobytes(), train.tobytes()))
    config = PrepareConfig(genomes=(fa,), out=tmp_path / "out", train=("chr1",), force=True, progress=False)
    with contextlib.redirect_stderr(io.StringIO()):
        out = prepare(config)
    dup = json.loads((out / "manifest.json").read_text())["duplication"]
    assert (dup["heldout_blocks"], dup["found_in_train"], dup["fraction"]) == (2, 2, 1.0)
