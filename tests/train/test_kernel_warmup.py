"""The kernel warm-up process (genolc/train/kernel_warmup.py): its step runs the trainer's code on the run's layer
kinds, it starts only on CUDA and once per shape, and its failures stay its own. The GPU side (kernels landing in
the caches before the trainer needs them) is measured by benchmarks/run_finetune_curve.sh with GPU_EMPTY_CACHES=1."""

from __future__ import annotations

import dataclasses
import json
import re
import subprocess
import threading
from pathlib import Path

import pytest
import torch

from genolc.model import preset
from genolc.train import kernel_warmup
from genolc.train.kernel_warmup import WarmupShape, run_warmup, start_kernel_warmup, warmup_model_config


FITS = dict(run_bytes=0, budget_bytes=1 << 40)


def shape(**changes) -> WarmupShape:
    config = preset("tiny", vocab_size=16)
    values = dict(model=config.to_hf(), seq_len=96, chunk=40, micro_batch=2, recompute=False, bf16=False,
                  indexer_mode=None)
    values.update(changes)
    return WarmupShape(**values)


def test_warmup_model_keeps_one_layer_of_each_kind_and_the_shapes():
    config = preset("small", vocab_size=16)
    cut = warmup_model_config(config)
    assert cut.layer_types == ("linear_attention", "indexed_attention")
    assert cut.mlp_layer_types == (config.mlp_layer_types[0], config.mlp_layer_types[-1])
    assert set(cut.mlp_layer_types) == {"dense", "sparse"}
    for name in ("hidden_size", "linear_num_heads", "linear_head_dim", "num_attention_heads", "kv_lora_rank",
                 "index_width", "n_routed_experts", "num_experts_per_tok"):
        assert getattr(cut, name) == getattr(config, name)


@pytest.mark.parametrize("chunk,recompute,seq_len,keep", [(40, False, 80, False), (40, True, 80, True),
                                                            (None, True, 96, False)])
def test_warmup_step_runs_the_trainers_step_on_cpu(chunk, recompute, seq_len, keep, monkeypatch):
    """``keep``: the run's strategy keeps fla's KDA intermediates, so the warm-up runs those kernel variants too."""
    from genolc.train import strategy as strategy_module

    ran = []
    real = strategy_module.run_micro_batch

    def spy(strategy, model, ids, weights, terms, autocast, on_loss):
        ran.append((strategy.chunk, strategy.seq_len, tuple(ids.shape), model.config.layer_types,
                    strategy.keep_kda_intermediates))
        result = real(strategy, model, ids, weights, terms, autocast, on_loss)
        ran.append(sum(p.grad is not None for p in model.parameters()))
        return result

    monkeypatch.setattr(strategy_module, "run_micro_batch", spy)
    seconds = run_warmup(shape(chunk=chunk, recompute=recompute, keep_kda_intermediates=keep), torch.device("cpu"))
    # Two chunks at most (the second is the one that carries state), the run's micro-batch, one layer of each kind.
    assert ran[0] == (chunk, seq_len, (2, seq_len + 1), ("linear_attention", "indexed_attention"), keep)
    assert ran[1] > 0                                 # the backward ran: gradients reached the parameters
    assert set(seconds) == {"step"}                   # fp32 on CPU: no TileLang or fla kernel to compile


def test_main_writes_the_marker_and_a_finished_shape_starts_nothing(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "Test GPU")
    started = []

    class FakeProcess:
        returncode = 0

        def __init__(self, args, **kwargs):
            assert kwargs["start_new_session"]
            started.append(args)

        def poll(self):
            return 0

    monkeypatch.setattr(subprocess, "Popen", FakeProcess)
    device = torch.device("cuda", 0)
    warmup = start_kernel_warmup(shape(), device, **FITS)
    assert warmup is not None and len(started) == 1
    assert warmup.finished().startswith("kernel warm-up process done")
    assert warmup.finished() is None                  # said once
    spec, marker, progress = started[0][-4], started[0][-2], started[0][-1]
    assert json.loads(open(spec).read())["chunk"] == 40
    assert marker == str(kernel_warmup.warmup_dir() / f"{shape().key(device)}.json")
    assert progress == str(warmup.progress) and progress.endswith(".progress.json")
    open(marker, "w").write("{}")                     # what main() leaves after its step
    assert start_kernel_warmup(shape(), device, **FITS) is None
    assert start_kernel_warmup(shape(chunk=48), device, **FITS) is not None      # another shape: another warm-up
    assert len(started) == 2


def test_off_on_cpu_and_by_the_environment(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert start_kernel_warmup(shape(), torch.device("cpu"), **FITS) is None
    monkeypatch.setenv(kernel_warmup.WARMUP_ENV, "0")
    assert start_kernel_warmup(shape(), torch.device("cuda", 0), **FITS) is None
    assert not (tmp_path / "genolc").exists()


def test_no_warmup_when_it_and_the_run_do_not_fit_together(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "Test GPU")
    monkeypatch.setattr(subprocess, "Popen", lambda *a, **k: pytest.fail("no warm-up process may start"))
    need = kernel_warmup.warmup_bytes(shape())
    assert need > kernel_warmup.PROCESS_OVERHEAD_BYTES
    from genolc.train.plan import PLAN_MARGIN, kda_intermediates_device_bytes

    kept = kda_intermediates_device_bytes(kernel_warmup.warmup_model_config(preset("tiny", vocab_size=16)), chunk=40,
                                          windows=2, bf16=False)
    assert kernel_warmup.warmup_bytes(shape(keep_kda_intermediates=True)) == need + int(PLAN_MARGIN * kept)
    assert start_kernel_warmup(shape(), torch.device("cuda", 0), run_bytes=10 << 30,
                               budget_bytes=(10 << 30) + need - 1) is None


def test_a_failed_warmup_is_reported_with_its_log(tmp_path):
    process = subprocess.Popen(["python3", "-c", "raise SystemExit(3)"])
    process.wait()
    warmup = kernel_warmup.KernelWarmup(process, tmp_path / "x.log", 0.0)
    line = warmup.finished()
    assert "failed (exit 3" in line and str(tmp_path / "x.log") in line


def test_main_writes_the_marker_only_after_a_step_without_failures(tmp_path, monkeypatch):
    spec, marker = tmp_path / "k.1.spec.json", tmp_path / "k.json"
    spec.write_text(json.dumps(dataclasses.asdict(shape())))
    assert kernel_warmup.main([str(spec), "cpu", str(marker)]) == 0
    assert json.loads(marker.read_text())["seconds"]["step"] >= 0 and not spec.exists()
    marker.unlink()
    spec.write_text(json.dumps(dataclasses.asdict(shape())))
    monkeypatch.setattr(kernel_warmup, "run_warmup", lambda *a: {"tilelang_dsa_forward": "failed: nvcc"})
    assert kernel_warmup.main([str(spec), "cpu", str(marker)]) == 1
    assert not marker.exists()


def test_dsa_kernel_arguments_are_the_layers():
    from genolc.model.layers.dsa import DSAAttention

    config = preset("base", vocab_size=16)
    with torch.device("meta"):
        layer = DSAAttention(config, config.dsa_layers[0])
    assert kernel_warmup.dsa_kernel_args(config) == (layer.num_heads, layer.kv_lora_rank, layer.width, "bfloat16",
                                                     float(layer.softmax_scale))


def test_any_error_starting_it_leaves_training_alone(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))

    def broken(shape):
        raise RuntimeError("no home directory")

    monkeypatch.setattr(kernel_warmup, "warmup_bytes", broken)
    assert start_kernel_warmup(shape(), torch.device("cuda", 0), **FITS) is None
    said = capsys.readouterr().err.strip().splitlines()
    assert said == ["genolc finetune: the kernel warm-up process could not start (RuntimeError: no home directory); "
                    "the first step compiles its kernels itself"]


def test_stop_ends_the_process_group(tmp_path):
    import os
    import signal
    import sys
    import time

    pid_file = tmp_path / "grandchild"
    code = ("import subprocess, sys, time; p = subprocess.Popen([sys.executable, '-c', 'import time; "
            f"time.sleep(60)']); open({str(pid_file)!r}, 'w').write(str(p.pid)); time.sleep(60)")
    process = subprocess.Popen([sys.executable, "-c", code], start_new_session=True)
    for _ in range(100):
        if pid_file.exists() and pid_file.read_text():
            break
        time.sleep(0.05)
    grandchild = int(pid_file.read_text())
    kernel_warmup.KernelWarmup(process, tmp_path / "log", 0.0).stop()
    assert process.returncode == -signal.SIGKILL
    for _ in range(100):
        try:
            os.kill(grandchild, 0)
        except ProcessLookupError:
            break
        time.sleep(0.05)
    else:
        pytest.fail("the warm-up's own child survived stop()")


def test_end_after_the_first_step_stops_a_warmup_that_still_runs(tmp_path):
    import sys

    running = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], start_new_session=True)
    warmup = kernel_warmup.KernelWarmup(running, tmp_path / "log", 0.0)
    assert warmup.end().startswith("kernel warm-up process stopped")
    assert running.poll() is not None                 # it holds no GPU memory through the run
    assert warmup.end() is None                       # said once
    done = subprocess.Popen([sys.executable, "-c", "pass"])
    done.wait()
    assert kernel_warmup.KernelWarmup(done, tmp_path / "log", 0.0).end().startswith("kernel warm-up process done")


def test_the_warmup_dies_with_a_trainer_killed_outright(tmp_path):
    import os
    import signal
    import sys
    import time

    pid_file = tmp_path / "child"
    child = ("import sys, time; from genolc.train.kernel_warmup import _die_with_parent; "
             f"ok = _die_with_parent(); open({str(pid_file)!r}, 'w').write(str(ok)); time.sleep(60)")
    trainer = ("import os, subprocess, sys, time; from genolc.train import kernel_warmup as k; "
               f"p = subprocess.Popen([sys.executable, '-c', {child!r}], env={{**os.environ, k.PARENT_ENV: "
               f"str(os.getpid())}}); open({str(pid_file) + '.pid'!r}, 'w').write(str(p.pid)); time.sleep(60)")
    parent = subprocess.Popen([sys.executable, "-c", trainer])
    for _ in range(200):
        if pid_file.exists() and pid_file.read_text():
            break
        time.sleep(0.05)
    assert pid_file.read_text() == "True"             # started by its trainer
    warmup_pid = int((tmp_path / "child.pid").read_text())
    parent.send_signal(signal.SIGKILL)
    parent.wait()
    status = Path(f"/proc/{warmup_pid}/status")
    for _ in range(100):
        # Gone, or a zombie that nobody has reaped yet (an orphan's reaper may be slow in a container).
        if not status.exists() or "\tZ" in status.read_text():
            break
        time.sleep(0.05)
    else:
        os.kill(warmup_pid, signal.SIGKILL)
        pytest.fail("the warm-up outlived its killed trainer")
    orphan = subprocess.run([sys.executable, "-c", "from genolc.train.kernel_warmup import _die_with_parent; "
                             "print(_die_with_parent())"], env={**os.environ, kernel_warmup.PARENT_ENV: "1"},
                            capture_output=True, text=True)
    assert orphan.stdout.strip() == "False"           # its trainer is gone: it starts nothing


def test_the_marker_key_changes_with_fla_or_triton_under_either_name(monkeypatch):
    from genolc.model.ops.kda import fla_tuning

    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "Test GPU")
    device = torch.device("cuda", 0)
    keys = set()
    for versions in ({"fla": "0.6.0", "triton": "3.6.0"}, {"fla": "0.7.0", "triton": "3.6.0"},
                     {"fla": "0.6.0", "triton": "3.7.0"}):
        monkeypatch.setattr(fla_tuning, "installed_versions", lambda versions=versions: versions)
        keys.add(shape().key(device))
    assert len(keys) == 3


def test_the_dsa_pair_is_compiled_only_where_the_layer_would_run_it(monkeypatch):
    """The layer's own kernel choice (dispatch.dsa_kernel_family): no TileLang compile for fp32 training, for more
    heads than its kernels take (the Triton pair runs there), or when GENOLC_DSA_KERNELS=triton."""
    import importlib.util

    from genolc.model.ops import dispatch
    from genolc.model.ops.dsa.tilelang import forward

    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(dispatch.importlib.util, "find_spec",
                        lambda name, *a: object() if name == "tilelang" else real_find_spec(name, *a))
    config = preset("small", vocab_size=16)
    wide = config.replace(num_attention_heads=forward.MAX_HEADS + 8, num_key_value_heads=forward.MAX_HEADS + 8)
    assert kernel_warmup._compile_dsa_kernels(config, False, 1 << 20, {}) == []
    assert kernel_warmup._compile_dsa_kernels(wide, True, 1 << 20, {}) == []
    monkeypatch.setenv("GENOLC_DSA_KERNELS", "triton")
    assert kernel_warmup._compile_dsa_kernels(config, True, 1 << 20, {}) == []


def test_the_dsa_kernels_are_compiled_with_the_layers_arguments_where_tilelang_runs(monkeypatch):
    """bf16 `small` with TileLang present: the forward and backward are compiled, in threads, with the arguments the
    layer's own call hands them, and the slab-ordered backward only for windows that reach SLABBED_FROM_ROWS
    (compile functions stubbed: no TileLang on CPU)."""
    import importlib.util
    import sys
    import types

    from genolc.model.ops import dispatch
    from genolc.model.ops.dsa.tilelang import backward, backward_slabs, forward

    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(dispatch.importlib.util, "find_spec",
                        lambda name, *a: object() if name == "tilelang" else real_find_spec(name, *a))
    monkeypatch.delenv("GENOLC_DSA_KERNELS", raising=False)
    monkeypatch.setitem(sys.modules, "tilelang", types.ModuleType("tilelang"))
    compiled = []
    monkeypatch.setattr(forward, "compiled_kernel", lambda *args: compiled.append(("forward", args)))
    monkeypatch.setattr(backward, "compiled_backward_kernel", lambda *args: compiled.append(("backward", args)))
    monkeypatch.setattr(backward_slabs, "compiled_slabbed_backward_kernel",
                        lambda *args: compiled.append(("backward_slabs", args)))
    config = preset("small", vocab_size=16)
    args = kernel_warmup.dsa_kernel_args(config)
    expected = [("backward", (*args, backward.default_backward_config(config.kv_lora_rank))),
                ("backward_slabs", (*args, backward_slabs.default_slabbed_config(config.kv_lora_rank))),
                ("forward", (*args, forward.default_config(config.kv_lora_rank)))]
    for seq_len, kinds in ((backward.SLABBED_FROM_ROWS - 64, {"backward", "forward"}),
                           (backward.SLABBED_FROM_ROWS, {"backward", "backward_slabs", "forward"})):
        compiled.clear()
        seconds: dict = {}
        threads = kernel_warmup._compile_dsa_kernels(config, True, seq_len, seconds)
        for thread in threads:
            thread.join()
        assert len(threads) == len(kinds) and set(seconds) == {f"tilelang_dsa_{kind}" for kind in kinds}
        assert all(isinstance(value, float) for value in seconds.values()), seconds
        assert sorted(compiled, key=lambda item: item[0]) == [item for item in expected if item[0] in kinds]


def test_the_warmup_runs_the_runs_stream_dtype_and_keys_on_it(monkeypatch):
    from genolc.train import strategy as strategy_module

    seen = []
    real = strategy_module.run_micro_batch

    def spy(strategy, model, ids, weights, terms, autocast, on_loss):
        model.layers[0].register_forward_pre_hook(lambda _, args: seen.append(args[0].dtype))
        return real(strategy, model, ids, weights, terms, autocast, on_loss)

    monkeypatch.setattr(strategy_module, "run_micro_batch", spy)
    monkeypatch.setenv("GENOLC_DSA_KERNELS", "triton")    # bf16 would start TileLang's compiles where installed
    run_warmup(shape(chunk=None, bf16=True, stream_dtype="bfloat16"), torch.device("cpu"))
    assert seen and set(seen) == {torch.bfloat16}
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "Test GPU")
    device = torch.device("cuda", 0)
    assert shape(stream_dtype="bfloat16").key(device) != shape().key(device)


def _sleeper() -> subprocess.Popen:
    import sys

    return subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], start_new_session=True)


def _write(path: Path, entries: dict) -> None:
    path.write_text(json.dumps(entries))


def test_the_wait_lasts_while_the_warmups_compile_runs(tmp_path, monkeypatch):
    """No wait before the warm-up has begun compiling fla's kernel or once it has reported it; a wait while it
    compiles, ended by its report, by the end of the process, or ``FLA_KDA_COMPILE_SECONDS`` after it began."""
    import threading
    import time

    progress = tmp_path / "progress.json"
    running = _sleeper()
    try:
        warmup = kernel_warmup.KernelWarmup(running, tmp_path / "log", 0.0, progress)
        assert warmup.wait_for_fla_kda_backward() < 0.2                 # no progress file yet: not compiling
        _write(progress, {kernel_warmup.FLA_KDA_STARTED: time.time()})
        threading.Timer(0.4, _write, (progress, {kernel_warmup.FLA_KDA_BACKWARD: 31.0})).start()
        assert 0.35 < warmup.wait_for_fla_kda_backward() < 5.0         # until the report
        assert warmup.wait_for_fla_kda_backward() < 0.2                 # reported: no wait
        monkeypatch.setattr(kernel_warmup, "FLA_KDA_COMPILE_SECONDS", 0.5)
        _write(progress, {kernel_warmup.FLA_KDA_STARTED: time.time() - 0.2})
        assert 0.2 < warmup.wait_for_fla_kda_backward() < 2.0          # a compile that overruns: 0.5 s after start
    finally:
        running.kill()
        running.wait()
    _write(progress, {kernel_warmup.FLA_KDA_STARTED: time.time()})
    assert warmup.wait_for_fla_kda_backward() < 0.2                     # a warm-up that is gone: no wait


def test_the_trainers_first_kda_backward_build_waits_for_the_warmups_compile(tmp_path, monkeypatch):
    """The trainer's first call of fla's TileLang KDA backward builder blocks until the warm-up process reports the
    kernel (then the builder finds it in TileLang's cache); later calls do not wait; end() puts fla's builder back,
    says how long the backward waited and removes the progress file."""
    import threading
    import time
    from types import SimpleNamespace

    built = []
    module = SimpleNamespace(_build_kda_bwd_kernel=lambda *args: built.append(args) or "kernel")
    original = module._build_kda_bwd_kernel
    monkeypatch.setattr(kernel_warmup, "_fla_kda_backward_module", lambda: module)
    running = _sleeper()
    progress = tmp_path / "progress.json"
    _write(progress, {kernel_warmup.FLA_KDA_STARTED: time.time()})
    warmup = kernel_warmup.KernelWarmup(running, tmp_path / "log", time.monotonic(), progress)
    try:
        assert warmup.hold_first_kda_backward()
        threading.Timer(0.8, _write, (progress, {kernel_warmup.FLA_KDA_BACKWARD: 30.0})).start()
        t0 = time.monotonic()
        assert module._build_kda_bwd_kernel(1, 2) == "kernel"
        assert time.monotonic() - t0 >= 0.75 and built == [(1, 2)]
        t0 = time.monotonic()
        assert module._build_kda_bwd_kernel(3) == "kernel" and time.monotonic() - t0 < 0.2
        assert 0.75 <= warmup.waited_seconds < 5.0
    finally:
        said = warmup.end()
    assert module._build_kda_bwd_kernel is original and running.poll() is not None
    assert said.endswith("the first KDA backward waited 1 s for its kernel") and not progress.exists()


def test_no_hold_where_fla_runs_no_tilelang_backward(tmp_path, monkeypatch):
    monkeypatch.setattr(kernel_warmup, "_fla_kda_backward_module", lambda: None)
    done = subprocess.Popen(["python3", "-c", "pass"])
    done.wait()
    assert not kernel_warmup.KernelWarmup(done, tmp_path / "log", 0.0, tmp_path / "p.json").hold_first_kda_backward()


def test_the_warmup_reports_fla_s_kernel_in_its_progress_file(tmp_path, monkeypatch):
    """The warm-up side: once its thread has built fla's kernel the progress file names it; where fla runs no
    TileLang backward the file says so at once, so that the trainer does not wait."""
    from types import SimpleNamespace

    def entry(**kwargs):
        module._build_kda_bwd_kernel("shapes")

    module = SimpleNamespace(_build_kda_bwd_kernel=lambda *args: "kernel",
                             chunk_kda_bwd_wy_dqkg_fused_tilelang=entry)
    monkeypatch.setattr(kernel_warmup, "_fla_kda_backward_module", lambda: module)
    progress = tmp_path / "progress.json"
    seconds = {}
    began = []
    thread = kernel_warmup._compile_fla_kda_backward(
        warmup_model_config(preset("tiny")), 1, torch.device("cpu"), seconds,
        lambda: progress.write_text(json.dumps(seconds)), lambda: began.append(True))
    thread.join(30)
    assert began == [True]
    assert isinstance(json.loads(progress.read_text())[kernel_warmup.FLA_KDA_BACKWARD], float)
    module.chunk_kda_bwd_wy_dqkg_fused_tilelang = lambda **kwargs: None        # returns without building
    kernel_warmup._compile_fla_kda_backward(warmup_model_config(preset("tiny")), 1, torch.device("cpu"), seconds,
                                            lambda: progress.write_text(json.dumps(seconds))).join(30)
    assert json.loads(progress.read_text())[kernel_warmup.FLA_KDA_BACKWARD].startswith("failed")
    progress.unlink()
    run_warmup(shape(), torch.device("cpu"), progress)
    assert json.loads(progress.read_text()) == {kernel_warmup.FLA_KDA_BACKWARD: "not compiled here"}


def test_kernel_compiles_in_threads_where_no_warmup_process_runs(tmp_path, monkeypatch, capsys):
    """Without a warm-up process the trainer compiles the TileLang kernels in threads of its own: fla's KDA backward
    (its builder wrapped until the thread is done, then itself again) and the DSA kernels of the run's window; each
    compile said once, the shape's marker written when all are done, so that a later run starts none; none on CPU or
    with GENOLC_KERNEL_WARMUP=0; a part that cannot start is said and the other kept."""
    from types import SimpleNamespace

    def builder(*args):
        return "kernel"

    def entry(**kwargs):
        module._build_kda_bwd_kernel("shapes")

    module = SimpleNamespace(_build_kda_bwd_kernel=builder, chunk_kda_bwd_wy_dqkg_fused_tilelang=entry)
    monkeypatch.setattr(kernel_warmup, "_fla_kda_backward_module", lambda: module)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "Test GPU")
    asked, late = [], threading.Event()

    def dsa_threads(config, bf16, seq_len, seconds):
        asked.append((config.num_attention_heads, bf16, seq_len))

        def compile_late():
            late.wait(30)
            seconds["tilelang_dsa_backward"] = 20.0

        seconds["tilelang_dsa_forward"] = 9.0
        return [threading.Thread(target=compile_late)]

    monkeypatch.setattr(kernel_warmup, "_compile_dsa_kernels", dsa_threads)
    # fla's thread makes its shape tensors on the run's device: on the CPU here.
    real_fla = kernel_warmup._compile_fla_kda_backward
    monkeypatch.setattr(kernel_warmup, "_compile_fla_kda_backward", lambda config, batch, device, seconds, report:
                        real_fla(config, batch, torch.device("cpu"), seconds, report))
    cuda, run = torch.device("cuda"), shape(bf16=True, seq_len=262144, micro_batch=1)
    assert kernel_warmup.start_kernel_compiles(run, torch.device("cpu")) is None
    monkeypatch.setenv(kernel_warmup.WARMUP_ENV, "0")
    assert kernel_warmup.start_kernel_compiles(run, cuda) is None
    monkeypatch.delenv(kernel_warmup.WARMUP_ENV)

    compiles = kernel_warmup.start_kernel_compiles(run, cuda)
    assert asked == [(preset("tiny").num_attention_heads, True, 262144)] and len(compiles.threads) == 2
    compiles.threads[1].start()
    compiles.threads[0].join(30)
    assert module._build_kda_bwd_kernel is not builder           # wrapped while the threads compile
    line = compiles.end()
    assert "tilelang_dsa_forward 9 s" in line and re.search(r"fla_tilelang_kda_backward \d+ s", line), line
    assert "tilelang_dsa_backward " not in line and compiles.end() is None
    assert not kernel_warmup.warmup_marker(run.key(cuda)).exists()
    late.set()
    compiles.threads[1].join(30)
    assert compiles.end() == "TileLang kernels compiled in threads from the run's start: tilelang_dsa_backward 20 s"
    assert module._build_kda_bwd_kernel is builder and kernel_warmup.warmup_marker(run.key(cuda)).exists()
    assert kernel_warmup.start_kernel_compiles(run, cuda) is None          # done before on this machine
    kernel_warmup.warmup_marker(run.key(cuda)).unlink()

    def broken(*args):
        raise OSError("no nvcc")

    monkeypatch.setattr(kernel_warmup, "_compile_dsa_kernels", broken)
    kept = kernel_warmup.start_kernel_compiles(run, cuda)
    assert "could not all start (OSError: no nvcc)" in capsys.readouterr().err
    assert len(kept.threads) == 1 and kept._restore_fla is not None     # fla's thread kept when the DSA's fail
    kept.threads[0].join(30)
    kept.stop()
    assert module._build_kda_bwd_kernel is builder
    monkeypatch.setattr(kernel_warmup, "_compile_fla_kda_backward", broken)
    assert kernel_warmup.start_kernel_compiles(run, cuda) is None
    monkeypatch.setattr(kernel_warmup, "_compile_dsa_kernels", lambda *args: [threading.Thread(target=lambda: None)])
    kept = kernel_warmup.start_kernel_compiles(run, cuda)
    assert len(kept.threads) == 1 and kept._restore_fla is None     # the DSA thread kept when fla's fails
