"""Checks on what an evaluation is asked to read: records, training overlap, window length.

Training overlap. A checkpoint written by ``genolc finetune`` carries ``trainer_state.json`` with its TrainConfig,
whose ``data`` is the prepared dataset it trained on; that dataset's manifest names its train records with their
``md5_upper`` and chromosome coordinates. A held-out record counts as trained on when its sequence md5 equals a
train record's, or when it lies on the same chromosome as a train record and their coordinates overlap. The chain
is followed through ``init`` (the checkpoint a run started from) when that is a genolc training checkpoint too.
A checkpoint without ``trainer_state.json`` (a bare ``save_pretrained`` directory) carries no such record: then only
the evaluated dataset's own ``split`` labels are checked, and the summary says the provenance is unknown.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

from genolc.data.genome import canonical_chrom
from genolc.errors import ConfigError, InputError

TRAINER_STATE = "trainer_state.json"
MAX_INIT_CHAIN = 8


def resolve_records(dataset: Any, spec: str) -> tuple[list[str], bool]:
    """Dataset keys for ``CHROM[,CHROM…]`` or ``heldout``; (keys, pooled) where pooled means 'heldout'.

    Names may be aliases (``22``, ``chr22``, ``NC_000022.11``); unknown names give one error listing the records.
    A record that prepare cut at held-out regions (``--heldout chr2R:1-5000000``) is named by its held-out pieces:
    ``chr2R`` gives them, ``chr2R:1-5000000`` or the piece's key gives that piece.
    """
    available = list(dataset.keys())
    words = [w.strip() for w in str(spec).split(",") if w.strip()]
    if not words:
        raise ConfigError("--by-position needs a record list or 'heldout'", fix="e.g. --by-position chr22")
    if words == ["heldout"]:
        keys = list(dataset.keys("heldout"))
        if not keys:
            raise InputError("the dataset has no held-out records", where=_where(dataset),
                             fix=f"name records to evaluate, e.g. --by-position {available[0] if available else 'chr22'}")
        return keys, True
    by_alias: dict[str, list[str]] = {}
    pieces: dict[str, list[str]] = {}
    for key in available:
        rec = dataset.record(key)
        if rec.get("region"):
            # A piece of a record cut at held-out regions: its key or span names it alone, the record's names
            # name its held-out pieces (or all its pieces when none is held out).
            aliases, record_aliases = (key, rec["region"]), (rec.get("chrom"), rec.get("name"))
            for alias in filter(None, record_aliases):
                pieces.setdefault(str(alias).lower(), []).append(key)
        else:
            aliases = (key, rec.get("chrom"), rec.get("name"))
        for alias in filter(None, aliases):
            by_alias.setdefault(str(alias).lower(), [key])
    for alias, members in pieces.items():
        held = [k for k in members if dataset.record(k).get("split") == "heldout"]
        by_alias.setdefault(alias, held or members)
    keys, unknown = [], []
    for word in words:
        found = by_alias.get(word.lower()) or by_alias.get(canonical_chrom(word).lower())
        if found is None:
            unknown.append(word)
        keys.extend(k for k in found or () if k not in keys)
    if unknown:
        listing = ", ".join(f"{k} ({dataset.record(k).get('split', '?')})" for k in available)
        raise InputError(f"record(s) {', '.join(unknown)} not in the dataset", where=_where(dataset),
                         fix=f"choose from: {listing}, or 'heldout'")
    # Records in neither split were only measured by genolc prepare: they have no tokens to score.
    untokenized = [k for k in keys if dataset.record(k).get("length_tokens") is None]
    if untokenized:
        raise InputError(f"record(s) {', '.join(untokenized)} were not tokenized (split 'unused' in the dataset)",
                         where=_where(dataset),
                         fix=f"prepare the dataset again with --heldout {','.join(untokenized)}")
    return keys, False


def _where(dataset: Any) -> str:
    return str(getattr(dataset, "path", "the prepared dataset"))


@dataclass
class Provenance:
    """What is known about the records a checkpoint was trained on."""

    known: bool
    datasets: list[str] = field(default_factory=list)
    train_records: list[dict] = field(default_factory=list)   # manifest entries of trained-on records
    notes: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {"known": self.known, "datasets": self.datasets,
                "train_records": [f"{r.get('key')} ({r.get('chrom')}:{r.get('start')})" for r in self.train_records],
                "notes": self.notes}


def training_provenance(checkpoint: Path) -> Provenance:
    """Train records of the dataset(s) behind ``checkpoint`` (and its init chain), read from trainer_state.json."""
    prov = Provenance(known=False)
    current: Path | None = Path(checkpoint)
    for _ in range(MAX_INIT_CHAIN):
        if current is None or not (current / TRAINER_STATE).is_file():
            break
        try:
            state = json.loads((current / TRAINER_STATE).read_text())
        except (OSError, json.JSONDecodeError) as exc:
            prov.notes.append(f"{current / TRAINER_STATE} unreadable ({exc})")
            break
        config = _train_config(state)
        data = config.get("data") if config else None
        if not data:
            prov.notes.append(f"{current / TRAINER_STATE} does not name its dataset")
            break
        manifest_path = Path(data) / "manifest.json"
        try:
            manifest = json.loads(manifest_path.read_text())
        except (OSError, json.JSONDecodeError):
            prov.notes.append(f"training dataset {data} is not readable here; overlap checked by split labels only")
            break
        prov.known = True
        prov.datasets.append(str(data))
        prov.train_records.extend(r for r in manifest.get("records", []) if r.get("split") == "train")
        init = config.get("init")
        current = Path(init) if init else None
    return prov


def _train_config(state: dict) -> dict | None:
    for name in ("config", "train_config"):
        value = state.get(name)
        if isinstance(value, dict) and "data" in value:
            return value
    for value in state.values():
        if isinstance(value, dict) and "data" in value and "seq_len" in value:
            return value
    return None


def trained_overlap(record: dict, train_records: Sequence[dict]) -> dict | None:
    """The first train record that holds ``record``'s sequence (same md5, or overlapping coordinates)."""
    md5 = record.get("md5_upper")
    start = int(record.get("start", 1))
    stop = start + int(record.get("length_bases", 0))
    for other in train_records:
        if md5 and other.get("md5_upper") == md5:
            return other
        if other.get("chrom") and other.get("chrom") == record.get("chrom"):
            o_start = int(other.get("start", 1))
            o_stop = o_start + int(other.get("length_bases", 0))
            if o_start < stop and start < o_stop:
                return other
    return None


def check_not_trained(dataset: Any, keys: Sequence[str], checkpoints: Sequence[tuple[str, Path]],
                      force: bool) -> dict[str, Any]:
    """Refuse (InputError) records a checkpoint trained on, unless ``force``; returns what was checked."""
    report: dict[str, Any] = {"forced": bool(force), "checkpoints": {}}
    problems = []
    for what, path in checkpoints:
        prov = training_provenance(path)
        report["checkpoints"][what] = prov.to_dict()
        for key in keys:
            rec = dataset.record(key)
            hit = trained_overlap(rec, prov.train_records) if prov.known else None
            if hit is not None:
                problems.append(f"{key} was trained on by the {what} (train record {hit.get('key')} of "
                                f"{prov.datasets[0] if prov.datasets else 'its dataset'})")
            elif rec.get("split") == "train":
                problems.append(f"{key} is in this dataset's train split")
    report["problems"] = problems
    if problems and not force:
        raise InputError("refusing to report training data as held-out: " + "; ".join(problems),
                         where=_where(dataset),
                         fix="evaluate held-out records (e.g. --by-position heldout), or pass --force to score them "
                             "anyway (the report marks the run as forced)")
    return report


def check_window_fits(dataset: Any, keys: Sequence[str], seq_len: int, pooled: bool) -> tuple[list[str], list[str]]:
    """(usable keys, skipped keys): a named record shorter than one window is an error; pooled ones are skipped."""
    width = seq_len + 1
    short = [k for k in keys if int(dataset.record(k)["length_tokens"]) < width]
    usable = [k for k in keys if k not in short]
    if short and (not pooled or not usable):
        longest = max(keys, key=lambda k: int(dataset.record(k)["length_tokens"]))
        n = int(dataset.record(longest)["length_tokens"])
        raise ConfigError(
            f"a window of {width} tokens (--seq {seq_len} + 1) is longer than held-out record(s) "
            + ", ".join(f"{k} ({int(dataset.record(k)['length_tokens'])} tokens)" for k in short),
            where=_where(dataset), fix=f"use --seq {n - 1} or less",
        )
    return usable, short
