"""`genolc prepare --heldout NAME:START-END` on a single-chromosome genome (real lambda phage DNA): the region is the
evaluation record, training windows never touch it, eval on it is not "forced", and bad regions get one clear error.
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner
from conftest import shared_file

from genolc.cli import main
from genolc.data.dataset import PreparedDataset
from genolc.data.prepare import PrepareConfig, prepare
from genolc.data.sampler import TrainSampler
from genolc.eval.inputs import resolve_records

pytestmark = pytest.mark.usefixtures("one_thread")

LAMBDA = "other/lambda_phage_NC_001416.1.fa.gz"
CHR22 = "human/GRCh37_chr22_20000001-21000000.fa.gz"
NAME = "NC_001416.1"
LENGTH = 48_502
REGION = (30_001, 40_000)   # 1-based inclusive


def _bases(path: Path) -> bytes:
    with gzip.open(path, "rb") as fh:
        return b"".join(line.strip() for line in fh if not line.startswith(b">"))


@pytest.fixture(scope="module")
def regional(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("regions") / "lambda"
    result = CliRunner().invoke(main, ["prepare", str(shared_file(LAMBDA)), "--train", NAME,
                                       "--heldout", f"{NAME}:{REGION[0]}-{REGION[1]}", "--out", str(out),
                                       "--no-progress"])
    assert result.exit_code == 0, result.output
    return out


def test_region_is_its_own_heldout_record_and_training_is_cut_around_it(regional):
    dataset = PreparedDataset(regional)
    bases = _bases(shared_file(LAMBDA))
    spans = {key: (dataset.record(key)["start"], dataset.record(key)["length_bases"]) for key in dataset.keys()}
    assert dataset.keys("heldout") == [f"{NAME}_30001-40000"]
    assert dataset.keys("train") == [f"{NAME}_1-30000", f"{NAME}_40001-48502"]
    assert spans == {f"{NAME}_1-30000": (1, 30_000), f"{NAME}_30001-40000": (30_001, 10_000),
                     f"{NAME}_40001-48502": (40_001, 8_502)}
    for key, (start, length) in spans.items():
        record = dataset.record(key)
        assert record["chrom"] == NAME and record["name"] == NAME
        assert record["region"] == f"{NAME}:{start}-{start + length - 1}"
        expected = dataset.tokenizer.encode(np.frombuffer(bases[start - 1:start - 1 + length], dtype=np.uint8))
        assert np.array_equal(np.asarray(dataset.tokens(key)), expected)   # every base once, in its own piece
    assert dataset.manifest["duplication"]["heldout_blocks"] == 10


def test_training_windows_never_overlap_the_region(regional):
    dataset = PreparedDataset(regional)
    sampler = TrainSampler(dataset, 511, seed=3)
    used = set()
    for step in range(400):
        window = sampler.window(step)
        used.add(window.key)
        offsets = dataset.token_base_offsets(window.key, window.start, window.stop)
        first = dataset.record(window.key)["start"] + int(offsets[0])
        last = dataset.record(window.key)["start"] + int(offsets[-1]) - 1
        assert last < REGION[0] or first > REGION[1], (window, first, last)
    assert used == set(dataset.keys("train"))   # both sides of the region are trained on


def test_eval_of_the_region_with_a_model_trained_on_the_rest_is_not_forced(regional, tmp_path):
    runner = CliRunner()
    result = runner.invoke(main, ["finetune", "--no-progress", "--data", str(regional), "--seq", "64", "--steps", "1",
                                  "--lr", "1e-3", "--warmup", "1", "--out", str(tmp_path / "run")])
    assert result.exit_code == 0, result.output
    checkpoint = tmp_path / "run" / "checkpoints" / "step-000001"
    for records in ("heldout", NAME):   # the chromosome's name means its held-out piece
        out = tmp_path / f"eval-{records}"
        result = runner.invoke(main, ["eval", "--by-position", records, "--data", str(regional), "--checkpoint",
                                      str(checkpoint), "--seq", "256", "--max-windows", "2", "--first-bucket", "64",
                                      "--bootstrap", "20", "--out", str(out), "--quiet"])
        assert result.exit_code == 0, result.output
        summary = json.loads((out / "summary.json").read_text())
        overlap = summary["training_overlap"]
        assert overlap["forced"] is False and overlap["problems"] == []
        assert overlap["checkpoints"]["checkpoint"]["known"] is True   # the training records were checked
        assert summary["records"] == [f"{NAME}_30001-40000"]
        assert summary["windows"]["scored"] == 2
    # The check is live: the trained stretch next to the region is refused.
    result = runner.invoke(main, ["eval", "--by-position", f"{NAME}:40001-48502", "--data", str(regional),
                                  "--checkpoint", str(checkpoint), "--seq", "256", "--max-windows", "1",
                                  "--bootstrap", "20", "--out", str(tmp_path / "refused"), "--quiet"])
    assert result.exit_code != 0 and "refusing to report training data as held-out" in result.output


def test_records_resolve_by_chromosome_region_or_key(regional):
    dataset = PreparedDataset(regional)
    held = f"{NAME}_30001-40000"
    assert resolve_records(dataset, NAME) == ([held], False)
    assert resolve_records(dataset, f"{NAME}:30001-40000") == ([held], False)
    assert resolve_records(dataset, f"{NAME}_1-30000") == ([f"{NAME}_1-30000"], False)


def test_region_in_a_record_with_a_header_region_uses_chromosome_coordinates(tmp_path):
    out = prepare(PrepareConfig(genomes=(shared_file(CHR22),), out=tmp_path / "chr22", train="all",
                                heldout=("chr22:20900001-21000000",), progress=False))
    dataset = PreparedDataset(out)
    assert [(dataset.record(k)["start"], dataset.record(k)["length_bases"], dataset.record(k)["split"])
            for k in dataset.keys()] == [(20_000_001, 900_000, "train"), (20_900_001, 100_000, "heldout")]


@pytest.mark.parametrize("heldout, message", [
    (f"{NAME}:40001-50000", f"ends after the record's last base, {NAME}:48502"),
    (f"{NAME}:60001-70000", f"starts after the record's last base, {NAME}:48502"),
    (f"{NAME}:1-100,{NAME}:50-200", "overlap"),
    (f"{NAME}:5-", "is not a region"),
    (f"{NAME}:0-10", "coordinates are 1-based"),
    (f"{NAME}:9-3", "starts after it ends"),
    (f"{NAME}:1-5,000", "without thousands separators"),
    (f"{NAME},{NAME}:1-10", "held out whole"),
    ("chrZ:1-100", "unknown chromosome 'chrZ'"),
])
def test_bad_regions_get_one_clear_error_and_write_nothing(heldout, message, tmp_path):
    out = tmp_path / "parent" / "ds"
    result = CliRunner().invoke(main, ["prepare", str(shared_file(LAMBDA)), "--train", "all", "--heldout", heldout,
                                       "--out", str(out), "--no-progress"])
    assert result.exit_code == 2
    assert result.output.count("genolc: error:") == 1 and message in result.output, result.output
    assert not out.exists()


def test_region_before_a_header_regions_first_base_is_refused(tmp_path):
    result = CliRunner().invoke(main, ["prepare", str(shared_file(CHR22)), "--train", "all", "--heldout", "22:1-100",
                                       "--out", str(tmp_path / "ds"), "--no-progress"])
    assert result.exit_code != 0 and "starts before the record's first base, chr22:20000001" in result.output


def test_train_takes_whole_records_only(tmp_path):
    result = CliRunner().invoke(main, ["prepare", str(shared_file(LAMBDA)), "--train", f"{NAME}:1-100",
                                       "--heldout", "none", "--out", str(tmp_path / "ds"), "--no-progress"])
    assert result.exit_code != 0 and "--train takes whole records" in result.output
