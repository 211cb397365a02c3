"""genolc's tuned fla kernel configs: when fla is pointed at them, and that the shipped files are ones fla can read."""

from __future__ import annotations

import hashlib
import json

import pytest

from genolc.model.ops.kda.fla import TUNED_CONFIGS, gpu_folder_name, use_tuned_configs


def test_gpu_folder_name_is_fla_s():
    assert gpu_folder_name("NVIDIA H200") == "NVIDIA_H200"
    assert gpu_folder_name("NVIDIA H100 80GB HBM3") == "NVIDIA_H100_80GB_HBM3"
    assert gpu_folder_name("  ") == "unknown_gpu"


def test_a_tuned_gpu_points_fla_at_its_folder(tmp_path):
    (tmp_path / "NVIDIA_H200").mkdir()
    environ = {}
    assert use_tuned_configs("NVIDIA H200", environ, tmp_path) == tmp_path / "NVIDIA_H200"
    assert environ == {"FLA_CONFIG_DIR": str(tmp_path / "NVIDIA_H200"), "FLA_CACHE_MODE": "strict"}


@pytest.mark.parametrize("environ", [{"FLA_CONFIG_DIR": "/mine"}, {"FLA_CACHE_MODE": "disabled"}])
def test_the_user_s_fla_settings_win(tmp_path, environ):
    (tmp_path / "NVIDIA_H200").mkdir()
    before = dict(environ)
    assert use_tuned_configs("NVIDIA H200", environ, tmp_path) is None
    assert environ == before


def test_an_untuned_gpu_changes_nothing(tmp_path):
    environ = {}
    assert use_tuned_configs("NVIDIA B200", environ, tmp_path) is None
    assert environ == {}


def _shipped():
    return sorted(TUNED_CONFIGS.glob("*/*.json"))


def test_an_h200_folder_is_shipped():
    assert (TUNED_CONFIGS / "NVIDIA_H200").is_dir() and _shipped()


@pytest.mark.parametrize("path", _shipped(), ids=lambda p: f"{p.parent.name}/{p.name}")
def test_shipped_files_are_what_fla_reads(path):
    data = json.loads(path.read_text())
    assert data["kernel_name"] == path.stem
    assert data["autotune_entries"]
    for key_hash, entry in data["autotune_entries"].items():
        # fla's AutotuneKey.key_hash: md5 of the key as compact, key-sorted JSON. A stale hash is never matched, so
        # the kernel would silently autotune again.
        serialized = json.dumps(entry["autotune_key"], separators=(",", ":"), sort_keys=True)
        assert hashlib.md5(serialized.encode()).hexdigest() == key_hash
        config = entry["config"]
        assert isinstance(config["kwargs"], dict)
        assert isinstance(config["num_warps"], int) and isinstance(config["num_stages"], int)
        assert isinstance(config["num_ctas"], int)
