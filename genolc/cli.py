"""The ``genolc`` command line. Commands stay thin: parse options, build a config, call one function.

Errors a user can cause (:class:`genolc.errors.GenolcError`) are printed as one message and exit with code 2; a
Ctrl-C that no command handles itself (e.g. during start-up) prints one line and exits with 130.
Each stage owns its command in ``genolc/<stage>/command.py``; this file only lists them. Commands are imported when
they run, so ``genolc --help`` does not pay for importing torch.
"""

from __future__ import annotations

import importlib
import sys

import click

import genolc
from genolc.errors import GenolcError
from genolc.parallel.launch import leave_quietly, quiet_rank

# command name -> (module, attribute, one-line summary shown by `genolc --help`)
COMMANDS: dict[str, tuple[str, str, str]] = {
    "prepare": ("genolc.data.command", "prepare_command", "Tokenize genome files into a training/held-out dataset."),
    "finetune": ("genolc.train.command", "finetune_command", "Train or finetune a model on a prepared dataset."),
    "eval": ("genolc.eval.command", "eval_command", "Held-out loss by context position, needle tests."),
    "convert": ("genolc.model.command", "convert", "Convert checkpoints between transformers layouts."),
    "plan": ("genolc.train.plan_command", "plan_command", "Predict finetune's memory and step time for a window."),
    "score": ("genolc.score.command", "score_command", "Score variants (VCF) by the model's log-likelihood ratio."),
    "embed": ("genolc.score.command", "embed_command", "Hidden-state embeddings of BED regions."),
    "runs": ("genolc.runs_command", "runs_command", "List, show and compare run records (failures included)."),
    "demo": ("genolc.demo.command", "demo_command", "Run the whole pipeline on bundled real human DNA."),
    "export": ("genolc.export.command", "export_command", "Export windows and configs for SkyRL or Megatron-core."),
}


class GenolcGroup(click.Group):
    """Loads commands lazily and turns GenolcError into one clear message and exit code 2, no traceback."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(COMMANDS)

    def get_command(self, ctx: click.Context, name: str) -> click.Command | None:
        if name not in COMMANDS:
            return None
        module, attribute, _ = COMMANDS[name]
        return getattr(importlib.import_module(module), attribute)

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        rows = [(name, COMMANDS[name][2]) for name in self.list_commands(ctx)]
        with formatter.section("Commands"):
            formatter.write_dl(rows)

    def make_context(self, *args, **kwargs) -> click.Context:
        try:
            return super().make_context(*args, **kwargs)
        except click.UsageError as exc:
            _quiet_on_other_ranks(exc)
            raise
        except KeyboardInterrupt:
            _interrupted()

    def invoke(self, ctx: click.Context):
        try:
            return super().invoke(ctx)
        except GenolcError as exc:
            click.echo(f"genolc: error: {exc.message}", err=True)
            sys.exit(exc.exit_code)
        except click.UsageError as exc:
            _quiet_on_other_ranks(exc)
            raise
        except KeyboardInterrupt:
            # Ctrl-C outside a command's own stop handling (start-up: importing torch, loading inputs): one line and
            # the shell's exit code for SIGINT, not click's "Aborted!" and exit code 1.
            _interrupted()


def _quiet_on_other_ranks(exc: click.UsageError) -> None:
    # Every torchrun rank parses the same command line: rank 0 alone reports a mistake in it.
    if quiet_rank():
        leave_quietly(exc.exit_code)


def _interrupted() -> None:
    click.echo("genolc: interrupted (Ctrl-C)", err=True)
    sys.exit(130)


@click.group(cls=GenolcGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(genolc.__version__, prog_name="genolc")
def main() -> None:
    """genolc: long-context genomic language modeling (prepare, finetune, eval)."""


if __name__ == "__main__":
    main()
