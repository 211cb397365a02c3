"""Bad input for genolc eval: unknown records, trained-on records, short records; the needle on an oracle."""

from __future__ import annotations

import json

import numpy as np
import pytest
from eval_helpers import CopyOracle, plain_window

from genolc.errors import ConfigError, InputError
from genolc.eval.by_position import select_windows
from genolc.eval.inputs import check_not_trained, check_window_fits, resolve_records
from genolc.eval.needle import default_distances, needle_trials, plant, summarise_needle
from genolc.tokenize import make_tokenizer

CHR22 = {"key": "chr22", "name": "22:20000001-21000000", "chrom": "chr22", "start": 20000001, "split": "heldout",
         "length_bases": 1000000, "length_tokens": 1000000, "md5_upper": "05a352ea48c23662e7d72e1614f88da7"}
LAMBDA = {"key": "NC_001416.1", "name": "NC_001416.1", "chrom": "NC_001416.1", "start": 1, "split": "train",
          "length_bases": 48502, "length_tokens": 48502, "md5_upper": "509bdb356475a21077713babc47a4a35"}


class FakeDataset:
    path = "/data/fake"

    def __init__(self, records):
        self._records = {r["key"]: r for r in records}

    def keys(self, split=None):
        return [k for k, r in self._records.items() if split is None or r["split"] == split]

    def record(self, key):
        return self._records[key]


def test_resolve_records_aliases_heldout_and_unknown():
    ds = FakeDataset([CHR22, LAMBDA])
    assert resolve_records(ds, "22") == (["chr22"], False)
    assert resolve_records(ds, "chr22,CHR22") == (["chr22"], False)
    assert resolve_records(ds, "heldout") == (["chr22"], True)
    with pytest.raises(InputError) as err:
        resolve_records(ds, "chr21")
    assert "chr21" in err.value.message and "chr22 (heldout)" in err.value.message and "NC_001416.1" in err.value.message
    unused = FakeDataset([dict(CHR22, split="unused", length_tokens=None), LAMBDA])
    with pytest.raises(InputError, match=r"chr22 were not tokenized \(split 'unused'") as err:
        resolve_records(unused, "22")
    assert "--heldout chr22" in err.value.fix


def _checkpoint(tmp_path, train_records):
    data = tmp_path / "train_data"
    data.mkdir()
    (data / "manifest.json").write_text(json.dumps({"records": train_records}))
    ckpt = tmp_path / "run" / "checkpoints" / "step-000010"
    ckpt.mkdir(parents=True)
    (ckpt / "trainer_state.json").write_text(json.dumps({"version": 1, "config": {"data": str(data), "init": None}}))
    return ckpt


def test_trained_records_are_refused_unless_forced(tmp_path):
    ds = FakeDataset([CHR22, LAMBDA])
    # the checkpoint's training dataset held the same chr22 sequence as a train record (another key, same md5)
    ckpt = _checkpoint(tmp_path, [dict(CHR22, key="22", split="train"), dict(LAMBDA, split="heldout")])
    with pytest.raises(InputError) as err:
        check_not_trained(ds, ["chr22"], [("checkpoint", ckpt)], force=False)
    assert "chr22 was trained on by the checkpoint" in err.value.message and "--force" in err.value.message
    report = check_not_trained(ds, ["chr22"], [("checkpoint", ckpt)], force=True)
    assert report["forced"] and report["problems"]
    # a train record overlapping by coordinates (not identical) also counts
    other = tmp_path / "o"
    other.mkdir()
    ckpt2 = _checkpoint(other, [dict(CHR22, key="chr22", split="train", start=20500001, md5_upper="x")])
    with pytest.raises(InputError):
        check_not_trained(ds, ["chr22"], [("checkpoint", ckpt2)], force=False)
    # a bare save_pretrained directory: provenance unknown, only the dataset's own split labels are checked
    bare = tmp_path / "bare"
    bare.mkdir()
    assert check_not_trained(ds, ["chr22"], [("checkpoint", bare)], force=False)["problems"] == []
    with pytest.raises(InputError, match="NC_001416.1 is in this dataset's train split"):
        check_not_trained(ds, ["NC_001416.1"], [("checkpoint", bare)], force=False)


def test_window_longer_than_the_heldout_record():
    ds = FakeDataset([CHR22, dict(LAMBDA, split="heldout")])
    with pytest.raises(ConfigError, match=r"longer than held-out record\(s\) chr22"):
        check_window_fits(ds, ["chr22"], 1 << 20, pooled=False)
    # pooled held-out records: short ones are skipped, not fatal, while one still fits
    assert check_window_fits(ds, ["chr22", "NC_001416.1"], 65536, pooled=True) == (["chr22"], ["NC_001416.1"])


def test_select_windows_bounds_work_evenly():
    windows = [np.zeros(11) for _ in range(10)]
    assert len(select_windows(windows, 3, None)) == 3
    assert len(select_windows(windows, None, 55)) == 5
    with pytest.raises(ConfigError, match="smaller than one window"):
        select_windows(windows, None, 5)


def test_needle_oracle_copies_the_second_copy():
    tok = make_tokenizer("char")
    rng = np.random.default_rng(0)
    host = plain_window(np.asarray(tok.encode(np.frombuffer(b"ACGT", np.uint8)[rng.integers(0, 4, 4097)]),
                                   dtype=np.int64), tok)
    alphabet = np.unique(host.ids)
    ids, first, second = plant(host.ids, np.arange(10) % 4 + 4, 100)
    assert second == 4097 - 10 and first == second - 100 and np.array_equal(ids[first:first + 10], ids[second:])
    assert default_distances(4097, 64) == [1024, 2048, 4032]
    trials = needle_trials(CopyOracle(alphabet, k=12), [host], tok, segment_bases=128, trials=3,
                           distances=[256, 1024, 3000], seed=1)
    assert len(trials) == 9
    # the copying oracle pays ~2 bits/base on the first copy, far less on the second (after its first 12 tokens)
    assert trials["first_bits_per_base"].min() > 1.8
    assert trials["second_bits_per_base"].max() < 0.4
    per_d = summarise_needle(trials, n_boot=100)
    assert per_d["distance"].tolist() == [256, 1024, 3000]
    assert (per_d["delta_ci_high"] < 0).all()
    with pytest.raises(ConfigError, match="does not fit"):
        needle_trials(CopyOracle(alphabet), [host], tok, segment_bases=128, trials=1, distances=[4000])


def test_a_finetune_run_directory_as_checkpoint_names_its_newest_checkpoint(tmp_path):
    from genolc.eval.scorer import check_checkpoint_tokenizer

    for step in ("step-000002", "step-000010"):
        saved = tmp_path / "run" / "checkpoints" / step
        saved.mkdir(parents=True)
        (saved / "config.json").write_text("{}")
    with pytest.raises(InputError, match="finetune run directory") as info:
        check_checkpoint_tokenizer(tmp_path / "run", make_tokenizer("char"))
    assert "step-000010" in info.value.message
    with pytest.raises(InputError, match="no tokenizer.json"):
        check_checkpoint_tokenizer(tmp_path / "run" / "checkpoints" / "step-000002", make_tokenizer("char"))


def test_eval_configs_share_checks_and_name_the_cli_options(tmp_path):
    from genolc.eval.config import ByPositionConfig, NeedleConfig

    for config_class in (ByPositionConfig, NeedleConfig):
        with pytest.raises(ConfigError, match="--seq must be positive"):
            config_class(data=tmp_path, checkpoint=tmp_path, seq_len=0)
        with pytest.raises(ConfigError, match="--bootstrap must be positive"):
            config_class(data=tmp_path, checkpoint=tmp_path, n_boot=0)
        assert config_class(data=str(tmp_path), checkpoint=str(tmp_path)).to_dict()["data"] == str(tmp_path)
    with pytest.raises(ConfigError, match="--needle-bases must be positive"):
        NeedleConfig(data=tmp_path, checkpoint=tmp_path, segment_bases=0)
