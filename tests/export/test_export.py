"""`genolc export` (genolc/export): SkyRL Parquet round trip, text tokenizer rows, Megatron dataset and arguments,
the SkyRL config against SkyRL 0.4.0's classes, the memory-model layout, and each refusal's one message."""

from __future__ import annotations

import json
import os
import subprocess
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import yaml
from click.testing import CliRunner

from genolc.cli import main
from genolc.data.dataset import PreparedDataset
from genolc.data.prepare import PrepareConfig, prepare
from genolc.data.sampler import TrainSampler
from genolc.errors import ConfigError, GenolcError, RefusedOutputError
from genolc.export import skyrl as skyrl_export
from genolc.export.config import ExportConfig
from genolc.export.layout import choose_layout, memory_gib
from genolc.export.megatron import MegatronWindowDataset, mla_transformer_config, provider_kwargs
from genolc.export.run import export
from genolc.model.presets import glm_5_3_flash, small, tiny
from skyrl_schema import normalized_row, validate_sft

pytest.importorskip("pyarrow")
SEQ = 256


def _random_dna(rng: np.random.Generator, n: int) -> str:
    return "".join(rng.choice(list("ACGT"), size=n))


@pytest.fixture(scope="module")
def dataset(tmp_path_factory) -> PreparedDataset:
    """chr1: 3000 clean bases; chr2: an 80-N run between clean stretches, so windows overlapping it carry Ns."""
    tmp = tmp_path_factory.mktemp("export")
    rng = np.random.default_rng(11)
    fasta = tmp / "genome.fa"
    records = {"chr1": _random_dna(rng, 3000),
               "chr2": _random_dna(rng, 700) + "N" * 80 + _random_dna(rng, 900),
               "chr22": _random_dna(rng, 1200)}
    fasta.write_text("".join(f">{k}\n{v}\n" for k, v in records.items()))
    out = prepare(PrepareConfig(genomes=(fasta,), out=tmp / "prepared", train=("chr1", "chr2"), heldout=("chr22",),
                                progress=False))
    return PreparedDataset(out)


def _config(dataset, out: Path, **changes) -> ExportConfig:
    base = ExportConfig(data=dataset.path, out=out, seq_len=SEQ, windows=40, seed=5, max_n_fraction=0.5,
                        progress=False)
    return replace(base, **changes)


def _expected(dataset, sampler, index):
    window = sampler.window(index, 0)
    ids = np.asarray(dataset.tokens(window.key)[window.start:window.stop], dtype=np.int64)
    if window.reverse_complement:
        ids = dataset.tokenizer.reverse_complement(ids)
    mask = (~np.asarray(dataset.tokenizer.ambiguous_mask(ids), dtype=bool)).astype(np.int8)
    mask[0] = 0
    return np.asarray(ids, dtype=np.int64), mask


@pytest.mark.parametrize("reverse_complement", [False, True])
def test_skyrl_export_round_trips_the_sampler_windows_and_n_masks(dataset, tmp_path, monkeypatch,
                                                                  reverse_complement):
    monkeypatch.setattr(skyrl_export, "ROW_GROUP_BYTES", 3 * (SEQ + 1) * 5)  # three rows a group: streamed
    out = tmp_path / "skyrl"
    manifest = export(_config(dataset, out, reverse_complement=reverse_complement))
    sampler = TrainSampler(dataset, SEQ, seed=5, max_n_fraction=0.5, reverse_complement=reverse_complement)
    rows = list(skyrl_export.read_rows(out))
    assert len(rows) == 40
    masked_targets = 0
    for index, (ids, mask) in enumerate(rows):
        want_ids, want_mask = _expected(dataset, sampler, index)
        np.testing.assert_array_equal(ids, want_ids)
        np.testing.assert_array_equal(mask, want_mask)
        masked_targets += int((mask[1:] == 0).sum())
    assert masked_targets > 0, "no exported window overlapped the N run; the N-mask went untested"
    if reverse_complement:
        assert any(sampler.window(i, 0).reverse_complement for i in range(40))

    import pyarrow as pa
    import pyarrow.parquet as pq
    parquet = pq.ParquetFile(str(out / "data" / "train.parquet"))
    assert parquet.schema_arrow.names == ["input_ids", "loss_mask"]
    assert parquet.schema_arrow.field("input_ids").type == pa.list_(pa.int32())
    assert parquet.schema_arrow.field("loss_mask").type == pa.list_(pa.int8())
    assert parquet.num_row_groups == 14  # 40 rows in groups of 3
    assert sorted(p.name for p in out.iterdir()) == [".genolc-output.json", "data", "manifest.json", "skyrl_sft.yaml",
                                                   "windows.tsv"]
    assert [p.name for p in (out / "data").iterdir()] == ["train.parquet"]  # SkyRL reads one format per directory

    on_disk = json.loads((out / "manifest.json").read_text())
    assert on_disk == json.loads(json.dumps(manifest))
    assert on_disk["source"]["path"] == str(dataset.path)
    assert on_disk["source"]["manifest_md5"] and on_disk["source"]["tokenizer_md5"]
    assert on_disk["tokenizer"]["kind"] == "genome" and on_disk["seq_len"] == SEQ and on_disk["windows"] == 40
    assert on_disk["sampler"]["seed"] == 5 and "git_sha" in on_disk["written_by"]
    assert on_disk["counts"]["rows"] == 40 and on_disk["counts"]["loss_tokens"] == sum(int(m.sum()) for _, m in rows)
    assert on_disk["files"]["data_md5"]
    lines = (out / "windows.tsv").read_text().splitlines()
    first = sampler.window(0, 0)
    assert lines[1].split("\t")[:5] == ["0", first.key, str(first.start), str(first.stop),
                                        str(int(first.reverse_complement))]


def test_rows_are_what_skyrls_pretokenized_loader_keeps(dataset, tmp_path):
    """Each row passes SkyRL 0.4.0's checks as transcribed (skyrl_schema.normalized_row), none is dropped, and the
    trained window (num_actions, window loss_mask) starts at the first target."""
    out = tmp_path / "skyrl"
    export(_config(dataset, out, windows=32))
    for ids, mask in skyrl_export.read_rows(out):
        row = normalized_row(ids.tolist(), mask.tolist(), max_length=SEQ + 1)
        assert row is not None
        assert row["num_actions"] == SEQ and row["loss_mask"] == mask[1:].tolist()


@pytest.mark.skipif(not os.environ.get("GENOLC_SKYRL_PYTHON"), reason="set GENOLC_SKYRL_PYTHON (and GENOLC_SKYRL_SRC) "
                    "to run SkyRL 0.4.0's own code from a separate environment")
def test_skyrls_own_config_classes_and_loader_accept_the_export(dataset, tmp_path):
    out = tmp_path / "skyrl"
    export(_config(dataset, out, windows=32))
    src = Path(os.environ.get("GENOLC_SKYRL_SRC", ""))
    env = dict(os.environ, PYTHONPATH=f"{src}:{src / 'skyrl-gym'}")
    result = subprocess.run([os.environ["GENOLC_SKYRL_PYTHON"], str(Path(__file__).with_name("skyrl_check.py")),
                             str(out)], capture_output=True, text=True, env=env, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads(result.stdout.strip().splitlines()[-1])
    assert report["strategy"] == "megatron" and report["recompute"] == "full"
    assert report["loader"] == "ok"
    mine = list(skyrl_export.read_rows(out))
    assert [r["input_ids"] for r in report["rows"]] == [ids.tolist() for ids, _ in mine]
    assert [r["loss_mask"] for r in report["rows"]] == [m[1:].tolist() for _, m in mine]


def _text_tokenizer(tmp_path: Path) -> Path:
    from tokenizers import Tokenizer, models, trainers

    rng = np.random.default_rng(3)
    tok = Tokenizer(models.BPE())
    trainer = trainers.BpeTrainer(vocab_size=48, initial_alphabet=list("ACGTN"), show_progress=False)
    tok.train_from_iterator([_random_dna(rng, 400) for _ in range(20)] + ["N" * 40], trainer=trainer)
    path = tmp_path / "tokenizer.json"
    tok.save(str(path))
    return path


def test_text_tokenizer_rows_reencode_the_window_bases_and_mask_tokens_touching_n(dataset, tmp_path):
    from tokenizers import Tokenizer

    path = _text_tokenizer(tmp_path)
    out = tmp_path / "text"
    manifest = export(_config(dataset, out, text_tokenizer=path))
    assert manifest["tokenizer"]["kind"] == "text" and manifest["tokenizer"]["vocab_size"] == 48
    tok = Tokenizer.from_file(str(path))
    sampler = TrainSampler(dataset, SEQ, seed=5, max_n_fraction=0.5)
    saw_n = False
    for index, (ids, mask) in enumerate(skyrl_export.read_rows(out)):
        window = sampler.window(index, 0)
        bases = dataset.tokenizer.decode(np.asarray(dataset.tokens(window.key)[window.start:window.stop])).tobytes()
        pieces = [tok.id_to_token(int(i)) for i in ids]
        assert "".join(pieces).encode() == bases[:len("".join(pieces))]  # the window's own bases, in order
        assert len(ids) <= SEQ + 1 and mask[0] == 0
        for piece, keep in zip(pieces[1:], mask[1:]):
            assert keep == (0 if "N" in piece else 1)
            saw_n |= "N" in piece
    assert saw_n


def test_megatron_dataset_yields_the_sampler_windows_and_the_exported_rows(dataset, tmp_path):
    out = tmp_path / "skyrl"
    export(_config(dataset, out, windows=32, reverse_complement=True))
    megatron = MegatronWindowDataset(dataset.path, SEQ, 32, seed=5, max_n_fraction=0.5, reverse_complement=True)
    sampler = TrainSampler(dataset, SEQ, seed=5, max_n_fraction=0.5, reverse_complement=True)
    assert len(megatron) == 32
    for index, (ids, mask) in enumerate(skyrl_export.read_rows(out)):
        item = megatron[index]
        assert set(item) == {"tokens", "labels", "loss_mask", "position_ids"}
        window = sampler.batch(index, 0)
        np.testing.assert_array_equal(item["tokens"].numpy(), window[:-1])
        np.testing.assert_array_equal(item["labels"].numpy(), window[1:])
        np.testing.assert_array_equal(item["tokens"].numpy(), ids[:-1])
        np.testing.assert_array_equal(item["loss_mask"].numpy(), mask[1:].astype(np.float32))
        np.testing.assert_array_equal(item["position_ids"].numpy(), np.arange(SEQ))
    with pytest.raises(IndexError):
        megatron[32]
    import torch
    batch = torch.utils.data.default_collate([megatron[0], megatron[1]])
    assert batch["tokens"].shape == (2, SEQ) and batch["loss_mask"].dtype == torch.float32


def test_exports_and_the_trainer_read_a_window_alike(dataset, tmp_path):
    """The trainer's micro-batch (--micro-batch 1, softmask weight 1), the SkyRL rows and the Megatron items of
    the same steps hold the same ids and the same N-masked targets (one reader: genolc.data.targets)."""
    from genolc.train.batch import read_micro_batch
    from genolc.train.schedule import StepShape

    out = tmp_path / "skyrl"
    export(_config(dataset, out, windows=32, reverse_complement=True))
    megatron = MegatronWindowDataset(dataset.path, SEQ, 32, seed=5, max_n_fraction=0.5, reverse_complement=True)
    sampler = TrainSampler(dataset, SEQ, seed=5, max_n_fraction=0.5, reverse_complement=True)
    shape = StepShape(seq_len=SEQ, windows=1, grad_accum=1, stage=0)
    masked = 0
    for step, (ids, mask) in enumerate(skyrl_export.read_rows(out)):
        trainer_ids, trainer_weights = read_micro_batch(dataset, sampler, step, shape, 0, 1.0)
        np.testing.assert_array_equal(trainer_ids[0].numpy(), ids)
        np.testing.assert_array_equal(trainer_weights[0].numpy(), mask[1:].astype(np.float32))
        np.testing.assert_array_equal(megatron[step]["loss_mask"].numpy(), trainer_weights[0].numpy())
        masked += int((trainer_weights == 0).sum())
    assert masked > 0, "no window overlapped the N run; the N-mask went untested"


@pytest.mark.parametrize("name,gpus", [("tiny", 8), ("glm-5.3-flash", 64)])
def test_megatron_provider_arguments_build_megatron_cores_config(name, gpus):
    mcore = pytest.importorskip("megatron.core.transformer.transformer_config")
    import dataclasses

    config = tiny() if name == "tiny" else glm_5_3_flash()
    layout = choose_layout(config, SEQ + 1, gpus, 8, 139.0)
    kwargs = provider_kwargs(config, SEQ, layout)
    built = mla_transformer_config(kwargs["transformer_config"])
    assert built.num_layers == config.num_hidden_layers
    assert built.linear_attention_freq == [1 if t == "linear_attention" else 0 for t in config.layer_types]
    assert built.moe_layer_freq == [1 if t == "sparse" else 0 for t in config.mlp_layer_types]
    assert built.num_moe_experts == config.n_routed_experts and built.moe_router_topk == config.num_experts_per_tok
    assert built.q_lora_rank == config.q_lora_rank and built.v_head_dim == config.v_head_dim
    assert built.recompute_granularity == "full"
    assert built.tensor_model_parallel_size == layout.tensor_parallel
    assert built.pipeline_model_parallel_size == layout.pipeline_parallel
    fields = {f.name for f in dataclasses.fields(mcore.MLATransformerConfig)}
    # The extension holds exactly what megatron-core 0.16.1 lacks (SkyRL's Glm5NextModelProvider fields).
    assert not fields & set(kwargs["glm5_next_extension"])
    assert kwargs["glm5_next_extension"]["mhc_num_residual_streams"] == config.hc_mult


# Where each extension field is defined, read from the sources: SkyRL 0.4.0's glm5_next/provider.py
# (Glm5NextModelProvider's own fields) and megatron-core 0.19.2's transformer/transformer_config.py (the DSA indexer
# knobs SkyRL's bridge sets, absent from 0.16.1).
GLM5_NEXT_PROVIDER_FIELDS = {"enable_mhc_connections", "mhc_num_residual_streams", "mhc_sinkhorn_iterations",
                             "mhc_init_gating_factor", "use_fused_mhc", "mhc_fused_backend", "mhc_norm_eps",
                             "mhc_norm_eps_inside_sqrt", "kda_gate_lower_bound", "dsa_indexer_kpool",
                             "dsa_indexer_kpool_always_select_tail"}
MEGATRON_CORE_0_19_DSA_FIELDS = {"dsa_indexer_rotate_activation", "dsa_indexer_scoring_relu",
                                 "dsa_indexer_k_norm_epsilon", "dsa_indexer_rope_interleaved",
                                 "dsa_indexer_topk_freq", "dsa_indexer_skip_topk_offset"}


def test_extension_fields_exist_where_skyrl_builds_the_model():
    extension = provider_kwargs(glm_5_3_flash(), SEQ)["glm5_next_extension"]
    assert set(extension) <= GLM5_NEXT_PROVIDER_FIELDS | MEGATRON_CORE_0_19_DSA_FIELDS


def test_megatron_core_refuses_context_parallel_dsa_which_is_why_cp_stays_1():
    pytest.importorskip("megatron.core.transformer.transformer_config")
    layout = choose_layout(glm_5_3_flash(), (1 << 20) + 1, 64, 8, 178.0, max_context_parallel=64)
    assert layout.context_parallel > 1
    kwargs = provider_kwargs(glm_5_3_flash(), 1 << 20, layout)["transformer_config"]
    with pytest.raises(AssertionError, match="context parallelism is not supported by DSAttention"):
        mla_transformer_config(kwargs)
    assert choose_layout(glm_5_3_flash(16), (1 << 20) + 1, 64, 8, 178.0).context_parallel == 1


@pytest.mark.parametrize("model,gpus,memory,seq", [
    ("small", 8, 139.0, "512k"), ("small", 16, 139.0, "1M"), ("glm-5.3-flash", 64, 139.0, "512k"),
    ("glm-5.3-flash", 64, 178.0, "512k")])
def test_generated_skyrl_config_passes_skyrl_0_4_0_schema_and_validation(dataset, tmp_path, model, gpus, memory,
                                                                           seq):
    from genolc.export.run import resolve_model
    from genolc.export.skyrl_config import sft_config
    from genolc.units import parse_length

    config = _config(dataset, tmp_path / "x", model=model, gpus=gpus, gpu_memory_gib=memory,
                     model_path="hf/ckpt" if model != "glm-5.3-flash" else "zai-org/GLM-5.3-Flash")
    net, path = resolve_model(config, 16)
    tokens = parse_length(seq) + 1
    layout = choose_layout(net, tokens, gpus, 8, memory)
    sft = sft_config(model_path=path, data_dir=tmp_path / "x" / "data", seq_tokens=tokens, rows=1024, layout=layout,
                     nodes=config.nodes, gpus_per_node=config.gpus_on_each_node, seed=0, out=tmp_path / "run")
    assert validate_sft(sft) == []
    assert sft["strategy"] == "megatron" and sft["megatron_config"]["transformer_config_kwargs"][
        "recompute_granularity"] == "full"
    assert sft["batch_size"] == layout.data_parallel and sft["max_length"] == tokens
    broken = json.loads(json.dumps(sft))
    broken["megatron_config"]["tensor_parallel_size"] = 2
    broken["placement"]["num_nodes"] = 3
    errors = validate_sft(broken)
    assert any("unknown field megatron_config.tensor_parallel_size" in e for e in errors)


def test_memory_model_layouts():
    flash = glm_5_3_flash()
    big = choose_layout(flash, (512 << 10) + 1, 64, 8, 178.0)
    assert (big.tensor_parallel, big.context_parallel) == (8, 1)
    assert big.world % (big.tensor_parallel * big.pipeline_parallel * big.context_parallel) == 0
    assert big.world % (big.pipeline_parallel * big.expert_parallel) == 0 and 288 % big.expert_parallel == 0
    # More memory never needs more model parallelism.
    roomy = choose_layout(small(), (512 << 10) + 1, 64, 8, 178.0)
    tight = choose_layout(small(), (512 << 10) + 1, 64, 8, 90.0)
    assert roomy.tensor_parallel * roomy.pipeline_parallel <= tight.tensor_parallel * tight.pipeline_parallel
    # Longer windows cost more activation memory.
    parts = memory_gib(flash, 1 << 19, 64, 8, 1, 8, False, pp=8)
    assert memory_gib(flash, 1 << 20, 64, 8, 1, 8, False, pp=8)["activations"] > parts["activations"]
    with pytest.raises(ConfigError, match="does not fit on 8 GPUs of 139 GiB"):
        choose_layout(flash, (512 << 10) + 1, 8, 8, 139.0)


def _cli(*args):
    result = CliRunner().invoke(main, ["export", *map(str, args)])
    if result.exit_code != 0:
        assert result.output.count("genolc: error:") == 1 and "Traceback" not in result.output, result.output
    return result.exit_code, result.output


def test_each_refusal_is_one_clear_message_and_writes_nothing(dataset, tmp_path):
    out = tmp_path / "out"
    common = ["--seq", SEQ, "--no-progress", "--out", out]
    code, text = _cli(dataset.path, "--format", "arrow", *common)
    assert code == 2 and "unknown export format 'arrow'" in text and "skyrl, megatron" in text
    code, text = _cli(tmp_path / "nowhere", *common)
    assert code == 2 and "prepared dataset not found" in text
    code, text = _cli(dataset.path, "--seq", "5000", "--no-progress", "--out", out)
    assert code == 2 and "longer than every train chromosome" in text and "--seq 2999 or less" in text
    code, text = _cli(dataset.path, "--text-tokenizer", tmp_path / "missing.json", *common)
    assert code == 2 and "text tokenizer file not found" in text
    (tmp_path / "bad.json").write_text("{not json")
    code, text = _cli(dataset.path, "--text-tokenizer", tmp_path / "bad.json", *common)
    assert code == 2 and "not a `tokenizers` JSON file" in text
    code, text = _cli(dataset.path, "--gpus", 8, *common)
    assert code == 2 and "does not fit on 8 GPUs" in text
    code, text = _cli(dataset.path, "--model", "small", *common)
    assert code == 2 and "has no published checkpoint" in text
    code, text = _cli(dataset.path, "--gpus", 16, "--gpu-memory", 178, "--windows", 1, *common)
    assert code == 2 and "--windows 1 is fewer than one step's batch" in text
    code, text = _cli(dataset.path, "--max-n-fraction", 2, *common)
    assert code == 2 and "--max-n-fraction" in text
    assert not out.exists()

    foreign = tmp_path / "foreign"
    foreign.mkdir()
    (foreign / "notes.txt").write_text("mine")
    code, text = _cli(dataset.path, "--seq", SEQ, "--no-progress", "--out", foreign)
    assert code == 2 and "already holds files genolc did not write (notes.txt)" in text
    assert sorted(p.name for p in foreign.iterdir()) == ["notes.txt"]


def test_a_failure_midway_leaves_no_output_and_a_rerun_replaces_genolcs_own(dataset, tmp_path, monkeypatch):
    from genolc.export import rows

    out = tmp_path / "nested" / "out"
    real_row = rows.RowBuilder.row

    def failing(self, index):
        if index == 3:
            raise ConfigError("simulated failure at row 3")
        return real_row(self, index)

    monkeypatch.setattr(rows.RowBuilder, "row", failing)
    with pytest.raises(ConfigError, match="simulated"):
        export(_config(dataset, out))
    assert not (tmp_path / "nested").exists()
    monkeypatch.setattr(rows.RowBuilder, "row", real_row)
    export(_config(dataset, out, windows=32))
    export(_config(dataset, out, windows=34))
    assert len(list(skyrl_export.read_rows(out))) == 34
    with pytest.raises(RefusedOutputError, match="holds a genolc"):
        export(_config(dataset, dataset.path.parent / "prepared"))


def test_megatron_format_writes_arguments_and_window_list_without_copying_data(dataset, tmp_path):
    out = tmp_path / "mg"
    code, text = _cli(dataset.path, "--format", "megatron", "--seq", SEQ, "--windows", 5, "--seed", 5,
                      "--max-n-fraction", 0.5, "--no-progress", "--out", out)
    assert code == 0, text
    assert "Megatron-core arguments and 5 windows" in text
    args = json.loads((out / "megatron.json").read_text())
    assert args["dataset"]["path"] == str(dataset.path) and args["dataset"]["length"] == 5
    assert args["provider"]["transformer_config"]["num_layers"] == 45
    assert not (out / "data").exists()
    item = MegatronWindowDataset(**{k: v for k, v in args["dataset"].items() if k not in ("class", "path")},
                                 dataset=args["dataset"]["path"])[2]
    row = (out / "windows.tsv").read_text().splitlines()[3].split("\t")
    np.testing.assert_array_equal(item["tokens"].numpy(),
                                  np.asarray(dataset.tokens(row[1])[int(row[2]):int(row[3]) - 1], dtype=np.int64))


def test_finetune_backend_skyrl_without_skyrl_stops_with_what_to_install(dataset, tmp_path):
    out = tmp_path / "run"
    result = CliRunner().invoke(main, ["finetune", "--backend", "skyrl", "--data", str(tmp_path), "--seq", "256",
                                       "--out", str(out)])
    assert result.exit_code == 2
    message = result.output
    assert message.count("genolc: error:") == 1
    assert "--backend skyrl needs SkyRL 0.4.0" in message and "Python 3.12" in message
    assert 'pip install "skyrl[megatron]==0.4.0"' in message
    assert not out.exists()


def test_finetune_backend_skyrl_builds_the_run_config_from_the_export(dataset, tmp_path):
    from genolc.export.skyrl_config import config_for_run

    export_dir = tmp_path / "skyrl"
    export(_config(dataset, export_dir, windows=32))
    run = tmp_path / "run"
    config = config_for_run(export_dir, run, {"steps": 3, "lr": 2e-5, "init": Path("/ckpt/genome")})
    assert config["num_steps"] == 3 and config["optimizer_config"]["lr"] == 2e-5
    assert config["model"]["path"] == "/ckpt/genome"
    assert config["export_path"] == str(run / "hf") and config["hf_save_interval"] == 3
    assert config["pretokenized_dataset_paths"] == [str(export_dir / "data")]
    assert validate_sft(config) == []
    # The launch line written at export time keeps SkyRL's checkpoints beside the export, which a re-export
    # replaces whole; a moved export is read where it is now.
    written = yaml.safe_load((export_dir / "skyrl_sft.yaml").read_text())
    assert written["ckpt_path"] == str(tmp_path / "skyrl-skyrl-run" / "checkpoints")
    moved = tmp_path / "moved"
    export_dir.rename(moved)
    assert config_for_run(moved, run, {})["pretokenized_dataset_paths"] == [str(moved / "data")]
    with pytest.raises(GenolcError, match="not a genolc export"):
        config_for_run(tmp_path, run, {})


def test_readme_scaling_out_commands_parse():
    """Every `genolc export` and `genolc finetune --backend skyrl` line of the README's "Scaling out" section names
    options the commands have (parsed by click, not run)."""
    import shlex

    from genolc.export.command import export_command
    from genolc.train.command import finetune_command

    readme = (Path(__file__).parents[2] / "README.md").read_text()
    section = readme.split("## Scaling out", 1)[1].split("\n## ", 1)[0]
    commands = {"export": export_command, "finetune": finetune_command}
    seen = set()
    for line in section.replace("\\\n", " ").splitlines():
        line = line.split("#", 1)[0].strip()
        if not line.startswith(("genolc export", "genolc finetune")):
            continue
        words = shlex.split(line)
        commands[words[1]].make_context(words[1], words[2:])
        seen.add(words[1])
    assert seen == {"export", "finetune"}
