"""--stream-dtype: mHC's residual streams carried in bf16 under autocast (genolc.train.apply.apply_stream_dtype),
the merge adding in fp32 and rounding once, the norm keeping a bf16 input bf16, and the options' errors."""

from __future__ import annotations

import copy

import pytest
import torch
from click.testing import CliRunner
from conftest import shared_file

from genolc.cli import main
from genolc.data.prepare import PrepareConfig, prepare
from genolc.errors import ConfigError
from genolc.model import build_model, preset
from genolc.model.layers.mhc import HyperConnection, merge_streams
from genolc.model.layers.norm import RMSNorm
from genolc.train.apply import Fp32MergeHyperConnection, StreamRMSNorm, apply_compile, apply_stream_dtype
from genolc.train.config import TrainConfig, stream_dtype_for

pytestmark = pytest.mark.usefixtures("one_thread")


def _merge_inputs(dtype: torch.dtype):
    gen = torch.Generator().manual_seed(3)
    block_out = torch.randn(2, 7, 32, generator=gen).bfloat16()
    post = torch.rand(2, 7, 4, generator=gen) * 2
    comb = torch.softmax(torch.randn(2, 7, 4, 4, generator=gen), dim=-1)
    streams = torch.randn(2, 7, 4, 32, generator=gen).to(dtype)
    return block_out, post, comb, streams


def test_merging_bf16_streams_in_fp32_rounds_once():
    block_out, post, comb, streams = _merge_inputs(torch.bfloat16)
    merged = merge_streams(block_out, post, comb, streams, compute_dtype=torch.float32)
    assert merged.dtype == torch.bfloat16
    assert torch.equal(merged, merge_streams(block_out, post, comb, streams.float()).bfloat16())


def _old_merge(block_out, post, comb, streams):
    dtype = streams.dtype
    merged = post.to(dtype).unsqueeze(-1) * block_out.unsqueeze(-2)
    for n in range(4):
        merged = merged + comb[..., n, :, None].to(dtype) * streams[..., n, None, :]
    return merged


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16-held"])
def test_merging_without_a_compute_dtype_is_the_formula_it_was(dtype):
    # fp32 streams (trainer, --stream-dtype float32) and a model held in bf16 (eval, score, embed on CUDA).
    block_out, post, comb, streams = _merge_inputs(dtype)
    merged = merge_streams(block_out, post, comb, streams)
    assert merged.dtype == dtype and torch.equal(merged, _old_merge(block_out, post, comb, streams))


def test_only_a_stream_norm_returns_a_bf16_input_under_fp32_weights_in_bf16():
    norm = RMSNorm(16)
    with torch.no_grad():
        norm.weight.uniform_(0.5, 1.5)
    x = torch.randn(3, 16)
    assert torch.equal(norm(x), norm.weight * (x * torch.rsqrt(x.square().mean(-1, keepdim=True) + norm.eps)))
    normed = x.bfloat16().float() * torch.rsqrt(x.bfloat16().float().square().mean(-1, keepdim=True) + norm.eps)
    expected = norm.weight * normed.bfloat16()
    assert norm(x.bfloat16()).dtype == torch.float32 and torch.equal(norm(x.bfloat16()), expected)
    norm.__class__ = StreamRMSNorm
    assert norm(x.bfloat16()).dtype == torch.bfloat16 and torch.equal(norm(x.bfloat16()), expected.bfloat16())
    assert torch.equal(norm(x), norm.weight * (x * torch.rsqrt(x.square().mean(-1, keepdim=True) + norm.eps)))
    assert list(norm.state_dict()) == ["weight"]


def _step(model: torch.nn.Module, ids: torch.Tensor, autocast: bool = True
          ) -> tuple[list[torch.dtype], float, torch.Tensor]:
    """Dtypes of the streams entering each layer, the loss, and every gradient flattened, for one step (under CPU
    bf16 autocast unless ``autocast`` is False)."""
    seen = []
    hooks = [layer.register_forward_pre_hook(lambda _, args: seen.append(args[0].dtype)) for layer in model.layers]
    model.zero_grad()
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
        logits = model(ids[:, :-1]).logits
    loss = torch.nn.functional.cross_entropy(logits.float().flatten(0, 1), ids[:, 1:].flatten())
    loss.backward()
    for hook in hooks:
        hook.remove()
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    assert all(g.dtype == torch.float32 and bool(torch.isfinite(g).all()) for g in grads)
    return seen, float(loss.detach()), torch.cat([g.flatten() for g in grads])


def _relative(actual: torch.Tensor, expected: torch.Tensor) -> float:
    return float((actual - expected).norm() / expected.norm())


def test_bf16_streams_under_autocast_train_like_fp32_streams():
    torch.manual_seed(0)
    plain = build_model(preset("tiny"))
    halved = copy.deepcopy(plain)
    assert apply_stream_dtype(halved, torch.bfloat16) == torch.bfloat16
    ids = torch.randint(0, plain.config.vocab_size, (1, 257))
    _, exact_loss, exact_grads = _step(plain, ids, autocast=False)
    plain_dtypes, plain_loss, plain_grads = _step(plain, ids)
    halved_dtypes, halved_loss, halved_grads = _step(halved, ids)
    assert set(plain_dtypes) == {torch.float32} and set(halved_dtypes) == {torch.bfloat16}
    assert len(halved_dtypes) == len(plain.layers)
    # Only the stream norms change class (DSA's latent norms keep their fp32 output); a copy keeps the cast; the
    # parameters' names are the plain model's.
    flagged = {name for name, module in halved.named_modules() if isinstance(module, StreamRMSNorm)}
    assert flagged == {"norm"} | {f"layers.{i}.{norm}" for i in range(len(plain.layers))
                                  for norm in ("input_layernorm", "post_attention_layernorm")}
    assert set(_step(copy.deepcopy(halved), ids)[0]) == {torch.bfloat16}
    merges = [type(m) for m in halved.modules() if isinstance(m, HyperConnection)]
    assert merges == [Fp32MergeHyperConnection] * (2 * len(plain.layers))
    assert list(halved.state_dict()) == list(plain.state_dict())
    # Against fp32 without autocast, bf16 streams add little to what autocast's bf16 matmuls already cost (tiny,
    # 256 tokens: gradients 5.59e-2 against 5.55e-2 off, losses 2.4e-4 and 0.8e-4 off).
    assert abs(halved_loss - exact_loss) < 1e-3 * exact_loss
    assert _relative(halved_grads, exact_grads) < 1.1 * _relative(plain_grads, exact_grads)
    assert abs(plain_loss - exact_loss) < 1e-3 * exact_loss


def test_stream_dtype_settings_that_cannot_run_are_refused(tmp_path):
    with pytest.raises(ConfigError, match="unknown --stream-dtype 'float16'"):
        TrainConfig(data=tmp_path, out=tmp_path / "run", seq_len=64, stream_dtype="float16")
    pinned = TrainConfig(data=tmp_path, out=tmp_path / "run", seq_len=64, dtype="float32", stream_dtype="bfloat16")
    with pytest.raises(ConfigError, match="needs bf16 autocast, but --dtype float32 trains in float32 here"):
        stream_dtype_for(pinned, bf16=False)


def test_streams_dtype_comes_before_compile_and_compiles_like_eager(tmp_path, monkeypatch):
    """The bf16-stream classes under torch.compile (inductor's CPU backend, bf16 autocast): the same logits as
    eagerly, bf16 streams reaching every layer; applied after compile it would be undone, so it is refused."""
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor"))
    torch.manual_seed(0)
    eager = build_model(preset("tiny"))
    apply_stream_dtype(eager, torch.bfloat16)
    compiled = copy.deepcopy(eager)
    assert apply_compile(compiled) > 0
    ids = torch.randint(0, eager.config.vocab_size, (1, 65))
    seen = []
    for layer in compiled.layers:
        layer.register_forward_pre_hook(lambda _, args: seen.append(args[0].dtype))
        layer.input_layernorm.register_forward_hook(lambda _, args, out: seen.append(out.dtype))
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        expected, got = eager(ids).logits.float(), compiled(ids).logits.float()
    assert seen == [torch.bfloat16] * (2 * len(compiled.layers))     # the compiled norms keep the bf16 too
    # Inductor fuses and rounds in other places than eager bf16 (tiny, 64 tokens: 3.7e-4).
    assert _relative(got, expected) < 1e-2
    with pytest.raises(ValueError, match="before apply_compile"):
        apply_stream_dtype(compiled, torch.bfloat16)


def test_auto_streams_are_bf16_exactly_under_bf16_autocast(tmp_path):
    config = TrainConfig(data=tmp_path, out=tmp_path / "run", seq_len=64)
    assert config.stream_dtype == "auto"
    assert stream_dtype_for(config, bf16=True) == "bfloat16" and stream_dtype_for(config, bf16=False) == "float32"
    pinned = TrainConfig(data=tmp_path, out=tmp_path / "run", seq_len=64, stream_dtype="float32")
    assert stream_dtype_for(pinned, bf16=True) == "float32"


def test_bf16_streams_without_autocast_are_one_error_that_leaves_no_run(tmp_path):
    data = prepare(PrepareConfig(genomes=(shared_file("other/lambda_phage_NC_001416.1.fa.gz"),), out=tmp_path / "ds",
                                 train="all", heldout=(), progress=False))
    result = CliRunner().invoke(main, ["finetune", "--no-progress", "--data", str(data), "--seq", "64", "--device",
                                       "cpu", "--stream-dtype", "bfloat16", "--out", str(tmp_path / "run")])
    assert result.exit_code == 2, result.output
    assert result.output.count("genolc: error:") == 1
    assert "--stream-dtype bfloat16 needs bf16 autocast, but --dtype auto trains in float32 here" in result.output
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("stream_dtype, fp32_streams", [("auto", False), ("float32", True)])
def test_the_memory_plan_counts_the_streams_the_run_carries(tmp_path, monkeypatch, stream_dtype, fp32_streams):
    """Under bf16 autocast `finetune` plans fp32 streams only with --stream-dtype float32 (genolc/train/plan.py)."""
    import genolc.train.step_plans as step_plans

    asked = []
    original = step_plans.choose_strategy
    monkeypatch.setattr(step_plans, "choose_strategy", lambda *args, **kwargs: asked.append(kwargs["fp32_streams"])
                        or original(*args, **kwargs))
    data = prepare(PrepareConfig(genomes=(shared_file("other/lambda_phage_NC_001416.1.fa.gz"),), out=tmp_path / "ds",
                                 train="all", heldout=(), progress=False))
    result = CliRunner().invoke(main, ["finetune", "--no-progress", "--data", str(data), "--seq", "64", "--model",
                                       "tiny", "--steps", "1", "--device", "cpu", "--dtype", "bfloat16",
                                       "--stream-dtype", stream_dtype, "--out", str(tmp_path / "run")])
    assert result.exit_code == 0, result.output
    assert asked and set(asked) == {fp32_streams}

