"""benchmarks/selection_overlap.py on CPU: the distinct-pool count per group of neighbouring queries against Python
sets, the DNA window against the genome read whole, and the script end to end on `tiny` over the packaged sample."""

from __future__ import annotations

import gzip
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "benchmarks" / "selection_overlap.py"
SAMPLE = ROOT / "genolc" / "sample" / "hg38_chr2_1-600000.fa.gz"
sys.path.insert(0, str(ROOT / "benchmarks"))

from selection_overlap import distinct_per_group, dna_window  # noqa: E402

from genolc.tokenize.char import CharTokenizer  # noqa: E402


def test_distinct_pools_per_group_match_python_sets():
    generator = torch.Generator().manual_seed(0)
    pools = torch.randint(-1, 40, (37, 9), generator=generator)
    for group in (1, 2, 4, 8):
        got = distinct_per_group(pools, group).tolist()
        rows = pools.tolist()
        want = [len({p for row in rows[g * group:(g + 1) * group] for p in row if p >= 0})
                for g in range(len(rows) // group)]
        assert got == want, group


def test_the_dna_window_is_the_records_bases_from_the_offset():
    with gzip.open(SAMPLE, "rt") as handle:
        bases = "".join(line.strip() for line in handle if not line.startswith(">"))
    want = CharTokenizer().encode(np.frombuffer(bases[250_001:250_001 + 3000].encode(), dtype=np.uint8))
    got = dna_window(SAMPLE, 250_001, 3000)
    assert got.shape == (1, 3000) and got[0].tolist() == want.tolist()


def _run(out: Path, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "OUT": str(out), "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, str(SCRIPT), "--model", "tiny", "--device", "cpu", *args], env=env,
                          cwd=ROOT, capture_output=True, text=True, timeout=300)


def test_the_script_writes_its_counts_and_refuses_a_missing_genome_in_one_line(tmp_path):
    done = _run(tmp_path, "--seq", "1k", "--chunk", "256", "--fasta", str(SAMPLE), "--offset", "100000")
    assert done.returncode == 0, done.stderr
    record = json.loads(next(tmp_path.glob("selection_overlap_tiny_1k_*.json")).read_text())
    assert record["rows"] and set(record["mean_union_over_g_keep"]) == {"g2", "g4", "g8", "g16"}
    assert all(0 < value <= 1 for value in record["mean_union_over_g_keep"].values())
    missing = _run(tmp_path / "other", "--seq", "1k", "--fasta", str(tmp_path / "absent.fa"))
    assert missing.returncode == 2 and "Traceback" not in missing.stderr
    assert "genome file not found" in missing.stderr


def test_the_script_reads_a_checkpoint_and_refuses_a_run_without_one(tmp_path):
    from genolc.model import build_model, preset
    from genolc.model.checkpoint import save_pretrained

    torch.manual_seed(3)
    save_pretrained(build_model(preset("tiny")), tmp_path / "trained")
    done = _run(tmp_path / "out", "--seq", "1k", "--chunk", "256", "--checkpoint", str(tmp_path / "trained"))
    assert done.returncode == 0, done.stderr
    record = json.loads((tmp_path / "out" / "selection_overlap_trained_1k_random.json").read_text())
    assert record["model"] == "trained" and record["weights"] == f"checkpoint {tmp_path / 'trained'}"
    random = _run(tmp_path / "random", "--seq", "1k", "--chunk", "256")
    assert random.returncode == 0, random.stderr
    seeded = json.loads(next((tmp_path / "random").glob("*.json")).read_text())
    assert seeded["rows"] != record["rows"]          # the checkpoint's weights chose, not the preset's seed-0 ones
    run_checkpoint = tmp_path / "run-a" / "checkpoints" / "step-000002"
    run_checkpoint.parent.mkdir(parents=True)
    (tmp_path / "trained").rename(run_checkpoint)
    done = _run(tmp_path / "out", "--seq", "1k", "--chunk", "256", "--checkpoint", str(run_checkpoint))
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "out" / "selection_overlap_run-a_step-000002_1k_random.json").is_file()
    (tmp_path / "run" / "checkpoints").mkdir(parents=True)
    (tmp_path / "run" / "metrics.jsonl").write_text("")
    refused = _run(tmp_path / "none", "--seq", "1k", "--checkpoint", str(tmp_path / "run"))
    assert refused.returncode == 2 and "Traceback" not in refused.stderr
    assert "error: --checkpoint: this finetune run directory has no complete checkpoint" in refused.stderr
    assert not (tmp_path / "none").exists()
