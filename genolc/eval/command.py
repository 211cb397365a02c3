"""``genolc eval``: the click command. Parses options, builds a config, calls one function.

The options come in groups: the mode (exactly one of --by-position, --needle, --routing), the inputs every mode
shares (:func:`_shared_setup` parses and resolves them once), and each mode's own. Defaults are the configs'
(:mod:`genolc.eval.config`).
"""

from __future__ import annotations

import contextlib
import datetime as dt
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import click

from genolc.config_defaults import config_default
from genolc.errors import ConfigError
from genolc.eval.config import ByPositionConfig, EvalInputs, NeedleConfig, RoutingConfig
from genolc.runs import run_record
from genolc.units import format_length, parse_length

_PATH = click.Path(path_type=Path)


def _options(*options: Callable[[Callable], Callable]) -> Callable[[Callable], Callable]:
    """Apply click options so that --help lists them in the order given."""
    def apply(command: Callable) -> Callable:
        for option in reversed(options):
            command = option(command)
        return command
    return apply


MODE_OPTIONS = (
    click.option("--by-position", "by_position", metavar="CHROM[,CHROM…]|heldout",
                 help="Held-out loss by preceding-context position on these records (or every held-out record). "
                      "One of --by-position, --needle and --routing is required."),
    click.option("--needle", is_flag=False, flag_value="heldout", default=None, metavar="[CHROM[,CHROM…]|heldout]",
                 help="Needle test: a random segment planted twice at distance D in held-out windows (alone: every "
                      "held-out record). One of --by-position, --needle and --routing is required."),
    click.option("--routing", is_flag=False, flag_value="heldout", default=None, metavar="[CHROM[,CHROM…]|heldout]",
                 help="MoE routing by context length: the same held-out DNA cut into windows of each --seq length "
                      "(a list, e.g. 1k,4k,16k); tokens per expert, busiest/mean, router entropy, capacity drop "
                      "shares."),
    click.option("--routing-group", default=config_default(RoutingConfig, "group_tokens", format_length),
                 show_default=True, metavar="N",
                 help="With --routing: tokens per dispatch group, the budget a capacity factor is applied to."),
)
SHARED_OPTIONS = (
    click.option("--data", required=True, type=_PATH, help="Prepared dataset directory (genolc prepare)."),
    click.option("--checkpoint", required=True, type=_PATH,
                 help="Model checkpoint (save_pretrained or genolc finetune), or a finetune run directory: its "
                      "newest checkpoint."),
    click.option("--seq", required=True, metavar="LENGTH",
                 help="Window length in tokens, e.g. 64k (k = 1024; windows hold seq + 1); with --routing a list."),
)
BY_POSITION_OPTIONS = (
    click.option("--baseline", type=_PATH,
                 help="Second checkpoint (or finetune run directory) scored on the same targets; paired deltas."),
    click.option("--context", "contexts", multiple=True, metavar="K",
                 help="Context-truncation control: also score with only the last K tokens visible (repeatable)."),
    click.option("--context-block", default=config_default(ByPositionConfig, "context_block"), metavar="M",
                 help="Targets per truncated-context forward (default K/4: visible context K..1.25K, 5x cost)."),
    click.option("--first-bucket", default=config_default(ByPositionConfig, "first_bucket", format_length),
                 show_default=True,
                 help="Upper edge of the first position bucket; later edges double ([0,1k), [1k,2k), …)."),
    click.option("--rc-average", is_flag=True, help="Score both strands and average per target."),
    click.option("--max-windows", type=int, default=config_default(ByPositionConfig, "max_windows"),
                 help="Score at most N windows (evenly spaced)."),
    click.option("--max-tokens", default=config_default(ByPositionConfig, "max_tokens"), metavar="N",
                 help="Score at most N window tokens (whole windows); with --routing: tokens per length (default: "
                      "one dispatch group)."),
)
SAMPLING_OPTIONS = (
    click.option("--max-n-fraction", type=float, default=config_default(EvalInputs, "max_n_fraction"),
                 show_default=True, help="Skip windows with a larger share of ambiguous (N) tokens."),
    click.option("--bootstrap", "n_boot", type=int, default=config_default(EvalInputs, "n_boot"), show_default=True,
                 help="Bootstrap replicates."),
    click.option("--seed", type=int, default=config_default(EvalInputs, "seed"), show_default=True,
                 help="Seed for the bootstrap and the needle."),
    click.option("--per-target", is_flag=True, help="Also write targets.csv.gz (one row per scored target)."),
)
NEEDLE_OPTIONS = (
    click.option("--needle-bases", type=int, default=config_default(NeedleConfig, "segment_bases"),
                 show_default=True, help="Needle segment length in bases."),
    click.option("--needle-trials", type=int, default=config_default(NeedleConfig, "trials"), show_default=True,
                 help="Needle trials (window + segment)."),
    click.option("--needle-distance", "needle_distances", multiple=True, metavar="D",
                 help="Needle distance in tokens (repeatable; default 1k, 2k, … up to the window)."),
)
RUN_OPTIONS = (
    click.option("--force", is_flag=True, help="Score records the checkpoint was trained on anyway."),
    click.option("--device", type=click.Choice(["auto", "cpu", "cuda"]), default=config_default(EvalInputs, "device"),
                 show_default=True, help="Where to score (auto: CUDA when visible, else CPU)."),
    click.option("--dtype", type=click.Choice(["auto", "float32", "bfloat16"]),
                 default=config_default(EvalInputs, "dtype"), show_default=True,
                 help="auto: bfloat16 on CUDA, float32 on CPU."),
    click.option("--batch-tokens", default=config_default(EvalInputs, "batch_tokens", format_length),
                 show_default=True, help="Tokens per forward call (rows x length)."),
    click.option("--out", "-o", type=_PATH, default=None,
                 help="Output directory: new, empty or an earlier evaluation's, replaced atomically "
                      "(default: ./genolc-eval-<time> or ./genolc-needle-<time>)."),
    click.option("--progress/--no-progress", default=config_default(EvalInputs, "progress"), show_default=True,
                 help="Show a progress bar on stderr."),
    click.option("--quiet", is_flag=True, hidden=True, help="Deprecated spelling of --no-progress."),
    click.option("--threads", type=int, default=config_default(EvalInputs, "threads"), metavar="N",
                 help="CPU threads for torch (default: $OMP_NUM_THREADS if set, else the cores free now)."),
)
# Output directory names by mode when --out is not given: genolc-<name>-<time>.
_OUT_NAMES = {"by_position": "eval", "needle": "needle", "routing": "routing"}
_MODE_FLAGS = {"by_position": "--by-position", "needle": "--needle", "routing": "--routing"}
# The options only some modes read (by parameter name); every other option applies to every mode. Giving one to a
# mode that does not read it is refused (it would be silently ignored otherwise).
MODES_OF_OPTION: dict[str, tuple[str, ...]] = {
    "routing_group": ("routing",),
    "baseline": ("by_position",), "contexts": ("by_position",), "context_block": ("by_position",),
    "first_bucket": ("by_position",), "rc_average": ("by_position",), "max_windows": ("by_position",),
    "max_tokens": ("by_position", "routing"),
    "n_boot": ("by_position", "needle"), "seed": ("by_position", "needle"), "per_target": ("by_position",),
    "needle_bases": ("needle",), "needle_trials": ("needle",), "needle_distances": ("needle",),
}


@click.command("eval")
@_options(*MODE_OPTIONS, *SHARED_OPTIONS, *BY_POSITION_OPTIONS, *SAMPLING_OPTIONS, *NEEDLE_OPTIONS, *RUN_OPTIONS)
def eval_command(by_position: str | None, needle: str | None, routing: str | None, quiet: bool, **options) -> None:
    """Evaluate a checkpoint on held-out records: loss by context position (--by-position) or copying (--needle).

    Exactly one of --by-position, --needle and --routing is required. --by-position ends by printing the per-bucket
    table (bits/base of the model, the baseline and each context control) and the paired comparisons; --routing
    prints, per context length and MoE layer, the busiest expert's load, the router entropy and the share of tokens
    capacity factors 1, 1.25, 1.5 and 2 would drop. An option of another mode (e.g. --baseline with --routing) is
    an error.

    \b
    Examples:
      genolc eval --by-position chr22 --data data/hg38 --checkpoint runs/hg38-512k --seq 512k --context 4096
      genolc eval --needle --data data/hg38 --checkpoint runs/hg38-512k --seq 64k
      genolc eval --routing --data data/hg38 --checkpoint runs/hg38-512k --seq 4k,64k,512k --max-tokens 1m
    """
    if quiet:
        click.echo("genolc: warning: --quiet is deprecated; use --no-progress", err=True)
        options["progress"] = False
    modes = {name: records for name, records in
             (("by_position", by_position), ("needle", needle), ("routing", routing)) if records is not None}
    if len(modes) != 1:
        raise ConfigError("choose exactly one of --by-position CHROM[,CHROM…]|heldout, --needle and --routing",
                          fix="e.g. genolc eval --by-position chr22 --data DIR --checkpoint CKPT --seq 64k")
    [(mode, records)] = modes.items()
    _refuse_options_of_other_modes(click.get_current_context(), mode)
    shared = _shared_setup(mode, records, options)
    {"by_position": _eval_by_position, "needle": _eval_needle, "routing": _eval_routing}[mode](shared, options)


def _refuse_options_of_other_modes(ctx: click.Context, mode: str) -> None:
    """ConfigError naming every option given on the command line that ``mode`` does not read, and its mode(s)."""
    given = [param for param in ctx.command.params
             if mode not in MODES_OF_OPTION.get(param.name, (mode,))
             and ctx.get_parameter_source(param.name) not in (None, click.core.ParameterSource.DEFAULT)]
    if not given:
        return
    names = [next(o for o in param.opts if o.startswith("--")) for param in given]
    read_by = [f"{name} (read by {' and '.join(_MODE_FLAGS[m] for m in MODES_OF_OPTION[param.name])})"
               for name, param in zip(names, given)]
    one = len(names) == 1
    raise ConfigError(f"{', '.join(read_by)} {'does' if one else 'do'} not apply to {_MODE_FLAGS[mode]}",
                      fix=f"drop {'it' if one else 'them'}, or run the mode that reads {'it' if one else 'them'}")


def _shared_setup(mode: str, records: str, options: dict[str, Any]) -> dict[str, Any]:
    """What every mode's config takes, parsed and resolved once: records, data, checkpoint (a run directory resolves
    to its newest checkpoint), output directory (default genolc-<mode>-<time>), filters and how to run."""
    from genolc.train.state import resolve_checkpoint

    stamp = dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    return dict(records=records, data=options["data"],
                checkpoint=resolve_checkpoint(options["checkpoint"], "--checkpoint"),
                out=options["out"] or Path(f"genolc-{_OUT_NAMES[mode]}-{stamp}"),
                max_n_fraction=options["max_n_fraction"], force=options["force"], device=options["device"],
                dtype=options["dtype"], batch_tokens=parse_length(options["batch_tokens"], "--batch-tokens"),
                progress=options["progress"])


def _scored_inputs(options: dict[str, Any]) -> dict[str, Any]:
    """The rest of :class:`EvalInputs`, for the modes that score windows (--by-position, --needle)."""
    return dict(seq_len=parse_length(options["seq"], "--seq"), seed=options["seed"], n_boot=options["n_boot"],
                threads=options["threads"])


def _optional_length(text: str | None, what: str) -> int | None:
    return parse_length(text, what) if text else None


def _eval_by_position(shared: dict[str, Any], options: dict[str, Any]) -> None:
    from genolc.eval.by_position import run_by_position
    from genolc.train.state import resolve_checkpoint

    baseline = options["baseline"]
    config = ByPositionConfig(
        baseline=resolve_checkpoint(baseline, "--baseline") if baseline is not None else None,
        contexts=tuple(parse_length(k, "--context") for k in options["contexts"]),
        context_block=_optional_length(options["context_block"], "--context-block"),
        first_bucket=parse_length(options["first_bucket"], "--first-bucket"), rc_average=options["rc_average"],
        max_windows=options["max_windows"], max_tokens=_optional_length(options["max_tokens"], "--max-tokens"),
        per_target=options["per_target"], **_scored_inputs(options), **shared)
    _run_and_print("eval", config, run_by_position, _echo_by_position)


def _eval_needle(shared: dict[str, Any], options: dict[str, Any]) -> None:
    from genolc.eval.needle import run_needle

    config = NeedleConfig(
        segment_bases=options["needle_bases"], trials=options["needle_trials"],
        distances=tuple(parse_length(d, "--needle-distance") for d in options["needle_distances"]),
        **_scored_inputs(options), **shared)
    _run_and_print("eval-needle", config, run_needle, _echo_needle)


def _run_and_print(command: str, config: Any, run: Callable[[Any, Any], dict[str, Any]],
                   echo: Callable[[dict[str, Any]], None]) -> None:
    with _print_kept(echo):
        with run_record(command, config.out, config.to_dict()) as record:
            summary = run(config, record)
    echo(summary)
    click.echo(f"wrote {config.out}")


def _eval_routing(shared: dict[str, Any], options: dict[str, Any]) -> None:
    from genolc.eval.routing import run_routing
    from genolc.threads import run_threads

    config = RoutingConfig(lengths=tuple(parse_length(part, "--seq") for part in options["seq"].split(",")
                                         if part.strip()),
                           group_tokens=parse_length(options["routing_group"], "--routing-group"),
                           max_tokens=_optional_length(options["max_tokens"], "--max-tokens"), **shared)
    with _print_kept(_echo_routing):
        with run_record("eval-routing", config.out, config.to_dict()) as record, \
                run_threads(options["threads"], record):
            summary = run_routing(config, record)
    _echo_routing(summary)
    click.echo(f"wrote {config.out}")


def _echo_routing(summary: dict[str, Any]) -> None:
    from genolc.eval.routing import routing_table

    lengths = summary["lengths"]
    partial = (f"; INTERRUPTED: {len(lengths['routed'])} of {len(lengths['asked'])} context lengths routed"
               if summary.get("status") == "interrupted" else "")
    click.echo(f"MoE routing by context length ({summary['tokens_per_length']} tokens each{partial}):")
    click.echo(routing_table(summary["routing"]).to_string(index=False, float_format=lambda v: f"{v:.3f}"))


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
