"""One real Megatron-core training step on genolc-exported data (issue 18's H200 check).

What it does, on one GPU (or on CPU with ``--device cpu``, for a smoke run):

1. prepares genolc's bundled human sample (hg38 chr2:1-600000 for training) and exports it with
   ``genolc export --format skyrl`` (Parquet rows of input_ids / loss_mask) into a scratch directory;
2. checks the exported rows against :class:`genolc.export.megatron.MegatronWindowDataset` (the Megatron loader
   over the prepared dataset): the same tokens, labels and loss masks;
3. builds a small model of the architecture with megatron-core 0.16.1 from
   :func:`genolc.export.megatron.provider_kwargs` of genolc's ``tiny`` preset widened to GPU-friendly sizes: MLA
   attention (NoPE, q/kv LoRA ranks), sigmoid-routed MoE with a shared expert and a dense first layer, RMSNorm,
   clamped SwiGLU. megatron-core alone has neither KDA nor mHC (they live in SkyRL 0.4.0's ``mcore_ext``, whose
   wheel stack - Ray, vLLM, Transformer Engine - does not travel in 64 MiB), so this step trains that MLA + MoE
   subset; ``linear_attention_freq``/``experimental_attention_variant`` are dropped and the report says so;
4. runs ``--steps`` optimizer steps (forward, masked cross-entropy over the exported loss mask, backward, Adam) on the
   exported rows and writes a JSON report (losses, finiteness, peak memory, what was dropped) to ``--report``.

Run on the H200 (wheels carried as the device README describes; see benchmarks/megatron_step_wheels.txt)::

    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
        .whl/*.whl && export PYTHONPATH=/tmp/site:$PWD && \
    python3 benchmarks/megatron_step.py --seq 4k --steps 3 --report $OUT/megatron_step.json
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seq", default="4k", help="input tokens a window (k = 1024)")
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--windows", type=int, default=32)
    parser.add_argument("--hidden", type=int, default=512)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--experts", type=int, default=8)
    parser.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    parser.add_argument("--report", default="megatron_step.json")
    parser.add_argument("--work", default=None, help="scratch directory (default: a temporary one)")
    return parser.parse_args()


def prepare_and_export(work: Path, seq_len: int, windows: int) -> tuple[Path, Path]:
    from genolc.data.prepare import PrepareConfig, prepare
    from genolc.export.config import ExportConfig
    from genolc.export.run import export
    from genolc.sample import sample_files

    data = prepare(PrepareConfig(genomes=tuple(sample_files()), out=work / "data", train=("chr2",),
                                 heldout=("chr22",), progress=False))
    out = work / "export"
    export(ExportConfig(data=Path(data), out=out, seq_len=seq_len, windows=windows, seed=0, progress=False))
    return Path(data), out


def model_config(args, vocab_size: int, seq_len: int):
    import dataclasses

    from genolc.export.megatron import mla_transformer_config, provider_kwargs
    from genolc.model.presets import tiny

    base = tiny(vocab_size)
    heads = max(4, args.hidden // 64)
    config = dataclasses.replace(
        base, hidden_size=args.hidden, intermediate_size=4 * args.hidden, moe_intermediate_size=args.hidden,
        num_hidden_layers=args.layers, num_attention_heads=heads, num_key_value_heads=heads,
        q_lora_rank=args.hidden // 2, kv_lora_rank=args.hidden // 4, qk_nope_head_dim=64, v_head_dim=64,
        n_routed_experts=args.experts, num_experts_per_tok=2, linear_num_heads=heads,
        layer_types=("linear_attention",) * (args.layers - 1) + ("indexed_attention",),
        mlp_layer_types=("dense",) + ("sparse",) * (args.layers - 1), indexer_types=("full",) * args.layers)
    kwargs = provider_kwargs(config, seq_len)
    transformer = dict(kwargs["transformer_config"])
    dropped = {key: transformer.pop(key) for key in
               ("experimental_attention_variant", "linear_attention_freq", "dsa_indexer_n_heads",
                "dsa_indexer_head_dim", "dsa_indexer_topk", "dsa_indexer_loss_coeff")}
    # The local (non-Transformer-Engine) spec: no grouped GEMM; recompute off for a short smoke window.
    transformer.update(moe_grouped_gemm=False, recompute_granularity=None, recompute_method=None,
                       recompute_num_layers=None, bf16=args.device == "cuda", params_dtype=(
                           "bfloat16" if args.device == "cuda" else "float32"),
                       use_cpu_initialization=args.device == "cpu",
                       moe_token_dispatcher_type="alltoall" if args.device == "cuda" else "allgather",
                       moe_router_dtype=None)
    built = mla_transformer_config(transformer)
    return config, kwargs, built, dropped


def sdpa_core_attention():
    """A core-attention module for MLA built on torch's scaled_dot_product_attention (causal).

    megatron-core 0.16.1's local ``DotProductAttention`` does not take MLA's separate key/value widths
    (``k_channels``/``v_channels``); its MLA otherwise needs Transformer Engine, which does not travel as a small
    wheel. Inputs are ``[s, b, heads, dim]``; the output is ``[s, b, heads * v_dim]``.
    """
    import torch
    from megatron.core.transformer.module import MegatronModule

    class SDPACoreAttention(MegatronModule):
        def __init__(self, config, layer_number, attn_mask_type, attention_type, attention_dropout=None,
                     softmax_scale=None, k_channels=None, v_channels=None, cp_comm_type=None, pg_collection=None,
                     **_):
            super().__init__(config=config)
            self.softmax_scale = softmax_scale

        def forward(self, query, key, value, attention_mask=None, attn_mask_type=None, attention_bias=None,
                    packed_seq_params=None, **_):
            q, k, v = (t.permute(1, 2, 0, 3) for t in (query, key, value))  # [b, h, s, d]
            out = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True, scale=self.softmax_scale)
            s, b = query.shape[0], query.shape[1]
            return out.permute(2, 0, 1, 3).reshape(s, b, -1)

    return SDPACoreAttention


def main() -> int:
    args = parse_args()
    import torch
    import torch.distributed as dist

    from genolc.export.megatron import MegatronWindowDataset
    from genolc.export.skyrl import read_rows
    from genolc.units import parse_length

    seq_len = parse_length(args.seq)
    report: dict = {"seq_len": seq_len, "steps": args.steps, "device": args.device, "torch": torch.__version__}
    work = Path(args.work) if args.work else Path(tempfile.mkdtemp(prefix="genolc-megatron-step-"))
    t0 = time.time()
    data, export_dir = prepare_and_export(work, seq_len, args.windows)
    report["export_seconds"] = round(time.time() - t0, 2)
    rows = list(read_rows(export_dir))
    loader = MegatronWindowDataset(data, seq_len, args.windows, seed=0)
    same = all(np.array_equal(loader[i]["tokens"].numpy(), ids[:-1])
               and np.array_equal(loader[i]["loss_mask"].numpy(), mask[1:].astype(np.float32))
               for i, (ids, mask) in enumerate(rows))
    report["parquet_equals_megatron_loader"] = bool(same)

    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29517")
    dist.init_process_group("nccl" if args.device == "cuda" else "gloo", rank=0, world_size=1)
    from megatron.core import parallel_state, tensor_parallel
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec

    parallel_state.initialize_model_parallel(1, 1)
    from megatron.core.transformer import multi_latent_attention as mla
    import importlib.util
    if importlib.util.find_spec("transformer_engine") is None:
        # Without Transformer Engine, megatron-core 0.16.1's TE extension module still imports (TE replaced by a
        # mock), so MLA believes TE is there and isinstance(..., TELinear) fails on the mock; a class nothing is an
        # instance of restores the non-TE path.
        mla.TELinear = type("NoTransformerEngineLinear", (), {})
        # ... and its router GEMM reads a te_general_gemm it only defines when TE imports: say it is absent.
        from megatron.core.transformer.moe import moe_utils
        if not hasattr(moe_utils, "te_general_gemm"):
            moe_utils.te_general_gemm = None
    if args.device == "cpu":
        # megatron-core 0.16.1's MLA builds its rotary embedding on the current CUDA device; the CPU smoke run
        # asks for a CPU one.
        import functools

        mla.RotaryEmbedding = functools.partial(mla.RotaryEmbedding, use_cpu_initialization=True)
        # The MoE router allocates its expert-bias buffers on torch.cuda.current_device(); the CPU run says "cpu".
        torch.cuda.current_device = lambda: "cpu"
    device = torch.device("cuda", 0) if args.device == "cuda" else torch.device("cpu")
    if args.device == "cuda":
        torch.cuda.set_device(0)
        tensor_parallel.model_parallel_cuda_manual_seed(0)
    vocab = int(loader.dataset.tokenizer.vocab_size)
    config, kwargs, transformer, dropped = model_config(args, vocab, seq_len)
    report["dropped_for_plain_megatron_core"] = sorted(dropped) + sorted(kwargs["glm5_next_extension"])
    spec = get_gpt_layer_local_spec(num_experts=config.n_routed_experts, moe_grouped_gemm=False, qk_layernorm=True,
                                    multi_latent_attention=True, normalization="RMSNorm")
    spec.submodules.self_attention.submodules.core_attention = sdpa_core_attention()
    model = GPTModel(config=transformer, transformer_layer_spec=spec, vocab_size=vocab, max_sequence_length=seq_len,
                     position_embedding_type="none", share_embeddings_and_output_weights=False).to(device)
    report["parameters"] = sum(p.numel() for p in model.parameters())
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    losses = []
    if args.device == "cuda":
        torch.cuda.reset_peak_memory_stats()
    for step in range(args.steps):
        ids, mask = rows[step % len(rows)]
        tokens = torch.from_numpy(ids[:-1]).unsqueeze(0).to(device)
        labels = torch.from_numpy(ids[1:]).unsqueeze(0).to(device)
        loss_mask = torch.from_numpy(mask[1:].astype(np.float32)).unsqueeze(0).to(device)
        position_ids = torch.arange(tokens.shape[1], device=device).unsqueeze(0)
        t = time.time()
        per_token = model(tokens, position_ids, None, labels=labels)  # [b, s] cross-entropy, vocab-parallel
        loss = (per_token.float() * loss_mask).sum() / loss_mask.sum()
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        if args.device == "cuda":
            torch.cuda.synchronize()
        losses.append({"step": step, "loss": loss.item(), "seconds": round(time.time() - t, 3)})
        print(json.dumps(losses[-1]), flush=True)
    report["losses"] = losses
    report["finite"] = all(np.isfinite(entry["loss"]) for entry in losses)
    if args.device == "cuda":
        report["peak_memory_gib"] = round(torch.cuda.max_memory_allocated() / 2**30, 3)
        report["gpu"] = torch.cuda.get_device_name(0)
    Path(args.report).write_text(json.dumps(report, indent=2) + "\n")
    print(json.dumps({k: v for k, v in report.items() if k != "losses"}), flush=True)
    dist.destroy_process_group()
    return 0 if report["finite"] and report["parquet_equals_megatron_loader"] else 1


if __name__ == "__main__":
    sys.exit(main())
