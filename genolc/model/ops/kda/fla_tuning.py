"""fla's KDA kernel configs as genolc ships them, tuned once per GPU, so a new machine's first step does not autotune.

fla autotunes a kernel the first time it meets a key (heads, head dims, block counts, flags, dtypes): it compiles and
times every candidate config. With every cache empty that took about 3 minutes of the first ``small`` step at 128k
on an H200 (benchmarks/results/first_step_cold_small_128k_2026-12-01/). fla can read a kernel's config from
``$FLA_CONFIG_DIR/<kernel>.json`` instead, when ``FLA_CACHE_MODE`` asks it to; ``strict`` uses an exact key match and
autotunes anything else as before. genolc keeps such files under ``tuned/<GPU>/`` (written on that GPU by
benchmarks/tune_fla_configs.py) with a ``manifest.json``: the fla and Triton versions they were tuned with and the
presets (KDA heads, head dim) tuned. :func:`point_fla_at_tuned_configs` sets fla's two variables when the installed
versions match, so a changed kernel never gets a stale config; a user who set either variable keeps fla's behaviour
as they set it. Keys hold the micro-batch and a bucket of tokens x heads for some small kernels (l2norm, cumsum): the
tuning sweeps the calls ``finetune`` makes on the H200 (1k-128k tokens at micro-batch 1, up to 32k at 2), and a
length or batch outside them still autotunes those (14.7 s for l2norm's backward at one new bucket).
"""

from __future__ import annotations

import json
import os
import re
import sys
from importlib import metadata
from pathlib import Path
from typing import Mapping, MutableMapping

TUNED_CONFIGS = Path(__file__).with_name("tuned")
MANIFEST = "manifest.json"
FLA_SWITCHES = ("FLA_CONFIG_DIR", "FLA_CACHE_MODE")

# What this process set itself, so that its own settings are not mistaken for the user's later on.
_set_here: dict[str, str] = {}


def gpu_folder_name(device_name: str) -> str:
    """The folder name fla gives a GPU (its ``sanitize_gpu_name``): ``"NVIDIA H200"`` -> ``"NVIDIA_H200"``."""
    return re.sub(r"[^0-9A-Za-z]+", "_", device_name).strip("_") or "unknown_gpu"


def fla_gpu_name(environ: Mapping[str, str] = os.environ) -> str:
    """The GPU name fla files configs under: ``$FLA_GPU_NAME`` (fla's own override) or CUDA device 0's name."""
    if environ.get("FLA_GPU_NAME"):
        return environ["FLA_GPU_NAME"]
    import torch

    return torch.cuda.get_device_name(0)


def installed_versions() -> dict[str, str | None]:
    """The installed fla (``fla-core``, or ``flash-linear-attention`` before the split) and Triton versions."""
    def version(*names: str) -> str | None:
        for name in names:
            try:
                return metadata.version(name)
            except metadata.PackageNotFoundError:
                continue
        return None

    return {"fla": version("fla-core", "flash-linear-attention"), "triton": version("triton", "pytorch-triton")}


def user_set_fla_switches(environ: Mapping[str, str] = os.environ) -> bool:
    return any(name in environ and environ[name] != _set_here.get(name) for name in FLA_SWITCHES)


def tuned_folder(device_name: str, tuned: Path = TUNED_CONFIGS,
                 versions: Mapping[str, str | None] | None = None) -> Path | None:
    """This GPU's folder of configs when genolc has one tuned with the installed fla and Triton; else None."""
    folder = tuned / gpu_folder_name(device_name)
    if not (folder / MANIFEST).is_file():
        return None
    manifest = json.loads((folder / MANIFEST).read_text())
    versions = installed_versions() if versions is None else versions
    if any(manifest.get(package) != versions.get(package) for package in ("fla", "triton")):
        return None
    return folder


def tuned_shapes(device_name: str, tuned: Path = TUNED_CONFIGS,
                 versions: Mapping[str, str | None] | None = None) -> set[tuple[int, int]]:
    """The ``(heads, head dim)`` KDA shapes with configs usable here (empty: none)."""
    folder = tuned_folder(device_name, tuned, versions)
    if folder is None:
        return set()
    presets = json.loads((folder / MANIFEST).read_text()).get("presets", {})
    return {(int(shape["heads"]), int(shape["head_dim"])) for shape in presets.values()}


def use_tuned_configs(device_name: str, environ: MutableMapping[str, str] = os.environ, tuned: Path = TUNED_CONFIGS,
                      versions: Mapping[str, str | None] | None = None) -> Path | None:
    """Point fla at the tuned configs for ``device_name`` (sets ``FLA_CONFIG_DIR`` and ``FLA_CACHE_MODE=strict`` in
    ``environ``) and return their folder; None, changing nothing, where the user set either variable or there are
    no configs for this GPU and these versions."""
    if user_set_fla_switches(environ):
        return None
    folder = tuned_folder(device_name, tuned, versions)
    if folder is None:
        return None
    for name, value in (("FLA_CONFIG_DIR", str(folder)), ("FLA_CACHE_MODE", "strict")):
        environ[name] = _set_here[name] = value
    return folder


def point_fla_at_tuned_configs(environ: MutableMapping[str, str] = os.environ, tuned: Path = TUNED_CONFIGS,
                               versions: Mapping[str, str | None] | None = None) -> Path | None:
    """:func:`use_tuned_configs` for this process's GPU, before fla is imported (or on the fla it already holds)."""
    folder = use_tuned_configs(fla_gpu_name(environ), environ, tuned, versions)
    if folder is not None and "fla.ops.utils.cache" in sys.modules:
        # fla reads FLA_CACHE_MODE when it is first imported; a process that imported fla before (transformers'
        # fla-backed layers) gets the mode set on the module it already holds.
        fla_cache = sys.modules["fla.ops.utils.cache"]
        fla_cache.FLA_CACHE_MODE = fla_cache.FlaCacheMode.from_env()
    return folder


def autotune_note(device_name: str, config, head_ranks: int = 1, bf16: bool = True,
                  environ: Mapping[str, str] = os.environ, tuned: Path = TUNED_CONFIGS,
                  versions: Mapping[str, str | None] | None = None) -> str | None:
    """What a run of the model ``config`` (a ModelConfig) should tell its user when fla will autotune the KDA kernels
    on this GPU: no configs here for its shape (``head_ranks``: processes splitting the heads, each running its
    share) or its precision (configs are tuned under bf16 autocast). None where the model has no KDA layer, configs
    apply, or the user set fla's own switches."""
    if "linear_attention" not in config.layer_types or user_set_fla_switches(environ):
        return None
    heads, head_dim = config.linear_num_heads // head_ranks, config.linear_head_dim
    if bf16 and (heads, head_dim) in tuned_shapes(device_name, tuned, versions):
        return None
    cache = environ.get("TRITON_CACHE_DIR") or str(Path.home() / ".triton" / "cache")
    return (f"fla autotunes its KDA kernels for {heads} heads x {head_dim}{'' if bf16 else ' in fp32'} on a GPU's "
            f"first run (about 3 minutes for the `small` preset's on an H200, every cache empty; the choices are kept "
            f"in {cache} for later runs; benchmarks/tune_fla_configs.py makes them once for genolc to ship)")
