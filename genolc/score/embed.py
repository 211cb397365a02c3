"""Region embeddings: a model's hidden states over reference regions, pooled (mean) or per token.

Which hidden state: by default the final norm's output (what the LM head reads, ``[T, D]``); with ``layer=N`` the
output of decoder layer ``N`` (0-based), whose hyper-connection streams ``[T, N_streams, D]`` are averaged over
streams as the model itself does before its final norm. Both are captured with forward hooks, so the model is used
unchanged. A region longer than ``window_chunk`` tokens runs chunk by chunk through the model's chunk interface
(:class:`genolc.model.cache.WindowCache`), so every token still sees the whole region before it.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

import numpy as np

from genolc.data.bed import bed_lines
from genolc.data.genome import canonical_chrom
from genolc.errors import ConfigError, InputError
from genolc.score.reference import Reference

POOLS = ("mean", "none")


@dataclass(frozen=True)
class Region:
    line: int  # 1-based line in the BED file
    chrom: str  # as written in the BED file
    start: int  # 0-based, BED convention
    end: int  # exclusive
    name: str  # the BED name column, or chrom:start-end (1-based inclusive) when there is none


def read_regions(path: str | Path) -> list[Region]:
    """BED intervals in file order, read and checked by :func:`genolc.data.bed.bed_lines` (the messages of every
    BED input of genolc), plus: an empty interval is refused, and so is a file without intervals."""
    regions: list[Region] = []
    for line in bed_lines(path):
        if line.end == line.start:
            raise InputError(f"BED interval {line.start}-{line.end} is empty: there is nothing to embed",
                             where=line.where, fix="give the region's bases: BED end must be greater than start")
        fields = line.fields
        name = fields[3] if len(fields) > 3 and fields[3] else f"{line.chrom}:{line.start + 1}-{line.end}"
        regions.append(Region(line.lineno, line.chrom, line.start, line.end, name))
    if not regions:
        raise InputError("the BED file holds no intervals", where=str(path), fix="check the file")
    return regions


def region_bases(reference: Reference, region: Region, source: str) -> np.ndarray:
    """The region's bases; InputError when the reference does not hold all of it."""
    where = f"{source}:{region.line}"
    span = reference.span(region.chrom)
    if span is None:
        shown = ", ".join(reference.chrom_names()[:20])
        raise InputError(f"unknown chromosome '{region.chrom}'", where=where,
                         fix=f"use one of the reference's chromosomes ({shown}); aliases such as 22/chr22 work")
    record = reference.locate(region.chrom, region.start + 1, region.end)
    if record is None:
        raise InputError(
            f"interval {canonical_chrom(region.chrom)}:{region.start}-{region.end} (BED) lies outside the reference, "
            f"which holds {canonical_chrom(region.chrom)}:{span[0] - 1}-{span[1]} (BED coordinates)",
            where=where, fix="clip or drop the interval")
    return reference.fetch(record, region.start + 1 - record.start, region.end + 1 - record.start)


class HiddenStates:
    """``hidden(ids) -> float32 [B, T, D]`` of one layer (or the final norm) of a GenomeLM, through forward hooks."""

    def __init__(self, model: Any, layer: int | None = None, window_chunk: int | None = None) -> None:
        import torch

        self.model = model
        n_layers = len(model.layers)
        if layer is not None and not -n_layers <= layer < n_layers:
            raise ConfigError(f"--layer {layer} is out of range: the model has {n_layers} layers",
                              fix=f"choose 0..{n_layers - 1} (or -1 for the last), or leave it out for the final norm")
        self.module = model.norm if layer is None else model.layers[layer]
        self.is_layer = layer is not None
        self.window_chunk = window_chunk
        self.device = next(model.parameters()).device
        self._torch = torch

    def _capture(self, captured: list) -> Any:
        from genolc.model.layers.mhc import collapse_streams

        def hook(_module, _inputs, output):
            tensor = output[0] if isinstance(output, tuple) else output
            captured.append((collapse_streams(tensor) if self.is_layer else tensor).float())
        return self.module.register_forward_hook(hook)

    def __call__(self, ids: np.ndarray) -> np.ndarray:
        torch = self._torch
        from genolc.eval.scorer import forward_chunks
        from genolc.model.cache import WindowCache

        x = torch.from_numpy(np.ascontiguousarray(ids, dtype=np.int64)).to(self.device)
        if x.ndim == 1:
            x = x[None]
        captured: list = []
        handle = self._capture(captured)
        length = x.shape[1]
        chunked = bool(self.window_chunk) and length > self.window_chunk
        window = WindowCache(self.model.config.num_hidden_layers, length) if chunked else None
        try:
            with torch.no_grad():
                # The logits are not needed: bypassing the head saves a [T, V] matmul per chunk.
                forward_chunks(self.model, window, x, 0, length, self.window_chunk, self.model.lm_head,
                               lambda *_: None)
        finally:
            handle.remove()
        return torch.cat(captured, dim=1).cpu().numpy()


def embed_regions(hidden: HiddenStates, tokenizer: Any, sequences: Iterator[np.ndarray] | list[np.ndarray],
                  pool: str) -> list[np.ndarray]:
    """Per sequence: ``float32 [D]`` (pool 'mean', over the sequence's tokens) or ``[T, D]`` (pool 'none')."""
    if pool not in POOLS:
        raise ConfigError(f"unknown pooling {pool!r}", fix="choose mean or none")
    out = []
    for bases in sequences:
        ids = tokenizer.encode(np.asarray(bases, dtype=np.uint8))
        states = hidden(ids[None])[0]
        out.append(states.mean(axis=0) if pool == "mean" else states)
    return out
