"""How much neighbouring queries' DSA selections overlap: what a sparse-attention kernel could share between them.

    python benchmarks/selection_overlap.py --model base --seq 512k --chunk 32k [--fasta .gpudata/X.fa.gz]

The sparse attention's backward adds one fp32 row of ``d_latent`` per (query, selected token) with atomics, and its
forward gathers one latent row per (query, token) (genolc/model/ops/dsa/tilelang/): both scale with ``T * W``. A
kernel that took ``g`` neighbouring queries in one block would gather and scatter each token of the union of their
selections once, so its traffic would be ``union / (g * keep)`` of today's. This script measures that ratio on the
selections the model actually makes: it runs one window through the model's chunk interface (genolc.model.cache,
no grad, bf16 autocast: the fill pass of the chunked step) and, for every DSA layer with an indexer, takes each
chunk's chosen pools (``selected_pools`` of its index rows) and counts, per group of ``g`` consecutive queries
(aligned at multiples of ``g``), the distinct pools among them. Queries that see ``keep`` or fewer complete pools
choose all of them and are left out (they overlap by construction).

Input: ``--fasta`` reads real DNA (the first ``--seq`` + 1 bases from ``--offset``, A/C/G/T/N through the char
tokenizer, case folded), otherwise the random tokens 0-3 that profile_chunked_step.py trains on. The weights are the
preset's random initialisation (seed 0), or with ``--checkpoint`` a checkpoint's (a checkpoint directory or a finetune
run's newest; its config replaces ``--model``): a run trained with ``--indexer sparse`` shows what a trained indexer
chooses, one trained with the default ``--indexer off`` what its untrained indexer chooses from trained hidden states.
Results (JSON with command, git SHA, device) go to $OUT (or benchmarks/results/).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from gpu_bench_common import git_sha  # noqa: E402

from genolc.model import build_model, preset  # noqa: E402
from genolc.model.checkpoint import load_pretrained  # noqa: E402
from genolc.train.state import resolve_checkpoint  # noqa: E402
from genolc.data.genome import open_genome  # noqa: E402
from genolc.errors import GenolcError  # noqa: E402
from genolc.eval.scorer import forward_chunks  # noqa: E402
from genolc.model.cache import WindowCache  # noqa: E402
from genolc.model.layers.dsa import DSAAttention  # noqa: E402
from genolc.model.ops.indexer.layout import complete_pools_visible, selected_pools  # noqa: E402
from genolc.tokenize.char import CharTokenizer  # noqa: E402
from genolc.units import format_length, parse_length  # noqa: E402

GROUPS = (2, 4, 8, 16)


def dna_window(path: Path, offset: int, length: int) -> torch.Tensor:
    """``[1, length]`` char-tokenizer ids of the bases ``offset .. offset + length - 1`` of the genome's first
    record (genolc.data.genome reads it; its InputError for a bad file)."""
    records = open_genome(path).records()
    record = next(records, None)           # read while the generator is alive: closing it ends the stream
    pieces, seen = [], 0
    for chunk in ([] if record is None else record.chunks(1 << 20)):
        pieces.append(chunk[max(0, offset - seen): max(0, offset + length - seen)])
        seen += len(chunk)
        if seen >= offset + length:
            break
    records.close()
    bases = np.concatenate(pieces) if pieces else np.zeros(0, np.uint8)
    if len(bases) < length:
        raise SystemExit(f"{path}: {len(bases)} bases from {offset} in its first record, fewer than the {length} "
                         f"asked for; lower --offset or --seq")
    return torch.from_numpy(CharTokenizer().encode(bases).astype(np.int64))[None]


def distinct_per_group(pools: torch.Tensor, group: int) -> torch.Tensor:
    """``pools [T, P]`` (-1: empty) -> ``[T // group]``: distinct pools among each ``group`` consecutive rows."""
    rows = pools.shape[0] // group * group
    merged = pools[:rows].reshape(rows // group, -1).sort(dim=-1).values
    fresh = torch.ones_like(merged, dtype=torch.bool)
    fresh[:, 1:] = merged[:, 1:] != merged[:, :-1]
    return (fresh & (merged >= 0)).sum(-1)


class OverlapCounter:
    """Forward hooks on the DSA layers with an indexer: per (layer, chunk) the pools chosen and the distinct pools
    per group of neighbouring queries, over the queries that had more than ``keep`` complete pools to choose from."""

    def __init__(self, model: torch.nn.Module) -> None:
        self.rows: list[dict] = []
        self.positions_seen: dict[str, int] = {}      # per layer: the chunks run so far, in order
        self.handles = [module.register_forward_hook(self._hook(name)) for name, module in model.named_modules()
                        if isinstance(module, DSAAttention) and module.indexer is not None]

    def _hook(self, name: str):
        def record(module: DSAAttention, args, output) -> None:
            keep = module.topk // module.kpool
            pools = selected_pools(output.indices, module.topk, module.kpool)[0]        # [T, keep]
            start = self.positions_seen.get(name, 0)
            self.positions_seen[name] = start + pools.shape[0]
            positions = torch.arange(start, start + pools.shape[0], device=pools.device)
            # Aligned groups from the first query that chooses among more than `keep` pools (positions ascend).
            choosing = complete_pools_visible(positions, module.kpool) > keep
            first = int(choosing.int().argmax()) if bool(choosing.any()) else pools.shape[0]
            row = {"layer": name, "chunk_start": start, "keep": keep}
            for group in GROUPS:
                start = -(-first // group) * group
                if pools.shape[0] - start < group:
                    continue
                distinct = distinct_per_group(pools[start:], group).double()
                row[f"g{group}_union_over_g_keep"] = round(float(distinct.mean() / (group * keep)), 4)
                row[f"g{group}_queries"] = int(distinct.numel() * group)
            self.rows.append(row)
        return record

    def close(self) -> None:
        for handle in self.handles:
            handle.remove()


def summarise(rows: list[dict]) -> dict:
    """Per group size: the query-weighted mean of ``union / (g keep)`` over every layer and chunk."""
    summary = {}
    for group in GROUPS:
        weighted = [(r[f"g{group}_union_over_g_keep"], r[f"g{group}_queries"]) for r in rows
                    if f"g{group}_queries" in r]
        total = sum(n for _, n in weighted)
        if total:
            summary[f"g{group}"] = round(sum(v * n for v, n in weighted) / total, 4)
    return summary


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="base", help="preset with its random initialisation")
    parser.add_argument("--checkpoint", default="", help="trained weights instead: a checkpoint directory or a "
                                                           "finetune run directory (its newest checkpoint)")
    parser.add_argument("--seq", default="512k")
    parser.add_argument("--chunk", default="32k")
    parser.add_argument("--fasta", default="", help="real DNA (default: random tokens 0-3, as the profile's)")
    parser.add_argument("--offset", type=int, default=10_000_000, help="first base taken from --fasta")
    parser.add_argument("--device", default="cuda", help="cuda, or cpu for a check of the script on a short window")
    args = parser.parse_args()
    if args.device == "cuda" and not torch.cuda.is_available():
        parser.error("no CUDA device here: run it on the GPU, or with --device cpu on a short window")
    seq, chunk = parse_length(args.seq), parse_length(args.chunk)
    torch.manual_seed(0)
    if args.fasta:
        try:
            ids = dna_window(Path(args.fasta), args.offset, seq).to(args.device)
        except GenolcError as error:
            parser.error(f"--fasta: {error.message}")
    else:
        ids = torch.randint(0, 4, (1, seq), generator=torch.Generator().manual_seed(0)).to(args.device)
    if args.checkpoint:
        try:
            checkpoint = resolve_checkpoint(Path(args.checkpoint), "--checkpoint")      # names the option itself
        except GenolcError as error:
            parser.error(error.message)
        try:
            model = load_pretrained(checkpoint, device=args.device)
        except GenolcError as error:
            parser.error(f"--checkpoint: {error.message}")
        # A run's checkpoints are all named step-NNNNNN: name the file after the run too.
        resolved = Path(checkpoint).resolve()
        in_run = resolved.parent.name == "checkpoints"
        name = f"{resolved.parent.parent.name}_{resolved.name}" if in_run else resolved.name
        weights = f"checkpoint {checkpoint}"
    else:
        model = build_model(preset(args.model), device=args.device)
        name, weights = args.model, "random initialisation (torch.manual_seed(0))"
    counter = OverlapCounter(model)
    window = WindowCache(model.config.num_hidden_layers, seq)
    with torch.no_grad(), torch.autocast(args.device, dtype=torch.bfloat16):
        forward_chunks(model, window, ids, 0, seq, chunk, None, lambda a, b, logits: None)
    counter.close()
    out_dir = Path(os.environ.get("OUT", Path(__file__).resolve().parent / "results"))
    out_dir.mkdir(parents=True, exist_ok=True)
    source = Path(args.fasta).name if args.fasta else "random"
    record = {"command": "python benchmarks/selection_overlap.py " + " ".join(sys.argv[1:]), "git_sha": git_sha(),
              "device": torch.cuda.get_device_name() if args.device == "cuda" else args.device,
              "torch": torch.__version__, "model": name,
              "seq": format_length(seq), "chunk": format_length(chunk), "input": source,
              "weights": weights,
              "mean_union_over_g_keep": summarise(counter.rows), "rows": counter.rows}
    path = out_dir / f"selection_overlap_{name}_{format_length(seq)}_{source.split('.')[0]}.json"
    path.write_text(json.dumps(record, indent=1))
    print(json.dumps(record["mean_union_over_g_keep"]), f"wrote {path}", flush=True)


if __name__ == "__main__":
    main()
