"""``genolc eval --routing``: a checkpoint's MoE routing on held-out DNA, by context length, on the same bases.

The same stretches of held-out sequence (each as long as the longest ``--seq`` length) are cut into windows of each
length: 64k tokens are 64 windows of 1k, 16 of 4k or one of 64k. Each length's windows run through the model in one
forward per stretch while :func:`genolc.routing.capture_routing` tallies every MoE layer; the dispatch groups of
``group_tokens`` then hold ``group_tokens / length`` windows. Outputs (atomically, in ``out``): ``routing.json``
(the figures of :mod:`genolc.routing` per length and layer), ``routing.csv`` (one row per length and layer) and
``routing_load.png`` (a layer x expert load heatmap per length); the run record's outputs carry the same figures.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import numpy as np

from genolc.errors import ConfigError
from genolc.eval.config import RoutingConfig
from genolc.routing import capture_routing, plot_load_heatmap, routing_summary
from genolc.signals import Interrupted, StopSignals
from genolc.units import format_length


def run_routing(config: RoutingConfig, record: Any | None = None) -> dict[str, Any]:
    """Route ``config.budget`` held-out tokens at each length and write the report into ``config.out``.

    Raises :class:`genolc.signals.Interrupted` when stopped by a signal: the first finishes the current stretch;
    the context lengths whose stretches are all routed are written, marked interrupted (a length cut short would
    not route the same bases as the others, so it is left out). A second signal stops at once, writing nothing.
    """
    from genolc.eval.report import OUTPUT_KIND
    from genolc.fsutil import check_output_dir

    check_output_dir(config.out, OUTPUT_KIND)
    try:
        return _run_routing(config, record)
    except KeyboardInterrupt:
        raise Interrupted.at_once("eval --routing", where=str(config.out)) from None


def _run_routing(config: RoutingConfig, record: Any | None) -> dict[str, Any]:
    from genolc.data.sampler import tile_for_eval
    from genolc.eval.report import OUTPUT_KIND
    from genolc.eval.setup import load_scorers, open_records
    from genolc.fsutil import atomic_dir

    t0 = time.monotonic()
    longest = config.lengths[-1]
    opened = open_records(config, longest)
    dataset, keys = opened.dataset, opened.keys
    stretches = [w for w in tile_for_eval(dataset, keys, longest, max_n_fraction=config.max_n_fraction)
                 if not w.partial][: config.budget // longest]
    if len(stretches) < config.budget // longest:
        raise ConfigError(f"only {len(stretches)} stretch(es) of {format_length(longest)} tokens in "
                          f"{', '.join(keys)} pass the N filter; {config.budget // longest} are needed for "
                          f"{config.budget} tokens per length", where="--max-tokens",
                          fix="lower --max-tokens or the longest --seq length")
    scorer = load_scorers(config, dataset.tokenizer)["model"]
    spans = [np.asarray(dataset.tokens(w.key)[w.start:w.start + longest], dtype=np.int64) for w in stretches]
    by_length: dict[str, dict[str, Any]] = {}
    seconds_by_length: dict[str, float] = {}
    with StopSignals("finishing the current stretch, then writing the context lengths routed so far") as stop:
        for length in config.lengths:
            if stop.received is not None:
                break
            started, routed = time.monotonic(), 0
            with capture_routing(scorer.model, config.group_tokens) as tallies:
                for span in spans:
                    scorer(span.reshape(-1, length))
                    routed += 1
                    if stop.received is not None:
                        break
            if routed < len(spans):
                break
            by_length[format_length(length)] = routing_summary(tallies)
            seconds_by_length[format_length(length)] = round(time.monotonic() - started, 3)
    interrupted = len(by_length) < len(config.lengths)
    if interrupted and not by_length:
        raise Interrupted(f"eval --routing stopped by {stop.name} before the first context length was routed; "
                          "nothing was written", stop.received, where=str(config.out), fix="run it again")
    if not any(by_length.values()):
        raise ConfigError("the checkpoint has no MoE layer: there is no routing to report",
                          where=str(config.checkpoint), fix="evaluate a checkpoint of an MoE preset")
    summary = {"status": "interrupted" if interrupted else "ok", "config": config.to_dict(), "records": keys,
               "tokens_per_length": config.budget,
               # Interrupted: the first of the asked lengths, each routed over every stretch.
               "lengths": {"asked": [format_length(n) for n in config.lengths], "routed": list(by_length)},
               "stretches": [{"key": w.key, "start": w.start, "stop": w.start + longest} for w in stretches],
               "dataset": {"path": str(config.data)}, "routing": by_length,
               "seconds_by_length": seconds_by_length, "seconds": time.monotonic() - t0}
    if record is not None:
        record.add_input(Path(config.data) / "manifest.json")
        for file in sorted(Path(config.checkpoint).glob("*.safetensors")) + [Path(config.checkpoint) / "config.json"]:
            record.add_input(file)
        record.outputs["routing"] = by_length
    with atomic_dir(config.out, OUTPUT_KIND) as tmp:
        (tmp / "routing.json").write_text(json.dumps(summary, indent=2) + "\n")
        routing_table(by_length).to_csv(tmp / "routing.csv", index=False)
        plot_load_heatmap(by_length, tmp / "routing_load.png",
                          f"{'INTERRUPTED: ' if interrupted else ''}expert load by context length "
                          f"({config.budget} tokens each, dispatch group {format_length(config.group_tokens)})")
    if interrupted:
        raise Interrupted(f"eval --routing stopped by {stop.name} after {len(by_length)} of {len(config.lengths)} "
                          "context lengths; their routing is written, marked interrupted (routing.json: status, "
                          "lengths.routed)", stop.received, where=str(config.out),
                          fix="run it again to route every length", kept=summary)
    return summary


def routing_table(by_length: dict[str, dict[str, Any]]):
    """One row per context length and MoE layer: busiest/mean, router entropy, drop share per capacity factor."""
    import pandas as pd

    rows = []
    for length, layers in by_length.items():
        for layer, figures in layers.items():
            row = {"context": length, "layer": int(layer), "tokens": figures["tokens"], "groups": figures["groups"],
                   "busiest_over_mean": figures["busiest_over_mean"], "router_entropy": figures["router_entropy"]}
            row.update({f"drop_c{c}": share for c, share in figures["drop_share"].items()})
            rows.append(row)
    return pd.DataFrame(rows)
