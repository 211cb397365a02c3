"""Real human DNA shipped with genolc for ``genolc demo`` and the workflow's ``.test`` config.

See PROVENANCE.md in this folder for sources, licences, the extraction command, lengths and md5s.
"""

from __future__ import annotations

from pathlib import Path

SAMPLE_DIR = Path(__file__).resolve().parent
TRAIN_FILE = SAMPLE_DIR / "hg38_chr2_1-600000.fa.gz"
HELDOUT_FILE = SAMPLE_DIR / "GRCh37_chr22_20480001-20680000.fa.gz"
TRAIN_CHROMS = ("chr2",)
HELDOUT_CHROMS = ("chr22",)


def sample_files() -> list[Path]:
    """The bundled FASTA files, training piece first."""
    return [TRAIN_FILE, HELDOUT_FILE]
