"""`genolc demo`: parse options, build a DemoConfig, call genolc.demo.pipeline.run_demo, print the report."""

from __future__ import annotations

from pathlib import Path

import click

from genolc.config_defaults import config_default
from genolc.demo.config import DEVICES, DemoConfig
from genolc.units import parse_length


@click.command("demo")
@click.option("--out", "-o", default=config_default(DemoConfig, "out"), show_default=True,
              type=click.Path(path_type=Path),
              help="Output directory: new, empty or an earlier demo's (reused).")
@click.option("--steps", type=int, default=config_default(DemoConfig, "steps"),
              help="Optimizer steps (default: 40 on CPU, 60 on CUDA).")
@click.option("--seq", default=None, metavar="LENGTH",
              help="Window length in tokens for training and evaluation, e.g. 4k (default: the demo's plan for "
                   "this machine, 2k on CPU, 16k on CUDA).")
@click.option("--smoke", is_flag=True, help="Smallest end-to-end form (seconds; for CI).")
@click.option("--device", type=click.Choice(DEVICES), default=config_default(DemoConfig, "device"), show_default=True,
              help="Where to train and evaluate (auto: CUDA when visible, else CPU).")
@click.option("--seed", type=int, default=config_default(DemoConfig, "seed"), show_default=True,
              help="Seed for the initial weights, the training windows and the bootstrap.")
@click.option("--progress/--no-progress", default=config_default(DemoConfig, "progress"), show_default=True,
              help="Show progress bars on stderr.")
def demo_command(out: Path, steps: int | None, seq: str | None, smoke: bool, device: str, seed: int,
                 progress: bool) -> None:
    """Prepare, fine-tune and evaluate on the real human sample bundled with genolc, then report.

    The demo picks every size for this machine (preset, window length, steps); --steps and --seq override them.

    \b
    Example:
      genolc demo --out genolc-demo
    """
    from genolc.demo.pipeline import run_demo
    from genolc.eval.report import bucket_report

    config = DemoConfig(out=out, steps=steps, seq=parse_length(seq, what="--seq") if seq else None, smoke=smoke,
                        device=device, seed=seed, progress=progress)
    result = run_demo(config)
    click.echo(f"\nheld-out chr22 bits/base by context position ({result['plan'].model} preset; baseline = the "
               "same model untrained; uniform ACGT = 2):")
    click.echo(bucket_report(result["summary"]))
    click.echo(f"\nreport: {result['report']}  (README.md, by_position.png, buckets.csv, commands.sh)")
