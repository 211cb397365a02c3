"""The ``genolc`` command line. Commands stay thin: parse options, build a config, call one function.

Errors a user can cause (:class:`genolc.errors.GenolcError`) are printed as one message and exit with code 2.
"""

from __future__ import annotations

import sys

import click

import genolc
from genolc.errors import GenolcError


class GenolcGroup(click.Group):
    """A click group that turns GenolcError into one clear message and a non-zero exit, no traceback."""

    def invoke(self, ctx: click.Context):
        try:
            return super().invoke(ctx)
        except GenolcError as exc:
            click.echo(f"genolc: error: {exc.message}", err=True)
            sys.exit(exc.exit_code)


@click.group(cls=GenolcGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(genolc.__version__, prog_name="genolc")
def main() -> None:
    """genolc: long-context genomic language modeling (prepare, finetune, eval)."""


def _register() -> None:
    # Each stage owns its command in its own module (genolc/<stage>/command.py); this file is a plain index.
    pass


_register()

if __name__ == "__main__":
    main()
