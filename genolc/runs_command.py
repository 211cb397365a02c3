"""``genolc runs ls|show|diff``: find and compare the run records every command writes (:mod:`genolc.runs`).

A record is ``<output>/runs/<start>_<pid>_<command>.json``; failed and interrupted runs leave one too, so ``ls``
lists them beside the successful ones. Key figures come from the record and, where the command wrote one, the
summary beside it (finetune's ``summary.json``: final loss; eval's: bits per base over all held-out targets).
"""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path
from typing import Any

import click

from genolc.errors import InputError
from genolc.fsutil import RUNS_DIRNAME

_PATH = click.Path(path_type=Path)


def find_records(root: Path) -> list[Path]:
    """Every run under ``root`` (recursively), one record each, oldest first; a folder that is not readable is
    skipped."""
    if not root.is_dir():
        raise InputError("no such directory to search for run records", where=str(root),
                         fix="pass a directory that holds genolc outputs (each has a runs/ folder)")
    found = [p for p in root.rglob(f"{RUNS_DIRNAME}/*.json") if _load(p, strict=False) is not None]
    return sorted(_one_per_run(found), key=_start_order)


def _one_per_run(paths: list[Path]) -> list[Path]:
    """One record per run: a copy of a record (``copy_of``: the demo's report gathers its stages') gives way to the
    original; copies made otherwise (``cp -r``) are told apart by command, start, end and host, and the shortest
    file name wins (the demo named its copies ``<stage>_<original name>``)."""
    chosen: dict[tuple[Any, ...], tuple[tuple[bool, int, str], Path]] = {}
    for path in paths:
        record = _load(path)
        host = record.get("host") if isinstance(record.get("host"), dict) else {}
        identity = (record.get("command"), record.get("started"), record.get("ended"), host.get("hostname"))
        rank = ("copy_of" in record, len(path.name), str(path))
        if identity not in chosen or rank < chosen[identity][0]:
            chosen[identity] = (rank, path)
    return [path for _, path in chosen.values()]


def _start_order(path: Path) -> tuple[str, int, str]:
    """Start time, then (two runs started within one second: ``started`` is in whole seconds) the time the record
    was written, at the command's end."""
    try:
        written = path.stat().st_mtime_ns
    except OSError:
        written = 0
    return (_load(path).get("started", ""), written, str(path))


def _load(path: Path, strict: bool = True) -> dict[str, Any] | None:
    try:
        record = json.loads(path.read_text())
        if isinstance(record, dict) and "record_version" in record and "command" in record:
            return record
        problem = "is not a genolc run record"
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        problem = f"cannot be read as a run record ({exc})"
    if strict:
        raise InputError(f"the file {problem}", where=str(path),
                         fix="pass a record (<output>/runs/*.json) or an output directory holding runs/")
    return None


def resolve_record(run: Path) -> Path:
    """A record file, or an output directory: its newest record."""
    if run.is_file():
        _load(run)
        return run
    if (run / RUNS_DIRNAME).is_dir():
        records = sorted((p for p in (run / RUNS_DIRNAME).glob("*.json") if _load(p, strict=False) is not None),
                         key=_start_order)
        if records:
            return records[-1]
    outputs = _outputs_under(run) if run.is_dir() else []
    if outputs:
        shown = ", ".join(map(str, outputs[:4])) + (f" and {len(outputs) - 4} more" if len(outputs) > 4 else "")
        raise InputError(f"no run record of its own; it holds the outputs of other runs ({shown})", where=str(run),
                         fix=f"show one with `genolc runs show {outputs[0]}`, or list them all with "
                             f"`genolc runs ls {run}`")
    raise InputError("no run record found", where=str(run),
                     fix="pass a record file (<output>/runs/*.json) or an output directory with a runs/ folder; "
                         "`genolc runs ls DIR` lists them")


def _outputs_under(directory: Path) -> list[Path]:
    """The output folders under ``directory`` (itself excluded) that hold run records, each once."""
    return sorted({path.parent.parent for path in find_records(directory)} - {directory})


def key_figures(path: Path, record: dict[str, Any]) -> dict[str, Any]:
    """The figures ``ls`` shows: duration, and what the command's summary says it achieved."""
    figures: dict[str, Any] = {"seconds": record.get("seconds")}
    out_dir = path.parent.parent
    # summary.json holds the figures of the output's latest invocation (a --resume or a rerun rewrites it), so
    # it speaks for a record only when that record is the output's newest; finetune records carry their own.
    summary = _summary(out_dir / "summary.json") if _is_newest(path, record) else None
    own = (record.get("outputs") or {}).get("figures")
    if record["command"] == "finetune" and (own or summary):
        source = own or summary
        figures["steps"] = f"{source.get('steps_done')}/{source.get('steps')}"
        figures["final_loss"] = source.get("final_loss")
        figures["tokens"] = source.get("tokens_seen")
    elif record["command"] == "eval" and summary:
        figures["bits_per_base"] = (summary.get("overall") or {}).get("model/all")
    elif record["command"] == "eval-routing":
        worst = [(length, max((f.get("busiest_over_mean", 0.0) for f in layers.values()), default=0.0))
                 for length, layers in (record.get("outputs", {}).get("routing") or {}).items() if layers]
        if worst:
            figures["busiest_over_mean"] = ", ".join(f"{length}: {value:.2f}" for length, value in worst)
    return figures


def _is_newest(path: Path, record: dict[str, Any]) -> bool:
    """Whether ``path`` is the newest record of its command in its runs/ folder, and the summary beside the output
    was written after it started (a run that failed before writing one must not show an earlier run's)."""
    same = [p for p in path.parent.glob(f"*_{record['command']}.json") if _load(p, strict=False) is not None]
    if same and max(same, key=_start_order) != path:
        return False
    try:
        started = dt.datetime.fromisoformat(str(record.get("started"))).timestamp()
        written = (path.parent.parent / "summary.json").stat().st_mtime
    except (ValueError, OSError):
        return False
    return written >= started


def _summary(path: Path) -> dict[str, Any] | None:
    try:
        return json.loads(path.read_text())
    except (OSError, json.JSONDecodeError):
        return None


def _figure_text(figures: dict[str, Any]) -> str:
    parts = []
    for name, value in figures.items():
        if value is None or name == "seconds":
            continue
        parts.append(f"{name} {value:.4g}" if isinstance(value, float) else f"{name} {value}")
    return ", ".join(parts)


def flatten(value: Any, prefix: str = "") -> dict[str, Any]:
    """Nested dicts as ``a.b`` keys (lists stay values), for field-by-field comparison."""
    if isinstance(value, dict):
        flat: dict[str, Any] = {}
        for key, inner in value.items():
            flat.update(flatten(inner, f"{prefix}{key}."))
        return flat
    return {prefix[:-1]: value}


def diff_records(a: dict[str, Any], b: dict[str, Any]) -> dict[str, list[tuple[str, Any, Any]]]:
    """Differences between two records: ``{"config": [(field, a, b)], "inputs": [(file, md5 a, md5 b)]}``.

    Config compares the command and its resolved arguments field by field; inputs compare md5s by path (a file
    only one run read shows ``None`` on the other side).
    """
    config_a = {"command": a["command"], **flatten(a.get("args", {}))}
    config_b = {"command": b["command"], **flatten(b.get("args", {}))}
    config = [(k, config_a.get(k), config_b.get(k)) for k in sorted(set(config_a) | set(config_b))
              if config_a.get(k) != config_b.get(k)]
    inputs_a, inputs_b = a.get("inputs", {}), b.get("inputs", {})
    inputs = [(k, inputs_a.get(k), inputs_b.get(k)) for k in sorted(set(inputs_a) | set(inputs_b))
              if inputs_a.get(k) != inputs_b.get(k)]
    return {"config": config, "inputs": inputs}


@click.group("runs")
def runs_command() -> None:
    """List, show and compare run records (every command leaves one in <output>/runs/, failures included).

    \b
    Example:
      genolc runs ls experiments/
      genolc runs diff runs/hg38-512k runs/hg38-512k-lowlr
    """


@runs_command.command("ls")
@click.argument("directory", type=_PATH)
def runs_ls(directory: Path) -> None:
    """Table of every run record under DIRECTORY (recursively): command, start, status, duration, key figures.

    \b
    Example:
      genolc runs ls experiments/
    """
    rows = []
    for path in find_records(directory):
        record = _load(path)
        figures = key_figures(path, record)
        seconds = figures.get("seconds")
        rows.append((record["command"], record.get("started", ""), record.get("status", "?"),
                     f"{seconds:.1f}s" if isinstance(seconds, (int, float)) else "-",
                     _figure_text(figures) or (record.get("error") or "")[:60], str(path.parent.parent)))
    if not rows:
        click.echo(f"no run records under {directory}")
        return
    header = ("kind", "started", "status", "took", "figures", "output")
    widths = [max(len(str(r[i])) for r in rows + [header]) for i in range(len(header))]
    for row in [header, *rows]:
        click.echo("  ".join(str(cell).ljust(width) for cell, width in zip(row, widths)).rstrip())


@runs_command.command("show")
@click.argument("run", type=_PATH)
def runs_show(run: Path) -> None:
    """One run record, readable: RUN is a record file or an output directory (its newest record; a directory with
    none of its own, such as a workflow's results, names the outputs under it that have some).

    \b
    Example:
      genolc runs show runs/hg38-512k
    """
    path = resolve_record(run)
    record = _load(path)
    click.echo(f"record:   {path}")
    for key in ("copy_of", "command", "status", "error", "started", "ended", "seconds", "genolc_version", "git_sha"):
        if record.get(key) is not None:
            click.echo(f"{key + ':':<10}{record[key]}")
    figures = _figure_text(key_figures(path, record))
    if figures:
        click.echo(f"figures:  {figures}")
    click.echo(f"command line: {' '.join(record.get('argv') or [])}")
    for title, section in (("arguments", record.get("args", {})), ("inputs (md5)", record.get("inputs", {})),
                           ("host", record.get("host", {}))):
        click.echo(f"{title}:")
        for key, value in flatten(section).items():
            click.echo(f"  {key}: {value}")
    outputs = {k: v for k, v in record.get("outputs", {}).items() if k != "routing"}
    click.echo("outputs:")
    for key, value in outputs.items():
        click.echo(f"  {key}: {value}")
    routing = record.get("outputs", {}).get("routing")
    if routing:
        from genolc.eval.routing import routing_table

        click.echo("MoE routing:")
        click.echo(routing_table(routing).to_string(index=False, float_format=lambda v: f"{v:.3f}"))
    others = _outputs_under(run) if run.is_dir() else []
    if others:
        click.echo(f"runs of the outputs under {run} (`genolc runs ls {run}` lists them; `genolc runs show "
                   f"{others[0]}` shows one):")
        for folder in others:
            click.echo(f"  {folder}")


@runs_command.command("diff")
@click.argument("run_a", type=_PATH)
@click.argument("run_b", type=_PATH)
def runs_diff(run_a: Path, run_b: Path) -> None:
    """Config fields and input files (by md5) that differ between two runs (record files or output directories).

    \b
    Example:
      genolc runs diff runs/hg38-512k runs/hg38-512k-lowlr
    """
    path_a, path_b = resolve_record(run_a), resolve_record(run_b)
    diff = diff_records(_load(path_a), _load(path_b))
    click.echo(f"A: {path_a}\nB: {path_b}")
    if not diff["config"] and not diff["inputs"]:
        click.echo("same config and inputs")
        return
    if diff["config"]:
        click.echo("config:")
        for key, a, b in diff["config"]:
            click.echo(f"  {key}: A {a!r}  B {b!r}")
    if diff["inputs"]:
        click.echo("inputs:")
        for key, a, b in diff["inputs"]:
            click.echo(f"  {key}: A {a or '(not read)'}  B {b or '(not read)'}")
