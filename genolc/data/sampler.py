"""Training windows and evaluation tiling over a prepared dataset.

All lengths and positions count tokens; base coordinates come from the dataset (multi-base tokenizers map
tokens to bases there). A training window holds ``seq_len + 1`` tokens so the model input is exactly ``seq_len``
(input = window[:-1], targets = window[1:]); evaluation windows have the same size for the same reason.

Training windows are a pure function of ``(seed, step, micro, dp_rank)``: nothing is carried between calls, so
resuming at step ``s`` reproduces exactly the windows an uninterrupted run would have drawn. Start positions are
uniform over every valid start in the train records (records weighted by their number of valid starts).
Data-parallel ranks are stratified: one uniform number ``u`` is drawn from ``(seed, step, micro)`` and rank ``r``
owns the ``1 / dp_size`` of all valid starts that begins at quantile ``(u + r / dp_size) mod 1``; its window and any
redraws (N filter, keyed on ``dp_rank`` and the attempt) stay inside that stratum, so ranks at one step never share
or overlap a window while the data holds ``dp_size`` windows. A stratum can lie wholly inside an assembly gap (hg38
chr1 has an 18 Mb N run; with chr1+chr2 and 32 ranks a stratum is 15 Mb), so after ``STRATUM_DRAWS`` rejected draws
the rank redraws over all starts instead: its window may then overlap another rank's, which beats failing the step.
Context-parallel ranks of one group share their window, so the sampler takes no context-parallel rank: each CP rank
builds it with its DP rank and the trainer splits the window (genolc/parallel/step.py).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Protocol, Sequence

import numpy as np

from genolc.data.targets import window_targets
from genolc.errors import ConfigError
from genolc.units import parse_length

SAMPLER_STATE_VERSION = 1
# Draws per window before giving up on the N filter; at max_n_fraction=0.1 on hg38 (about 5% N overall, in long
# runs) almost every draw passes, so exhausting this many means the filter cannot be met on this data.
MAX_DRAWS = 64
# Draws kept inside the rank's stratum before redrawing over every start (a stratum may be all N).
STRATUM_DRAWS = MAX_DRAWS // 2
# Ambiguity is scanned in blocks this many tokens long so tiling chr1 does not hold a 250 M-entry mask at once.
_SCAN_BLOCK = 1 << 24


class DatasetLike(Protocol):
    """What the samplers need from :class:`genolc.data.dataset.PreparedDataset`."""

    manifest: dict
    tokenizer: Any

    def keys(self, split: str | None = None) -> list[str]: ...
    def record(self, key: str) -> dict: ...
    def tokens(self, key: str) -> np.ndarray: ...
    def token_base_offsets(self, key: str, start: int, stop: int) -> np.ndarray: ...
    def token_ambiguous(self, key: str, start: int, stop: int) -> np.ndarray: ...


@dataclass(frozen=True)
class Window:
    """A training window: tokens ``[start, stop)`` of record ``key``, reverse-complemented when flagged."""

    key: str
    start: int
    stop: int
    reverse_complement: bool

    def __len__(self) -> int:
        return self.stop - self.start


def _as_seq_len(seq_len: int | str) -> int:
    value = parse_length(seq_len, what="sequence length")
    if value < 1:
        raise ConfigError(f"sequence length must be at least 1 token, got {seq_len!r}")
    return value


def _check_fraction(value: float, name: str) -> float:
    value = float(value)
    if not 0.0 <= value <= 1.0 or math.isnan(value):
        raise ConfigError(f"{name} must be between 0 and 1, got {value}", fix=f"pass e.g. {name}=0.1")
    return value


class TrainSampler:
    """Seeded, resumable, data-parallel-aware windows of ``seq_len + 1`` tokens from a dataset's train records."""

    def __init__(
        self,
        dataset: DatasetLike,
        seq_len: int | str,
        *,
        seed: int = 0,
        max_n_fraction: float = 0.1,
        reverse_complement: bool = False,
        dp_rank: int = 0,
        dp_size: int = 1,
    ) -> None:
        self.dataset = dataset
        self.seq_len = _as_seq_len(seq_len)
        self.window_tokens = self.seq_len + 1
        self.seed = int(seed)
        if self.seed < 0:
            raise ConfigError(f"seed must be a non-negative integer, got {seed}")
        self.max_n_fraction = _check_fraction(max_n_fraction, "max_n_fraction")
        self.reverse_complement = bool(reverse_complement)
        if dp_size < 1 or not 0 <= dp_rank < dp_size:
            raise ConfigError(f"data-parallel rank {dp_rank} is outside a group of size {dp_size}",
                              fix="ranks count from 0 to size - 1")
        self.dp_rank, self.dp_size = int(dp_rank), int(dp_size)

        keys = list(dataset.keys("train"))
        if not keys:
            raise ConfigError("the dataset has no train records", where=_dataset_where(dataset),
                              fix="prepare it with --train naming at least one chromosome")
        lengths = {k: int(dataset.record(k)["length_tokens"]) for k in keys}
        self.train_lengths = lengths
        usable = [(k, n - self.window_tokens + 1) for k, n in lengths.items() if n >= self.window_tokens]
        if not usable:
            longest_key = max(lengths, key=lengths.__getitem__)
            raise ConfigError(
                f"a window of {self.window_tokens} tokens (seq_len {self.seq_len} + 1) is longer than every train "
                f"chromosome; the longest, {longest_key}, has {lengths[longest_key]} tokens",
                where=_dataset_where(dataset),
                fix=f"use --seq {lengths[longest_key] - 1} or less, or add longer train chromosomes",
            )
        self._keys = [k for k, _ in usable]
        counts = np.array([c for _, c in usable], dtype=np.int64)
        # cumulative valid starts: record i owns global start indices [cum[i], cum[i+1])
        self._cum = np.concatenate([[0], np.cumsum(counts)])
        self.total_starts = int(self._cum[-1])

    def _generator(self, *words: int) -> np.random.Generator:
        # Philox is counter-based: a key built from the words gives an independent stream with no shared state.
        return np.random.Generator(np.random.Philox(np.random.SeedSequence([self.seed, *words])))

    def _locate(self, index: int) -> tuple[str, int]:
        rec = int(np.searchsorted(self._cum, index, side="right")) - 1
        return self._keys[rec], index - int(self._cum[rec])

    def _candidate(self, step: int, micro: int, attempt: int) -> tuple[str, int]:
        # Rank r owns the stratum of start indices beginning at quantile (u + r / dp_size); its first draw is the
        # stratum's first start and redraws (N filter) stay inside the stratum minus its last window, so windows
        # of different ranks cannot overlap whenever each stratum holds at least one window.
        total = self.total_starts
        u = self._generator(0, step, micro).random()
        low = int(((u + self.dp_rank / self.dp_size) % 1.0) * total)
        offset = 0
        if attempt > 0:
            stratum = total // self.dp_size
            span = stratum - self.window_tokens + 1 if stratum >= self.window_tokens else max(1, stratum)
            if attempt >= STRATUM_DRAWS:
                span = total
            offset = int(self._generator(2, step, micro, self.dp_rank, attempt).random() * span)
        return self._locate((low + offset) % total)

    def n_fraction(self, key: str, start: int, stop: int) -> float:
        return float(np.count_nonzero(self.dataset.token_ambiguous(key, start, stop))) / max(1, stop - start)

    def window(self, step: int, micro: int = 0) -> Window:
        """The window for optimizer ``step`` and micro-batch ``micro`` on this data-parallel rank."""
        if step < 0 or micro < 0:
            raise ConfigError(f"step and micro must be non-negative, got step={step}, micro={micro}")
        worst = 0.0
        for attempt in range(MAX_DRAWS):
            key, start = self._candidate(step, micro, attempt)
            stop = start + self.window_tokens
            frac = self.n_fraction(key, start, stop)
            if frac <= self.max_n_fraction:
                rc = False
                if self.reverse_complement:
                    rc = bool(self._generator(1, step, micro, self.dp_rank).random() < 0.5)
                return Window(key, start, stop, rc)
            worst = max(worst, frac)
        raise ConfigError(
            f"no training window of {self.window_tokens} tokens passed the N filter (max_n_fraction "
            f"{self.max_n_fraction}) in {MAX_DRAWS} draws at step {step}; the worst had {worst:.1%} ambiguous tokens",
            where=_dataset_where(self.dataset),
            fix="raise --max-n-fraction, shorten --seq, or exclude N-heavy regions when preparing",
        )

    def batch(self, step: int, micro: int = 0) -> np.ndarray:
        """int64[seq_len + 1] token ids of :meth:`window`, reverse-complemented when the window says so."""
        return window_targets(self.dataset, self.window(step, micro))[0]

    def state_dict(self) -> dict[str, Any]:
        """What fixes the window stream. Windows depend on nothing else, so this plus the step resumes exactly."""
        return {
            "version": SAMPLER_STATE_VERSION,
            "seed": self.seed,
            "seq_len": self.seq_len,
            "max_n_fraction": self.max_n_fraction,
            "reverse_complement": self.reverse_complement,
            "dp_size": self.dp_size,
            "train_lengths": dict(self.train_lengths),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Adopt a saved seed after checking the rest of the configuration matches; ConfigError naming any change."""
        if state.get("version") != SAMPLER_STATE_VERSION:
            raise ConfigError(f"sampler state has version {state.get('version')!r}, this genolc reads "
                              f"{SAMPLER_STATE_VERSION}", fix="resume with the genolc version that wrote it")
        mine = self.state_dict()
        changed = [
            f"{name}: saved {state.get(name)!r}, now {mine[name]!r}"
            for name in ("seq_len", "max_n_fraction", "reverse_complement", "dp_size", "train_lengths")
            if state.get(name) != mine[name]
        ]
        if changed:
            raise ConfigError(
                "cannot resume: the sampler configuration differs from the checkpoint's (" + "; ".join(changed) + ")",
                fix="resume with the same dataset, --seq, --max-n-fraction, reverse-complement setting and "
                    "data-parallel size, or start a new run",
            )
        self.seed = int(state["seed"])


@dataclass(frozen=True)
class EvalWindow:
    """A held-out window with absolute coordinates.

    ``start``/``stop``: token coordinates in record ``key`` (stop exclusive); ``base_start``/``base_stop``: the bases
    they cover, 0-based half-open within the record; ``chrom_start``/``chrom_end``: the same span as 1-based inclusive
    chromosome coordinates (record start from the manifest, e.g. chr22:20000001 for a ``>22:20000001-21000000``
    header). ``partial`` marks the shorter last window of a segment; ``n_fraction`` is its share of ambiguous tokens.
    """

    key: str
    chrom: str
    start: int
    stop: int
    base_start: int
    base_stop: int
    chrom_start: int
    chrom_end: int
    n_fraction: float
    partial: bool

    def __len__(self) -> int:
        return self.stop - self.start

    @property
    def region(self) -> str:
        return f"{self.chrom}:{self.chrom_start}-{self.chrom_end}"


def _ambiguous_runs(dataset: DatasetLike, key: str, length: int, min_run: int) -> np.ndarray:
    """int64[k, 2] runs of consecutive ambiguous tokens at least ``min_run`` long (token coords, half-open)."""
    runs: list[tuple[int, int]] = []
    open_start: int | None = None  # start of a run that reached the end of the previous block
    for block_start in range(0, length, _SCAN_BLOCK):
        block_stop = min(length, block_start + _SCAN_BLOCK)
        amb = np.asarray(dataset.token_ambiguous(key, block_start, block_stop), dtype=bool)
        if open_start is not None and not amb[0]:
            runs.append((open_start, block_start))  # it ended exactly at the block edge
            open_start = None
        edges = np.diff(np.concatenate([[False], amb, [False]]).astype(np.int8))
        starts = np.flatnonzero(edges == 1) + block_start
        stops = np.flatnonzero(edges == -1) + block_start
        for s, e in zip(starts.tolist(), stops.tolist()):
            if open_start is not None:
                s, open_start = open_start, None  # the block's first run (at block_start) continues it
            if e == block_stop and block_stop < length:
                open_start = s  # may continue into the next block
                continue
            runs.append((s, e))
    if open_start is not None:
        runs.append((open_start, length))
    kept = [(s, e) for s, e in runs if e - s >= min_run]
    return np.array(kept, dtype=np.int64).reshape(-1, 2)


def _base_span(dataset: DatasetLike, key: str, start: int, stop: int) -> tuple[int, int]:
    # The dataset maps tokens to bases (k-mer remainder tokens at a record end cover one base each, so
    # ``stop * k`` would overshoot for a window that ends among them); offsets [start, stop] include the end.
    offsets = np.asarray(dataset.token_base_offsets(key, start, stop))
    return int(offsets[0]), int(offsets[stop - start])


def tile_for_eval(
    dataset: DatasetLike,
    keys: Sequence[str] | None,
    seq_len: int | str,
    *,
    max_n_fraction: float = 0.5,
    min_partial_fraction: float = 0.5,
) -> list[EvalWindow]:
    """Non-overlapping windows of ``seq_len + 1`` tokens over held-out records, in record then position order.

    Rule, per record:
      1. Runs of ambiguous (N/IUPAC) tokens longer than ``max_n_fraction * (seq_len + 1)`` are gaps: any window
         holding one would be rejected anyway, so the record is cut at them into segments and each segment is
         tiled from its own first token (the windows realign after an assembly gap instead of straddling it).
      2. Each segment gets as many full windows as fit, back to back.
      3. The remainder at a segment's end becomes one window flagged ``partial=True`` when it holds at least
         ``min_partial_fraction`` of a full window (and at least 2 tokens, one input and one target); shorter
         remainders are dropped.
      4. Any window whose ambiguous share still exceeds ``max_n_fraction`` is skipped.
    ``keys=None`` means every held-out record.
    """
    seq = _as_seq_len(seq_len)
    max_n_fraction = _check_fraction(max_n_fraction, "max_n_fraction")
    min_partial_fraction = _check_fraction(min_partial_fraction, "min_partial_fraction")
    width = seq + 1
    keys = list(dataset.keys("heldout") if keys is None else keys)
    if not keys:
        raise ConfigError("no held-out records to evaluate", where=_dataset_where(dataset),
                          fix="prepare the dataset with --heldout, or name records to evaluate")
    known = set(dataset.keys())
    missing = [k for k in keys if k not in known]
    if missing:
        raise ConfigError(f"record(s) {', '.join(missing)} are not in the dataset", where=_dataset_where(dataset),
                          fix=f"choose from {', '.join(sorted(known))}")
    min_partial = max(2, math.ceil(min_partial_fraction * width))
    gap_run = max(1, math.floor(max_n_fraction * width) + 1)
    windows: list[EvalWindow] = []
    for key in keys:
        record = dataset.record(key)
        length = int(record["length_tokens"])
        gaps = _ambiguous_runs(dataset, key, length, gap_run)
        seg_starts = np.concatenate([[0], gaps[:, 1]]).tolist()
        seg_stops = np.concatenate([gaps[:, 0], [length]]).tolist()
        for seg_start, seg_stop in zip(seg_starts, seg_stops):
            n_full, rest = divmod(seg_stop - seg_start, width)
            spans = [(seg_start + i * width, seg_start + (i + 1) * width, False) for i in range(n_full)]
            if rest >= min_partial:
                spans.append((seg_stop - rest, seg_stop, True))
            for start, stop, partial in spans:
                amb = np.asarray(dataset.token_ambiguous(key, start, stop), dtype=bool)
                frac = float(np.count_nonzero(amb)) / (stop - start)
                if frac > max_n_fraction:
                    continue
                base_start, base_stop = _base_span(dataset, key, start, stop)
                first = int(record.get("start", 1))
                windows.append(EvalWindow(
                    key=key, chrom=str(record.get("chrom", key)), start=start, stop=stop,
                    base_start=base_start, base_stop=base_stop,
                    chrom_start=first + base_start, chrom_end=first + base_stop - 1,
                    n_fraction=frac, partial=partial,
                ))
    return windows


def _dataset_where(dataset: DatasetLike) -> str:
    return str(getattr(dataset, "path", "the prepared dataset"))
