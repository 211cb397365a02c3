"""benchmarks/bench_checkpoint.py on CPU (its plumbing; the numbers are for the H200): every form is timed, the
checkpoints it wrote are whole and removed after, and a --dir holding files is refused in one line."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "benchmarks" / "bench_checkpoint.py"
sys.path.insert(0, str(ROOT / "benchmarks"))

from bench_checkpoint import bench_preset  # noqa: E402


def test_every_form_is_timed_and_its_checkpoints_removed(tmp_path):
    rows = bench_preset("tiny", "cpu", tmp_path)
    assert [row["form"] for row in rows] == ["foreground", "snapshot (new buffers)", "background write",
                                             "snapshot (reused buffers)", "background write"]
    assert all(row["seconds"] >= 0 for row in rows)
    written = [row["written_files"] for row in rows if "written_files" in row]
    assert len(written) == 3 and sum(written[0].values()) > 0
    # The same files each way; sizes alike but for a few pickled bytes of the optimizer and trainer state.
    assert written[0].keys() == written[1].keys() == written[2].keys()
    for name in written[0]:
        sizes = [files[name] for files in written]
        limit = 1024 if name.endswith(("optimizer.pt", "trainer_state.json")) else 0
        assert max(sizes) - min(sizes) <= limit, (name, sizes)
    assert list(tmp_path.iterdir()) == []


def test_an_unknown_preset_is_one_line(tmp_path):
    result = subprocess.run([sys.executable, str(SCRIPT), "--presets", "huge", "--dir", str(tmp_path)],
                            capture_output=True, text=True, cwd=ROOT / "benchmarks")
    assert result.returncode == 1 and len(result.stderr.splitlines()) == 1 and "huge" in result.stderr
    assert list(tmp_path.iterdir()) == []


def test_a_dir_holding_files_is_refused(tmp_path):
    (tmp_path / "notes.txt").write_text("mine")
    result = subprocess.run([sys.executable, str(SCRIPT), "--presets", "tiny", "--dir", str(tmp_path)],
                            capture_output=True, text=True, cwd=ROOT / "benchmarks")
    assert result.returncode == 1 and "is not empty" in result.stderr and len(result.stderr.splitlines()) == 1
    assert (tmp_path / "notes.txt").read_text() == "mine"
