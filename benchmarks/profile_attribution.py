"""Device time of a profiled step by the module and genolc function that launched it, forward and backward apart.

torch.profiler's kernel tables name kernels, not the code that asked for them: a ``bfloat16_copy`` or an inductor
``triton_poi_fused_...`` kernel could come from any layer. :func:`label_modules` wraps every submodule's forward in
a ``record_function`` range named by its path with layer numbers folded (``module: layers.*.mlp.gate
(TopKRouter)``), so each kernel's launching op has the module it ran in above it. Where the profiler also records
Python calls (``with_stack=True``; torch 2.13 on CPU does, torch 2.11 with CUDA gave none on the H200), the innermost
genolc function is named too. A backward op runs under ``autograd::engine::evaluate_function: XBackward0``, whose
``sequence_nr`` (with ``fwd_thread``) is that of the forward op which recorded the node; such kernels are charged to
that forward op's module and function, unless a range or genolc code is open inside the backward itself (a custom
autograd Function's Python ``backward``, a checkpoint's replay), which then names itself.

:func:`attribute_device_time` takes ``profiler.events()`` and returns rows of ``{pass, module, where, device_ms,
kernels, top_kernels}``. Pure Python over the events, so it runs on CPU profiles too (tests weigh events by their
CPU time there).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable

BACKWARD_NODE = "autograd::engine::evaluate_function: "
MODULE_RANGE = "module: "
_GENOLC_FRAME = re.compile(r"(?:^|/)genolc/(.+\.py\(\d+\): .+)$")
_MODULE_FRAME = re.compile(r"^nn\.Module: (.+?)(?:_\d+)?$")
_LAYER_NUMBER = re.compile(r"(?<=\.)\d+(?=\.|$)|^\d+(?=\.|$)")
UNKNOWN = "-"


def module_label(path: str, module) -> str:
    """``layers.3.mlp.gate`` -> ``layers.*.mlp.gate (TopKRouter)``: one label for a submodule of every layer."""
    return f"{_LAYER_NUMBER.sub('*', path) or '(model)'} ({type(module).__name__})"


def label_modules(model, name=None) -> list:
    """Open a ``record_function`` range around the forward of every submodule (the model's own included) that
    ``name(path, module)`` names (default: ``MODULE_RANGE`` + :func:`module_label`; None leaves a module out);
    returns the hook handles to remove."""
    import torch

    name = name or (lambda path, module: MODULE_RANGE + module_label(path, module))
    handles, open_ranges = [], {}

    def before(label, module, args):
        context = torch.profiler.record_function(label)
        context.__enter__()
        open_ranges.setdefault(id(module), []).append(context)

    def after(module, args, output):
        open_ranges[id(module)].pop().__exit__(None, None, None)

    for path, module in model.named_modules():
        label = name(path, module)
        if label is None:
            continue
        handles.append(module.register_forward_pre_hook(lambda m, a, label=label: before(label, m, a)))
        handles.append(module.register_forward_hook(after, always_call=True))
    return handles


def kernel_us(event) -> float:
    """Device microseconds of the kernels this event launched itself (its ``kernels`` list)."""
    return float(sum(kernel.duration for kernel in getattr(event, "kernels", ()) or ()))


def _ancestors(event):
    while event is not None:
        yield event
        event = event.cpu_parent


def _scan(event) -> tuple[str | None, str | None, object | None]:
    """(innermost genolc frame, innermost module, backward node) walking up from ``event``; the walk stops at the
    first backward node, so frames above it (the training loop calling ``backward()``) name nothing. A module is a
    :func:`label_modules` range or, failing one, the profiler's own ``nn.Module:`` frame (class only)."""
    where = module = None
    for ancestor in _ancestors(event):
        name = ancestor.name
        if name.startswith(BACKWARD_NODE):
            return where, module, ancestor
        if where is None:
            found = _GENOLC_FRAME.search(name)
            if found:
                where = found.group(1)
        if module is None:
            if name.startswith(MODULE_RANGE):
                module = name[len(MODULE_RANGE):]
            else:
                found = _MODULE_FRAME.match(name)
                if found:
                    module = found.group(1)
    return where, module, None


def forward_sites(events: Iterable) -> dict[tuple[int, int], tuple[str | None, str | None]]:
    """``(thread, sequence_nr) -> (where, module)`` of the forward op that recorded each autograd node. Every op run
    in grad mode records the number the next node will get, so the ops since the previous node share it with the
    one that creates the node: the last of them (in start order) is that op."""
    sites: dict[tuple[int, int], tuple[str | None, str | None]] = {}
    for event in sorted(events, key=lambda event: event.time_range.start):
        if event.sequence_nr is None or event.sequence_nr < 0 or event.name.startswith(BACKWARD_NODE):
            continue
        where, module, node = _scan(event)
        if node is None:
            sites[(event.thread, event.sequence_nr)] = (where, module)
    return sites


def _site(node, sites) -> tuple[str | None, str | None]:
    """The forward site of a backward node, or of the nearest enclosing node that has one (a backward that replays
    a forward and runs its own backward inside, as the segmented KDA op does, nests nodes without a forward op)."""
    while node is not None:
        thread = node.fwd_thread if node.fwd_thread is not None else node.thread
        found = sites.get((thread, node.sequence_nr))
        if found is not None:
            return found
        node = next((a for a in _ancestors(node.cpu_parent) if a.name.startswith(BACKWARD_NODE)), None)
    return None, None


def attribute_device_time(events, weight: Callable[[object], float] = kernel_us, top_kernels: int = 3
                          ) -> tuple[list[dict], float]:
    """Rows ``{pass, module, where, device_ms, kernels, top_kernels}`` sorted by time, and the total weight seen.

    ``weight(event)`` is the time to charge to an event (default: the device time of the kernels it launched);
    events weighing 0 are skipped. ``kernels`` counts the weighted events' kernels (the events themselves where
    they launched none, as on CPU)."""
    events = list(events)
    sites = forward_sites(events)
    rows: dict[tuple[str, str, str], dict] = {}
    total = 0.0
    for event in events:
        time_us = weight(event)
        if time_us <= 0:
            continue
        total += time_us
        where, module, node = _scan(event)
        if node is None:
            phase = "forward"
        else:
            phase = "backward"
            site_where, site_module = _site(node, sites)
            if module is None:
                where, module = where or site_where, site_module
            if where is None and module is None:
                where = f"(no forward site) {node.name[len(BACKWARD_NODE):]}"
        key = (phase, module or UNKNOWN, where or UNKNOWN)
        row = rows.setdefault(key, {"pass": phase, "module": key[1], "where": key[2], "device_ms": 0.0,
                                    "kernels": 0, "by_kernel": {}})
        row["device_ms"] += time_us / 1e3
        launched = getattr(event, "kernels", ()) or ()
        row["kernels"] += len(launched) or 1
        for kernel in launched or [event]:
            name = kernel.name[:120]
            spent = kernel.duration if launched else time_us
            row["by_kernel"][name] = row["by_kernel"].get(name, 0.0) + spent / 1e3
    ranked = sorted(rows.values(), key=lambda row: -row["device_ms"])
    for row in ranked:
        by_kernel = row.pop("by_kernel")
        row["device_ms"] = round(row["device_ms"], 2)
        row["top_kernels"] = [{"name": name, "device_ms": round(ms, 2)}
                              for name, ms in sorted(by_kernel.items(), key=lambda item: -item[1])[:top_kernels]]
    return ranked, total
