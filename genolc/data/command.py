"""`genolc prepare`: the click command (parse options, build a PrepareConfig, call prepare)."""

from __future__ import annotations

from pathlib import Path

import click

from genolc.config_defaults import config_default
from genolc.data.prepare import PrepareConfig, prepare
from genolc.data.record_selection import parse_split


@click.command("prepare")
@click.argument("genomes", nargs=-1, required=True, type=click.Path(path_type=Path))
@click.option("--out", "-o", type=click.Path(path_type=Path), default=None,
              help="Dataset directory to write: new, empty or an earlier genolc dataset, replaced atomically "
                   "(default: ./prepared/<first genome's name>).")
@click.option("--train", default=None,
              help="Training records: comma-separated names or aliases (X, chrX, NC_000023.11), or 'all' (every "
                   "primary record not held out). Default: chr1,chr2 when present, else the run stops and lists "
                   "the records it found.")
@click.option("--heldout", default=None,
              help="Held-out records (comma-separated), or 'none' for no held-out split. Must not overlap --train. "
                   "A region NAME:START-END (1-based, inclusive, as samtools; e.g. chr2R:1-5000000) holds out that "
                   "stretch only: it becomes its own record and the rest of the record is cut around it, so a "
                   "single-chromosome genome can be trained on and evaluated honestly. "
                   "Default: chr22 when present, else the run stops and lists the records it found.")
@click.option("--tokenizer", default=config_default(PrepareConfig, "tokenizer"), show_default=True,
              help="char | kmer:K | bpe:VOCAB | byte | path/to/tokenizer.json")
@click.option("--include-bed", type=click.Path(path_type=Path), default=None,
              help="Keep only these intervals (0-based half-open); other bases are tokenized as N.")
@click.option("--exclude-bed", type=click.Path(path_type=Path), default=None,
              help="Mask these intervals (blacklist, gaps): tokenized as N, never a training target.")
@click.option("--all-records", is_flag=True,
              help="Also use non-primary records (_alt, _random, chrUn, ...) with --train all.")
@click.option("--duplication-threshold", type=float, default=config_default(PrepareConfig, "duplication_threshold"),
              show_default=True,
              help="Refuse when more than this share of held-out 1 kb blocks is found verbatim in training.")
@click.option("--force", is_flag=True, help="Keep a held-out split that duplicates training sequence.")
@click.option("--bpe-sample", "bpe_sample_bases", type=int, default=config_default(PrepareConfig, "bpe_sample_bases"),
              show_default=True,
              help="Bases of training sequence to learn a BPE vocabulary from.")
@click.option("--progress/--no-progress", default=config_default(PrepareConfig, "progress"), show_default=True,
              help="Show a progress bar on stderr.")
def prepare_command(genomes: tuple[Path, ...], out: Path | None, train: str | None, heldout: str | None,
                    tokenizer: str, include_bed: Path | None, exclude_bed: Path | None, all_records: bool,
                    duplication_threshold: float, force: bool, bpe_sample_bases: int, progress: bool) -> None:
    """Turn genome files into a token dataset for training and evaluation.

    GENOMES are FASTA (plain, gzip or bgzip; no index needed), GenBank or 2bit files, read in one streaming pass.
    The dataset directory gets memory-mappable token arrays, soft-mask bitmaps, N runs and manifest.json
    (see docs/internals.md); nothing is written next to the inputs. Re-running with the same inputs and options
    does nothing.

    \b
    Examples:
      genolc prepare hg38.fa.gz --out data/hg38 --train chr1,chr2 --heldout chr22 --tokenizer char
      genolc prepare dm6_chr2R.fa.gz --out data/dm --train chr2R --heldout chr2R:1-5000000
    """
    config = PrepareConfig(
        genomes=tuple(genomes),
        out=out if out is not None else Path("prepared") / _stem(genomes[0]),
        train=parse_split(train, "--train"),
        heldout=parse_split(heldout, "--heldout"),
        tokenizer=tokenizer,
        include_bed=include_bed,
        exclude_bed=exclude_bed,
        all_records=all_records,
        force=force,
        duplication_threshold=duplication_threshold,
        bpe_sample_bases=bpe_sample_bases,
        progress=progress,
    )
    prepare(config)


def _stem(path: Path) -> str:
    name = path.name
    for suffix in (".gz", ".bgz", ".fa", ".fasta", ".fna", ".gb", ".gbk", ".2bit"):
        if name.endswith(suffix):
            name = name[: -len(suffix)]
    return name or "dataset"
