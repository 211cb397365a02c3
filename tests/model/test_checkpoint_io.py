"""Checkpoints: sharded and legacy-named loading, atomic saves with a tokenizer, convert, and clear errors."""

from __future__ import annotations

import json
import shutil

import pytest
import torch
from click.testing import CliRunner
from safetensors.torch import load_file, save_file

from genolc.cli import main
from genolc.errors import InputError
from genolc.model import build_model, convert_checkpoint, load_pretrained, save_pretrained
from genolc.model.checkpoint import INDEX_NAME, WEIGHTS_NAME

pytest.importorskip("transformers.models.glm5_next")
from glm5_reference import random_reference_model, save_reference, small_config  # noqa: E402

IDS = torch.randint(0, 37, (1, 41), generator=torch.Generator().manual_seed(0))


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """A genolc model and its text-layout checkpoint."""
    torch.manual_seed(0)
    model = build_model(small_config()).eval()
    path = tmp_path_factory.mktemp("ckpt") / "model"
    save_pretrained(model, path)
    return model, path


def _logits(model):
    with torch.no_grad():
        return model(IDS).logits


def test_text_layout_round_trip_and_dtype(saved):
    model, path = saved
    config = json.loads((path / "config.json").read_text())
    assert config["model_type"] == "glm5_next_text" and "text_config" not in config
    keys = load_file(str(path / WEIGHTS_NAME)).keys()
    assert "lm_head.weight" in keys and all(k == "lm_head.weight" or k.startswith("model.layers.")
                                            or k in ("model.embed_tokens.weight", "model.norm.weight") for k in keys)
    assert torch.equal(_logits(load_pretrained(path)), _logits(model))
    half = load_pretrained(path, dtype=torch.bfloat16)
    assert half.embed_tokens.weight.dtype == torch.bfloat16
    assert half.layers[0].self_attn.forget_gate.A_log.dtype == torch.float32
    assert half.layers[1].mlp.gate.e_score_correction_bias.dtype == torch.float32


def test_sharded_save_and_load(saved, tmp_path):
    model, _ = saved
    save_pretrained(model, tmp_path / "sharded", max_shard_bytes=40_000)
    index = json.loads((tmp_path / "sharded" / INDEX_NAME).read_text())
    assert len(set(index["weight_map"].values())) > 2
    assert torch.equal(_logits(load_pretrained(tmp_path / "sharded")), _logits(model))


def test_multimodal_checkpoint_from_transformers_ignores_vision(tmp_path):
    reference = random_reference_model(small_config(), seed=11)
    path = save_reference(reference, tmp_path / "mm")
    assert any(k.startswith("model.visual.") for k in load_file(str(path / WEIGHTS_NAME)))
    ours = load_pretrained(path)
    with torch.no_grad():
        expected = reference(input_ids=IDS, use_cache=False).logits
    assert (_logits(ours) - expected).abs().max().item() < 1e-5


def test_original_release_names_are_understood(saved, tmp_path):
    """Per-expert weights, split q/k/v convs, un-nested forget gate, hc_* names and an MTP layer all load."""
    model, path = saved
    state = load_file(str(path / WEIGHTS_NAME))
    legacy = {}
    for key, tensor in state.items():
        if key.endswith("mlp.experts.gate_up_proj"):
            base = key[: -len("gate_up_proj")]
            gate, up = tensor.chunk(2, dim=1)
            for e in range(tensor.shape[0]):
                legacy[f"{base}{e}.gate_proj.weight"] = gate[e].clone()
                legacy[f"{base}{e}.up_proj.weight"] = up[e].clone()
        elif key.endswith("mlp.experts.down_proj"):
            base = key[: -len("down_proj")]
            for e in range(tensor.shape[0]):
                legacy[f"{base}{e}.down_proj.weight"] = tensor[e].clone()
        elif key.endswith("self_attn.conv1d.weight"):
            for name, part in zip("qkv", tensor.chunk(3, dim=0)):
                legacy[key.replace("conv1d", f"{name}_conv1d")] = part.clone()
        else:
            key = key.replace("self_attn.forget_gate.", "self_attn.")
            key = key.replace("attn_hc.", "hc_attn_").replace("ffn_hc.", "hc_ffn_")
            legacy[key] = tensor
    legacy["model.layers.4.eh_proj.weight"] = torch.zeros(2, 2)
    (tmp_path / "legacy").mkdir()
    save_file(legacy, str(tmp_path / "legacy" / WEIGHTS_NAME))
    (tmp_path / "legacy" / "config.json").write_text((path / "config.json").read_text())
    assert torch.equal(_logits(load_pretrained(tmp_path / "legacy")), _logits(model))


def _broken_copy(path, tmp_path, edit):
    state = load_file(str(path / WEIGHTS_NAME))
    edit(state)
    out = tmp_path / "broken"
    out.mkdir(exist_ok=True)
    save_file(state, str(out / WEIGHTS_NAME))
    (out / "config.json").write_text((path / "config.json").read_text())
    return out


def test_bad_checkpoints_raise_clear_errors(saved, tmp_path):
    _, path = saved
    with pytest.raises(InputError, match="missing model.layers.1.mlp.gate.weight|missing layers.1.mlp.gate.weight"):
        load_pretrained(_broken_copy(path, tmp_path, lambda s: s.pop("model.layers.1.mlp.gate.weight")))
    with pytest.raises(InputError, match="unexpected layers.0.extra.weight"):
        load_pretrained(_broken_copy(path, tmp_path, lambda s: s.__setitem__("model.layers.0.extra.weight",
                                                                              torch.zeros(1))))
    with pytest.raises(InputError, match=r"shapes do not match.*embed_tokens.weight \(36, 32\)"):
        load_pretrained(_broken_copy(path, tmp_path, lambda s: s.__setitem__(
            "model.embed_tokens.weight", s["model.embed_tokens.weight"][:36].clone())))
    with pytest.raises(InputError, match="checkpoint directory not found"):
        load_pretrained(tmp_path / "nowhere")
    (tmp_path / "empty").mkdir()
    (tmp_path / "empty" / "config.json").write_text((path / "config.json").read_text())
    with pytest.raises(InputError, match="no model.safetensors"):
        load_pretrained(tmp_path / "empty")
    (tmp_path / "empty" / WEIGHTS_NAME).write_bytes(b"\x00garbage")
    with pytest.raises(InputError, match="cannot read safetensors"):
        load_pretrained(tmp_path / "empty")
    (tmp_path / "empty" / INDEX_NAME).write_text(json.dumps({"weight_map": {"a": "model-00001-of-00002.safetensors"}}))
    with pytest.raises(InputError, match="missing"):
        load_pretrained(tmp_path / "empty")


def test_failed_save_leaves_nothing_behind(saved, tmp_path):
    model, _ = saved

    class BrokenTokenizer:
        pass

    with pytest.raises(Exception):
        save_pretrained(model, tmp_path / "out", tokenizer=BrokenTokenizer())
    assert not (tmp_path / "out").exists() and not list(tmp_path.iterdir())


def test_save_with_tokenizer(saved, tmp_path):
    tokenize = pytest.importorskip("genolc.tokenize")
    model, _ = saved
    tokenizer = tokenize.make_tokenizer("char")
    save_pretrained(model, tmp_path / "with_tok", tokenizer=tokenizer)
    assert tokenize.load_tokenizer(tmp_path / "with_tok" / "tokenizer.json").to_dict() == tokenizer.to_dict()


def test_convert_command_between_layouts(saved, tmp_path):
    model, path = saved
    runner = CliRunner()
    result = runner.invoke(main, ["convert", str(path), "--out", str(tmp_path / "mm"), "--layout", "multimodal"])
    assert result.exit_code == 0, result.output
    config = json.loads((tmp_path / "mm" / "config.json").read_text())
    assert config["model_type"] == "glm5_next" and "text_config" in config
    assert any(k.startswith("model.language_model.") for k in load_file(str(tmp_path / "mm" / WEIGHTS_NAME)))
    assert list((tmp_path / "mm" / "runs").glob("*convert*.json"))
    result = runner.invoke(main, ["convert", str(tmp_path / "mm"), "-o", str(tmp_path / "text")])
    assert result.exit_code == 0, result.output
    assert torch.equal(_logits(load_pretrained(tmp_path / "text")), _logits(model))
    assert convert_checkpoint(path, tmp_path / "again")["layout"] == "text"

    result = runner.invoke(main, ["convert", str(tmp_path / "nowhere"), "--out", str(tmp_path / "out")])
    assert result.exit_code == 2 and "genolc: error: checkpoint directory not found" in result.output
    assert not (tmp_path / "out").exists()


def test_convert_never_replaces_a_directory_genolc_did_not_write(saved, tmp_path, monkeypatch):
    _, path = saved
    runner = CliRunner()
    mine = tmp_path / "d"
    mine.mkdir()
    (mine / "notes.txt").write_text("important\n")
    result = runner.invoke(main, ["convert", str(path), "--out", str(mine)])
    assert result.exit_code == 2 and result.output.count("genolc: error:") == 1, result.output
    assert "checkpoint directory already holds files genolc did not write (notes.txt)" in result.output
    assert [p.name for p in mine.iterdir()] == ["notes.txt"] and (mine / "notes.txt").read_text() == "important\n"
    # refused before the source is read: a missing source is not what the message is about
    result = runner.invoke(main, ["convert", str(tmp_path / "nowhere"), "--out", str(mine)])
    assert result.exit_code == 2 and "did not write (notes.txt)" in result.output and "not found" not in result.output
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    result = runner.invoke(main, ["convert", str(path), "-o", "."])
    assert result.exit_code == 2 and "the current directory" in result.output and not any(work.iterdir())
    # an earlier conversion is genolc's own checkpoint: replaced
    for layout in ("multimodal", "text"):
        result = runner.invoke(main, ["convert", str(path), "--out", str(tmp_path / "converted"), "--layout", layout])
        assert result.exit_code == 0, result.output
    assert "text_config" not in json.loads((tmp_path / "converted" / "config.json").read_text())


def test_convert_a_finetune_run_directory_takes_its_newest_checkpoint(saved, tmp_path):
    model, path = saved
    for step in ("step-000002", "step-000004"):
        shutil.copytree(path, tmp_path / "run" / "checkpoints" / step)
        (tmp_path / "run" / "checkpoints" / step / "trainer_state.json").write_text("{}")
    result = CliRunner().invoke(main, ["convert", str(tmp_path / "run"), "--out", str(tmp_path / "out")])
    assert result.exit_code == 0, result.output
    newest = tmp_path / "run" / "checkpoints" / "step-000004"
    assert result.stderr.splitlines() == [f"genolc: SRC {tmp_path / 'run'}: using the run's newest checkpoint {newest}"]
    assert torch.equal(_logits(load_pretrained(tmp_path / "out")), _logits(model))
    record = json.loads(next((tmp_path / "out" / "runs").glob("*convert*.json")).read_text())
    assert record["args"]["src"] == str(newest)
    shutil.rmtree(tmp_path / "run" / "checkpoints")
    (tmp_path / "run" / "metrics.jsonl").write_text("")
    result = CliRunner().invoke(main, ["convert", str(tmp_path / "run"), "--out", str(tmp_path / "never")])
    assert result.exit_code == 2 and "SRC: this finetune run directory has no complete checkpoint" in result.output
    assert not (tmp_path / "never").exists()


def test_text_vocabulary_checkpoint_resized_to_genome_tokens(tmp_path):
    """A transformers checkpoint with a 300-token text vocabulary -> resize_vocab -> a genome model that saves/loads."""
    from genolc.model import resize_vocab
    from genolc.tokenize import load_tokenizer, make_tokenizer

    text = load_pretrained(save_reference(random_reference_model(small_config(vocab_size=300), seed=5),
                                          tmp_path / "text_vocab")).eval()
    char = make_tokenizer("char")
    ids = torch.randint(0, char.vocab_size, (2, 50), generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        text_logits = text(ids).logits
    genome = resize_vocab(text, char.vocab_size)
    assert genome.config.vocab_size == char.vocab_size and genome.config.pad_token_id == 0
    with torch.no_grad():
        genome_logits = genome(ids).logits
    # Every transformer-block weight and the first vocab_size embedding / LM-head rows are kept, so on ids below
    # the new size the genome model's logits are the text model's first columns.
    assert genome_logits.shape == (2, 50, char.vocab_size)
    torch.testing.assert_close(genome_logits, text_logits[..., : char.vocab_size], rtol=0, atol=1e-6)

    save_pretrained(genome, tmp_path / "genome", tokenizer=char)
    assert json.loads((tmp_path / "genome" / "config.json").read_text())["vocab_size"] == char.vocab_size
    assert load_tokenizer(tmp_path / "genome" / "tokenizer.json") == char
    with torch.no_grad():
        assert torch.equal(load_pretrained(tmp_path / "genome").eval()(ids).logits, genome_logits)
