"""FLOPs per token (genolc/train/flops.py): the one count behind the trainer's MFU and `genolc plan`."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from genolc.model import ModelConfig, parameter_counts, preset
from genolc.train.flops import average_keys_per_query, device_peak_flops, fill_fraction, token_flops


@pytest.mark.parametrize("seq_len, width", [(1, 4), (5, 8), (8, 8), (9, 8), (100, 7), (4097, 2051)])
def test_average_keys_is_the_mean_of_each_querys_causal_keys_capped_at_the_width(seq_len, width):
    assert average_keys_per_query(seq_len, width) == pytest.approx(
        sum(min(t + 1, width) for t in range(seq_len)) / seq_len)


def test_counts_follow_the_definitions():
    config = preset("small")
    short, long = token_flops(config, 1024), token_flops(config, 1 << 22)
    assert short.dense_forward == 2 * parameter_counts(config).active
    n_dsa, heads, rank = len(config.dsa_layers), config.num_attention_heads, config.kv_lora_rank
    assert short.attention_forward == pytest.approx(n_dsa * 4 * heads * rank * (1024 + 1) / 2)
    # Sparse: past the index width every query reads W keys, so the core stops growing with the window ...
    assert long.attention_forward < n_dsa * 4 * heads * rank * config.index_width
    assert long.attention_forward > 0.99 * n_dsa * 4 * heads * rank * config.index_width
    # ... while the indexer's scoring grows linearly per token (quadratic per window).
    assert long.indexer_forward == pytest.approx(short.indexer_forward * (1 << 12))
    assert short.model == pytest.approx(3 * (short.dense_forward + short.attention_forward) + short.indexer_forward)


def test_hardware_flops_add_the_strategys_extra_forwards():
    config = preset("tiny")
    plain = token_flops(config, 4096)
    forward = plain.dense_forward + plain.attention_forward + plain.indexer_forward
    assert plain.hardware == plain.model
    assert token_flops(config, 4096, recompute=True).hardware == pytest.approx(plain.model + forward)
    # A context-parallel shard's chunked step fills every chunk: one whole forward more.
    both = token_flops(config, 4096, recompute=True, chunk_fill=1.0)
    assert both.model == plain.model and both.hardware == pytest.approx(plain.model + 2 * forward)
    # Keeping the first pass's pools, the chunked step scores the indexer's pools once: its forwards again lack it.
    kept = token_flops(config, 4096, recompute=True, chunk_fill=1.0, selections_kept=True)
    assert plain.indexer_forward > 0
    assert kept.hardware == pytest.approx(plain.model + 2 * (forward - plain.indexer_forward))
    assert token_flops(config, 4096, recompute=True, selections_kept=True).hardware == pytest.approx(
        both.hardware - forward)
    # Keeping its DSA forwards too, its forwards again run neither the indexer nor the DSA core.
    forwards_kept = token_flops(config, 4096, recompute=True, chunk_fill=1.0, selections_kept=True,
                                attention_kept=True)
    assert plain.attention_forward > 0 and forwards_kept.model == plain.model
    assert forwards_kept.hardware == pytest.approx(plain.model + 2 * plain.dense_forward)


def test_chunked_step_fills_every_chunk_but_the_last():
    """One process's chunked step runs its fill pass over every chunk but the last (genolc/train/chunked.py)."""
    config = preset("tiny")
    plain = token_flops(config, 4096)
    forward = plain.dense_forward + plain.attention_forward + plain.indexer_forward
    assert fill_fraction(4096, None) == 0.0
    assert fill_fraction(4096, 1024) == 0.75
    assert fill_fraction(4000, 1024) == 3072 / 4000           # a shorter last chunk
    assert fill_fraction(1024, 1024) == 0.0 and fill_fraction(100, 1024) == 0.0
    assert fill_fraction(4096, 1024, sharded=True) == 1.0
    fill = fill_fraction(4096, 1024)
    assert token_flops(config, 4096, chunk_fill=fill).hardware == pytest.approx(plain.model + fill * forward)
    # The pools and DSA forwards kept, its recompute runs only the last chunk's DSA forward again.
    kept = token_flops(config, 4096, recompute=True, chunk_fill=fill, selections_kept=True, attention_kept=True)
    assert kept.hardware == pytest.approx(plain.model + (1 + fill) * plain.dense_forward
                                          + (1 - fill) * plain.attention_forward)
    with pytest.raises(ValueError, match="chunk_fill"):
        token_flops(config, 4096, chunk_fill=1.5)
    with pytest.raises(ValueError, match="positive"):
        fill_fraction(4096, 0)


def test_device_peaks():
    assert device_peak_flops("NVIDIA H200") == 989e12
    assert device_peak_flops("NVIDIA B200") == 2250e12
    assert device_peak_flops("cpu") is None and device_peak_flops("AMD Instinct MI300X") is None


def _finetune_one_step(tmp_path, monkeypatch, *options: str) -> tuple[dict, Path]:
    """One `finetune` step of `tiny` at 256 tokens on the sample DNA, with a stand-in peak (a CPU has none, so no
    MFU): its metrics line and the run's folder."""
    from click.testing import CliRunner

    from genolc.cli import main as cli
    from genolc.sample import sample_files
    from genolc.train import loop

    data = tmp_path / "data"
    runner = CliRunner()
    prepared = runner.invoke(cli, ["prepare", str(sample_files()[0]), "--out", str(data), "--train", "all",
                                   "--heldout", "none", "--no-progress"])
    assert prepared.exit_code == 0, prepared.output
    monkeypatch.setattr(loop, "peak_flops", lambda device, **kwargs: 1e12)
    trained = runner.invoke(cli, ["finetune", "--data", str(data), "--model", "tiny", "--seq", "256", "--steps", "1",
                                  "--warmup", "0", "--out", str(tmp_path / "run"), "--no-progress", "--threads", "1",
                                  *options])
    assert trained.exit_code == 0, trained.output
    return json.loads((tmp_path / "run" / "metrics.jsonl").read_text().splitlines()[0]), tmp_path / "run"


def _tiny(tmp_path) -> ModelConfig:
    from genolc.data.dataset import PreparedDataset

    return preset("tiny", vocab_size=PreparedDataset(tmp_path / "data").tokenizer.vocab_size)


def test_trainer_logs_model_flops_and_mfu_per_step(tmp_path, monkeypatch):
    step, run = _finetune_one_step(tmp_path, monkeypatch)
    flops = token_flops(_tiny(tmp_path), 256)
    assert step["model_flops_per_token"] == pytest.approx(flops.model)
    assert step["mfu"] == pytest.approx(flops.model * step["tokens_per_s"] / 1e12)
    assert step["hfu"] >= step["mfu"]
    assert "fill_pass_seconds" not in step                 # the whole window at once: no passes
    summary = json.loads((run / "summary.json").read_text())
    assert summary["mfu"] == pytest.approx(flops.model * summary["tokens_per_s"] / 1e12)


def test_trainer_logs_the_chunked_steps_passes(tmp_path, monkeypatch):
    """A chunked step's metrics say how long its two passes took, and its hardware FLOPs count the first pass over
    every chunk but the last."""
    step, _ = _finetune_one_step(tmp_path, monkeypatch, "--chunk", "64")
    assert step["step_strategy"] == "chunked" and step["chunk"] == 64
    assert 0 < step["fill_pass_seconds"] and 0 < step["grad_pass_seconds"]
    assert step["fill_pass_seconds"] + step["grad_pass_seconds"] <= step["step_seconds"]
    config = _tiny(tmp_path)
    # The first pass ran chunks 1-3 of 4, the pools chosen once (on a CPU the DSA forwards are not kept).
    hardware = token_flops(config, 256, chunk_fill=0.75, selections_kept=True).hardware
    assert step["hfu"] / step["mfu"] == pytest.approx(hardware / token_flops(config, 256).model)
