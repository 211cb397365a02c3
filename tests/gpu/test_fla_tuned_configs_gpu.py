"""On a GPU that genolc ships fla configs for (genolc/model/ops/kda/tuned/<GPU>/, tuned with the installed fla and
Triton): each tuned preset's KDA layer runs what the manifest says was tuned without fla autotuning anything. Guards
the shipped files against a change in how genolc calls fla (other keys: the configs would silently stop applying
and a new machine's first step would autotune for minutes again)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

if not torch.cuda.is_available():
    pytest.skip("needs a CUDA device", allow_module_level=True)

from genolc.model.ops.kda.fla_tuning import MANIFEST, fla_gpu_name, tuned_folder  # noqa: E402

pytestmark = pytest.mark.gpu
ROOT = Path(__file__).resolve().parents[2]
FOLDER = tuned_folder(fla_gpu_name())


def _presets() -> list[str]:
    return [] if FOLDER is None else sorted(json.loads((FOLDER / MANIFEST).read_text())["presets"])


@pytest.mark.skipif(FOLDER is None, reason="no fla configs shipped for this GPU and these fla/Triton versions")
@pytest.mark.parametrize("name", _presets())
def test_a_tuned_preset_runs_without_autotuning(name, tmp_path):
    shape = json.loads((FOLDER / MANIFEST).read_text())["presets"][name]
    windows = tuple(tuple(window) for window in shape["windows"])
    code = ("from benchmarks.tune_fla_configs import run_layer; "
            f"run_layer({name!r}, {shape['length']}, {windows!r})")
    env = {key: value for key, value in os.environ.items() if key not in ("FLA_CACHE_MODE", "FLA_CONFIG_DIR")}
    # A new process (fla reads its mode when imported) and an empty Triton cache (no earlier autotune results).
    env.update(TRITON_CACHE_DIR=str(tmp_path / "triton"), TRITON_PRINT_AUTOTUNING="1",
               PYTHONPATH=os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")]))
    run = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True,
                         timeout=900)
    assert run.returncode == 0, run.stderr[-3000:]
    autotuned = [line for line in (run.stdout + run.stderr).splitlines()
                 if line.startswith("Triton autotuning for function")]
    assert not autotuned, autotuned
    # And the run did compile the tuned kernels into this cache (not a run whose output format merely changed).
    compiled = {path.stem for path in (tmp_path / "triton").rglob("*.cubin")}
    tuned = {path.stem for path in FOLDER.glob("*.json") if path.name != MANIFEST}
    assert compiled & tuned, (sorted(compiled)[:20], sorted(tuned))
