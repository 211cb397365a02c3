"""benchmarks/profile_attribution.py: kernels charged to the genolc function that launched them, the backward's to
the forward op that recorded its autograd node, on hand-built profiler event trees (torch's own FunctionEvent)."""

from __future__ import annotations

import sys
from pathlib import Path

from torch.autograd.profiler_util import FunctionEvent

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))

from profile_attribution import attribute_device_time, label_modules, module_label  # noqa: E402

_ids = iter(range(1, 10_000))


def _event(name: str, parent: FunctionEvent | None = None, *, thread: int = 1, sequence_nr: int = -1,
           fwd_thread: int | None = None, kernels: tuple[tuple[str, float], ...] = ()) -> FunctionEvent:
    event = FunctionEvent(id=next(_ids), name=name, thread=thread, start_us=0, end_us=1, sequence_nr=sequence_nr,
                          fwd_thread=fwd_thread)
    for kernel, duration in kernels:
        event.append_kernel(kernel, 0, duration)
    if parent is not None:
        event.set_cpu_parent(parent)
        parent.append_cpu_child(event)
    return event


def _step() -> list[FunctionEvent]:
    loop = _event("/repo/genolc/train/chunked.py(78): _chunked_forward_backward")
    layer = _event("nn.Module: DecoderLayer_0", loop)
    layer_forward = _event("/repo/genolc/model/model.py(72): forward", layer)
    hyper = _event("nn.Module: HyperConnection_3", layer_forward)
    hyper_forward = _event("/repo/genolc/model/layers/mhc.py(47): forward", hyper)
    linear = _event("aten::linear", hyper_forward, sequence_nr=5)
    matmul = _event("aten::mm", linear, sequence_nr=5, kernels=(("nvjet_fwd", 10_000.0),))
    attention = _event("/repo/genolc/model/ops/dsa/triton.py(150): forward", layer_forward)
    apply = _event("SparseLatentAttention", attention, sequence_nr=9)
    loss = _event("aten::nll_loss", loop, sequence_nr=11, kernels=(("nll_fwd", 1_000.0),))

    engine = _event("<built-in method run_backward>", loop, thread=2)
    mm_node = _event("autograd::engine::evaluate_function: MmBackward0", engine, thread=2, sequence_nr=5,
                     fwd_thread=1)
    mm_backward = _event("aten::mm", mm_node, thread=2, kernels=(("nvjet_bwd", 20_000.0), ("nvjet_bwd", 5_000.0)))
    dsa_node = _event("autograd::engine::evaluate_function: SparseLatentAttentionBackward", engine, thread=2,
                      sequence_nr=9, fwd_thread=1)
    dsa_backward = _event("/repo/genolc/model/ops/dsa/triton.py(200): backward", dsa_node, thread=2)
    kernel_call = _event("aten::empty", dsa_backward, thread=2, kernels=(("sparse_latent_bwd_kernel", 30_000.0),))
    orphan_node = _event("autograd::engine::evaluate_function: FooBackward0", engine, thread=2, sequence_nr=99,
                         fwd_thread=1)
    orphan = _event("aten::add", orphan_node, thread=2, kernels=(("add_kernel", 2_000.0),))
    return [loop, layer, layer_forward, hyper, hyper_forward, linear, matmul, attention, apply, loss, engine,
            mm_node, mm_backward, dsa_node, dsa_backward, kernel_call, orphan_node, orphan]


def test_backward_kernels_are_charged_to_the_forward_site_not_the_training_loop():
    rows, total = attribute_device_time(_step())
    assert total == 68_000.0
    by_key = {(row["pass"], row["module"], row["where"]): row for row in rows}
    forward = by_key[("forward", "HyperConnection", "model/layers/mhc.py(47): forward")]
    assert forward["device_ms"] == 10.0 and forward["kernels"] == 1
    backward = by_key[("backward", "HyperConnection", "model/layers/mhc.py(47): forward")]
    assert backward["device_ms"] == 25.0 and backward["kernels"] == 2
    assert backward["top_kernels"] == [{"name": "nvjet_bwd", "device_ms": 25.0}]
    # genolc code inside the backward (a custom Function's Python backward) names itself.
    assert ("backward", "DecoderLayer", "model/ops/dsa/triton.py(200): backward") in by_key
    assert ("backward", "-", "(no forward site) FooBackward0") in by_key
    assert ("forward", "-", "train/chunked.py(78): _chunked_forward_backward") in by_key
    assert [row["device_ms"] for row in rows] == sorted((row["device_ms"] for row in rows), reverse=True)
    assert not any("chunked" in row["where"] for row in rows if row["pass"] == "backward")


def test_a_weight_function_charges_cpu_time_where_no_kernels_ran():
    events = _step()
    rows, total = attribute_device_time(events, weight=lambda event: 4_000.0 if event.name == "aten::linear" else 0.0)
    assert total == 4_000.0
    assert rows == [{"pass": "forward", "module": "HyperConnection", "where": "model/layers/mhc.py(47): forward",
                     "device_ms": 4.0, "kernels": 1, "top_kernels": [{"name": "aten::linear", "device_ms": 4.0}]}]


def test_module_ranges_name_the_submodule_of_every_layer_and_reach_the_backward():
    import torch

    from genolc.model import build_model, preset

    assert module_label("layers.11.mlp.gate", torch.nn.Linear(1, 1)) == "layers.*.mlp.gate (Linear)"
    assert module_label("", torch.nn.Linear(1, 1)) == "(model) (Linear)"
    torch.manual_seed(0)
    model = build_model(preset("tiny"))
    ids = torch.randint(0, 4, (1, 64))
    handles = label_modules(model)
    try:
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as profiler:
            model(ids).logits.float().square().mean().backward()
    finally:
        for handle in handles:
            handle.remove()
    assert all(not hook for m in model.modules() for hook in (m._forward_hooks, m._forward_pre_hooks))
    rows, _ = attribute_device_time(
        profiler.events(), weight=lambda e: e.self_cpu_time_total if e.name.startswith("aten::") else 0.0)
    modules = {(row["pass"], row["module"]) for row in rows}
    # A projection's matmul in both passes: the backward's charged through its node to the forward's range.
    assert ("forward", "layers.*.self_attn.o_proj (Linear)") in modules
    assert ("backward", "layers.*.self_attn.o_proj (Linear)") in modules
    assert ("backward", "layers.*.mlp.gate (TopKRouter)") in modules


def test_a_node_belongs_to_the_last_op_with_its_number_and_nested_nodes_to_their_encloser():
    """Ops run in grad mode record the number the next node gets, so an op of another module that created no node
    can share the number with the op that did, before it; a node replayed inside another's backward (the segmented
    KDA op) has no forward op and is charged to the node around it."""
    loop = _event("/repo/genolc/train/chunked.py(78): _chunked_forward_backward")
    router = _event("module: layers.*.mlp.gate (TopKRouter)", loop)
    _event("aten::topk", router, sequence_nr=7)
    kda = _event("module: layers.*.self_attn (KimiDeltaAttention)", loop)
    _event("SegmentedKDA", kda, sequence_nr=7)
    engine = _event("<built-in method run_backward>", loop, thread=2)
    outer = _event("autograd::engine::evaluate_function: SegmentedKDABackward", engine, thread=2, sequence_nr=7,
                   fwd_thread=1)
    replay = _event("autograd::engine::evaluate_function: ChunkKDAFunctionBackward", outer, thread=2,
                    sequence_nr=40, fwd_thread=2)
    kernel_call = _event("aten::empty", replay, thread=2, kernels=(("chunk_kda_bwd_kernel_intra", 3_000.0),))
    events = [loop, router, *router.cpu_children, kda, *kda.cpu_children, engine, outer, replay, kernel_call]
    rows, total = attribute_device_time(events)
    assert total == 3_000.0
    assert [(row["pass"], row["module"]) for row in rows] == [("backward", "layers.*.self_attn (KimiDeltaAttention)")]


def test_label_modules_opens_ranges_only_for_the_modules_named():
    import torch

    from genolc.model import build_model, preset

    model = build_model(preset("tiny"))
    handles = label_modules(model, lambda path, module: f"forward:{type(module).__name__}"
                            if type(module).__name__ == "TopKRouter" else None)
    try:
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as profiler:
            model(torch.randint(0, 4, (1, 32)))
    finally:
        for handle in handles:
            handle.remove()
    ranges = {event.name for event in profiler.events() if event.name.startswith(("forward:", "module: "))}
    assert ranges == {"forward:TopKRouter"}
    assert len(handles) == 2 * sum(1 for m in model.modules() if type(m).__name__ == "TopKRouter")
