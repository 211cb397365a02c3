"""python benchmarks/fla_import_check.py   (on the GPU machine, after gpu_env_setup; writes $OUT/fla_import_times.json)

How long importing fla's KDA op takes in a new process: fla's ordinary ``from fla.ops.kda import chunk_kda`` (its
package __init__ files import every layer, model and op) against genolc's (genolc/model/ops/kda/fla_import.py),
alternating, twice each (the first pair also writes the bytecode). Each process imports torch first, so only fla's
share is timed; the lean one also says whether fla's layers or transformers were imported.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

FULL = "import time, torch; t = time.time(); from fla.ops.kda import chunk_kda; print(time.time() - t)"
LEAN = ("import sys, time, torch; t = time.time(); from genolc.model.ops.kda.fla import _fla_chunk_kda; "
        "_fla_chunk_kda(); print(time.time() - t, 'fla.layers' in sys.modules, 'transformers' in sys.modules)")


def main() -> None:
    rows = []
    for run in range(2):
        for way, code in (("full", FULL), ("lean", LEAN)):
            done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
            rows.append({"run": run, "way": way, "stdout": done.stdout.strip(), "rc": done.returncode,
                         "stderr": done.stderr[-300:]})
            print(rows[-1], flush=True)
    record = {"command": "python3 benchmarks/fla_import_check.py", "git_sha": os.environ.get("GENOLC_GIT_SHA"),
              "rows": rows}
    with open(os.path.join(os.environ.get("OUT", "."), "fla_import_times.json"), "w") as out:
        json.dump(record, out, indent=1)


if __name__ == "__main__":
    main()
