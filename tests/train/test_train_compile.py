"""apply_compile (--compile): which modules it wraps, that it leaves names alone and deep copies intact, when the
trainer applies it, where its cache goes, the errors; and (slow, inductor's CPU backend) a chunked step with
recompute equal to the eager one. The GPU comparison of the same modules at realistic widths is
tests/gpu/test_compile_fast.py."""

from __future__ import annotations

import contextlib
import copy
import functools
import json
from pathlib import Path

import pytest
import torch

from conftest import shared_file

import genolc.train.apply as apply_module
from genolc.data.prepare import PrepareConfig, prepare
from genolc.errors import ConfigError, InputError
from genolc.model import build_model, preset
from genolc.train.apply import apply_compile, apply_recompute, apply_transforms, compile_cache_dir, compile_wanted
from genolc.train.chunked import chunked_forward_backward
from genolc.train.config import TrainConfig
from genolc.train.loop import finetune
from genolc.train.loss import LossTerms
from genolc.train.plan import OutOfMemoryPlanError

pytestmark = pytest.mark.usefixtures("one_thread")


def _config(tmp_path: Path, **changes) -> TrainConfig:
    return TrainConfig(data=tmp_path / "data", out=tmp_path / "out", seq_len=128, **changes)


def test_compile_wraps_the_per_token_modules_once_and_keeps_names(monkeypatch, tmp_path):
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor"))
    model = build_model(preset("tiny"))
    names = list(model.state_dict())
    # tiny: 4 layers x (2 hyper-connections + 2 norms) + 3 KDA layers x (short conv + gated norm) + the DSA
    # layer's two latent norms + the final norm.
    assert apply_compile(model) == 4 * 4 + 3 * 2 + 2 + 1
    assert apply_compile(model) == 0
    assert list(model.state_dict()) == names
    layer = model.layers[0]
    for module, name in ((layer.attn_hc, "forward"), (layer.attn_hc, "merge"), (layer.input_layernorm, "forward"),
                         (layer.self_attn, "short_conv"), (layer.self_attn, "convolved_heads"),
                         (layer.self_attn.o_norm, "forward")):
        method = vars(module)[name]
        assert isinstance(method, functools.partial) and method.args == (module,), (module, name)
        assert getattr(method.func, "_torchdynamo_orig_callable", None) is getattr(type(module), name)
    # Attention, experts and the decoder layer itself stay eager (their kernels are fla/TileLang/Triton).
    assert "forward" not in vars(layer) and "forward" not in vars(layer.mlp) and "forward" not in vars(layer.self_attn)
    # One compiled function per class method, shared; a deep copy's methods are bound to the copy's modules.
    assert vars(model.layers[1].attn_hc)["forward"].func is vars(layer.attn_hc)["forward"].func
    twin = copy.deepcopy(model)
    assert vars(twin.layers[0].attn_hc)["merge"].args[0] is twin.layers[0].attn_hc


def test_inductors_online_softmax_note_is_silenced(monkeypatch, tmp_path):
    """Inductor warns once per graph that splits a softmax reduction (on the H200 three times a run, each in six
    lines of a user's log); its text starts with a newline. Other UserWarnings still show."""
    import warnings

    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor"))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        apply_compile(build_model(preset("tiny")))
        warnings.warn("\nOnline softmax is disabled on the fly since Inductor decides to\nsplit the reduction.",
                      UserWarning)
        warnings.warn("something else", UserWarning)
    # Only UserWarnings: run alone, this test is also the first to import the torch modules that warn of their own
    # deprecation.
    assert [str(w.message) for w in caught if issubclass(w.category, UserWarning)] == ["something else"]


def test_compile_auto_is_on_cuda_only_and_the_trainer_applies_it_after_recompute(tmp_path, monkeypatch):
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor"))
    assert compile_wanted(_config(tmp_path), "cuda") and not compile_wanted(_config(tmp_path), "cpu")
    assert compile_wanted(_config(tmp_path, compile="on"), "cpu")
    assert not compile_wanted(_config(tmp_path, compile="off"), "cuda")
    model = build_model(preset("tiny"))
    assert apply_transforms(model, _config(tmp_path, recompute=True), "cpu",
                            stream_dtype="float32") == ["recompute(4 layers)"]
    applied = apply_transforms(build_model(preset("tiny")), _config(tmp_path, recompute=True), "cuda",
                               stream_dtype="bfloat16")
    assert applied[:2] == ["recompute(4 layers)", "streams(torch.bfloat16)"]
    assert applied[2].startswith("compile(25 modules, cache ")
    with pytest.raises(ConfigError, match="--compile"):
        _config(tmp_path, compile="yes")


def test_compile_cache_dir_is_the_users_unless_torch_is_told_otherwise(monkeypatch, tmp_path):
    monkeypatch.delenv("TORCHINDUCTOR_CACHE_DIR", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert compile_cache_dir() == tmp_path / "xdg" / "genolc" / "torchinductor"
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "mine"))
    assert compile_cache_dir() == tmp_path / "mine"
    (tmp_path / "a-file").write_text("")
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "a-file" / "cache"))
    with pytest.raises(InputError, match="cannot be written") as error:
        apply_compile(build_model(preset("tiny")))
    assert "--compile off" in error.value.fix


@pytest.fixture(scope="module")
def lambda_data(tmp_path_factory) -> Path:
    return prepare(PrepareConfig(genomes=(shared_file("other/lambda_phage_NC_001416.1.fa.gz"),),
                                 out=tmp_path_factory.mktemp("char") / "ds", train="all", heldout=(), progress=False))


def _train(data: Path, out: Path, **changes) -> Path:
    return finetune(TrainConfig(data=data, out=out, seq_len=64, steps=1, lr=1e-3, warmup_steps=1, progress=False,
                                device="cpu", **changes))


def test_the_trainer_compiles_when_asked_and_names_a_compile_failure(lambda_data, tmp_path, monkeypatch, capsys):
    compiled = []
    monkeypatch.setattr(apply_module, "apply_compile", lambda model: compiled.append(model) or 7)
    _train(lambda_data, tmp_path / "off")
    assert compiled == [] and "torch.compile" not in capsys.readouterr().err
    _train(lambda_data, tmp_path / "on", compile="on")
    assert len(compiled) == 1
    assert "torch.compile builds the per-token glue in the first step" in capsys.readouterr().err
    summary = json.loads((tmp_path / "on" / "summary.json").read_text())
    assert summary["transforms"][-1].startswith("compile(7 modules, cache ")

    def compile_with(model, backend):
        for module in model.modules():
            if type(module).__name__ == "HyperConnection":
                module.forward = functools.partial(torch.compile(type(module).forward, backend=backend), module)
        return 1

    def failing_compile(model):
        def backend(graph_module, example_inputs):
            raise RuntimeError("no C++ compiler here")
        return compile_with(model, backend)
    monkeypatch.setattr(apply_module, "apply_compile", failing_compile)
    with pytest.raises(ConfigError, match="torch.compile could not build") as error:
        _train(lambda_data, tmp_path / "failing", compile="on")
    assert "RuntimeError: no C++ compiler here" in error.value.what
    assert error.value.fix.startswith("train with --compile off") and "step 1" in error.value.where

    # Memory running out while compiling is reported as memory, not as a compiler failure.
    def out_of_memory(graph_module, example_inputs):
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
    monkeypatch.setattr(apply_module, "apply_compile",
                        lambda model: compile_with(model, out_of_memory))
    with pytest.raises(OutOfMemoryPlanError, match="out of device memory at --seq 64"):
        _train(lambda_data, tmp_path / "oom", compile="on")


def _compiled_step_against_eager(monkeypatch, tmp_path, prepare=None) -> dict[str, object]:
    """One chunked step (with recompute) of the tiny model compiled and of its eager twin, ``prepare`` applied to the
    compiled one first; the loss and every gradient compared. Returns what dynamo and AOTAutograd counted during the
    steps: new unique graphs, cache bypasses and the graph breaks by reason (the counters are the process's)."""
    from torch._dynamo.utils import counters

    # Inductor's C++ backend on CPU: about two minutes of compiling for the tiny model, hence slow.
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor"))
    torch.manual_seed(0)
    eager = build_model(preset("tiny"))
    compiled = copy.deepcopy(eager)
    if prepare is not None:
        prepare(compiled)
    apply_compile(compiled)
    apply_recompute(compiled)
    length = 301                                   # chunks of 128, 128 and 45: a second shape for the compiler
    ids = torch.randint(0, 4, (1, length + 1), generator=torch.Generator().manual_seed(1))
    weights = torch.ones(1, length)
    terms = LossTerms(total_weight=float(length), grad_accum=1, moe_balance_coef=0.01, indexer_kl_coef=1.0,
                      indexer_mode=None)
    graphs = counters["stats"]["unique_graphs"]
    bypassed = counters["aot_autograd"]["autograd_cache_bypass"]
    breaks = dict(counters["graph_break"])
    results = [chunked_forward_backward(model, ids, weights, terms, 128, contextlib.nullcontext)
               for model in (eager, compiled)]
    assert float(results[1].lm) == pytest.approx(float(results[0].lm), rel=1e-6)
    for (name, p_eager), p_compiled in zip(eager.named_parameters(), compiled.parameters()):
        assert (p_eager.grad is None) == (p_compiled.grad is None), name
        if p_eager.grad is not None:
            torch.testing.assert_close(p_compiled.grad, p_eager.grad, rtol=1e-4, atol=1e-6, msg=name)
    return {"new_graphs": counters["stats"]["unique_graphs"] - graphs,
            "cache_bypasses": counters["aot_autograd"]["autograd_cache_bypass"] - bypassed,
            "new_breaks": [reason for reason, count in counters["graph_break"].items()
                           if count > breaks.get(reason, 0)]}


@pytest.mark.slow
def test_compiled_chunked_step_with_recompute_equals_eager(monkeypatch, tmp_path):
    counted = _compiled_step_against_eager(monkeypatch, tmp_path)
    assert counted["new_graphs"] > 0 and not counted["new_breaks"]                       # really compiled, whole
    # Every graph goes into AOTAutograd's cache, the short convolution's autograd.Function ones included, so a
    # later process loads them rather than tracing them again.
    assert counted["cache_bypasses"] == 0


@pytest.mark.slow
def test_compiled_chunked_step_with_the_cuda_mhc_ops_equals_eager(monkeypatch, tmp_path):
    """The hyper-connections as CUDA runs them (genolc/model/ops/mhc/op.py's block-input function and custom ops on
    their CPU formulas), compiled and recomputed, against the eager reference model: the same loss and gradients, and
    every merge's share of the streams' gradient handed to its block-input function's backward
    (op.BlockInputPassingStreams) rather than added by autograd, in the compiled methods and their recompute replays
    too (a share routed around the function would reach its backward as None; it does not fill unused gradients with
    zeros). The only graph breaks are the function's calls (dynamo-disabled), and every graph goes into
    AOTAutograd's cache."""
    from tensor_memory import use_cuda_mhc_ops
    from genolc.model.ops.mhc import op as mhc_op

    merge_shares = []
    gradients = mhc_op.block_input_gradients
    monkeypatch.setattr(mhc_op, "block_input_gradients", lambda *args, **kwargs: merge_shares.append(
        kwargs["grad_x"] is not None and bool(kwargs["grad_x"].any())) or gradients(*args, **kwargs))
    counted = _compiled_step_against_eager(monkeypatch, tmp_path, prepare=use_cuda_mhc_ops)
    layers = len(build_model(preset("tiny")).layers)
    assert len(merge_shares) == 2 * layers * 3 and all(merge_shares)       # two connections a layer, three chunks
    assert counted["new_graphs"] > 0 and counted["cache_bypasses"] == 0
    new_breaks = counted["new_breaks"]
    assert new_breaks and all("function block_input" in reason for reason in new_breaks), new_breaks


@pytest.mark.slow
def test_compiled_whole_window_with_recompute_equals_eager(lambda_data, tmp_path, monkeypatch):
    # Whole windows with per-layer recompute: each norm's graph must be the one its replay runs again (static
    # shapes), and a window not a multiple of the pool size gives the compiler an odd shape.
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor"))
    from torch._dynamo.utils import counters

    graphs = counters["stats"]["unique_graphs"]
    runs = {}
    for mode in ("off", "on"):
        finetune(TrainConfig(data=lambda_data, out=tmp_path / mode, seq_len=301, steps=2, lr=1e-3, warmup_steps=1,
                             progress=False, device="cpu", recompute=True, chunk=0, compile=mode))
        runs[mode] = [json.loads(line) for line in (tmp_path / mode / "metrics.jsonl").read_text().splitlines()]
    assert counters["stats"]["unique_graphs"] > graphs
    for eager, compiled in zip(runs["off"], runs["on"]):
        assert compiled["loss"] == pytest.approx(eager["loss"], rel=1e-6)
        assert compiled["grad_norm"] == pytest.approx(eager["grad_norm"], rel=1e-4)
