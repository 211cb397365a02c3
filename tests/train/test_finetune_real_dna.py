"""`finetune` end to end on real DNA (tiny preset, short windows): learning, outputs, exact resume, a kill during a
checkpoint save, the NaN guard and --init from a transformers-layout text checkpoint."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from conftest import shared_file

from genolc.data.prepare import PrepareConfig, prepare
from genolc.model.checkpoint import load_pretrained
from genolc.train import state as st
from genolc.train.config import TrainConfig
from genolc.train.loop import METRICS, SUMMARY, TrainHooks, finetune

pytestmark = pytest.mark.usefixtures("one_thread")

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def lambda_data(tmp_path_factory) -> Path:
    src = shared_file("other/lambda_phage_NC_001416.1.fa.gz")
    return prepare(PrepareConfig(genomes=(src,), out=tmp_path_factory.mktemp("lambda") / "ds", train="all",
                                 heldout=(), progress=False))


@pytest.fixture(scope="module")
def masked_data(tmp_path_factory) -> Path:
    # hg38 chr16 piece: 41 % soft-masked, so the soft-mask weight changes the loss.
    src = shared_file("human/hg38_chr16_186964-397118.fa.gz")
    return prepare(PrepareConfig(genomes=(src,), out=tmp_path_factory.mktemp("chr16") / "ds", train="all",
                                 heldout=(), progress=False))


def _losses(out: Path) -> list[float]:
    return [json.loads(line)["loss"] for line in (out / METRICS).read_text().splitlines()]


def _resume_config(data: Path, out: Path) -> TrainConfig:
    # Exercises everything a resume must restore: seq warm-up stages, accumulation, several windows per
    # micro-batch, reverse complement, soft-mask weights, the cosine position and AdamW moments.
    return TrainConfig(data=data, out=out, seq_len=64, steps=8, lr=3e-3, warmup_steps=2, seq_warmup=(32,),
                       seq_warmup_steps=3, grad_accum=2, micro_batch=1, softmask_weight=0.1, reverse_complement=True,
                       moe_balance_coef=0.01, checkpoint_every=2, keep_checkpoints=2, seed=3, progress=False)


@pytest.fixture(scope="module")
def reference_losses(masked_data, tmp_path_factory) -> list[float]:
    out = tmp_path_factory.mktemp("reference") / "run"
    finetune(_resume_config(masked_data, out))
    return _losses(out)


def test_finetune_learns_real_dna_and_writes_outputs(lambda_data, tmp_path):
    out = tmp_path / "run"
    cfg = TrainConfig(data=lambda_data, out=out, seq_len=128, steps=20, lr=3e-3, warmup_steps=2,
                      checkpoint_every=10, keep_checkpoints=1, progress=False)
    final = finetune(cfg)
    assert final == out / "checkpoints" / "step-000020"
    assert [p.name for p in (out / "checkpoints").iterdir()] == ["step-000020"]      # keep=1 pruned step 10
    lines = [json.loads(line) for line in (out / METRICS).read_text().splitlines()]
    assert [m["step"] for m in lines] == list(range(1, 21))
    for key in ("loss", "tokens", "lr", "tokens_per_s", "grad_norm", "aux_moe_balance", "memory_gib",
                "host_memory_gib"):
        assert all(key in m for m in lines), key
    assert lines[-1]["tokens"] == 20 * 128
    losses = [m["loss"] for m in lines]
    # Starts near ln(16) (uniform over the char vocabulary) and must learn at least the base composition.
    assert losses[0] > 2.3
    assert sum(losses[-5:]) / 5 < sum(losses[:3]) / 3 - 0.6, losses
    summary = json.loads((out / SUMMARY).read_text())
    assert summary["status"] == "ok" and summary["final_checkpoint"] == str(final)
    # The first step is reported apart (on a GPU it loads or compiles the kernels); the rate after it is the later
    # steps' tokens over their seconds.
    assert summary["first_step_seconds"] == pytest.approx(lines[0]["step_seconds"])
    later = sum(m["tokens"] - p["tokens"] for p, m in zip(lines, lines[1:])) / sum(m["step_seconds"] for m in lines[1:])
    assert summary["tokens_per_s_after_first_step"] == pytest.approx(later)
    assert summary["peak_host_memory_gib"] > 0.1
    records = list((out / "runs").glob("*_finetune.json"))
    assert len(records) == 1 and json.loads(records[0].read_text())["status"] == "ok"
    # The checkpoint is a model directory the model package (and genolc eval) loads, with the genome tokenizer.
    model = load_pretrained(final)
    assert model.config.vocab_size == 16 and (final / "tokenizer.json").is_file()


def test_resume_after_interruption_is_bitwise_identical(masked_data, reference_losses, tmp_path):
    out = tmp_path / "run"

    class Interrupted(Exception):
        pass

    def stop_after_5(step, metrics):
        if step == 5:
            raise Interrupted

    with pytest.raises(Interrupted):
        finetune(_resume_config(masked_data, out), TrainHooks(on_step_end=stop_after_5))
    assert st.latest_checkpoint(out / "checkpoints").name == "step-000004"
    finetune(_resume_config(masked_data, out).replace(resume=True))
    assert _losses(out) == reference_losses          # exact float equality, every step


def test_kill_during_checkpoint_save_keeps_previous_and_resumes_exactly(masked_data, reference_losses, tmp_path):
    out = tmp_path / "run"
    cfg = _resume_config(masked_data, out)
    script = textwrap.dedent(f"""
        import os, signal, torch
        torch.set_num_threads(1)
        from pathlib import Path
        from genolc.train import state
        from genolc.train.config import TrainConfig
        from genolc.train.loop import finetune

        def kill_mid_save(name):
            # Second save (step 4): the weights are written, the optimizer state is not.
            if name == state.WEIGHTS and (Path({str(out)!r}) / "checkpoints" / "step-000002").is_dir():
                os.kill(os.getpid(), signal.SIGKILL)

        state.after_file_written = kill_mid_save
        finetune(TrainConfig.from_dict({cfg.to_dict()!r}))
    """)
    proc = subprocess.run([sys.executable, "-c", script], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert proc.returncode == -signal.SIGKILL, proc.stderr[-2000:]
    root = out / "checkpoints"
    assert [s for s, _ in st.list_checkpoints(root)] == [2]
    assert any(p.name.startswith(".step-000004") for p in root.iterdir())         # the half-written save
    load_pretrained(root / "step-000002")
    finetune(cfg.replace(resume=True))
    assert not any(p.name.startswith(".") for p in root.iterdir())                 # swept on start
    assert _losses(out) == reference_losses


def test_accumulation_matches_one_larger_micro_batch(lambda_data, tmp_path):
    # Both draw the sampler's windows (step, 0) and (step, 1); the loss is normalised over the whole step.
    one = TrainConfig(data=lambda_data, out=tmp_path / "one", seq_len=64, steps=3, lr=3e-3, warmup_steps=1,
                      micro_batch=2, grad_accum=1, progress=False)
    finetune(one)
    finetune(one.replace(out=tmp_path / "two", micro_batch=1, grad_accum=2))
    assert _losses(tmp_path / "two") == pytest.approx(_losses(tmp_path / "one"), rel=1e-5)
    # Tokens per expert are summed over micro-batches before the router-bias update, so both route alike.
    loads = [[json.loads(line)["moe_load_max_over_mean"] for line in (tmp_path / run / METRICS).open()]
             for run in ("one", "two")]
    assert loads[0] == loads[1] and len(loads[0]) == 3
    biases = [{k: v for k, v in load_pretrained(tmp_path / run / "checkpoints" / "step-000003").state_dict().items()
               if k.endswith("e_score_correction_bias")} for run in ("one", "two")]
    assert len(biases[0]) == 3 and all(torch.equal(biases[0][k], biases[1][k]) for k in biases[0])
    assert any(b.any() for b in biases[0].values())      # the default rate moved them


@pytest.mark.parametrize("chunk", [0, 16])
def test_nan_loss_stops_naming_the_step_and_keeps_last_good(lambda_data, tmp_path, chunk):
    """A non-finite loss stops the run before the optimizer steps on it, whole window or chunked (where the loss
    of one chunk, not the last the step runs backward from, is poisoned: the check is read once per micro-batch)."""
    out = tmp_path / "run"
    cfg = TrainConfig(data=lambda_data, out=out, seq_len=64, steps=10, checkpoint_every=2, progress=False,
                      chunk=chunk)
    calls = []

    def poison(step, micro, loss):
        calls.append(step)
        return loss * float("inf") if step == 4 and calls.count(step) == (2 if chunk else 1) else loss

    with pytest.raises(st.NonFiniteLossError, match="step 5") as info:
        finetune(cfg, TrainHooks(on_loss=poison))
    assert calls.count(4) == (4 if chunk else 1)
    assert "loss is inf" in info.value.message and "step-000004" in info.value.message
    assert [s for s, _ in st.list_checkpoints(out / "checkpoints")] == [2, 4]
    load_pretrained(out / "checkpoints" / "step-000004")
    assert len((out / METRICS).read_text().splitlines()) == 4
    record = json.loads(next((out / "runs").glob("*_finetune.json")).read_text())
    assert record["status"] == "failed" and "step 5" in record["error"]
    summary = json.loads((out / SUMMARY).read_text())
    assert summary["status"] == "diverged" and summary["final_checkpoint"].endswith("step-000004")


def test_init_from_text_vocab_transformers_checkpoint(lambda_data, tmp_path):
    """A checkpoint written by transformers itself (multimodal GLM-5.3-Flash layout, 300-token text vocabulary and
    a text tokenizer.json) starts a genome run: blocks kept, embedding rows cut to the genome vocabulary."""
    from tokenizers import Tokenizer as TextTokenizer
    from tokenizers.models import WordLevel
    from transformers import Glm5NextConfig, Glm5NextForConditionalGeneration
    from transformers.utils import logging as hf_logging

    from genolc.model import preset

    hf_logging.set_verbosity_error()
    torch.manual_seed(7)
    vision = dict(depth=1, hidden_size=16, num_heads=2, intermediate_size=16, out_hidden_size=32,
                  projection_intermediate_size=16, patch_size=2, image_size=4)
    reference = Glm5NextForConditionalGeneration(
        Glm5NextConfig(text_config=preset("tiny", vocab_size=300).to_hf(), vision_config=vision))
    reference.save_pretrained(str(tmp_path / "text-ckpt"))
    TextTokenizer(WordLevel({"[UNK]": 0, "the": 1}, unk_token="[UNK]")).save(str(tmp_path / "text-ckpt" /
                                                                                 "tokenizer.json"))
    text_model = load_pretrained(tmp_path / "text-ckpt")
    cfg = TrainConfig(data=lambda_data, out=tmp_path / "run", seq_len=64, steps=1, lr=1e-6, warmup_steps=0,
                      init=tmp_path / "text-ckpt", progress=False)
    trained = load_pretrained(finetune(cfg))
    assert trained.config.vocab_size == 16
    before, after = text_model.state_dict(), trained.state_dict()
    assert set(after) == set(before)
    for name in ("layers.0.self_attn.q_proj.weight", "layers.3.mlp.experts.down_proj", "norm.weight"):
        assert (after[name] - before[name]).abs().max() < 1e-4, name      # blocks kept (one step at lr 1e-6)
    assert (after["embed_tokens.weight"] - before["embed_tokens.weight"][:16]).abs().max() < 1e-4


def test_indexer_kl_schedule_and_recompute_match_plain(lambda_data, tmp_path):
    # 128-token windows exceed the tiny preset's index_topk (64), so the sparse phase really selects keys.
    base = TrainConfig(data=lambda_data, out=tmp_path / "plain", seq_len=128, steps=4, lr=3e-3, warmup_steps=1,
                       indexer="dense-then-sparse", indexer_dense_steps=2, indexer_kl_coef=0.5, progress=False)
    finetune(base)
    finetune(base.replace(out=tmp_path / "recompute", recompute=True))
    plain = [json.loads(line) for line in (tmp_path / "plain" / METRICS).read_text().splitlines()]
    recomputed = [json.loads(line) for line in (tmp_path / "recompute" / METRICS).read_text().splitlines()]
    assert [m["indexer_mode"] for m in plain] == ["dense", "dense", "sparse", "sparse"]
    assert all(m["aux_indexer_kl"] > 0 for m in plain)
    assert [m["loss"] for m in recomputed] == pytest.approx([m["loss"] for m in plain], rel=1e-5, abs=1e-6)
    summary = json.loads((tmp_path / "recompute" / SUMMARY).read_text())
    assert summary["transforms"] == ["recompute(4 layers)"]


def test_loss_excludes_n_and_downweights_softmasked_targets(tmp_path):
    """The logged loss is sum(w * CE) / sum(w) with w = 0 on N targets and 0.1 on soft-masked ones, recomputed here
    from the dataset's own masks; the unweighted and N-only means differ by far more than the tolerance."""
    import numpy as np
    import torch.nn.functional as F

    from genolc.data.dataset import PreparedDataset
    from genolc.data.sampler import TrainSampler
    from genolc.model import build_model, preset

    # GRCh37 chr1 start: a 60 kb telomere N run; hg38 chr16 piece: 41 % soft-masked.
    data = prepare(PrepareConfig(genomes=(shared_file("human/GRCh37_chr1_truncated_240kb.fa.gz"),
                                          shared_file("human/hg38_chr16_186964-397118.fa.gz")),
                                 out=tmp_path / "ds", train="all", heldout=(), progress=False))
    cfg = TrainConfig(data=data, out=tmp_path / "run", seq_len=64, steps=1, micro_batch=12, grad_accum=2,
                      max_n_fraction=1.0, softmask_weight=0.1, seed=1, progress=False)
    finetune(cfg)
    logged = json.loads((cfg.out / METRICS).read_text().splitlines()[0])["loss"]

    dataset = PreparedDataset(data)
    sampler = TrainSampler(dataset, 64, seed=cfg.seed, max_n_fraction=1.0)
    torch.manual_seed(cfg.seed)
    model = build_model(preset("tiny", vocab_size=dataset.tokenizer.vocab_size))
    ce, ambiguous, soft = [], [], []
    with torch.no_grad():
        for micro in range(2):
            windows = [sampler.window(0, micro * 12 + b) for b in range(12)]
            ids = torch.from_numpy(np.stack([np.asarray(dataset.tokens(w.key)[w.start:w.stop], dtype=np.int64)
                                             for w in windows]))
            logits = model(ids[:, :-1]).logits
            ce.append(F.cross_entropy(logits.reshape(-1, logits.shape[-1]), ids[:, 1:].reshape(-1), reduction="none"))
            ambiguous += [dataset.token_ambiguous(w.key, w.start + 1, w.stop) for w in windows]
            soft += [dataset.token_softmask(w.key, w.start + 1, w.stop) for w in windows]
    ce_all = torch.cat(ce).double().numpy()
    ambiguous, soft = np.concatenate(ambiguous), np.concatenate(soft)
    assert ambiguous.sum() > 20 and (soft & ~ambiguous).sum() > 20 and (~soft & ~ambiguous).sum() > 20
    weights = np.where(ambiguous, 0.0, np.where(soft, 0.1, 1.0))
    expected = float((weights * ce_all).sum() / weights.sum())
    assert logged == pytest.approx(expected, rel=1e-6)
    # At initialisation CE differs little between target kinds, but ignoring either mask moves the mean by over
    # 50 times the tolerance above.
    unweighted = float(ce_all.mean())
    n_only = float(ce_all[~ambiguous].mean())
    assert abs(unweighted - expected) > 5e-5 * expected and abs(n_only - expected) > 5e-5 * expected


_SIGNAL_SCRIPT = """
import os, signal, sys, torch
torch.set_num_threads(1)
signal.signal(signal.SIGINT, signal.default_int_handler)      # as in an interactive shell, whatever our parent set
from genolc.cli import main
from genolc.train import loop

plain_step = loop._Trainer._step

def step_with_signals(self, step):
    if step == 2:                                             # the signal arrives while step 3 is computing
        for _ in range({count}):
            os.kill(os.getpid(), signal.{name})
    return plain_step(self, step)

loop._Trainer._step = step_with_signals
main({args!r}, prog_name="genolc")
"""


@pytest.mark.parametrize("name, count, saved", [("SIGINT", 1, 3), ("SIGTERM", 1, 3), ("SIGINT", 2, 2)])
def test_ctrl_c_or_sigterm_stops_cleanly_and_resumes_exactly(masked_data, reference_losses, tmp_path, name, count,
                                                            saved):
    out = tmp_path / "run"
    args = ["finetune", "--data", str(masked_data), "--out", str(out), "--seq", "64", "--steps", "8", "--lr", "3e-3",
            "--warmup", "2", "--seq-warmup", "32", "--seq-warmup-steps", "3", "--grad-accum", "2",
            "--softmask-weight", "0.1", "--reverse-complement", "--moe-balance", "0.01", "--checkpoint-every", "2",
            "--keep", "2", "--seed", "3", "--no-progress"]
    script = _SIGNAL_SCRIPT.format(count=count, name=name, args=args)
    proc = subprocess.run([sys.executable, "-c", script], cwd=REPO, capture_output=True, text=True, timeout=300)
    signum = getattr(signal, name)
    assert proc.returncode == (128 + signum if count == 1 else 130), proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr and proc.stderr.count("genolc: error:") == 1, proc.stderr
    if count == 1:
        assert f"stopped by {name} after step 3 of 8" in proc.stderr and "--resume" in proc.stderr
    else:
        assert "stopped at once during step 3 without saving" in proc.stderr
    assert f"step-{saved:06d}" in proc.stderr
    assert st.list_checkpoints(out / "checkpoints")[-1][0] == saved
    summary = json.loads((out / SUMMARY).read_text())
    assert summary["status"] == "interrupted" and summary["final_checkpoint"].endswith(f"step-{saved:06d}")
    if count == 1:
        records = [json.loads(p.read_text()) for p in (out / "runs").glob("*_finetune.json")]
        assert [r["status"] for r in records] == ["interrupted"]
    finetune(_resume_config(masked_data, out).replace(resume=True))
    assert _losses(out) == reference_losses
    summary = json.loads((out / SUMMARY).read_text())
    assert summary["status"] == "ok" and summary["steps_done"] == 8
    assert summary["mean_loss_last_10"] == pytest.approx(sum(reference_losses) / 8)
