"""Tune fla's KDA kernels for each preset's shapes on this GPU and write the winners where genolc ships them.

    python benchmarks/tune_fla_configs.py [--presets small base mini glm-5.3-flash] [--length 32768] [--extend]
        [--out genolc/model/ops/kda/tuned] [--record benchmarks/results/fla_tuning_<date>.json]

(on the GPU, from the repository root, after ``source benchmarks/gpu_env.sh && gpu_env_setup``.) Why: with every
cache empty, fla's autotuning (each candidate config compiled, then timed) took about 3 minutes of the first
``small`` step at 128k on an H200 (2026-12-01), more than anything else a new machine pays. fla looks a kernel's
config up in ``$FLA_CONFIG_DIR/<kernel>.json`` first when ``FLA_CACHE_MODE`` asks it to; genolc points it at
``genolc/model/ops/kda/tuned/<GPU>/`` (genolc/model/ops/kda/fla_tuning.py), so on a GPU tuned
here the first step compiles one config per kernel instead of all of them.

Per preset it runs one KDA layer (the preset's heads and dims, fp32 weights, bf16 autocast, as the trainer does)
the ways training and evaluation call fla: a whole window of two segments (no initial state, then one), a chunk
with a carried state and convolution tail and gradients flowing into both, and a no-grad forward. fla's autotuner
keys hold shapes (heads, head dims, block sizes, flags, dtypes), mostly not the sequence length, so configs tuned at
``--length`` serve every length of that preset; the exceptions (l2norm's bucket of tokens x heads, a compile-time
constant of its kernels, and cumsum's batch) are covered for the windows of :data:`SWEEP_WINDOWS`: 1k-128k tokens at
micro-batch 1, the tokens a KDA call gets from ``finetune`` on the H200 (`small`: whole windows up to 128k, then 128k
and 64k chunks; `base`: 32k, then 32k and 16k chunks, as ``genolc plan`` says), and 1k-32k at micro-batch 2. Each
entry written is read back through fla's own lookup in strict mode before the script ends; entries already in a file
for other keys are kept, unless the folder's ``manifest.json`` names other fla or Triton versions (then its files are
replaced). ``--extend`` autotunes only the keys the folder lacks: fla reads the rest from it (strict mode), so
covering a new window costs its own kernels' tuning, not the preset's minutes again. The manifest lists the versions
and the presets tuned; genolc uses the folder only with those versions installed
(genolc/model/ops/kda/fla_tuning.py), and ``finetune`` tells a user whose shape is not among them that its first
run autotunes.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from genolc.fsutil import atomic_write_json  # noqa: E402
from genolc.model.cache import LayerCache  # noqa: E402
from genolc.model.layers.kda import KimiDeltaAttention  # noqa: E402
from genolc.model.model import _init_forget_gate  # noqa: E402
from genolc.model.ops.kda.fla import DEFAULT_SEGMENT_LEN  # noqa: E402
from genolc.model.ops.kda.fla_tuning import (MANIFEST, TUNED_CONFIGS, gpu_folder_name, installed_versions,  # noqa: E402
                                             tuned_folder)
from genolc.model.presets import PRESETS, preset  # noqa: E402


# (micro-batch, tokens): the calls finetune makes on the H200 at micro-batch 1 (up to 128k chunks) and 2 (32k).
SWEEP_WINDOWS = tuple((1, 1024 << i) for i in range(8)) + tuple((2, 1024 << i) for i in range(6))


def sweep_cache(tokens: int) -> LayerCache | None:
    """How the sweep runs a window of ``tokens``: whole (fla gets it in segments of at most DEFAULT_SEGMENT_LEN), or,
    past one segment, as a chunk whose KDA intermediates are kept, which fla gets in one call as the chunked step
    hands it (a whole window there would tune nothing a segment had not)."""
    if tokens <= DEFAULT_SEGMENT_LEN:
        return None
    return LayerCache(start=0, window_len=2 * tokens, keep_kda_intermediates=True)


def run_layer(name: str, length: int, sweep_windows: tuple[tuple[int, int], ...] = SWEEP_WINDOWS) -> None:
    """The fla calls a preset's KDA layer makes in training (whole window, carried chunk) and evaluation, then the
    calls of ``sweep_windows`` ((micro-batch, tokens) pairs): fla's l2norm kernels key on
    ``ceil(batch x tokens x heads / 65536)`` and its cumsum kernels on the batch. A whole window reaches fla in
    segments of at most ``DEFAULT_SEGMENT_LEN`` tokens; a chunked step's chunk whose KDA intermediates are kept
    (genolc/train/strategy.py) reaches it whole, so lengths past a segment are run that way."""
    config = preset(name)
    torch.manual_seed(0)
    layer = KimiDeltaAttention(config, layer_idx=0).cuda()
    for module in layer.modules():
        if isinstance(module, torch.nn.Linear):
            torch.nn.init.normal_(module.weight, std=config.initializer_range)
    _init_forget_gate(layer.forget_gate)
    autocast = torch.autocast("cuda", dtype=torch.bfloat16)
    x = torch.randn(1, 2 * length, config.hidden_size, device="cuda", requires_grad=True)
    with autocast:
        layer(x).float().square().mean().backward()
    chunk = x[:, :length].detach().requires_grad_()
    with torch.no_grad(), autocast:
        first = LayerCache(start=0, window_len=2 * length)
        layer(chunk, cache=first)
    past = {"state": first.present["state"].detach().requires_grad_(),
            "conv_tail": first.present["conv_tail"].detach().requires_grad_()}
    carried = LayerCache(start=length, window_len=2 * length, past=past)
    with autocast:
        out = layer(chunk, cache=carried)
    torch.autograd.backward([out.float().square().mean(), carried.present["state"]],
                            [None, torch.randn_like(carried.present["state"])])
    with torch.no_grad(), autocast:
        layer(chunk)
    buckets = set()
    for batch, tokens in sweep_windows:
        bucket = (batch, -(-batch * tokens * config.linear_num_heads // 65536))
        if bucket in buckets:
            continue
        buckets.add(bucket)
        x = torch.randn(batch, tokens, config.hidden_size, device="cuda", requires_grad=True)
        with autocast:
            layer(x, cache=sweep_cache(tokens)).float().square().mean().backward()
        del x
    torch.cuda.synchronize()


def fla_autotuners() -> tuple[dict[str, object], list[str]]:
    """fla's tuned kernels by name (its ``CachedAutotuner``, whose configs a file can supply), and the names of any
    other autotuned kernel that ran (plain Triton autotuners: a file cannot supply theirs)."""
    from triton.runtime.autotuner import Autotuner

    from fla.ops.utils.cache import CachedAutotuner

    def autotuner(value):
        # fla stacks ``triton.heuristics`` over its autotuner: each wrapper holds the next in ``.fn``.
        for _ in range(4):
            if isinstance(value, Autotuner):
                return value
            value = getattr(value, "fn", None)
        return None

    tuners, others = {}, []
    for module_name, module in list(sys.modules.items()):
        if not module_name.startswith("fla.") or module is None:
            continue
        for value in map(autotuner, vars(module).values()):
            if value is not None and value.cache:
                kernel = value.fn.__name__ if hasattr(value.fn, "__name__") else str(value.fn)
                if isinstance(value, CachedAutotuner):
                    tuners[value.kernel_name] = value
                else:
                    others.append(kernel)
    return tuners, sorted(set(others))


def config_entry(config) -> dict:
    entry = {"kwargs": dict(config.kwargs), "num_warps": config.num_warps, "num_stages": config.num_stages,
             "num_ctas": getattr(config, "num_ctas", 1), "maxnreg": getattr(config, "maxnreg", None)}
    if getattr(config, "ir_override", None) is not None:
        entry["ir_override"] = config.ir_override
    return entry


def start_folder(folder: Path, versions: dict) -> dict:
    """The folder's manifest, emptied first when its configs were tuned with other fla or Triton versions."""
    manifest_path = folder / MANIFEST
    manifest = json.loads(manifest_path.read_text()) if manifest_path.exists() else {}
    if manifest and any(manifest.get(package) != version for package, version in versions.items()):
        print(f"{folder}: tuned with fla {manifest.get('fla')}, Triton {manifest.get('triton')}; installed "
              f"{versions['fla']}, {versions['triton']}: its configs are replaced", flush=True)
        for stale in folder.glob("*.json"):
            # Only the kernel files this script writes (and the manifest): anything else in the folder stays.
            if stale.name == MANIFEST or set(json.loads(stale.read_text())) == {"kernel_name", "triton_version",
                                                                               "autotune_entries"}:
                stale.unlink()
        manifest = {}
    return {**versions, "presets": manifest.get("presets", {})}


def write_configs(tuners: dict[str, object], folder: Path) -> tuple[int, list[str]]:
    """Every config the tuners hold, written into the folder's kernel files; returns how many, and the keys (as
    ``kernel [key]``) that no file held before."""
    import triton

    from fla.ops.utils.cache import AutotuneKey

    folder.mkdir(parents=True, exist_ok=True)
    written, added = 0, []
    for kernel, tuner in sorted(tuners.items()):
        path = folder / f"{kernel}.json"
        data = json.loads(path.read_text()) if path.exists() else {}
        entries = data.get("autotune_entries") or {}
        for key, config in tuner.cache.items():
            key_hash = AutotuneKey.key_hash(key)
            if key_hash not in entries:
                added.append(f"{kernel} {AutotuneKey.serialize(key)}")
            entries[key_hash] = {"autotune_key": AutotuneKey.normalize_autotune_key(key),
                                 "config": config_entry(config)}
            written += 1
        atomic_write_json(path, {"kernel_name": kernel, "triton_version": triton.__version__, "autotune_entries": entries})
    return written, added


def check_written(tuners: dict[str, object], folder: Path) -> None:
    """Every tuned key reads back through fla's strict lookup as the config the autotuner chose."""
    from fla.ops.utils import cache as fla_cache

    # Strict lookup only while checking: the presets tuned after this one must autotune, not read these files.
    mode, config_dir = fla_cache.FLA_CACHE_MODE, os.environ.get("FLA_CONFIG_DIR")
    os.environ["FLA_CONFIG_DIR"] = str(folder)
    fla_cache.FLA_CACHE_MODE = fla_cache.FlaCacheMode.STRICT
    fla_cache.load_config_file.cache_clear()
    try:
        for kernel, tuner in tuners.items():
            for key, config in tuner.cache.items():
                found = fla_cache.load_cached_config(kernel, fla_cache.AutotuneKey(autotune_key=key))
                if found != json.loads(json.dumps(config_entry(config))):
                    raise SystemExit(f"{folder}/{kernel}.json: key {key} reads back as {found}, "
                                     f"not the tuned {config_entry(config)}")
    finally:
        fla_cache.FLA_CACHE_MODE = mode
        fla_cache.load_config_file.cache_clear()
        if config_dir is None:
            os.environ.pop("FLA_CONFIG_DIR", None)
        else:
            os.environ["FLA_CONFIG_DIR"] = config_dir


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--presets", nargs="+", default=["small", "base", "mini", "glm-5.3-flash"],
                        choices=sorted(PRESETS))
    parser.add_argument("--length", type=int, default=32768, help="tokens per chunk (the trainer's default chunk)")
    parser.add_argument("--extend", action="store_true",
                        help="keep the folder's configs (fla reads them) and autotune only the keys it lacks")
    parser.add_argument("--out", type=Path, default=TUNED_CONFIGS)
    parser.add_argument("--record", type=Path,
                        default=Path(f"benchmarks/results/fla_tuning_{datetime.date.today()}.json"))
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        raise SystemExit("tune_fla_configs.py tunes CUDA kernels: run it on a machine with a GPU")
    if any(name in os.environ for name in ("FLA_CACHE_MODE", "FLA_CONFIG_DIR")):
        raise SystemExit("FLA_CACHE_MODE or FLA_CONFIG_DIR is set: unset them; this script chooses what fla reads "
                         "(nothing, or with --extend the folder it writes)")
    folder = args.out / gpu_folder_name(torch.cuda.get_device_name(0))
    versions = installed_versions()
    if args.extend:
        if tuned_folder(torch.cuda.get_device_name(0), args.out, versions) is None:
            raise SystemExit(f"--extend: {folder} holds no configs tuned with fla {versions['fla']} and Triton "
                             f"{versions['triton']}; run without --extend to tune every kernel")
        # Set before fla is imported (it reads its mode once): the folder's keys are loaded, the rest autotuned.
        os.environ.update(FLA_CACHE_MODE="strict", FLA_CONFIG_DIR=str(folder))
    else:
        os.environ["FLA_CACHE_MODE"] = "disabled"
    folder.mkdir(parents=True, exist_ok=True)
    manifest = start_folder(folder, versions)
    sha = os.environ.get("GENOLC_GIT_SHA") or subprocess.run(["git", "rev-parse", "--short", "HEAD"],
                                                             capture_output=True, text=True).stdout.strip()
    record = {"command": "python " + " ".join([sys.argv[0], *(argv if argv is not None else sys.argv[1:])]),
              "git_sha": sha, "device": torch.cuda.get_device_name(0), "torch": torch.__version__,
              "fla": manifest["fla"], "triton": manifest["triton"], "presets": args.presets, "length": args.length,
              "windows": [list(window) for window in SWEEP_WINDOWS], "extend": args.extend, "seconds_per_preset": {}}
    args.record.parent.mkdir(parents=True, exist_ok=True)
    # Written after each preset, so a run stopped part-way keeps (and records) the presets it finished.
    for name in args.presets:
        start = time.monotonic()
        run_layer(name, args.length)
        record["seconds_per_preset"][name] = round(time.monotonic() - start, 1)
        tuners, others = fla_autotuners()
        entries, added = write_configs(tuners, folder)
        check_written(tuners, folder)
        config = preset(name)
        manifest["presets"][name] = {"heads": config.linear_num_heads, "head_dim": config.linear_head_dim,
                                     "length": args.length, "windows": [list(window) for window in SWEEP_WINDOWS]}
        atomic_write_json(folder / MANIFEST, manifest)
        record.setdefault("keys_added", {})[name] = added
        record.update(kernels=sorted(tuners), entries_in_files=entries, other_autotuned_kernels=others)
        atomic_write_json(args.record, record)
        print(f"{name}: {record['seconds_per_preset'][name]} s; {entries} configs of {len(tuners)} kernels in "
              f"{folder}, {len(added)} new; autotuned kernels no file can supply: {others or 'none'}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
