"""`genolc export`: parse options, build an ExportConfig, call genolc.export.run.export under a run record."""

from __future__ import annotations

from pathlib import Path

import click

from genolc.export.config import DEFAULT_MODEL_PATH, FORMATS, ExportConfig
from genolc.units import parse_length


@click.command("export")
@click.argument("dataset", type=click.Path(path_type=Path))
@click.option("--format", "format_", default="skyrl", show_default=True, metavar="|".join(FORMATS),
              help="skyrl: SkyRL 0.4.0 pretokenized SFT Parquet (input_ids, loss_mask) plus a SkyRL SFT config; "
                   "megatron: Megatron-core model-provider arguments (the data is read in place).")
@click.option("--seq", "seq", required=True, metavar="LENGTH", help="Input tokens per window, e.g. 512k (k = 1024).")
@click.option("--out", "-o", "out", required=True, type=click.Path(path_type=Path),
              help="Export directory: new, empty or an earlier export's, replaced atomically.")
@click.option("--windows", default=1024, show_default=True, type=int,
              help="Rows to write: genolc's training windows for steps 0..N-1.")
@click.option("--seed", default=0, show_default=True, type=int, help="Seed of the training windows.")
@click.option("--max-n-fraction", default=0.1, show_default=True, type=float,
              help="Skip windows with more ambiguous (N) tokens than this.")
@click.option("--reverse-complement/--no-reverse-complement", default=False, show_default=True,
              help="Reverse-complement half the windows, as finetune does.")
@click.option("--text-tokenizer", default=None, type=click.Path(path_type=Path), metavar="FILE",
              help="Tokenize the bases with a checkpoint's own tokenizer (a `tokenizers` JSON file) instead of the "
                   "dataset's genome tokenizer.")
@click.option("--model", default="glm-5.3-flash", show_default=True, metavar="PRESET|DIR",
              help="Architecture to size the parallel layout for: a preset or a transformers-layout checkpoint.")
@click.option("--model-path", default=DEFAULT_MODEL_PATH, show_default=True,
              help="Checkpoint the trainer starts from (a Hugging Face name or a directory).")
@click.option("--gpus", default=64, show_default=True, type=int, help="GPUs to train on (whole nodes beyond one).")
@click.option("--gpus-per-node", default=8, show_default=True, type=int, help="GPUs in each node.")
@click.option("--gpu-memory", "gpu_memory_gib", default=139.0, show_default=True, type=float, metavar="GIB",
              help="Memory of each GPU in GiB (H200: 139, B200: 178).")
@click.option("--max-context-parallel", default=1, show_default=True, type=int, metavar="N",
              help="Largest context-parallel size to consider; 1 because SkyRL 0.4.0's KDA layers and megatron-core "
                   "0.16.1's DSA refuse context parallelism.")
@click.option("--progress/--no-progress", default=True, show_default=True, help="Show a progress bar on stderr.")
def export_command(dataset: Path, format_: str, seq: str, **options) -> None:
    """Export DATASET (a prepared dataset) for training by SkyRL or Megatron-core.

    Writes genolc's training windows (N positions carry loss_mask 0) with a manifest, and a config whose tensor,
    context and expert parallel sizes fit --gpus GPUs of --gpu-memory GiB by genolc's memory model
    (docs/scaling-out.md).

    \b
    Example:
      genolc export data/hg38 --format skyrl --seq 512k --gpus 64 --out export/hg38-512k
      genolc finetune --backend skyrl --data export/hg38-512k --seq 512k --out runs/hg38-skyrl
    """
    from genolc.export.run import export, summary_line
    from genolc.runs import run_record

    config = ExportConfig(data=dataset, format=format_, seq_len=parse_length(seq, what="--seq"), **options)
    with run_record("export", config.out, config.to_dict()) as record:
        record.add_input(Path(dataset) / "manifest.json")
        manifest = export(config)
        record.outputs.update(manifest["counts"])
    click.echo(summary_line(manifest, config.out))
