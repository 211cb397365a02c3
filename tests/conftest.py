"""Shared fixtures: the real DNA in ../shared/data (read-only), GPU/slow markers, and the GPU tests' helpers.

This is the suite's only conftest.py: several test modules import ``shared_file`` from it, and a second
conftest module elsewhere in tests/ could shadow it under the same module name.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parent.parent
SHARED_DATA = Path(os.environ.get("GENOLC_SHARED_DATA", REPO_ROOT.parent / "shared" / "data"))


def shared_file(relative: str) -> Path:
    """A file under ../shared/data; skips the test with a clear reason when the data folder is absent."""
    path = SHARED_DATA / relative
    if not path.exists():
        # CI always has ../shared beside the clone: a missing file there is a failure, not a skip.
        if os.environ.get("CI"):
            pytest.fail(f"real DNA not found at {path}")
        pytest.skip(f"real DNA not found at {path} (set GENOLC_SHARED_DATA)")
    return path


def chr22_window(path: Path | str, length: int, into_n_run: int):
    """``(ids [1, length + 1], weights [1, length])`` of the GRCh37 chr22 piece at ``path``, ending ``into_n_run``
    bases into its 100 kbp N run at 20,509,432 (N targets weigh 0): real DNA that crosses an N run."""
    import gzip

    import numpy as np
    import torch

    from genolc.tokenize import CharTokenizer

    with gzip.open(path, "rt") as handle:
        handle.readline()
        sequence = "".join(line.strip() for line in handle)
    start = 509431 - length + into_n_run
    bases = np.frombuffer(sequence[start: start + length + 1].encode(), dtype=np.uint8)
    tokenizer = CharTokenizer()
    ids = torch.from_numpy(np.asarray(tokenizer.encode(bases), dtype=np.int64))[None]
    weights = torch.from_numpy(~np.asarray(tokenizer.ambiguous_mask(ids[0, 1:].numpy()), dtype=bool)).float()[None]
    return ids, weights


def tiny_model_with_skewed_routing():
    """The tiny preset (char vocabulary), seeded, with router biases that are not uniform, so the MoE balance loss
    and the bias matter in gradient comparisons."""
    import torch

    from genolc.model import build_model, preset
    from genolc.tokenize import CharTokenizer

    torch.manual_seed(0)
    model = build_model(preset("tiny", vocab_size=CharTokenizer().vocab_size))
    with torch.no_grad():
        for name, buffer in model.named_buffers():
            if name.endswith("e_score_correction_bias"):
                buffer.copy_(0.05 * torch.randn(buffer.shape))
    return model


@pytest.fixture(name="shared_file")
def shared_file_fixture():
    """``shared_file("human/GRCh37_chr22_20000001-21000000.fa.gz")`` -> Path, skipping/failing if absent."""
    return shared_file


@pytest.fixture
def shared_data() -> Path:
    if not SHARED_DATA.is_dir():
        if os.environ.get("CI"):
            pytest.fail(f"real DNA folder not found at {SHARED_DATA}")
        pytest.skip(f"real DNA folder not found at {SHARED_DATA}")
    return SHARED_DATA


def pytest_collection_modifyitems(config, items):
    try:
        import torch

        has_cuda = torch.cuda.is_available()
    except ImportError:
        has_cuda = False
    if not has_cuda:
        skip_gpu = pytest.mark.skip(reason="needs a CUDA device")
        for item in items:
            if "gpu" in item.keywords:
                item.add_marker(skip_gpu)


@pytest.fixture(scope="module")
def one_thread():
    """Run a module's torch work on one thread: the CI box has 2 shared cores that pytest-xdist already keeps busy,
    and tiny-model matmuls run several times faster single-threaded under that contention. OMP_NUM_THREADS=1 makes
    finetune and eval (genolc.threads), in this process and in the subprocesses it starts, keep to one thread too:
    tests that compare runs bit for bit need the same count in every run, not one that follows the load."""
    import torch

    previous, previous_env = torch.get_num_threads(), os.environ.get("OMP_NUM_THREADS")
    torch.set_num_threads(1)
    os.environ["OMP_NUM_THREADS"] = "1"
    yield
    torch.set_num_threads(previous)
    if previous_env is None:
        os.environ.pop("OMP_NUM_THREADS", None)
    else:
        os.environ["OMP_NUM_THREADS"] = previous_env


def poison_cuda_cache(gib: float = 4.0) -> None:
    """Fill ``gib`` GiB of fresh device memory with NaN and free it back to torch's cache.

    Later ``torch.empty`` calls (the ops' outputs and gradients) are carved from these cached blocks, so any
    element an op leaves unwritten reads NaN.
    """
    import torch

    torch.cuda.synchronize()
    block = torch.full((int(gib * (1 << 30)) // 4,), float("nan"), dtype=torch.float32, device="cuda")
    del block
    torch.cuda.synchronize()


@pytest.fixture(name="poison")
def poison_fixture():
    return poison_cuda_cache


def rel_err(actual, expected) -> float:
    """``||actual - expected|| / ||expected||`` in float64; NaN anywhere gives inf (never passes)."""
    import torch

    actual, expected = actual.detach().double(), expected.detach().double()
    if not torch.isfinite(actual).all():
        return float("inf")
    return float((actual - expected).norm() / expected.norm().clamp_min(1e-30))


@pytest.fixture(name="rel_err")
def rel_err_fixture():
    return rel_err
