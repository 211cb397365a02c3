"""``genolc eval``: the click command. Parses options, builds a config, calls one function."""

from __future__ import annotations

import contextlib
import datetime as dt
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import click

from genolc.errors import ConfigError
from genolc.runs import run_record
from genolc.units import parse_length

_PATH = click.Path(path_type=Path)


@click.command("eval")
@click.option("--by-position", "by_position", metavar="CHROM[,CHROM…]|heldout",
              help="Held-out loss by preceding-context position on these records (or every held-out record). "
                   "One of --by-position, --needle and --routing is required.")
@click.option("--needle", is_flag=False, flag_value="heldout", default=None, metavar="[CHROM[,CHROM…]|heldout]",
              help="Needle test: a random segment planted twice at distance D in held-out windows (alone: every "
                   "held-out record). One of --by-position, --needle and --routing is required.")
@click.option("--routing", is_flag=False, flag_value="heldout", default=None, metavar="[CHROM[,CHROM…]|heldout]",
              help="MoE routing by context length: the same held-out DNA cut into windows of each --seq length "
                   "(a list, e.g. 1k,4k,16k); tokens per expert, busiest/mean, router entropy, capacity drop shares.")
@click.option("--routing-group", default="64k", show_default=True, metavar="N",
              help="With --routing: tokens per dispatch group, the budget a capacity factor is applied to.")
@click.option("--data", required=True, type=_PATH, help="Prepared dataset directory (genolc prepare).")
@click.option("--checkpoint", required=True, type=_PATH,
              help="Model checkpoint (save_pretrained or genolc finetune), or a finetune run directory: its newest "
                   "checkpoint.")
@click.option("--seq", required=True, metavar="LENGTH",
              help="Window length in tokens, e.g. 64k (k = 1024; windows hold seq + 1); with --routing a list.")
@click.option("--baseline", type=_PATH,
              help="Second checkpoint (or finetune run directory) scored on the same targets; paired deltas.")
@click.option("--context", "contexts", multiple=True, metavar="K",
              help="Context-truncation control: also score with only the last K tokens visible (repeatable).")
@click.option("--context-block", default=None, metavar="M",
              help="Targets per truncated-context forward (default K/4: visible context K..1.25K, 5x cost).")
@click.option("--first-bucket", default="1k", show_default=True,
              help="Upper edge of the first position bucket; later edges double ([0,1k), [1k,2k), …).")
@click.option("--rc-average", is_flag=True, help="Score both strands and average per target.")
@click.option("--max-windows", type=int, default=None, help="Score at most N windows (evenly spaced).")
@click.option("--max-tokens", default=None, metavar="N",
              help="Score at most N window tokens (whole windows); with --routing: tokens per length (default: one "
                   "dispatch group).")
@click.option("--max-n-fraction", type=float, default=0.5, show_default=True,
              help="Skip windows with a larger share of ambiguous (N) tokens.")
@click.option("--bootstrap", "n_boot", type=int, default=1000, show_default=True, help="Bootstrap replicates.")
@click.option("--seed", type=int, default=0, show_default=True, help="Seed for the bootstrap and the needle.")
@click.option("--per-target", is_flag=True, help="Also write targets.csv.gz (one row per scored target).")
@click.option("--needle-bases", type=int, default=256, show_default=True, help="Needle segment length in bases.")
@click.option("--needle-trials", type=int, default=8, show_default=True, help="Needle trials (window + segment).")
@click.option("--needle-distance", "needle_distances", multiple=True, metavar="D",
              help="Needle distance in tokens (repeatable; default 1k, 2k, … up to the window).")
@click.option("--force", is_flag=True, help="Score records the checkpoint was trained on anyway.")
@click.option("--device", type=click.Choice(["auto", "cpu", "cuda"]), default="auto", show_default=True,
              help="Where to score (auto: CUDA when visible, else CPU).")
@click.option("--dtype", type=click.Choice(["auto", "float32", "bfloat16"]), default="auto", show_default=True,
              help="auto: bfloat16 on CUDA, float32 on CPU.")
@click.option("--batch-tokens", default="64k", show_default=True, help="Tokens per forward call (rows x length).")
@click.option("--out", "-o", type=_PATH, default=None,
              help="Output directory: new, empty or an earlier evaluation's, replaced atomically "
                   "(default: ./genolc-eval-<time> or ./genolc-needle-<time>).")
@click.option("--progress/--no-progress", default=True, show_default=True, help="Show a progress bar on stderr.")
@click.option("--quiet", is_flag=True, hidden=True, help="Deprecated spelling of --no-progress.")
@click.option("--threads", type=int, default=None, metavar="N",
              help="CPU threads for torch (default: $OMP_NUM_THREADS if set, else the cores free now).")
def eval_command(by_position, needle, routing, routing_group, data, checkpoint, seq, baseline, contexts, context_block,
                 first_bucket,
                 rc_average,
                 max_windows, max_tokens, max_n_fraction, n_boot, seed, per_target, needle_bases, needle_trials,
                 needle_distances, force, device, dtype, batch_tokens, out, progress, quiet, threads) -> None:
    """Evaluate a checkpoint on held-out records: loss by context position (--by-position) or copying (--needle).

    Exactly one of --by-position, --needle and --routing is required. --by-position ends by printing the per-bucket
    table (bits/base of the model, the baseline and each context control) and the paired comparisons; --routing
    prints, per context length and MoE layer, the busiest expert's load, the router entropy and the share of tokens
    capacity factors 1, 1.25, 1.5 and 2 would drop.

    \b
    Examples:
      genolc eval --by-position chr22 --data data/hg38 --checkpoint runs/hg38-512k --seq 512k --context 4096
      genolc eval --needle --data data/hg38 --checkpoint runs/hg38-512k --seq 64k
      genolc eval --routing --data data/hg38 --checkpoint runs/hg38-512k --seq 4k,64k,512k --max-tokens 1m
    """
    from genolc.train.state import resolve_checkpoint

    if quiet:
        click.echo("genolc: warning: --quiet is deprecated; use --no-progress", err=True)
    if sum(mode is not None for mode in (by_position, needle, routing)) != 1:
        raise ConfigError("choose exactly one of --by-position CHROM[,CHROM…]|heldout, --needle and --routing",
                          fix="e.g. genolc eval --by-position chr22 --data DIR --checkpoint CKPT --seq 64k")
    checkpoint = resolve_checkpoint(checkpoint, "--checkpoint")
    stamp = dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    if routing is not None:
        _eval_routing(routing, data, checkpoint, seq, routing_group, max_tokens, max_n_fraction, force, device, dtype,
                      batch_tokens, out or Path(f"genolc-routing-{stamp}"), progress and not quiet, threads)
        return
    if baseline is not None:
        baseline = resolve_checkpoint(baseline, "--baseline")
    common = dict(data=data, checkpoint=checkpoint, seq_len=parse_length(seq, "--seq"), seed=seed, n_boot=n_boot,
                  force=force, device=device, dtype=dtype, max_n_fraction=max_n_fraction,
                  batch_tokens=parse_length(batch_tokens, "--batch-tokens"), progress=progress and not quiet,
                  threads=threads)
    if by_position is not None:
        from genolc.eval.by_position import ByPositionConfig, run_by_position

        config = ByPositionConfig(
            records=by_position, out=out or Path(f"genolc-eval-{stamp}"), baseline=baseline,
            contexts=tuple(parse_length(k, "--context") for k in contexts),
            context_block=parse_length(context_block, "--context-block") if context_block else None,
            first_bucket=parse_length(first_bucket, "--first-bucket"), rc_average=rc_average, max_windows=max_windows,
            max_tokens=parse_length(max_tokens, "--max-tokens") if max_tokens else None,
            per_target=per_target, **common)
        with _print_kept(_echo_by_position):
            with run_record("eval", config.out, config.to_dict()) as record:
                summary = run_by_position(config, record)
        _echo_by_position(summary)
        click.echo(f"wrote {config.out}")
        return
    from genolc.eval.needle import NeedleConfig, run_needle

    config = NeedleConfig(records=needle, out=out or Path(f"genolc-needle-{stamp}"), segment_bases=needle_bases,
                          trials=needle_trials,
                          distances=tuple(parse_length(d, "--needle-distance") for d in needle_distances), **common)
    with _print_kept(_echo_needle):
        with run_record("eval-needle", config.out, config.to_dict()) as record:
            summary = run_needle(config, record)
    _echo_needle(summary)
    click.echo(f"wrote {config.out}")


def _eval_routing(records, data, checkpoint, seq, group, max_tokens, max_n_fraction, force, device, dtype,
                  batch_tokens, out, progress, threads) -> None:
    from genolc.eval.routing import RoutingConfig, routing_table, run_routing
    from genolc.threads import run_threads

    config = RoutingConfig(data=data, checkpoint=checkpoint, out=out, records=records,
                           lengths=tuple(parse_length(part, "--seq") for part in seq.split(",") if part.strip()),
                           group_tokens=parse_length(group, "--routing-group"),
                           max_tokens=parse_length(max_tokens, "--max-tokens") if max_tokens else None,
                           max_n_fraction=max_n_fraction, force=force, device=device, dtype=dtype,
                           batch_tokens=parse_length(batch_tokens, "--batch-tokens"), progress=progress)
    with run_record("eval-routing", config.out, config.to_dict()) as record, run_threads(threads, record):
        summary = run_routing(config, record)
    click.echo(f"MoE routing by context length ({summary['tokens_per_length']} tokens each):")
    click.echo(routing_table(summary["routing"]).to_string(index=False, float_format=lambda v: f"{v:.3f}"))
    click.echo(f"wrote {config.out}")


@contextlib.contextmanager
def _print_kept(echo: Callable[[dict[str, Any]], None]) -> Iterator[None]:
    """A stop (Ctrl-C) that kept results prints them like a finished run, then its message says what they are."""
    from genolc.signals import Interrupted

    try:
        yield
    except Interrupted as stopped:
        if stopped.kept is not None:
            echo(stopped.kept)
        raise


def _echo_by_position(summary: dict[str, Any]) -> None:
    from genolc.eval.report import bucket_report

    windows = summary["windows"]
    partial = (f"; INTERRUPTED: {windows['scored']} of {windows['selected']} windows scored"
               if summary.get("status") == "interrupted" else "")
    click.echo(f"held-out bits/base by context position ({', '.join(summary['records'])}{partial}):")
    click.echo(bucket_report(summary))


def _echo_needle(summary: dict[str, Any]) -> None:
    needle = summary["needle"]
    if summary.get("status") == "interrupted":
        click.echo(f"INTERRUPTED: {needle['trials_done']} of {needle['trials']} needle trials done")
    for row in summary["per_distance"]:
        click.echo(f"D={row['distance']}: first copy {row['first_bits_per_base']:.3f}, "
                   f"second copy {row['second_bits_per_base']:.3f} bits/base")
