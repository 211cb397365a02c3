"""genolc's tuned fla kernel configs: when fla is pointed at them, and that the shipped files are ones fla can read."""

from __future__ import annotations

import hashlib
import json
import sys
import types

import pytest

from genolc.model.ops.kda import fla_tuning
from genolc.model.ops.kda.fla_tuning import (MANIFEST, TUNED_CONFIGS, autotune_note, gpu_folder_name, tuned_shapes,
                                             use_tuned_configs)
from genolc.model.presets import preset

VERSIONS = {"fla": "0.6.0", "triton": "3.6.0"}


@pytest.fixture
def tuned(tmp_path, monkeypatch):
    monkeypatch.setattr(fla_tuning, "_set_here", {})
    folder = tmp_path / "NVIDIA_H200"
    folder.mkdir()
    manifest = {**VERSIONS, "presets": {"small": {"heads": 8, "head_dim": 128, "length": 32768,
                                                  "windows": [[1, 32768]]}}}
    (folder / MANIFEST).write_text(json.dumps(manifest))
    return tmp_path


def test_gpu_folder_name_is_fla_s():
    assert gpu_folder_name("NVIDIA H200") == "NVIDIA_H200"
    assert gpu_folder_name("NVIDIA H100 80GB HBM3") == "NVIDIA_H100_80GB_HBM3"
    assert gpu_folder_name("  ") == "unknown_gpu"


def test_a_tuned_gpu_points_fla_at_its_folder(tuned):
    environ = {}
    assert use_tuned_configs("NVIDIA H200", environ, tuned, VERSIONS) == tuned / "NVIDIA_H200"
    assert environ == {"FLA_CONFIG_DIR": str(tuned / "NVIDIA_H200"), "FLA_CACHE_MODE": "strict"}
    # genolc's own settings are not taken for the user's: a second call and the note still see the configs.
    assert use_tuned_configs("NVIDIA H200", environ, tuned, VERSIONS) == tuned / "NVIDIA_H200"
    assert autotune_note("NVIDIA H200", preset("small"), environ=environ, tuned=tuned, versions=VERSIONS) is None


@pytest.mark.parametrize("environ", [{"FLA_CONFIG_DIR": "/mine"}, {"FLA_CACHE_MODE": "disabled"}])
def test_the_user_s_fla_settings_win(tuned, environ):
    before = dict(environ)
    assert use_tuned_configs("NVIDIA H200", environ, tuned, VERSIONS) is None
    assert environ == before
    assert autotune_note("NVIDIA B200", preset("small"), environ=environ, tuned=tuned, versions=VERSIONS) is None


@pytest.mark.parametrize("versions", [{"fla": "0.6.1", "triton": "3.6.0"}, {"fla": "0.6.0", "triton": "3.7.1"},
                                      {"fla": None, "triton": None}])
def test_configs_tuned_with_other_versions_are_not_used(tuned, versions):
    environ = {}
    assert use_tuned_configs("NVIDIA H200", environ, tuned, versions) is None and environ == {}
    assert "8 heads x 128" in autotune_note("NVIDIA H200", preset("small"), environ={}, tuned=tuned,
                                            versions=versions)


def test_an_untuned_gpu_changes_nothing(tuned):
    environ = {}
    assert use_tuned_configs("NVIDIA B200", environ, tuned, VERSIONS) is None
    assert environ == {}


def test_the_autotune_note_names_the_shape_precision_and_cache(tuned):
    small, base = preset("small"), preset("base")
    assert autotune_note("NVIDIA H200", small, 1, True, {}, tuned, VERSIONS) is None
    note = autotune_note("NVIDIA H200", base, 1, True, {"TRITON_CACHE_DIR": "/t"}, tuned, VERSIONS)
    assert "12 heads x 128 on" in note and "/t" in note
    # --cp-kda heads over 2 ranks: each rank's kernels see half the heads.
    assert "6 heads x 128" in autotune_note("NVIDIA H200", base, 2, True, {}, tuned, VERSIONS)
    # The configs are tuned under bf16 autocast; fp32 training has other keys.
    assert "8 heads x 128 in fp32" in autotune_note("NVIDIA H200", small, 1, False, {}, tuned, VERSIONS)
    assert "8 heads x 128" in autotune_note("NVIDIA B200", small, 1, True, {}, tuned, VERSIONS)
    no_kda = small.replace(layer_types=("indexed_attention",) * small.num_hidden_layers)
    assert autotune_note("NVIDIA B200", no_kda, 1, True, {}, tuned, VERSIONS) is None


def test_fla_already_imported_gets_the_mode_on_its_module(tuned, monkeypatch):
    environ = {"FLA_GPU_NAME": "NVIDIA H200"}

    class Mode:
        @staticmethod
        def from_env():
            return f"from env: {environ.get('FLA_CACHE_MODE')}"

    held = types.SimpleNamespace(FLA_CACHE_MODE="disabled", FlaCacheMode=Mode)
    monkeypatch.setitem(sys.modules, "fla.ops.utils.cache", held)
    assert fla_tuning.point_fla_at_tuned_configs(environ, tuned, VERSIONS) == tuned / "NVIDIA_H200"
    assert held.FLA_CACHE_MODE == "from env: strict"


def _shipped():
    return sorted(path for path in TUNED_CONFIGS.glob("*/*.json") if path.name != MANIFEST)


def test_an_h200_folder_is_shipped_with_its_manifest():
    manifest = json.loads((TUNED_CONFIGS / "NVIDIA_H200" / MANIFEST).read_text())
    assert manifest["fla"] and manifest["triton"] and _shipped()
    assert (8, 128) in tuned_shapes("NVIDIA H200", versions={"fla": manifest["fla"], "triton": manifest["triton"]})
    for folder in TUNED_CONFIGS.iterdir():
        for name, shape in json.loads((folder / MANIFEST).read_text())["presets"].items():
            assert (preset(name).linear_num_heads, preset(name).linear_head_dim) == (shape["heads"],
                                                                                     shape["head_dim"])
            # What tests/gpu/test_fla_tuned_configs_gpu.py runs again to show nothing autotunes.
            assert shape["length"] > 0 and all(batch > 0 and tokens > 0 for batch, tokens in shape["windows"])


def test_the_sweep_covers_the_kda_calls_finetune_makes_on_the_h200():
    """fla's l2norm kernels compile per bucket of batch x tokens x heads (65,536 rows each): a bucket the tuning did
    not sweep autotunes on a new machine (14.7 s for `small`'s 64k chunks,
    benchmarks/results/finetune_sync_slab_2026-12-04/finetune_curve_small_512k_cold/).
    A KDA call gets the window or the chunk that ``genolc plan`` picks, in segments of at most DEFAULT_SEGMENT_LEN
    tokens unless the chunk's intermediates are kept (one call); the sweep runs lengths past a segment that way."""
    from benchmarks.tune_fla_configs import SWEEP_WINDOWS, sweep_cache
    from genolc.model.ops.kda.fla import DEFAULT_SEGMENT_LEN
    from genolc.train.plan import GIB
    from genolc.train.strategy import choose_strategy

    common = dict(windows=1, grad_accum=1, chunk=None, recompute=False, auto_recompute=True, bf16=True,
                  fast_kernels=True, budget_bytes=int(139.8 * GIB), multiple=64, where="test")
    for name in ("small", "base"):
        config = preset(name)
        swept = set()
        for batch, tokens in SWEEP_WINDOWS:
            # The sweep runs a window past one segment as a kept chunk: one fla call of all its tokens.
            cache = sweep_cache(tokens)
            called = tokens if cache is not None and cache.keep_kda_intermediates else min(tokens, DEFAULT_SEGMENT_LEN)
            swept.add((batch, -(-batch * called * config.linear_num_heads // 65536)))
        for seq_len in (32768 << i for i in range(6)):
            strategy = choose_strategy(config, seq_len=seq_len, **common)
            tokens = strategy.chunk or seq_len
            if not strategy.keep_kda_intermediates:
                tokens = min(tokens, DEFAULT_SEGMENT_LEN)
            assert (1, -(-tokens * config.linear_num_heads // 65536)) in swept, (name, seq_len, tokens)


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
