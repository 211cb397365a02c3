"""``genolc convert SRC DST [--layout text|multimodal]``: rewrite a checkpoint in the other transformers layout."""

from __future__ import annotations

import click

from genolc.fsutil import check_output_dir
from genolc.runs import run_record


@click.command("convert")
@click.argument("src", type=click.Path(file_okay=False, path_type=str))
@click.argument("dst", type=click.Path(file_okay=False, path_type=str))
@click.option("--layout", type=click.Choice(["text", "multimodal"]), default="text", show_default=True,
              help="text: flat config + model.* weights (genolc's own); multimodal: Glm5NextForConditionalGeneration "
                   "(text_config, model.language_model.* weights).")
def convert(src: str, dst: str, layout: str) -> None:
    """Convert the checkpoint in SRC to LAYOUT, written atomically to DST (vision weights are dropped)."""
    from genolc.model.checkpoint import convert_checkpoint

    # Refused before the source is read: a large checkpoint is not loaded only to be refused its destination.
    check_output_dir(dst, "checkpoint directory")
    with run_record("convert", dst, {"src": src, "dst": dst, "layout": layout}) as record:
        record.add_input(f"{src}/config.json")
        summary = convert_checkpoint(src, dst, layout=layout)
    click.echo(f"wrote {dst} ({summary['layout']} layout, {summary['tensors']} tensors, "
               f"{summary['parameters']:,} parameters)")
