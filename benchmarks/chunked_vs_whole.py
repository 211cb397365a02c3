"""Where the chunk-recurrent step's gradients part from the whole window's, on the GPU (issue 14).

    python3 benchmarks/chunked_vs_whole.py --model small --seq 64k --chunk 16k [--json OUT]

tests/gpu/test_chunked_step_fast.py asks the chunked step's gradients to be within 1e-2 (relative L2, all
parameters) of one whole-window step with recompute. When it fails, this script says which part of the step is
responsible: one model, one window (random 4-letter ids, as the test's), and these gradient sets, each compared
with the whole window (layers checkpointed, as the test's: `small` at 64k does not fit without):

    chunked, chunked again        the step as it runs, and its run-to-run spread
    chunked, recompute            the step with its layers checkpointed (finetune's choice at some lengths)
    whole, whole again            the reference, and its own run-to-run spread
    chunked, no weight copies     genolc.train.chunked without ops/weight_casts.py's one copy per micro-batch
    eager MoE glue                chunked and whole with the routed experts' glue as torch formulas (ops/moe/op.py)
    torch.topk selection          chunked and whole with the indexer's pools chosen by torch.topk, not the kernel

Per comparison: the relative L2 error over all parameters, the parameters that hold most of the error's square,
and the worst relative errors. ``--spread N`` instead asks how far identical steps land apart: N chunked steps with
the weight copies and N without, compared pairwise (benchmarks/forward_determinism.py finds which module makes
identical forwards differ). Needs CUDA (the kernels under test).
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from genolc.model import build_model, preset  # noqa: E402
from genolc.model.ops.moe import op as moe_op  # noqa: E402
from genolc.train import chunked as chunked_module  # noqa: E402
from genolc.train.apply import apply_recompute  # noqa: E402
from genolc.train.loss import LossTerms, micro_batch_loss  # noqa: E402
from genolc.errors import ConfigError  # noqa: E402
from genolc.units import parse_length  # noqa: E402


def autocast():
    return torch.autocast("cuda", dtype=torch.bfloat16)


def gradients(model) -> dict[str, torch.Tensor]:
    grads = {name: p.grad.detach().float().clone() for name, p in model.named_parameters() if p.grad is not None}
    model.zero_grad(set_to_none=True)
    return grads


def chunked_step(model, ids, weights, terms, chunk) -> dict[str, torch.Tensor]:
    chunked_module.chunked_forward_backward(model, ids, weights, terms, chunk, autocast)
    return gradients(model)


def whole_step(model, ids, weights, terms) -> dict[str, torch.Tensor]:
    with autocast():
        out = model(ids[:, :-1], indexer_loss=terms.indexer_mode)
    micro_batch_loss(out, ids[:, 1:], weights, terms).loss.backward()
    del out
    return gradients(model)


def compare(test: dict[str, torch.Tensor], reference: dict[str, torch.Tensor]) -> dict:
    if set(test) != set(reference):
        return {"error": f"gradient sets differ: {sorted(set(test) ^ set(reference))[:8]}"}
    squares = {name: float(((test[name] - reference[name]) ** 2).sum()) for name in reference}
    total_square = sum(float((g ** 2).sum()) for g in reference.values())
    relative = {name: float((test[name] - reference[name]).norm() / reference[name].norm().clamp_min(1e-30))
                for name in reference}
    error_square = sum(squares.values())
    return {
        "relative_l2_all": (error_square / total_square) ** 0.5,
        "largest_share_of_error": [(name, round(value / max(error_square, 1e-300), 4))
                                   for name, value in sorted(squares.items(), key=lambda kv: -kv[1])[:8]],
        "worst_relative": [(name, round(value, 4))
                           for name, value in sorted(relative.items(), key=lambda kv: -kv[1])[:8]],
    }


@contextlib.contextmanager
def patched(module, name: str, replacement):
    original = getattr(module, name)
    setattr(module, name, replacement)
    try:
        yield
    finally:
        setattr(module, name, original)


@contextlib.contextmanager
def eager_moe_glue():
    from genolc.model.ops.moe import triton as moe_triton   # imports Triton: CUDA only

    with contextlib.ExitStack() as stack:
        stack.enter_context(patched(moe_triton, "swiglu", moe_op.swiglu_formula))
        stack.enter_context(patched(moe_triton, "swiglu_backward", moe_op.swiglu_backward_formula))
        stack.enter_context(patched(moe_triton, "combine", moe_op.combine_formula))
        stack.enter_context(patched(moe_triton, "combine_backward", moe_op.combine_backward_formula))
        yield


def torch_topk():
    from genolc.model.ops.indexer import triton as indexer_triton

    return patched(indexer_triton, "streamed_select",
                   functools.partial(indexer_triton.streamed_select, fused_topk=False))


def no_weight_copies():
    return patched(chunked_module, "weight_casts_per_step", contextlib.nullcontext)


def spread(model, ids, weights, terms, chunk, repeats: int) -> dict:
    steps = {}
    for i in range(repeats):
        steps[f"chunked {i}"] = chunked_step(model, ids, weights, terms, chunk)
        with no_weight_copies():
            steps[f"chunked, no weight copies {i}"] = chunked_step(model, ids, weights, terms, chunk)
        print(f"steps {i} done", flush=True)
    names = list(steps)
    pairs = {f"{a} vs {b}": compare(steps[a], steps[b])["relative_l2_all"]
             for k, a in enumerate(names) for b in names[k + 1:]}
    for pair, error in pairs.items():
        print(f"{pair}: relative L2 {error:.3e}")
    return {"step_pairs": pairs}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="small")
    parser.add_argument("--seq", default="64k")
    parser.add_argument("--chunk", default="16k")
    parser.add_argument("--json", type=Path)
    parser.add_argument("--spread", type=int, default=0, metavar="N",
                        help="identical steps' spread instead of the variants: N chunked steps with and N without the "
                             "weight copies")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        parser.error("needs CUDA: this compares the fast kernels' chunked step with the whole window")
    try:
        length, chunk = parse_length(args.seq, "--seq"), parse_length(args.chunk, "--chunk")
    except ConfigError as error:
        parser.error(str(error))
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)

    torch.manual_seed(0)
    model = build_model(preset(args.model)).cuda()
    generator = torch.Generator().manual_seed(0)
    ids = torch.randint(0, 4, (1, length + 1), generator=generator).cuda()
    weights = torch.ones(1, length, device="cuda")
    weights[0, 1000:1500] = 0.0
    terms = LossTerms(total_weight=float(weights.sum()), grad_accum=1, moe_balance_coef=0.01, indexer_kl_coef=1.0,
                      indexer_mode="sparse")

    if args.spread:
        found = spread(model, ids, weights, terms, chunk, args.spread)
        if args.json:
            args.json.write_text(json.dumps({"args": vars(args) | {"json": str(args.json)}, "spread": found},
                                            indent=1))
        return 0

    runs: dict[str, dict[str, torch.Tensor]] = {}
    seconds: dict[str, float] = {}

    def run(name: str, step, *context):
        started = time.monotonic()
        with contextlib.ExitStack() as stack:
            for make in context:
                stack.enter_context(make())
            runs[name] = step()
        torch.cuda.synchronize()
        seconds[name] = round(time.monotonic() - started, 1)
        print(f"{name}: {seconds[name]} s", flush=True)

    chunked_run = functools.partial(chunked_step, model, ids, weights, terms, chunk)
    whole_run = functools.partial(whole_step, model, ids, weights, terms)
    run("chunked", chunked_run)
    run("chunked again", chunked_run)
    run("chunked, no weight copies", chunked_run, no_weight_copies)
    run("chunked, eager MoE glue", chunked_run, eager_moe_glue)
    run("chunked, torch.topk", chunked_run, torch_topk)
    apply_recompute(model)
    run("whole", whole_run)
    run("whole again", whole_run)
    run("whole, eager MoE glue", whole_run, eager_moe_glue)
    run("whole, torch.topk", whole_run, torch_topk)
    run("chunked, recompute", chunked_run)

    pairs = [("chunked", "whole"), ("chunked again", "chunked"), ("whole again", "whole"),
             ("chunked, no weight copies", "whole"), ("chunked, no weight copies", "chunked"),
             ("chunked, eager MoE glue", "whole, eager MoE glue"), ("whole, eager MoE glue", "whole"),
             ("chunked, torch.topk", "whole, torch.topk"), ("whole, torch.topk", "whole"),
             ("chunked, recompute", "whole"), ("chunked, recompute", "chunked")]
    report = {}
    for test, reference in pairs:
        report[f"{test} vs {reference}"] = found = compare(runs[test], runs[reference])
        print(f"\n{test} vs {reference}: relative L2 {found.get('relative_l2_all', float('nan')):.3e}")
        print("  most of the error:", found.get("largest_share_of_error"))
        print("  worst relative:", found.get("worst_relative"))
    if args.json:
        args.json.write_text(json.dumps({"args": vars(args) | {"json": str(args.json)}, "seconds": seconds,
                                         "comparisons": report}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
