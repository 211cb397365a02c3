"""benchmarks/mfu_ceiling.py on the committed H200 profiles: the MFU it measures is the trainer's, the DSA backward
is split out of its kind, the removals run largest first and never take the wall below the GEMMs, and a file that
is not a profile record is refused with one line."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "benchmarks" / "mfu_ceiling.py"
PROFILES = ROOT / "benchmarks" / "results" / "kda_conv_2026-12-03" / "call4_b6e1319"
sys.path.insert(0, str(ROOT / "benchmarks"))

from mfu_ceiling import DSA_BACKWARD, DSA_REST, RecordError, ceiling  # noqa: E402

from genolc.model import preset  # noqa: E402
from genolc.train.flops import token_flops  # noqa: E402


def load(name: str) -> dict:
    return json.loads((PROFILES / name).read_text())


def test_the_measured_mfu_is_the_trainers_count_over_the_profiled_wall():
    record = load("profile_base_512k.json")
    result = ceiling(record, 0.25, "base")
    tokens = 512 * 1024
    want = token_flops(preset("base"), tokens).model * tokens / 14.07 / 989e12
    assert result["mfu"] == pytest.approx(want, abs=5e-5)
    assert result["mfu"] == pytest.approx(0.1261, abs=5e-5)       # what the session-27 README reported
    assert result["target_seconds"] == pytest.approx(result["seconds"] * result["mfu"] / 0.25, rel=1e-3)


def test_the_dsa_backward_is_split_out_and_the_removals_run_largest_first():
    record = load("profile_base_512k.json")
    result = ceiling(record, 0.25, "base")
    rows = result["removed_largest_first"]
    by_kind = {row["without"]: row["kind_seconds"] for row in rows}
    step = next(step for step in record["steps"] if step["phase"] == "profiled")
    backward_ms = sum(k["device_ms"] for k in step["top_kernels"] if k["name"].startswith("sparse_latent_bwd"))
    dsa_ms = next(k["device_ms"] for k in step["kernel_kinds"] if k["kind"].startswith("dsa/"))
    assert by_kind[DSA_BACKWARD] == pytest.approx(backward_ms / 1e3, abs=1e-3)
    assert by_kind[DSA_BACKWARD] + by_kind[DSA_REST] == pytest.approx(dsa_ms / 1e3, abs=2e-3)
    assert not any(row["without"].startswith("gemm") for row in rows)
    seconds = [row["kind_seconds"] for row in rows]
    assert seconds == sorted(seconds, reverse=True)
    walls = [row["wall_at_least"] for row in rows]
    assert walls == sorted(walls, reverse=True)
    assert walls[0] == pytest.approx(result["seconds"] - seconds[0], abs=1e-3)
    assert min(walls) == pytest.approx(result["gemm_seconds"], abs=1e-3)
    mfus = [row["mfu_at_most"] for row in rows]
    assert mfus == sorted(mfus) and mfus[0] > result["mfu"]


def test_small_needs_every_dsa_and_indexer_kernel_gone_to_reach_its_target():
    result = ceiling(load("profile_small_512k.json"), 0.15, "small")
    rows = result["removed_largest_first"]
    assert [row["without"] for row in rows[:2]] == [DSA_BACKWARD, DSA_REST]
    assert rows[0]["mfu_at_most"] < 0.15 <= rows[1]["mfu_at_most"]


def test_a_record_without_a_profiled_step_is_refused():
    record = load("profile_base_512k.json")
    record["steps"] = [step for step in record["steps"] if step["phase"] != "profiled"]
    with pytest.raises(RecordError, match="no profiled step"):
        ceiling(record, 0.25, "x.json")


def test_a_malformed_profiled_step_is_refused_in_one_line():
    record = load("profile_base_512k.json")
    step = next(step for step in record["steps"] if step["phase"] == "profiled")
    step["kernel_kinds"] = [{"kind": "gemm (cuBLAS/CUTLASS)"}]
    with pytest.raises(RecordError, match="missing or malformed"):
        ceiling(record, 0.25, "x.json")
    record["device"] = None
    with pytest.raises(RecordError, match="not in genolc/train/flops.py's peak table"):
        ceiling(record, 0.25, "x.json")


def test_the_command_prints_the_table_and_refuses_what_it_cannot_read(tmp_path):
    out = tmp_path / "ceiling.json"
    done = subprocess.run([sys.executable, str(SCRIPT), str(PROFILES / "profile_small_512k.json"), "--target", "0.15",
                           "--json", str(out)], capture_output=True, text=True, check=True)
    assert "| without (cumulative) |" in done.stdout and "MFU 8.88%" in done.stdout
    assert json.loads(out.read_text())[0]["model"] == "small"
    junk = tmp_path / "notes.txt"
    junk.write_text("not json")
    refused = subprocess.run([sys.executable, str(SCRIPT), str(junk)], capture_output=True, text=True)
    assert refused.returncode == 2 and "not JSON" in refused.stderr
    assert "Traceback" not in refused.stderr
    junk.write_bytes(b"\x1f\x8b\x08\x00\xff")
    refused = subprocess.run([sys.executable, str(SCRIPT), str(junk)], capture_output=True, text=True)
    assert refused.returncode == 2 and "not JSON" in refused.stderr and "Traceback" not in refused.stderr
    junk.write_text("[1, 2]")
    refused = subprocess.run([sys.executable, str(SCRIPT), str(junk)], capture_output=True, text=True)
    assert refused.returncode == 2 and "not a profile record" in refused.stderr
    refused = subprocess.run([sys.executable, str(SCRIPT), str(PROFILES / "profile_small_512k.json"), "--json",
                              str(tmp_path / "absent" / "x.json")], capture_output=True, text=True)
    assert refused.returncode == 2 and "its folder does not exist" in refused.stderr and not refused.stdout
    refused = subprocess.run([sys.executable, str(SCRIPT), str(PROFILES / "profile_small_512k.json"), "--target", "0"],
                             capture_output=True, text=True)
    assert refused.returncode == 2 and "--target 0.0" in refused.stderr


def test_another_peak_scales_every_mfu_and_the_target_wall():
    """Issue 14 divided by the 798 TFLOP/s measured on the H200, genolc by the vendor's 989."""
    record = load("profile_base_512k.json")
    vendor = ceiling(record, 0.25, "base")
    measured = ceiling(record, 0.25, "base", peak_flops=798e12)
    assert measured["peak_tflops"] == 798 and measured["seconds"] == vendor["seconds"]
    assert measured["mfu"] == pytest.approx(vendor["mfu"] * 989 / 798, abs=1e-4)
    assert measured["target_seconds"] == pytest.approx(vendor["target_seconds"] * 989 / 798, rel=1e-3)
    for ours, theirs in zip(vendor["removed_largest_first"], measured["removed_largest_first"]):
        assert theirs["wall_at_least"] == ours["wall_at_least"]
        assert theirs["mfu_at_most"] == pytest.approx(ours["mfu_at_most"] * 989 / 798, abs=1e-4)
    done = subprocess.run([sys.executable, str(SCRIPT), str(PROFILES / "profile_small_512k.json"), "--peak-tflops",
                           "798"], capture_output=True, text=True, check=True)
    assert "of 798 TFLOP/s" in done.stdout
    refused = subprocess.run([sys.executable, str(SCRIPT), str(PROFILES / "profile_small_512k.json"),
                              "--peak-tflops", "-1"], capture_output=True, text=True)
    assert refused.returncode == 2 and "--peak-tflops -1.0" in refused.stderr and not refused.stdout
