"""``genolc convert SRC --out DST [--layout text|multimodal]``: rewrite a checkpoint in the other layout."""

from __future__ import annotations

from pathlib import Path

import click

from genolc.fsutil import check_output_dir
from genolc.runs import run_record


class _UnlistedArgument(click.Argument):
    """A positional argument left out of the usage line: the deprecated ``DST`` of ``genolc convert SRC DST``."""

    def get_usage_pieces(self, ctx: click.Context) -> list[str]:
        return []


@click.command("convert")
@click.argument("src", type=click.Path(file_okay=False, path_type=Path))
@click.argument("legacy_dst", required=False, cls=_UnlistedArgument, type=click.Path(file_okay=False, path_type=Path))
@click.option("--out", "-o", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="Directory to write the converted checkpoint to (required): new, empty or an earlier conversion's, "
                   "replaced atomically.")
@click.option("--layout", type=click.Choice(["text", "multimodal"]), default="text", show_default=True,
              help="text: flat config + model.* weights (genolc's own); multimodal: Glm5NextForConditionalGeneration "
                   "(text_config, model.language_model.* weights).")
def convert(src: Path, legacy_dst: Path | None, out: Path | None, layout: str) -> None:
    """Convert the checkpoint in SRC to --layout, written atomically to --out (vision weights are dropped).

    SRC is a checkpoint directory, or a finetune run directory: its newest checkpoint.

    \b
    Examples:
      genolc convert runs/hg38-512k --out hf/hg38-512k --layout multimodal
      genolc convert hf/hg38-512k -o ckpt/hg38-512k --layout text
    """
    from genolc.model.checkpoint import convert_checkpoint
    from genolc.train.state import resolve_checkpoint

    if legacy_dst is not None and out is not None:
        raise click.UsageError("give the destination once, with --out (DST after SRC is its old spelling)")
    if legacy_dst is not None:
        click.echo("genolc: warning: `genolc convert SRC DST` is deprecated; use `genolc convert SRC --out DST`",
                   err=True)
        out = legacy_dst
    if out is None:
        raise click.UsageError("Missing option '-o' / '--out'.")
    # Refused before the source is read: a large checkpoint is not loaded only to be refused its destination.
    check_output_dir(out, "checkpoint directory")
    src = resolve_checkpoint(src, "SRC")
    with run_record("convert", out, {"src": str(src), "dst": str(out), "layout": layout}) as record:
        record.add_input(src / "config.json")
        summary = convert_checkpoint(src, out, layout=layout)
    click.echo(f"wrote {out} ({summary['layout']} layout, {summary['tensors']} tensors, "
               f"{summary['parameters']:,} parameters)")
