"""`genolc prepare`: genome files -> a memory-mappable token dataset (see docs/internals.md, "Prepared dataset").

One streaming pass over the inputs, record by record and chunk by chunk, so memory does not grow with chromosome
size: each selected record's tokens go straight to ``tokens/<key>.bin``, its soft-mask bits to
``softmask/<key>.bits`` and its N runs to ``nruns/<key>.npy``. Records named by neither split are still read
(their length, md5 and N counts go into the manifest, marked ``unused``) but nothing is tokenized for them.

Because the pass is single, splits are decided per record as it arrives (a query matches a record by its name,
its canonical chromosome or an alias of it); queries that matched nothing are reported at the end, with close
matches, and nothing is written. Bases excluded by BED files are tokenized as N, so no token over them is ever a
training target or an evaluation position; they are listed in ``nruns`` beside the N runs and counted per record
as ``excluded_bases``, while ``md5_upper``/``n_bases`` describe the sequence as read. A record with held-out
regions (``--heldout chr2R:1-5000000``) is written as consecutive pieces, each a manifest record of its own: the
regions held out, the rest in the record's split (see :func:`_write_pieces`).
"""

from __future__ import annotations

import hashlib
import json
import shutil
import sys
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import click
import numpy as np

import genolc
from genolc.data import genome
from genolc.data.bed import read_bed
from genolc.data.duplication import BLOCK_BASES, TrainBlockIndex, heldout_coverage
from genolc.data.prepare_record import OFFSET_STRIDE, RecordWriter, RegionMask
from genolc.data.record_selection import (RecordSelector, Region, check_queries_disjoint, check_regions_disjoint,
                                          check_selection, parse_region, split_queries)
from genolc.errors import ConfigError, InputError
from genolc.fsutil import atomic_dir, atomic_write_json, check_output_dir, file_md5
from genolc.runs import RUNS_DIRNAME, run_record
from genolc.tokenize import make_tokenizer, save_tokenizer

FORMAT_VERSION = 1
OUTPUT_KIND = "dataset directory"
# Datasets written before outputs carried genolc's marker are recognised by their manifest.
LEGACY_OUTPUT = ("manifest.json",)


@dataclass(frozen=True)
class PrepareConfig:
    """Everything `genolc prepare` does is decided by these fields (and the input files' contents).

    ``train``: queries (names or aliases), ``"all"`` for every record not held out, or None for chr1,chr2.
    ``heldout``: queries, ``()`` for no held-out split, or None for chr22. A query may be a region,
    ``NAME:START-END`` (1-based, inclusive, chromosome coordinates, as samtools writes them): that stretch of the
    record is held out and the rest of it goes where the record would otherwise go
    (genolc.data.record_selection.parse_region).
    """

    genomes: tuple[Path, ...]
    out: Path
    train: tuple[str, ...] | str | None = None
    heldout: tuple[str, ...] | None = None
    tokenizer: str = "char"
    include_bed: Path | None = None
    exclude_bed: Path | None = None
    all_records: bool = False
    force: bool = False
    duplication_threshold: float = 0.05
    bpe_sample_bases: int = 16_000_000
    chunk_bases: int = 1 << 24
    progress: bool = True

    def __post_init__(self) -> None:
        if not self.genomes:
            raise ConfigError("no genome file given", fix="pass one or more FASTA/GenBank/2bit files")
        if not 0.0 <= self.duplication_threshold <= 1.0:
            raise ConfigError(f"duplication threshold must be between 0 and 1, got {self.duplication_threshold}")
        if self.chunk_bases < 1 << 16 or self.chunk_bases % 8:
            raise ConfigError(f"chunk size must be a multiple of 8 and at least 65536, got {self.chunk_bases}")
        if self.bpe_sample_bases < 1:
            raise ConfigError(f"the BPE training sample must be positive, got {self.bpe_sample_bases}")
        check_regions_disjoint([r for r in map(parse_region, self.heldout or ()) if r is not None])


def _say(message: str) -> None:
    click.echo(message, err=True)


def _check_inputs(config: PrepareConfig) -> list[Path]:
    paths = []
    for raw in config.genomes:
        path = Path(raw).expanduser().absolute()
        if not path.exists():
            raise InputError("genome file not found", where=str(path), fix="check the path")
        if not path.is_file():
            raise InputError("genome path is not a file", where=str(path), fix="pass a FASTA/GenBank/2bit file")
        paths.append(path)
    if len({str(p.resolve()) for p in paths}) != len(paths):
        raise InputError("the same genome file is given twice", fix="pass each file once")
    for bed in (config.include_bed, config.exclude_bed):
        if bed is not None and not Path(bed).is_file():
            raise InputError("BED file not found", where=str(bed), fix="check the path")
    return paths


def _fingerprint(config: PrepareConfig, paths: list[Path]) -> str:
    """What decides the output: inputs by content, and every option that changes a byte of it."""
    tok_spec: Any = config.tokenizer
    if Path(config.tokenizer).is_file():
        tok_spec = {"file_md5": file_md5(config.tokenizer)}
    beds = [None if b is None else file_md5(b) for b in (config.include_bed, config.exclude_bed)]
    payload = {
        "format_version": FORMAT_VERSION,
        "genolc_version": genolc.__version__,
        "inputs": [file_md5(p) for p in paths],
        "train": config.train,
        "heldout": config.heldout,
        "tokenizer": tok_spec,
        "beds": beds,
        "all_records": config.all_records,
        "force": config.force,
        "threshold": config.duplication_threshold,
        "bpe_sample_bases": config.bpe_sample_bases,
        "chunk_bases": config.chunk_bases,
    }
    return hashlib.sha256(json.dumps(payload, sort_keys=True, default=str).encode()).hexdigest()


def _existing_is_current(out: Path, fingerprint: str) -> bool:
    manifest_path = out / "manifest.json"
    if not manifest_path.is_file():
        return False
    try:
        manifest = json.loads(manifest_path.read_text())
    except (OSError, ValueError):
        return False
    if manifest.get("fingerprint") != fingerprint:
        return False
    for rec in manifest.get("records", []):
        for part in ("tokens", "softmask", "nruns"):
            if rec.get(part) and not (out / rec[part]).is_file():
                return False
    return (out / "tokenizer.json").is_file()


def _open_all(paths: list[Path]) -> list[genome.GenomeReader]:
    return [genome.open_genome(p) for p in paths]


def _bpe_sample(config: PrepareConfig, paths: list[Path], selector: RecordSelector) -> list[np.ndarray]:
    """A bounded sample of training sequence (from the start of each train record, N-poor chunks only)."""
    budget = config.bpe_sample_bases
    per_record = max(1 << 20, budget // 4)
    sample: list[np.ndarray] = []
    probe = RecordSelector(selector.train, selector.heldout, selector.all_records)
    for reader in _open_all(paths):
        for stream in reader.records():
            if budget <= 0:
                return sample
            split, regions = probe.plan(stream.info, stream.info.chrom)
            if split != "train":
                continue
            # Held-out regions stay out of the tokenizer's training sample as they stay out of training.
            held = [(r.start - stream.info.start, r.end - stream.info.start + 1) for r in regions]
            taken = offset = 0
            for chunk in stream.chunks(1 << 20):
                keep = np.ones(len(chunk), dtype=bool)
                for lo, hi in held:
                    keep[max(lo - offset, 0):max(hi - offset, 0)] = False
                offset += len(chunk)
                for a, b in genome.true_runs(keep).tolist():
                    bases = np.array(chunk[a:b], dtype=np.uint8)
                    if np.count_nonzero((bases | np.uint8(0x20)) == ord("n")) > len(bases) // 2:
                        continue
                    piece = bases[: min(len(bases), budget, per_record - taken)]
                    sample.append(piece)
                    taken += len(piece)
                    budget -= len(piece)
                    if taken >= per_record or budget <= 0:
                        break
                if taken >= per_record or budget <= 0:
                    break
    return sample


def _make_tokenizer(config: PrepareConfig, paths: list[Path], selector: RecordSelector):
    kind = config.tokenizer.split(":", 1)[0].lower()
    sample = _bpe_sample(config, paths, selector) if kind == "bpe" else None
    if sample is not None and not sample:
        raise InputError(
            "no training sequence to learn the BPE vocabulary from (every train record is mostly N or none matched)",
            fix="check --train, or use --tokenizer char / kmer:K",
        )
    # The sample is already bounded by --bpe-sample; BPE must learn from all of it, not its own smaller default.
    return make_tokenizer(config.tokenizer, sample, max_training_bases=config.bpe_sample_bases)


@dataclass
class _Repeats:
    """Records of one chromosome given more than once (e.g. chr20 in two input files).

    The same sequence at the same coordinates (md5 of the upper-cased bases, length, start) and split is kept
    once: the later copy's files are removed and the kept record lists it under ``also_in``. Different sequence
    under one chromosome name is kept under a new key (chr20_2), as before; both cases are named in one warning each.
    A record cut at held-out regions is compared piece by piece and kept once only when every piece matches, so a
    copy is dropped whole or kept whole, never in part.
    """

    dropped: list[tuple[dict, list[dict]]] = field(default_factory=list)   # (later copy, the entries kept)
    renamed: list[tuple[list[dict], dict]] = field(default_factory=list)   # (renamed entries, first of that chromosome)

    def drop_if_identical(self, entries: list[dict], earlier: list[dict], tmp: Path, scratch: Path) -> bool:
        """``entries``: one record's manifest entries (one, or its pieces); ``earlier``: those of records before it."""
        same_chrom = [r for r in earlier if r["chrom"] == entries[0]["chrom"]]
        twins = [next((r for r in same_chrom if _identity(r) == _identity(entry)), None) for entry in entries]
        if None in twins:
            if same_chrom:
                self.renamed.append((entries, same_chrom[0]))
            return False
        for entry, twin in zip(entries, twins):
            for part in ("tokens", "softmask", "nruns", "token_offsets"):
                if entry.get(part):
                    (tmp / entry[part]).unlink(missing_ok=True)
            (scratch / f"{entry['key']}.u8").unlink(missing_ok=True)
            twin.setdefault("also_in", []).append({"source": entry["source"], "name": entry["name"]})
        self.dropped.append((entries[0], twins))
        return True

    def warn(self, paths: list[Path]) -> None:
        def where(r: dict) -> str:
            return f"'{r['name']}' in {paths[r['source']]}"

        def keys(entries: list[dict]) -> str:
            return ", ".join(e["key"] for e in entries)

        if self.dropped:
            shown = "; ".join(f"{where(later)} = {where(kept[0])}, kept once as {keys(kept)}"
                              for later, kept in self.dropped[:10])
            more = f" and {len(self.dropped) - 10} more" if len(self.dropped) > 10 else ""
            _say(f"genolc prepare: warning: {len(self.dropped)} record(s) given twice with identical sequence, "
                 f"each kept once: {shown}{more}.")
        if self.renamed:
            shown = "; ".join(f"{where(entries[0])} is kept as {keys(entries)} ({where(first)} is {first['key']})"
                              for entries, first in self.renamed[:10])
            more = f" and {len(self.renamed) - 10} more" if len(self.renamed) > 10 else ""
            _say(f"genolc prepare: warning: {len(self.renamed)} record(s) name a chromosome already read, with a "
                 f"different sequence: {shown}{more}. Check that the inputs are meant to hold both.")


def _identity(entry: dict) -> tuple:
    return entry["md5_upper"], entry["length_bases"], entry["start"], entry["split"]


def _unique_key(chrom: str, used: set[str]) -> str:
    safe = "".join(c if c.isalnum() or c in "._-" else "_" for c in chrom) or "record"
    key, n = safe, 1
    while key in used:
        n += 1
        key = f"{safe}_{n}"
    used.add(key)
    return key


def prepare(config: PrepareConfig) -> Path:
    """Build the dataset described by ``config`` at ``config.out`` (atomically) and return its path.

    A rerun with the same inputs and options finds the existing dataset current and does nothing.
    """
    paths = _check_inputs(config)
    check_queries_disjoint(config.train, config.heldout)
    out = check_output_dir(config.out, OUTPUT_KIND, legacy=LEGACY_OUTPUT)
    fingerprint = _fingerprint(config, paths)
    args = asdict(config)
    if _existing_is_current(out, fingerprint):
        with run_record("prepare", out, args | {"no_op": True}) as rec:
            for p in paths:
                rec.add_input(p)
        _say(f"genolc prepare: {out} is up to date with these inputs and options; nothing to do.")
        return out
    with run_record("prepare", out, args) as rec:
        for p in paths:
            rec.add_input(p)
        previous_runs = out / RUNS_DIRNAME
        with atomic_dir(out, OUTPUT_KIND, legacy=LEGACY_OUTPUT) as tmp:
            manifest = _build(config, paths, tmp, fingerprint)
            if previous_runs.is_dir():
                shutil.copytree(previous_runs, tmp / RUNS_DIRNAME, dirs_exist_ok=True)
        rec.outputs = {
            "dataset": str(out),
            "train": manifest["splits"]["train"],
            "heldout": manifest["splits"]["heldout"],
            "duplication_fraction": (manifest["duplication"] or {}).get("fraction"),
        }
    _summarise(out, manifest)
    return out


def _build(config: PrepareConfig, paths: list[Path], tmp: Path, fingerprint: str) -> dict:
    train_q, heldout_q = split_queries(config.train, config.heldout)
    selector = RecordSelector(train_q, heldout_q, config.all_records)
    readers = _open_all(paths)
    include = read_bed(config.include_bed) if config.include_bed else None
    exclude = read_bed(config.exclude_bed) if config.exclude_bed else None

    tokenizer = _make_tokenizer(config, paths, selector)
    save_tokenizer(tokenizer, tmp / "tokenizer.json")
    dtype = np.dtype("<u2") if tokenizer.vocab_size <= 1 << 16 else np.dtype("<i4")
    train_index = TrainBlockIndex() if heldout_q else None
    scratch = tmp / ".scratch"
    scratch.mkdir()

    records: list[dict] = []
    out = _Pass(tmp, scratch, tokenizer, dtype, include, exclude, train_index, config.chunk_bases, _progress(config))
    repeats = _Repeats()
    try:
        for source_index, reader in enumerate(readers):
            # Duplicate names within a file are refused by GenomeReader.records() itself.
            for stream in reader.records():
                info = stream.info
                key = _unique_key(info.chrom, out.used_keys)
                split, regions = selector.plan(info, key)
                if regions:
                    entries = _write_pieces(out, stream, key, source_index, split, regions)
                else:
                    entries = [_write_whole(out, stream, key, source_index, split)]
                if repeats.drop_if_identical(entries, records, tmp, scratch):
                    out.used_keys.discard(key)
                    out.used_keys.difference_update(e["key"] for e in entries)
                    continue
                records.extend(entries)
    finally:
        out.bar.close()
    repeats.warn(paths)

    check_selection(selector, records, config.train, config.heldout, train_q, heldout_q)
    _check_masks(config, include, exclude, records)
    duplication = None
    if heldout_q:
        duplication = _duplication(config, records, train_index, scratch)
    shutil.rmtree(scratch)
    manifest = {
        "format_version": FORMAT_VERSION,
        "genolc_version": genolc.__version__,
        "fingerprint": fingerprint,
        "sources": [
            {"path": str(p), "size": p.stat().st_size, "md5": file_md5(p), "format": r.format}
            for p, r in zip(paths, readers)
        ],
        "tokenizer": tokenizer.to_dict(),
        "token_dtype": "uint16" if dtype == np.dtype("<u2") else "int32",
        "records": records,
        "splits": {
            "train": [r["key"] for r in records if r["split"] == "train"],
            "heldout": [r["key"] for r in records if r["split"] == "heldout"],
        },
        "duplication": duplication,
        "masks": {
            "include_bed": None if config.include_bed is None else str(Path(config.include_bed).absolute()),
            "exclude_bed": None if config.exclude_bed is None else str(Path(config.exclude_bed).absolute()),
        },
    }
    if tokenizer.fixed_bases_per_token is None:
        manifest["offset_stride"] = OFFSET_STRIDE
    atomic_write_json(tmp / "manifest.json", manifest)
    return manifest


@dataclass
class _Pass:
    """Where the records of one prepare pass are written, and the state they share."""

    tmp: Path
    scratch: Path
    tokenizer: Any
    dtype: np.dtype
    include: dict[str, np.ndarray] | None
    exclude: dict[str, np.ndarray] | None
    train_index: TrainBlockIndex | None
    chunk_bases: int
    bar: Any
    used_keys: set[str] = field(default_factory=set)

    def writer(self, key: str, info: genome.RecordInfo, split: str, record_offset: int = 0) -> RecordWriter:
        return RecordWriter(
            self.tmp, key, info, self.tokenizer, self.dtype,
            write=split != "unused",
            mask=RegionMask(self.include, self.exclude, info.chrom, info.start),
            train_index=self.train_index if split == "train" else None,
            heldout_copy=self.scratch / f"{key}.u8" if split == "heldout" else None,
            record_offset=record_offset,
        )


def _entry(key: str, info: genome.RecordInfo, source: int, split: str, fields: dict) -> dict:
    return {"key": key, "name": info.name, "description": info.description, "chrom": info.chrom,
            "start": info.start, "source": source, "split": split, **fields}


def _write_whole(out: _Pass, stream: genome.RecordStream, key: str, source: int, split: str) -> dict:
    writer = out.writer(key, stream.info, split)
    try:
        out.bar.set_description_str(f"{key} ({split})")
        for chunk in stream.chunks(out.chunk_bases, exact=False):
            writer.add(chunk)
            out.bar.update(len(chunk))
        fields = writer.finish()
    finally:
        writer.close()
    return _entry(key, stream.info, source, split, fields)


def _piece_bounds(info: genome.RecordInfo, split: str, regions: list[Region]) -> list[tuple[int, str]]:
    """(first base, split) of each piece of a record cut at its held-out regions (record offsets, 0-based); a piece
    ends where the next begins, the last at the record's end (unknown until it is read)."""
    pieces: list[tuple[int, str]] = []
    at = 0
    for region in regions:
        if region.start < info.start:
            raise InputError(f"--heldout {region.query} starts before the record's first base, {info.chrom}:"
                             f"{info.start}", where=info.label,
                             fix="coordinates count from the chromosome start (the record's header region); give "
                                 "a region inside the record")
        lo, hi = region.start - info.start, region.end - info.start + 1
        if lo > at:
            pieces.append((at, split))
        pieces.append((lo, "heldout"))
        at = hi
    pieces.append((at, split))
    return pieces


def _write_pieces(out: _Pass, stream: genome.RecordStream, key: str, source: int, split: str,
                  regions: list[Region]) -> list[dict]:
    """A record with held-out regions as consecutive manifest records: each region held out, the stretches around
    it in ``split``. Each piece is a record of its own (tokens, soft-mask, N runs, ``start`` its first base), so no
    training window can reach into a region; ``region`` gives each piece's span."""
    info = stream.info
    bounds = _piece_bounds(info, split, regions)
    writers: list[RecordWriter] = []
    try:
        position, next_piece, piece_end = 0, 0, 0
        for chunk in stream.chunks(out.chunk_bases, exact=False):
            at = 0
            while at < len(chunk):
                if next_piece < len(bounds) and position + at >= piece_end:
                    lo, piece_split = bounds[next_piece]
                    next_piece += 1
                    piece_end = bounds[next_piece][0] if next_piece < len(bounds) else None
                    # Provisional name: the key holds the piece's last base, known only once it is read.
                    writers.append(out.writer(f"{key}.piece{len(writers)}", replace(info, start=info.start + lo),
                                              piece_split, record_offset=lo))
                    out.bar.set_description_str(f"{key} from {info.start + lo:,} ({piece_split})")
                take = len(chunk) - at if piece_end is None else min(len(chunk) - at, piece_end - position - at)
                writers[-1].add(chunk[at:at + take])
                at += take
            position += len(chunk)
            out.bar.update(len(chunk))
        last_base = info.start + position - 1
        for region in regions:
            if region.end > last_base:
                where_it_is = "starts" if region.start > last_base else "ends"
                raise InputError(f"--heldout {region.query} {where_it_is} after the record's last base, "
                                 f"{info.chrom}:{last_base}", where=info.label,
                                 fix=f"the record is {info.chrom}:{info.start}-{last_base} ({position:,} bases); give "
                                     "a region inside it")
        entries = []
        for writer, (lo, piece_split) in zip(writers, bounds):
            fields = writer.finish()
            first = info.start + lo
            span = f"{info.chrom}:{first}-{first + fields['length_bases'] - 1}"
            final = _unique_key(span, out.used_keys)
            _rename_record_files(out, writer.key, final, fields)
            entries.append(_entry(final, writer.info, source, piece_split, fields) | {"region": span})
        return entries
    finally:
        for writer in writers:
            writer.close()


def _rename_record_files(out: _Pass, old: str, new: str, fields: dict) -> None:
    """Move a record's files (and its held-out scratch copy) from key ``old`` to ``new``; updates ``fields``."""
    for part in ("tokens", "softmask", "nruns", "token_offsets"):
        if fields.get(part):
            folder, name = fields[part].split("/", 1)
            renamed = f"{folder}/{new}{name[len(old):]}"
            (out.tmp / fields[part]).rename(out.tmp / renamed)
            fields[part] = renamed
    scratch = out.scratch / f"{old}.u8"
    if scratch.exists():
        scratch.rename(out.scratch / f"{new}.u8")


def _check_masks(config: PrepareConfig, include: dict[str, np.ndarray] | None,
                 exclude: dict[str, np.ndarray] | None, records: list[dict]) -> None:
    """A BED whose chromosome names match no used record is almost surely for another naming or build."""
    used = {r["chrom"] for r in records if r["split"] != "unused"}
    for option, path, bed in (("--include-bed", config.include_bed, include),
                              ("--exclude-bed", config.exclude_bed, exclude)):
        if bed is None or used & set(bed) or (option == "--exclude-bed" and not bed):
            continue
        shown = ", ".join(sorted(bed)[:10]) + (" …" if len(bed) > 10 else "") if bed else "none, the file is empty"
        records_shown = ", ".join(sorted(used)[:30]) + (" …" if len(used) > 30 else "")
        what = f"{option} names none of the records used (its chromosomes: {shown}; records: {records_shown})"
        if option == "--include-bed":
            raise InputError(what + "; every base would be masked", where=str(path),
                             fix="use a BED for this genome's chromosomes (aliases such as 22/chr22 are matched)")
        _say(f"genolc prepare: warning: {what}; nothing is excluded.")


def _duplication(config: PrepareConfig, records: list[dict], index: TrainBlockIndex | None, scratch: Path) -> dict:
    assert index is not None
    eligible = found = 0
    for rec in records:
        if rec["split"] != "heldout":
            continue
        bases = np.memmap(scratch / f"{rec['key']}.u8", dtype=np.uint8, mode="r", shape=(rec["length_bases"],))
        e, f = heldout_coverage(lambda lo, hi: bases[lo:hi], rec["length_bases"], index)
        rec["duplicated_blocks"] = f
        eligible, found = eligible + e, found + f
        del bases
    fraction = found / eligible if eligible else 0.0
    result = {
        "block_bases": BLOCK_BASES, "heldout_blocks": eligible, "found_in_train": found,
        "fraction": round(fraction, 6), "threshold": config.duplication_threshold, "forced": config.force,
    }
    if fraction > config.duplication_threshold and not config.force:
        raise InputError(
            f"{fraction:.1%} of held-out 1 kb blocks ({found} of {eligible}) appear verbatim in the training "
            f"sequence, above the {config.duplication_threshold:.1%} threshold (e.g. the same chromosome from two "
            "builds)",
            where="held out: " + ", ".join(r["key"] for r in records if r["split"] == "heldout"),
            fix="hold out sequence that is not in training, or pass --force to keep this split anyway",
        )
    return result


def _progress(config: PrepareConfig):
    from tqdm import tqdm

    return tqdm(
        total=None, unit="bp", unit_scale=True, file=sys.stderr,
        disable=not (config.progress and sys.stderr.isatty()),
        desc="prepare", leave=False,
    )


def _summarise(out: Path, manifest: dict) -> None:
    used = [r for r in manifest["records"] if r["split"] != "unused"]
    bases = sum(r["length_bases"] for r in used)
    tokens = sum(r["length_tokens"] for r in used)
    dup = manifest["duplication"]
    dup_text = "" if dup is None else f"; held-out blocks found in train: {dup['fraction']:.2%}"
    _say(
        f"genolc prepare: wrote {out}: {len(manifest['splits']['train'])} train / "
        f"{len(manifest['splits']['heldout'])} held-out records, {bases:,} bases, {tokens:,} tokens{dup_text}."
    )
