"""``genolc score`` and ``genolc embed``: the click commands. Parse options, build a config, call one function."""

from __future__ import annotations

from functools import partial
from pathlib import Path

import click

from genolc.config_defaults import config_default
from genolc.errors import ConfigError
from genolc.score.run import EmbedConfig, ScoreConfig
from genolc.units import format_length, parse_length

_PATH = click.Path(path_type=Path)
_DEVICE = click.Choice(["auto", "cpu", "cuda"])
_DTYPE = click.Choice(["auto", "float32", "bfloat16"])
_score = partial(config_default, ScoreConfig)
_embed = partial(config_default, EmbedConfig)


def _windows(window: str, windows: str | None) -> tuple[tuple[int, ...], tuple[str, ...]]:
    labels = tuple(w.strip() for w in (windows.split(",") if windows else [window]) if w.strip())
    if not labels:
        raise ConfigError("--windows lists no window", fix="e.g. --windows 1k,8k,64k")
    values = tuple(parse_length(label, "--windows" if windows else "--window") for label in labels)
    if min(values) < 2:
        raise ConfigError("a window must hold at least 2 bases", fix="e.g. --window 8k")
    if len(set(values)) != len(values):
        raise ConfigError(f"--windows repeats a window ({windows})", fix="list each window once")
    return values, labels


@click.command("score")
@click.option("--vcf", required=True, type=_PATH, help="Variants: VCF, plain or gzip/bgzip (.vcf, .vcf.gz).")
@click.option("--genome", required=True, type=_PATH,
              help="Reference FASTA, plain or bgzip, read by index (.fai; bgzip also .gzi; built if missing and the "
                   "folder is writable).")
@click.option("--checkpoint", required=True, type=_PATH,
              help="Model checkpoint (save_pretrained or genolc finetune), or a finetune run directory: its newest "
                   "checkpoint.")
@click.option("--window", default=_score("window_labels", lambda labels: labels[0]), show_default=True, metavar="BASES",
              help="Window around each variant, in bases (k = 1024).")
@click.option("--windows", default=None, metavar="W1,W2,…",
              help="Several windows, each reported in its own score column (e.g. 1k,8k,64k); replaces --window.")
@click.option("--placement", type=click.Choice(["center", "causal-end"]), default=_score("placement"),
              show_default=True,
              help="center: equal flanks on both sides; causal-end: the variant ends the window (upstream only).")
@click.option("--rc-average", is_flag=True, help="Score both strands and average their scores.")
@click.option("--reduce", type=click.Choice(["sum", "mean"]), default=_score("reduce"), show_default=True,
              help="Sum of log p over each sequence's tokens, or its mean (Evo 2's default).")
@click.option("--out", "-o", type=_PATH, default=Path("scores.tsv"), show_default=True,
              help="Output TSV: the VCF's 8 fixed columns (one row per ALT allele), ALT_INDEX, status, score(s).")
@click.option("--vcf-out", type=_PATH, default=_score("vcf_out"),
              help="Also write a VCF with the score in INFO (GENOLC_LLR; GENOLC_STATUS for skipped alleles).")
@click.option("--device", type=_DEVICE, default=_score("device"), show_default=True,
              help="Where to score (auto: CUDA when visible, else CPU).")
@click.option("--dtype", type=_DTYPE, default=_score("dtype"), show_default=True,
              help="auto: bfloat16 on CUDA, float32 on CPU.")
@click.option("--batch-tokens", default=_score("batch_tokens", format_length), show_default=True,
              help="Tokens per forward call (rows x length).")
@click.option("--progress/--no-progress", default=_score("progress"), show_default=True,
              help="Show a progress bar on stderr.")
def score_command(vcf, genome, checkpoint, window, windows, placement, rc_average, reduce, out, vcf_out, device,
                  dtype, batch_tokens, progress) -> None:
    """Score variants: log-likelihood ratio of the ALT versus the REF sequence in a window around each.

    score = S(ALT window) - S(REF window), S = sum over the window's tokens (all but the first) of log p(token | the
    tokens before it), natural log; negative: the model finds ALT less likely. SNVs and indels up to 50 bases are
    scored; symbolic/structural alleles, ALT alleles equal to REF, unknown chromosomes, positions outside the genome
    and REF alleles that differ from the genome are counted and listed with their status, not scored. Multi-allelic records are split.
    See the README ("Variant scores and embeddings") for the exact definition.

    \b
    Example:
      genolc score --vcf clinvar_chr22.vcf.gz --genome hg38.fa.gz --checkpoint runs/hg38-64k \\
          --windows 8k,64k --rc-average --out scores.tsv
    """
    from genolc.score.run import run_score
    from genolc.train.state import resolve_checkpoint

    values, labels = _windows(window, windows)
    config = ScoreConfig(vcf=vcf, genome=genome, checkpoint=resolve_checkpoint(checkpoint, "--checkpoint"), out=out,
                         windows=values, window_labels=labels, placement=placement, rc_average=rc_average,
                         reduce=reduce, vcf_out=vcf_out, device=device, dtype=dtype,
                         batch_tokens=parse_length(batch_tokens, "--batch-tokens"), progress=progress)
    summary = run_score(config)
    counts = ", ".join(f"{n} {status}" for status, n in summary["by_status"].items())
    click.echo(f"{summary['variants']} alleles from {summary['records']} records: {counts}")
    forwards = summary["forwards"]
    if forwards["unshared_forward_tokens"]:
        click.echo(f"forward tokens: {forwards['forward_tokens']:,} ({forwards['saved_forward_tokens']:,} saved by "
                   f"sharing REF windows and prefixes: {forwards['shared_ref_windows']} REF windows reused, "
                   f"{forwards['alt_rows_from_ref_prefix']} ALT windows continued from their REF's prefix)")
    if summary["unknown_chromosomes"]:
        click.echo(f"chromosomes not in the genome (skipped): {', '.join(summary['unknown_chromosomes'][:20])}")
    for path in summary["outputs"].values():
        click.echo(f"wrote {path}")


@click.command("embed")
@click.option("--bed", required=True, type=_PATH, help="Regions: BED (chrom, 0-based start, end, optional name).")
@click.option("--genome", required=True, type=_PATH, help="Reference FASTA, plain or bgzip, read by index.")
@click.option("--checkpoint", required=True, type=_PATH,
              help="Model checkpoint, or a finetune run directory: its newest checkpoint.")
@click.option("--pool", type=click.Choice(["mean", "none"]), default=_embed("pool"), show_default=True,
              help="mean: one vector per region; none: one vector per token.")
@click.option("--layer", type=int, default=_embed("layer"),
              help="Decoder layer N (0-based, streams averaged); default: the final norm's output.")
@click.option("--out", "-o", required=True, type=_PATH,
              help="FILE.npy (with FILE.npy.names.tsv beside it) or FILE.parquet (needs pyarrow).")
@click.option("--chunk", default=_embed("window_chunk", format_length), show_default=True,
              help="Regions longer than this many tokens run chunk by chunk (same result, bounded memory).")
@click.option("--device", type=_DEVICE, default=_embed("device"), show_default=True,
              help="Where to run (auto: CUDA when visible, else CPU).")
@click.option("--dtype", type=_DTYPE, default=_embed("dtype"), show_default=True,
              help="auto: bfloat16 on CUDA, float32 on CPU.")
@click.option("--progress/--no-progress", default=_embed("progress"), show_default=True,
              help="Show a progress bar on stderr.")
def embed_command(bed, genome, checkpoint, pool, layer, out, chunk, device, dtype, progress) -> None:
    """Embed regions: a model's hidden states over each BED interval, mean-pooled or per token.

    With --pool mean, FILE.npy is [regions, D]; with --pool none it is [total tokens, D] and the names file gives
    each region's rows (row_start, row_stop). An interval outside the genome is an error.

    \b
    Example:
      genolc embed --bed promoters.bed --genome hg38.fa.gz --checkpoint runs/hg38-64k --layer 6 --out promoters.npy
    """
    from genolc.score.run import run_embed
    from genolc.train.state import resolve_checkpoint

    config = EmbedConfig(bed=bed, genome=genome, checkpoint=resolve_checkpoint(checkpoint, "--checkpoint"), out=out,
                         pool=pool, layer=layer, device=device, dtype=dtype,
                         window_chunk=parse_length(chunk, "--chunk"), progress=progress)
    summary = run_embed(config)
    click.echo(f"embedded {summary['regions']} regions (dimension {summary['dim']}, pool {summary['pool']})")
    for path in summary["outputs"].values():
        click.echo(f"wrote {path}")
