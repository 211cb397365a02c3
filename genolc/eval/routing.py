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
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from genolc.errors import ConfigError
from genolc.routing import DEFAULT_GROUP_TOKENS, capture_routing, plot_load_heatmap, routing_summary
from genolc.signals import Interrupted, StopSignals
from genolc.units import format_length


@dataclass(frozen=True)
class RoutingConfig:
    data: Path
    checkpoint: Path
    out: Path
    lengths: tuple[int, ...]                   # context lengths compared (tokens per window)
    records: str = "heldout"                   # CHROM[,CHROM…] or every held-out record
    group_tokens: int = DEFAULT_GROUP_TOKENS   # tokens per dispatch group (the capacity's budget)
    max_tokens: int | None = None              # tokens routed per length (default: one dispatch group)
    max_n_fraction: float = 0.5
    force: bool = False
    device: str = "auto"
    dtype: str = "auto"
    batch_tokens: int = 1 << 16
    progress: bool = True

    def __post_init__(self) -> None:
        lengths = tuple(sorted(set(int(n) for n in self.lengths)))
        if not lengths or lengths[0] < 2:
            raise ConfigError(f"--routing needs context lengths of at least 2 tokens, got {list(self.lengths)}",
                              where="--seq", fix="e.g. --seq 1k,4k,16k")
        bad = [n for n in lengths if lengths[-1] % n]
        if bad:
            raise ConfigError(f"context length(s) {[format_length(n) for n in bad]} do not divide the longest, "
                              f"{format_length(lengths[-1])}: the lengths must cut the same stretches of DNA",
                              where="--seq", fix="use lengths such as 1k,4k,16k")
        if self.group_tokens <= 0:
            raise ConfigError(f"the dispatch group must hold at least one token, got {self.group_tokens}",
                              where="--routing-group")
        object.__setattr__(self, "lengths", lengths)

    @property
    def budget(self) -> int:
        """Tokens routed per length: whole stretches of the longest length, at least one."""
        want = self.max_tokens or self.group_tokens
        return max(1, want // self.lengths[-1]) * self.lengths[-1]

    def to_dict(self) -> dict[str, Any]:
        return {k: (str(v) if isinstance(v, Path) else list(v) if isinstance(v, tuple) else v)
                for k, v in asdict(self).items()}


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
    from genolc.data.dataset import PreparedDataset
    from genolc.data.sampler import tile_for_eval
    from genolc.eval.inputs import check_not_trained, check_window_fits, resolve_records
    from genolc.eval.report import OUTPUT_KIND
    from genolc.eval.scorer import load_model_scorer
    from genolc.fsutil import atomic_dir

    t0 = time.monotonic()
    dataset = PreparedDataset(config.data)
    keys, pooled = resolve_records(dataset, config.records)
    check_not_trained(dataset, keys, [("checkpoint", config.checkpoint)], config.force)
    longest = config.lengths[-1]
    keys, _ = check_window_fits(dataset, keys, longest, pooled)
    stretches = [w for w in tile_for_eval(dataset, keys, longest, max_n_fraction=config.max_n_fraction)
                 if not w.partial][: config.budget // longest]
    if len(stretches) < config.budget // longest:
        raise ConfigError(f"only {len(stretches)} stretch(es) of {format_length(longest)} tokens in "
                          f"{', '.join(keys)} pass the N filter; {config.budget // longest} are needed for "
                          f"{config.budget} tokens per length", where="--max-tokens",
                          fix="lower --max-tokens or the longest --seq length")
    scorer = load_model_scorer(config.checkpoint, dataset.tokenizer, device=config.device, dtype=config.dtype,
                               batch_tokens=config.batch_tokens)
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
