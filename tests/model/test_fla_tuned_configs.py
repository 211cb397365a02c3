"""genolc's tuned fla kernel configs: when fla is pointed at them, and that the shipped files are ones fla can read."""

from __future__ import annotations

import hashlib
import json

import pytest

from genolc.model.ops.kda.fla import (SHAPES_FILE, TUNED_CONFIGS, autotune_note, gpu_folder_name, tuned_shapes,
                                      use_tuned_configs)


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
    return sorted(path for path in TUNED_CONFIGS.glob("*/*.json") if path.name != SHAPES_FILE)


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


def test_shipped_shapes_name_presets_and_their_kda_shape():
    from genolc.model.presets import preset

    for folder in TUNED_CONFIGS.iterdir():
        shapes = json.loads((folder / SHAPES_FILE).read_text())
        assert shapes, folder
        for name, (heads, dim) in shapes.items():
            assert (preset(name).linear_num_heads, preset(name).linear_head_dim) == (heads, dim)
    assert (8, 128) in tuned_shapes("NVIDIA H200")      # small


def test_the_autotune_note_names_the_shape_and_the_cache(tmp_path):
    from genolc.model.presets import preset

    (tmp_path / "NVIDIA_H200").mkdir()
    (tmp_path / "NVIDIA_H200" / SHAPES_FILE).write_text('{"small": [8, 128]}')
    small, base = preset("small"), preset("base")
    assert autotune_note("NVIDIA H200", small, 1, {}, tmp_path) is None
    note = autotune_note("NVIDIA H200", base, 1, {"TRITON_CACHE_DIR": "/t"}, tmp_path)
    assert "12 heads x 128" in note and "/t" in note
    # --cp-kda heads over 2 ranks: each rank's kernels see half the heads.
    assert "6 heads x 128" in autotune_note("NVIDIA H200", base, 2, {}, tmp_path)
    assert "8 heads x 128" in autotune_note("NVIDIA B200", small, 1, {}, tmp_path)
    assert autotune_note("NVIDIA B200", small, 1, {"FLA_CACHE_MODE": "disabled"}, tmp_path) is None
    no_kda = small.replace(layer_types=("indexed_attention",) * small.num_hidden_layers)
    assert autotune_note("NVIDIA B200", no_kda, 1, {}, tmp_path) is None
