"""`genolc plan`: what `genolc finetune` would choose for a model and window length, and what it would cost.

Prints the step strategy (genolc/train/strategy.py) that ``--chunk`` would give on the device, the predicted peak
device memory with its parts, the predicted peak host memory and the step time at a given model-FLOP utilisation.
With ``--cp N`` the memory is one context-parallel rank's (genolc/train/plan.py, estimate_context_parallel_memory).
The figures are the memory plan's (genolc/train/plan.py; 15-19 % above the steady-state peaks of `small` at 512k-1M
and `base` at 512k-2M on the H200, margin included: benchmarks/results/plan_peaks_2026-12-03/), not measurements.
"""

from __future__ import annotations

import click

from genolc.train.config import STREAM_DTYPES, resolve_stream_dtype
from genolc.units import format_length, parse_length

# Host memory besides the model: Python, torch and CUDA runtime, dataset maps (2.0-2.2 GiB in the H200 runs).
HOST_RUNTIME_BYTES = int(2.1 * 1024**3)


@click.command("plan")
@click.option("--model", "model", default="small", show_default=True,
              help="Preset: tiny | mini | small | base | glm-5.3-flash.")
@click.option("--seq", "seq", required=True, help="Input tokens per window, e.g. 1M.")
@click.option("--chunk", "chunk", default="auto", show_default=True,
              help="As finetune's --chunk: auto, off, or a chunk length such as 64k.")
@click.option("--micro-batch", default=1, show_default=True, type=int, help="Windows per micro-batch.")
@click.option("--cp", "cp", default=1, show_default=True, type=click.IntRange(min=1),
              help="Context-parallel ranks per window, as finetune's --cp (zigzag layout): memory is per rank.")
@click.option("--recompute/--no-recompute", default=False, show_default=True,
              help="Per-layer activation checkpointing (inside each chunk when chunked).")
@click.option("--device", default="cuda", show_default=True, type=click.Choice(["cuda", "cpu"]),
              help="cuda: the fast kernels' activations and bf16; cpu: the reference path in fp32.")
@click.option("--stream-dtype", default="auto", show_default=True, type=click.Choice(STREAM_DTYPES),
              help="As finetune's --stream-dtype: mHC's residual streams (auto: bfloat16 on cuda, float32 on cpu).")
@click.option("--gpu-memory", default=139.8, show_default=True, type=float,
              help="GiB the device offers (an H200: 139.8; on cpu: the host's free memory).")
@click.option("--vocab", default=16, show_default=True, type=int, help="Vocabulary size (char tokenizer: 16).")
@click.option("--mfu", default=None, type=click.FloatRange(min=0, max=1, min_open=True),
              help="Utilisation for the step-time estimate (default: measured on the H200 for the model, "
                   "genolc/train/measured.py).")
def plan_command(model: str, seq: str, chunk: str, micro_batch: int, cp: int, recompute: bool, device: str,
                 stream_dtype: str, gpu_memory: float, vocab: int, mfu: float | None) -> None:
    """Predict memory and time of `genolc finetune --model M --seq L` without running it.

    Example: genolc plan --model base --seq 1M --chunk 8k

    Example: genolc plan --model small --seq 4M --cp 8
    """
    from genolc.model import parameter_counts, preset
    from genolc.parallel.layout import Layout
    from genolc.train.command import parse_chunk
    from genolc.train.flops import token_flops
    from genolc.train.plan import (GIB, CUDA_SEQ_MULTIPLE, H200_BF16_FLOPS, OutOfMemoryPlanError,
                                   check_window_lengths, estimate_memory, estimate_step_seconds, format_gib,
                                   plans_fp32_streams)
    from genolc.train.measured import measured_utilisation
    from genolc.train.strategy import choose_context_parallel_strategy, choose_strategy

    seq_len = parse_length(seq, what="--seq")
    config = preset(model, vocab_size=vocab)
    cuda = device == "cuda"
    streams = resolve_stream_dtype(stream_dtype, cuda, why_fp32="--device cpu plans the fp32 reference path",
                                   fix="use --stream-dtype auto or float32 with --device cpu, or --device cuda")
    common = dict(windows=micro_batch, chunk=parse_chunk(chunk), recompute=recompute, bf16=cuda, fast_kernels=cuda,
                  budget_bytes=int(gpu_memory * GIB), multiple=CUDA_SEQ_MULTIPLE if cuda else 1,
                  fp32_streams=plans_fp32_streams(cuda, streams))
    try:
        check_window_lengths([seq_len], device, cp)
        if cp == 1:
            strategy = choose_strategy(config, seq_len=seq_len, grad_accum=1, auto_recompute=cuda,
                                       where=f"--model {model} --seq {format_length(seq_len)}", **common)
        else:
            pieces = Layout(seq_len, cp, "zigzag").piece_count
            strategy = choose_context_parallel_strategy(
                config, seq_len=seq_len, cp=cp, pieces=pieces, auto_recompute=cuda,
                where=f"--model {model} --seq {format_length(seq_len)} --cp {cp}", **common)
    except OutOfMemoryPlanError as error:
        click.echo(f"does not fit: {error.message}")
        return
    params = parameter_counts(config)
    tokens = seq_len * micro_batch
    # The chunked step (like recompute) runs two forwards and one backward (its last chunk one forward since session
    # 33: not counted here, an overestimate of 1 / (2 chunks) of a forward); under --cp each rank runs 1/cp of the
    # FLOPs (zigzag balances the causal attention), the collectives not counted.
    forwards = 2 if strategy.chunk is not None or strategy.recompute else 1
    # A chunked step that keeps the DSA pools chooses them once (genolc/train/chunked.py).
    passes = 1 if strategy.chunk is not None and strategy.keep_selections else forwards
    mfu = measured_utilisation(config) if mfu is None else mfu
    seconds = estimate_step_seconds(config, seq_len=seq_len, tokens_per_step=tokens, mfu=mfu, forwards=forwards,
                                    indexer_passes=passes) / cp
    # The model is built in fp32 on the host before it moves; a chunked step may keep its DSA forwards there; the
    # checkpoints written in the background (--checkpoint-every) keep the fp32 weights and AdamW's two moments in
    # host buffers (genolc/train/background_save.py), where the host has room for them.
    host = HOST_RUNTIME_BYTES + 4 * params.total + strategy.kept_attention_bytes
    checkpoint_buffers = 12 * params.total
    stream_text = "fp32 streams" if common["fp32_streams"] else "bf16 streams"
    device_text = (f"a {gpu_memory:.1f} GiB CUDA device (bf16, {stream_text}, fast kernels)" if cuda else
                   f"the CPU with {gpu_memory:.1f} GiB (fp32, reference ops)")
    click.echo(f"planned for {device_text}; --device and --gpu-memory change that")
    click.echo(strategy.describe())
    fixed_plan = estimate_memory(config, seq_len=1, bf16=cuda, fast_kernels=cuda)
    fixed = fixed_plan.weights + fixed_plan.gradients + fixed_plan.optimizer
    click.echo(f"  parameters {params.total:,} ({params.active:,} active); weights + gradients + AdamW "
               f"{format_gib(fixed)} GiB")
    per_rank = f" on each of the {cp} ranks" if cp > 1 else ""
    click.echo(f"  peak device memory {format_gib(strategy.estimate_bytes)} GiB of {gpu_memory:.1f}{per_rank}")
    click.echo(f"  peak host memory {format_gib(host)} GiB ({format_gib(host + checkpoint_buffers)} GiB with "
               f"--checkpoint-every: {format_gib(checkpoint_buffers)} GiB of buffers for the checkpoints written in "
               f"the background)")
    if not cuda:
        click.echo("  step time: estimated only for the H200 (--device cuda); the CPU's reference path was not "
                   "measured")
        return
    # The MFU the trainer would log (model FLOPs over the step), beside the utilisation the estimate assumed.
    model_mfu = token_flops(config, seq_len).model * tokens / cp / seconds / H200_BF16_FLOPS
    click.echo(f"  step time {seconds:.0f} s ({tokens / seconds:,.0f} tokens/s, MFU {model_mfu:.1%}) at "
               f"{mfu:.1%} utilisation of the H200's bf16 peak by the dense and DSA-core products")
