"""The sign of the variant score on a constructed case: a tiny model trained (genolc finetune) on real DNA with a
planted repeat scores, at a position of the second copy, the allele that restores the repeat above one that breaks it.

The scoring genome carries a mismatch at each tested position of the second copy (REF = a base the first copy does
not have); for each position two ALTs are scored: the first copy's base (keeps the repeat) and a third base (breaks
it). A model that learned the sequence, or learned to copy, must prefer the first.
"""

from __future__ import annotations

import gzip

import pandas as pd
import pytest

from genolc.data.prepare import PrepareConfig, prepare
from genolc.score.api import load
from genolc.train.config import TrainConfig
from genolc.train.loop import finetune
from tests.conftest import shared_file

pytestmark = pytest.mark.usefixtures("one_thread")

CHR22 = "human/GRCh37_chr22_20000001-21000000.fa.gz"
REPEAT = 32
TESTED = (10, 20, 30)                  # offsets inside the second copy
NEXT_BASE = {"A": "C", "C": "G", "G": "T", "T": "A"}


def _planted() -> tuple[bytes, int]:
    """Real chr22 DNA (168 bases) with a 32-base stretch planted twice, 40 bases apart; the second copy's offset."""
    with gzip.open(shared_file(CHR22), "rb") as fh:
        body = b"".join(line.strip() for line in fh if not line.startswith(b">"))[200_000:202_000].upper()
    repeat = body[1000:1000 + REPEAT]
    sequence = body[:48] + repeat + body[200:240] + repeat + body[300:316]
    return sequence, 48 + REPEAT + 40


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    sequence, second = _planted()
    root = tmp_path_factory.mktemp("planted")
    fasta = root / "planted.fa"
    fasta.write_bytes(b">chr1\n" + sequence + b"\n")
    data = prepare(PrepareConfig(genomes=(fasta,), out=root / "data", train="all", heldout=(), progress=False,
                                 duplication_threshold=1.0))
    checkpoint = finetune(TrainConfig(data=data, out=root / "run", seq_len=160, steps=60, lr=1e-2, warmup_steps=2,
                                      seed=0, progress=False))
    mutated = bytearray(sequence)
    for j in TESTED:
        mutated[second + j] = ord(NEXT_BASE[chr(sequence[second + j])])
    genome = root / "mutated.fa"
    genome.write_bytes(b">chr1\n" + bytes(mutated) + b"\n")
    rows = []
    for j in TESTED:
        keeps = chr(sequence[second + j])
        ref = NEXT_BASE[keeps]
        breaks = NEXT_BASE[ref]
        rows += [("chr1", second + j + 1, ref, keeps), ("chr1", second + j + 1, ref, breaks)]
    return load(checkpoint, device="cpu"), genome, pd.DataFrame(rows, columns=["chrom", "pos", "ref", "alt"])


@pytest.mark.parametrize("placement", ["center", "causal-end"])
def test_breaking_the_second_copy_scores_worse_than_keeping_it(trained, placement):
    model, genome, variants = trained
    scored = model.score_variants(variants, genome, windows=(64,), placement=placement)
    assert list(scored.status) == ["ok"] * len(variants)
    keeps, breaks = scored.score.to_numpy()[0::2], scored.score.to_numpy()[1::2]
    assert (keeps - breaks > 1.0).all(), (keeps, breaks)
