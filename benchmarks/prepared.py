"""The dataset a GPU benchmark runs on: the one given with --data, or --fasta prepared by `genolc prepare`."""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def dataset_for(data: Path | None, fasta: Path | None, heldout: str, work: Path, env: dict) -> Path:
    """``data``, or ``fasta`` prepared into ``work/data`` (char tokenizer, every record trains but ``heldout``);
    exits with prepare's message when it fails."""
    if data is not None:
        return data
    data = work / "data"
    prep = subprocess.run([sys.executable, "-m", "genolc.cli", "prepare", str(fasta), "--out", str(data),
                           "--train", "all", "--heldout", heldout, "--tokenizer", "char", "--no-progress"],
                          env=env, cwd=ROOT, capture_output=True, text=True)
    if prep.returncode:
        sys.exit(f"prepare failed: {prep.stderr[-2000:]}")
    return data


def add_dataset_options(parser: argparse.ArgumentParser, *, fasta_help: str = "genome to prepare (char tokenizer)",
                        data_help: str = "a prepared dataset") -> None:
    """The benchmark's one required source: ``--fasta`` (prepared by :func:`dataset_for`) or ``--data``."""
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--fasta", type=Path, help=fasta_help)
    source.add_argument("--data", type=Path, help=data_help)
