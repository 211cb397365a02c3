"""``genolc score`` and ``genolc embed`` end to end: configs, reading inputs, scoring, writing outputs atomically.

Outputs are built in memory and written together with :func:`genolc.fsutil.atomic_write_new_files` (score's TSV and
VCF, embed's ``.npy`` and its names file; existing outputs are refused up front), so a failed or interrupted run never
leaves a half-written file, nor one file of a pair. A successful run's record goes to ``runs/`` beside the output
file; a failed or interrupted one leaves nothing there (the output folder is usually shared with other files, so no
record).
"""

from __future__ import annotations

import io
import math
import sys
from collections import Counter
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from genolc.errors import ConfigError, InputError
from genolc.fsutil import atomic_write_new_files
from genolc.runs import run_record
from genolc.score.variants import ScoreSettings

SCORE_INFO_PREFIX = "GENOLC_LLR"
STATUS_INFO = "GENOLC_STATUS"


@dataclass(frozen=True)
class ScoreConfig:
    vcf: Path
    genome: Path
    checkpoint: Path
    out: Path
    windows: tuple[int, ...] = (8192,)
    window_labels: tuple[str, ...] = ("8k",)
    placement: str = "center"
    rc_average: bool = False
    reduce: str = "sum"
    vcf_out: Path | None = None
    device: str = "auto"
    dtype: str = "auto"
    batch_tokens: int = 1 << 16
    progress: bool = True

    def to_dict(self) -> dict[str, Any]:
        return {k: str(v) if isinstance(v, Path) else v for k, v in asdict(self).items()}


@dataclass(frozen=True)
class EmbedConfig:
    bed: Path
    genome: Path
    checkpoint: Path
    out: Path
    pool: str = "mean"
    layer: int | None = None
    device: str = "auto"
    dtype: str = "auto"
    window_chunk: int = 1 << 16
    progress: bool = True

    def to_dict(self) -> dict[str, Any]:
        return {k: str(v) if isinstance(v, Path) else v for k, v in asdict(self).items()}


def _refuse_overwriting_inputs(outputs: list[Path | None], inputs: list[Path], checkpoint: Path) -> None:
    """ConfigError when an output path names an input or another output, lies inside the checkpoint, or exists
    already: a file genolc did not just write is never replaced (a single file carries no ownership marker)."""
    taken = {p.resolve(): f"the input {p}" for p in inputs}
    inside = Path(checkpoint).resolve()
    for out in outputs:
        if out is None:
            continue
        if out.resolve() in taken:
            raise ConfigError(f"the output would overwrite {taken[out.resolve()]}", where=str(out),
                              fix="choose another output path")
        if inside in out.resolve().parents:
            raise ConfigError("the output would be written into the checkpoint", where=str(out),
                              fix="choose an output path outside the checkpoint directory")
        if out.exists():
            raise ConfigError("the output file already exists; genolc does not replace files", where=str(out),
                              fix="choose another output path, or move the existing file away first")
        taken[out.resolve()] = f"the other output {out}"


def score_columns(labels: tuple[str, ...]) -> list[str]:
    return ["score"] if len(labels) == 1 else [f"score_{label}" for label in labels]


def _format(value: float) -> str:
    return "" if math.isnan(value) else f"{value:.6g}"


def _progress_bar(enabled: bool, total: int, unit: str):
    from tqdm import tqdm

    return tqdm(total=total, unit=unit, disable=not enabled, file=sys.stderr, leave=False)


def run_score(config: ScoreConfig) -> dict[str, Any]:
    """Score every variant of ``config.vcf``; returns the summary (counts by status, outputs)."""
    with run_record("score", config.out.parent, config.to_dict(), keep_failed=False) as record:
        from genolc.score.api import load
        from genolc.score.reference import Reference
        from genolc.score.shared import ForwardCount
        from genolc.score.variants import score_variants
        from genolc.score.vcf import read_vcf

        if config.out.is_dir():
            raise ConfigError("--out names a directory; it should be the TSV file to write", where=str(config.out),
                              fix="e.g. --out scores.tsv")
        _refuse_overwriting_inputs([config.out, config.vcf_out], [config.vcf, config.genome], config.checkpoint)
        settings = ScoreSettings(windows=config.windows, placement=config.placement, rc_average=config.rc_average,
                                 reduce=config.reduce)
        contents = read_vcf(config.vcf)
        record.add_input(config.vcf)
        with Reference(config.genome) as reference:
            unknown = sorted({v.chrom for v in contents.variants if not reference.has_chrom(v.chrom)})
            if unknown and all(not reference.has_chrom(v.chrom) for v in contents.variants):
                raise InputError(
                    f"none of the VCF's chromosomes ({', '.join(unknown[:10])}) is in the genome "
                    f"(which holds {', '.join(reference.chrom_names()[:10])})",
                    where=f"{config.vcf} and {config.genome}",
                    fix="score against the genome the VCF was called on (aliases such as 22/chr22 work)")
            loaded = load(config.checkpoint, device=config.device, dtype=config.dtype,
                          batch_tokens=config.batch_tokens)
            count = ForwardCount()
            with _progress_bar(config.progress, len(contents.variants) * len(config.windows), "window") as bar:
                statuses, scores = score_variants(loaded.scorer, loaded.tokenizer, reference, contents.variants,
                                                  settings, progress=bar.update, count=count)
        counts = Counter(statuses)
        labels = config.window_labels
        files = {config.out: _score_tsv(contents, statuses, scores, labels)}
        outputs = {"tsv": str(config.out)}
        if config.vcf_out is not None:
            files[config.vcf_out] = _score_vcf(contents, statuses, scores, labels, config)
            outputs["vcf"] = str(config.vcf_out)
        _write_outputs(files, "scores")
        summary = {"records": contents.records, "variants": len(contents.variants),
                   "by_status": dict(sorted(counts.items())), "unknown_chromosomes": unknown, "outputs": outputs,
                   "forwards": count.to_dict()}
        record.outputs.update(outputs)
        record.outputs["by_status"] = summary["by_status"]
        record.outputs["forwards"] = summary["forwards"]
        return summary


def _write_outputs(files: dict[Path, bytes], what: str) -> None:
    """All of ``files`` or none of them; a failure is one message."""
    try:
        atomic_write_new_files(files)
    except OSError as exc:
        raise InputError(f"cannot write the {what} ({exc.strerror or exc})", where=str(next(iter(files))),
                         fix="check the folder is writable and has space; nothing was written") from None


def _score_tsv(contents, statuses: list[str], scores: np.ndarray, labels: tuple[str, ...]) -> bytes:
    header = list(contents.columns) + ["ALT_INDEX", "status"] + score_columns(labels)
    lines = ["\t".join(header)]
    for variant, status, row in zip(contents.variants, statuses, scores):
        lines.append("\t".join(list(variant.fields) + [str(variant.allele_index), status]
                               + [_format(v) for v in row]))
    return ("\n".join(lines) + "\n").encode()


def _score_vcf(contents, statuses: list[str], scores: np.ndarray, labels: tuple[str, ...],
               config: ScoreConfig) -> bytes:
    meta = [line for line in contents.header]
    if not any(line.startswith("##fileformat") for line in meta):
        meta.insert(0, "##fileformat=VCFv4.2")
    strands = "both strands averaged" if config.rc_average else "forward strand"
    for field, label in zip(_info_ids(labels), labels):
        meta.append(f'##INFO=<ID={field},Number=1,Type=Float,Description="genolc score: log-likelihood ratio '
                    f'ALT vs REF ({config.reduce} of log p over the window), {label} window, {config.placement} '
                    f'placement, {strands}">')
    meta.append(f'##INFO=<ID={STATUS_INFO},Number=1,Type=String,Description="why genolc did not score this allele '
                f'(symbolic, alt_equals_ref, too_long, unknown_chrom, outside, ref_mismatch, edge)">')
    lines = meta + ["#" + "\t".join(contents.columns)]
    for variant, status, row in zip(contents.variants, statuses, scores):
        fields = list(variant.fields)
        if status == "ok":
            added = [f"{field}={_format(v)}" for field, v in zip(_info_ids(labels), row)]
        else:
            added = [f"{STATUS_INFO}={status}"]
        info = fields[7] if fields[7] not in ("", ".") else ""
        fields[7] = ";".join(([info] if info else []) + added)
        lines.append("\t".join(fields))
    return ("\n".join(lines) + "\n").encode()


def _info_ids(labels: tuple[str, ...]) -> list[str]:
    return [SCORE_INFO_PREFIX] if len(labels) == 1 else [f"{SCORE_INFO_PREFIX}_{label}" for label in labels]


def run_embed(config: EmbedConfig) -> dict[str, Any]:
    """Embed every BED interval; writes ``out`` (.npy plus ``<out>.names.tsv``, or .parquet)."""
    with run_record("embed", config.out.parent, config.to_dict(), keep_failed=False) as record:
        from genolc.score.api import load
        from genolc.score.embed import HiddenStates, embed_regions, read_regions, region_bases
        from genolc.score.reference import Reference

        parquet = config.out.suffix.lower() == ".parquet"
        if parquet:
            try:
                import pyarrow  # noqa: F401
            except ImportError:
                raise ConfigError("writing Parquet needs pyarrow, which is not installed", where=str(config.out),
                                  fix="pip install pyarrow, or write .npy (--out regions.npy)") from None
        elif config.out.suffix.lower() != ".npy":
            raise ConfigError("--out must end in .npy or .parquet", where=str(config.out),
                              fix="e.g. --out regions.npy (a names file regions.npy.names.tsv is written beside it)")
        _refuse_overwriting_inputs([config.out, config.out.with_name(config.out.name + ".names.tsv")],
                                   [config.bed, config.genome], config.checkpoint)
        regions = read_regions(config.bed)
        record.add_input(config.bed)
        with Reference(config.genome) as reference:
            sequences = [region_bases(reference, region, str(config.bed)) for region in regions]
        loaded = load(config.checkpoint, device=config.device, dtype=config.dtype)
        hidden = HiddenStates(loaded.model, config.layer, config.window_chunk)
        vectors = []
        with _progress_bar(config.progress, len(regions), "region") as bar:
            for bases in sequences:
                vectors.extend(embed_regions(hidden, loaded.tokenizer, [bases], config.pool))
                bar.update(1)
        if parquet:
            _write_outputs({config.out: _embed_parquet(regions, vectors, config.pool)}, "embeddings")
            outputs = {"parquet": str(config.out)}
        else:
            names = config.out.with_name(config.out.name + ".names.tsv")
            array, table = _embed_npy(regions, vectors, config.pool)
            buffer = io.BytesIO()
            np.save(buffer, array)
            # Both or neither: a names file left alone would make the next run refuse its output path.
            _write_outputs({names: table, config.out: buffer.getvalue()}, "embeddings")
            outputs = {"npy": str(config.out), "names": str(names)}
        record.outputs.update(outputs)
        dim = int(vectors[0].shape[-1])
        return {"regions": len(regions), "dim": dim, "pool": config.pool, "outputs": outputs}


def _embed_npy(regions, vectors, pool: str) -> tuple[np.ndarray, bytes]:
    """mean: ``[n_regions, D]``, row i is region i. none: ``[total_tokens, D]``, region i's rows are
    ``row_start..row_stop`` of the names file."""
    lines = ["name\tchrom\tstart\tend\trow_start\trow_stop"]
    row = 0
    for region, vector in zip(regions, vectors):
        rows = 1 if pool == "mean" else len(vector)
        lines.append(f"{region.name}\t{region.chrom}\t{region.start}\t{region.end}\t{row}\t{row + rows}")
        row += rows
    array = np.stack(vectors) if pool == "mean" else np.concatenate(vectors, axis=0)
    return array.astype(np.float32), ("\n".join(lines) + "\n").encode()


def _embed_parquet(regions, vectors, pool: str) -> bytes:
    import pyarrow as pa
    import pyarrow.parquet as pq

    if pool == "mean":
        columns = {"name": [r.name for r in regions], "chrom": [r.chrom for r in regions],
                   "start": [r.start for r in regions], "end": [r.end for r in regions],
                   "embedding": [v.astype(np.float32).tolist() for v in vectors]}
    else:
        columns = {"name": [], "chrom": [], "token": [], "embedding": []}
        for region, states in zip(regions, vectors):
            for t, state in enumerate(states):
                columns["name"].append(region.name)
                columns["chrom"].append(region.chrom)
                columns["token"].append(t)
                columns["embedding"].append(state.astype(np.float32).tolist())
    sink = io.BytesIO()
    pq.write_table(pa.table(columns), sink)
    return sink.getvalue()
