"""``genolc export --format skyrl``: training windows as SkyRL 0.4.0's pretokenized SFT dataset.

Schema, from SkyRL 0.4.0's ``skyrl/train/dataset/pretokenized.py`` (module docstring, lines 15-29, and
``_validate_and_plan``, lines 163-260): one row per sequence, stored unpadded, with

- ``input_ids``: list of int, the full sequence;
- ``loss_mask``: list of int, same length, only 0s and 1s, at least one 1 (rows without one are dropped).

SkyRL infers ``num_actions`` from the first 1 of ``loss_mask`` (lines 25-29, 288-312) and regenerates
``attention_mask``; other columns pass through to the collator, so the rows carry nothing else. A directory given as
``pretokenized_dataset_paths`` is walked recursively and must hold one file format (``_collect_data_files`` and
``_load_as_hf_dataset``, lines 76-139), so the Parquet lives alone under ``DIR/data/`` and genolc's manifest
(JSON) and window list (TSV) sit beside it, not inside.

Layout of ``DIR``::

    data/train.parquet      input_ids list<int32>, loss_mask list<int8>; row groups of about 64 MiB
    manifest.json           source dataset and md5s, tokenizer, seq, windows, seed, git sha, counts
    windows.tsv             row, record, start, stop (tokens), reverse_complement, loss tokens
    skyrl_sft.yaml          SkyRL SFTConfig for GLM-5.3-Flash on --gpus GPUs (genolc.export.skyrl_config)

Rows stream to disk one row group at a time: memory holds one row group, never a chromosome's windows at once.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Iterator

import numpy as np

import genolc
from genolc.errors import ConfigError, InputError
from genolc.fsutil import atomic_write_bytes, file_md5

SKYRL_VERSION = "0.4.0"
EXPORT_FORMAT_VERSION = 1
DATA_DIR = "data"
PARQUET_NAME = "train.parquet"
MANIFEST_NAME = "manifest.json"
WINDOWS_NAME = "windows.tsv"
CONFIG_NAME = "skyrl_sft.yaml"
# Target bytes per row group: large enough for fast sequential reads, small enough to bound the writer's memory.
ROW_GROUP_BYTES = 64 << 20
# Per token: int32 id + int8 mask, plus Arrow's list offsets (negligible per row).
_BYTES_PER_TOKEN = 5


def _pyarrow():
    try:
        import pyarrow as pa
        import pyarrow.parquet as pq
    except ImportError:
        raise ConfigError("`genolc export` writes Parquet, which needs pyarrow, and it is not installed",
                          fix='install it: pip install "genolc[export]" (or pip install pyarrow)') from None
    return pa, pq


def parquet_schema():
    pa, _ = _pyarrow()
    return pa.schema([pa.field("input_ids", pa.list_(pa.int32()), nullable=False),
                      pa.field("loss_mask", pa.list_(pa.int8()), nullable=False)])


def rows_per_group(row_tokens: int) -> int:
    return max(1, ROW_GROUP_BYTES // max(1, row_tokens * _BYTES_PER_TOKEN))


def _table(batch: list[Any]):
    pa, _ = _pyarrow()
    lengths = np.array([len(r.input_ids) for r in batch], dtype=np.int32)
    offsets = pa.array(np.concatenate([[0], np.cumsum(lengths, dtype=np.int64)]).astype(np.int32))
    ids = np.concatenate([r.input_ids for r in batch]).astype(np.int32)
    masks = np.concatenate([r.loss_mask for r in batch]).astype(np.int8)
    return pa.Table.from_arrays(
        [pa.ListArray.from_arrays(offsets, pa.array(ids, type=pa.int32())),
         pa.ListArray.from_arrays(offsets, pa.array(masks, type=pa.int8()))],
        schema=parquet_schema())


def write_rows(rows: Iterator[Any], path: Path, row_tokens: int, on_row=None) -> dict[str, int]:
    """Stream ``rows`` into one Parquet file at ``path``; returns counts (rows, tokens, loss tokens, row groups)."""
    _, pq = _pyarrow()
    group = rows_per_group(row_tokens)
    counts = {"rows": 0, "tokens": 0, "loss_tokens": 0, "row_groups": 0}
    batch: list[Any] = []
    with pq.ParquetWriter(str(path), parquet_schema(), compression="zstd") as writer:
        def flush() -> None:
            writer.write_table(_table(batch), row_group_size=len(batch))
            counts["row_groups"] += 1
            batch.clear()

        for row in rows:
            if int(row.input_ids.max(initial=0)) > np.iinfo(np.int32).max:
                raise ConfigError("a token id does not fit the int32 input_ids column", where=str(path))
            batch.append(row)
            counts["rows"] += 1
            counts["tokens"] += int(row.input_ids.size)
            counts["loss_tokens"] += int(row.loss_mask.sum())
            if on_row is not None:
                on_row(row)
            if len(batch) >= group:
                flush()
        if batch:
            flush()
    return counts


def read_rows(path: str | Path) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """``(input_ids, loss_mask)`` per row of an export (its directory, data/ or the Parquet file), in order."""
    _, pq = _pyarrow()
    p = Path(path)
    if p.is_dir() and (p / DATA_DIR).is_dir():
        p = p / DATA_DIR
    files = sorted(p.glob("*.parquet")) if p.is_dir() else [p]
    if not files or not all(f.is_file() for f in files):
        raise InputError("no Parquet rows found", where=str(path), fix="point at a `genolc export --format skyrl` "
                                                                      "directory")
    for f in files:
        reader = pq.ParquetFile(str(f))
        for g in range(reader.num_row_groups):
            table = reader.read_row_group(g, columns=["input_ids", "loss_mask"])
            ids, masks = table.column("input_ids"), table.column("loss_mask")
            for i in range(table.num_rows):
                yield (np.asarray(ids[i].values, dtype=np.int64), np.asarray(masks[i].values, dtype=np.int8))


def source_description(dataset: Any) -> dict[str, Any]:
    """The prepared dataset an export came from, by path and md5s (its manifest, its tokenizer, its inputs)."""
    path = Path(dataset.path)
    return {
        "path": str(path),
        "manifest_md5": file_md5(path / "manifest.json"),
        "tokenizer_md5": file_md5(path / "tokenizer.json"),
        "inputs": [{"path": s.get("path"), "md5": s.get("md5")} for s in dataset.manifest.get("sources", [])],
        "train_records": list(dataset.keys("train")),
    }


def export_manifest(config: Any, dataset: Any, builder: Any, counts: dict[str, int], files: dict[str, str],
                    parallel: dict[str, Any] | None) -> dict[str, Any]:
    from genolc.runs import git_sha

    return {
        "export_format_version": EXPORT_FORMAT_VERSION,
        "format": config.format,
        "written_by": {"genolc_version": genolc.__version__, "git_sha": git_sha()},
        "target": {"skyrl": SKYRL_VERSION, "reader": "skyrl.train.dataset.pretokenized.load_from_pretokenized",
                   "config_key": "pretokenized_dataset_paths"} if config.format == "skyrl" else
                  {"megatron_core": "0.16.1"},
        "source": source_description(dataset),
        "tokenizer": builder.describe_tokenizer(),
        "seq_len": config.seq_len,
        "row_tokens": builder.sampler.window_tokens,
        "windows": config.windows,
        "sampler": builder.sampler.state_dict(),
        "row_rule": "row i = TrainSampler.window(step=i, micro=0) on one data-parallel rank; loss_mask 0 at the "
                    "first token and at ambiguous (N/IUPAC/excluded) tokens",
        "counts": counts,
        "files": files,
        "parallel": parallel,
    }


def write_windows_tsv(path: Path, lines: list[str]) -> None:
    header = "row\trecord\tstart\tstop\treverse_complement\tloss_tokens\n"
    atomic_write_bytes(path, (header + "".join(lines)).encode())


def window_line(row: Any) -> str:
    w = row.window
    return f"{row.index}\t{w.key}\t{w.start}\t{w.stop}\t{int(w.reverse_complement)}\t{int(row.loss_mask.sum())}\n"


def load_export_manifest(directory: str | Path) -> dict[str, Any]:
    path = Path(directory) / MANIFEST_NAME
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        raise InputError("not a genolc export: no readable manifest.json", where=str(directory),
                         fix="point at a directory written by `genolc export`") from None

