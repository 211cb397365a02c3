"""Edge cases of the samplers against brute-force answers: scan-block edges, the tiling rule, DP strata over gaps,
and determinism across processes."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys

import numpy as np
import pytest

import genolc.data.sampler as sampler
from genolc.data.sampler import TrainSampler, tile_for_eval
from genolc.tokenize import make_tokenizer


class ArrayDataset:
    """A char-token dataset held in memory: record key -> ambiguous flags (True = N)."""

    def __init__(self, train: dict[str, np.ndarray], heldout: dict[str, np.ndarray] | None = None,
                 start: int = 1) -> None:
        self.amb = {**train, **(heldout or {})}
        self.split = {**{k: "train" for k in train}, **{k: "heldout" for k in heldout or {}}}
        self.manifest: dict = {}
        self.tokenizer = make_tokenizer("char")
        self.start = start
        self.path = "in-memory"

    def keys(self, split=None):
        return [k for k in self.amb if split is None or self.split[k] == split]

    def record(self, key):
        n = len(self.amb[key])
        return {"key": key, "chrom": key, "start": self.start, "length_tokens": n, "length_bases": n,
                "split": self.split[key]}

    def tokens(self, key):
        return np.where(self.amb[key], 8, 4).astype(np.uint16)

    def token_base_offsets(self, key, start, stop):
        return np.arange(start, stop + 1, dtype=np.int64)

    def token_ambiguous(self, key, start, stop):
        return self.amb[key][start:stop]


def _runs(amb: np.ndarray, min_run: int) -> list[tuple[int, int]]:
    out, i = [], 0
    while i < len(amb):
        j = i
        while j < len(amb) and amb[j]:
            j += 1
        if j - i >= min_run:
            out.append((i, j))
        i = max(j, i + 1)
    return out


def test_ambiguous_runs_are_found_whole_across_scan_blocks(monkeypatch):
    rng = np.random.default_rng(0)
    for _ in range(400):
        n = int(rng.integers(1, 50))
        amb = rng.random(n) < rng.uniform(0.1, 0.9)
        min_run = int(rng.integers(1, 4))
        monkeypatch.setattr(sampler, "_SCAN_BLOCK", int(rng.integers(1, 9)))
        got = sampler._ambiguous_runs(ArrayDataset({"c": amb}), "c", n, min_run)
        assert [tuple(r) for r in got.tolist()] == _runs(amb, min_run), (sampler._SCAN_BLOCK, amb.astype(int))


def _tile_by_hand(amb: np.ndarray, seq: int, max_n: float, min_partial_fraction: float) -> list[tuple]:
    """The documented rule, written out token by token."""
    width = seq + 1
    gaps = _runs(amb, math.floor(max_n * width) + 1)
    bounds = [0] + [x for g in gaps for x in g] + [len(amb)]
    out = []
    for a, b in zip(bounds[::2], bounds[1::2]):
        start = a
        while start + width <= b:
            out.append((start, start + width, False))
            start += width
        if b - start >= max(2, math.ceil(min_partial_fraction * width)):
            out.append((start, b, True))
    return [(s, e, p) for s, e, p in out if amb[s:e].mean() <= max_n]


def test_tiling_follows_its_rule_on_random_gaps(monkeypatch):
    rng = np.random.default_rng(1)
    monkeypatch.setattr(sampler, "_SCAN_BLOCK", 13)
    for _ in range(150):
        n = int(rng.integers(10, 200))
        amb = np.zeros(n, dtype=bool)
        for _ in range(int(rng.integers(0, 5))):
            s = int(rng.integers(0, n))
            amb[s:s + int(rng.integers(1, 40))] = True
        if amb.all():
            continue
        seq, max_n, frac = int(rng.integers(3, 40)), float(rng.uniform(0.05, 0.6)), float(rng.uniform(0, 1))
        ds = ArrayDataset({"c1": np.zeros(5, bool)}, {"chr22": amb}, start=20_000_001)
        wins = tile_for_eval(ds, None, seq, max_n_fraction=max_n, min_partial_fraction=frac)
        assert [(w.start, w.stop, w.partial) for w in wins] == _tile_by_hand(amb, seq, max_n, frac)
        for w in wins:
            assert (w.chrom_start, w.chrom_end) == (20_000_001 + w.start, 20_000_000 + w.stop)
            assert w.n_fraction == pytest.approx(amb[w.start:w.stop].mean())


def test_data_parallel_strata_inside_an_assembly_gap_still_get_windows():
    """A 30k-token N run wider than a rank's stratum (150k starts / 7 ranks): every rank still gets a window."""
    gap = np.zeros(100_000, dtype=bool)
    gap[40_000:70_000] = True
    ds = ArrayDataset({"c1": gap, "c2": np.zeros(50_000, dtype=bool)})
    samplers = [TrainSampler(ds, 999, seed=1, dp_rank=r, dp_size=7, max_n_fraction=0.1) for r in range(7)]
    for step in range(60):
        for s in samplers:
            w = s.window(step)
            assert ds.amb[w.key][w.start:w.stop].mean() <= 0.1


def test_data_parallel_ranks_never_overlap_when_each_stratum_has_clean_windows():
    rng = np.random.default_rng(2)
    amb = rng.random(60_000) < 0.002                       # scattered Ns: some draws rejected at 0.1%
    ds = ArrayDataset({"c1": amb[:35_000], "c2": amb[35_000:]})
    for dp in (2, 3, 5):
        samplers = [TrainSampler(ds, 511, seed=4, dp_rank=r, dp_size=dp, max_n_fraction=0.001) for r in range(dp)]
        for step in range(40):
            wins = sorted(((w.key, w.start, w.stop) for w in (s.window(step) for s in samplers)))
            for (k1, _, e1), (k2, s2, _) in zip(wins, wins[1:]):
                assert k1 != k2 or e1 <= s2, (dp, step, wins)
            for key, s, e in wins:
                assert ds.amb[key][s:e].mean() <= 0.001


_CHILD = """
import json, sys
import numpy as np
sys.path.insert(0, {tests!r})
from test_sampler_edges import ArrayDataset
from genolc.data.sampler import TrainSampler
amb = np.zeros(20_000, dtype=bool); amb[5_000:6_000] = True
ds = ArrayDataset({{"chrB": amb, "chrA": np.zeros(9_000, dtype=bool)}})
s = TrainSampler(ds, 300, seed=9, dp_rank=1, dp_size=2, reverse_complement=True)
print(json.dumps([[w.key, w.start, w.reverse_complement] for w in (s.window(t, m) for t in range(30) for m in (0, 1))]))
"""


def test_windows_are_identical_across_processes_with_different_hash_seeds():
    code = _CHILD.format(tests=os.path.dirname(__file__))
    outputs = []
    for hash_seed in ("1", "12345"):
        env = dict(os.environ, PYTHONHASHSEED=hash_seed)
        done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, done.stderr
        outputs.append(json.loads(done.stdout))
    assert outputs[0] == outputs[1] and len({tuple(x) for x in outputs[0]}) > 40
