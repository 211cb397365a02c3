"""python benchmarks/fla_import_check.py   (on the GPU machine, after gpu_env_setup)

How long importing fla's KDA op takes in a new process: fla's ordinary ``from fla.ops.kda import chunk_kda`` (its
package __init__ files import every layer, model and op) against genolc's (genolc/model/ops/kda/fla_import.py),
alternating, twice each (the first pair also writes the bytecode). Each process imports torch first, so only fla's
share is timed; the lean one also says whether fla's layers or transformers were imported. Writes JSON (command, git
SHA, device) to $OUT or benchmarks/results/fla_import_<date>.json (gpu_bench_common.write_results).
"""

from __future__ import annotations

import subprocess
import sys

from gpu_bench_common import write_results

FULL = "import time, torch; t = time.time(); from fla.ops.kda import chunk_kda; print(time.time() - t)"
LEAN = ("import sys, time, torch; t = time.time(); from genolc.model.ops.kda.fla import _fla_chunk_kda; "
        "_fla_chunk_kda(); print(time.time() - t, 'fla.layers' in sys.modules, 'transformers' in sys.modules)")


def main() -> None:
    rows = []
    for run in range(2):
        for way, code in (("full", FULL), ("lean", LEAN)):
            done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
            row = {"run": run, "way": way, "rc": done.returncode}
            fields = done.stdout.split()
            if done.returncode == 0 and fields:
                row["seconds"] = round(float(fields[0]), 2)
                if way == "lean":
                    row["fla_layers_imported"], row["transformers_imported"] = fields[1] == "True", fields[2] == "True"
            else:
                row["stderr"] = done.stderr[-300:]
            rows.append(row)
            print(rows[-1], flush=True)
    print(f"wrote {write_results('fla_import', rows, {'timing': 'wall seconds of the import in a new process'})}")


if __name__ == "__main__":
    main()
