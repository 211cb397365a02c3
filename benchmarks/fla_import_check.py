import json, os, subprocess, sys, time
code_full = "import time, torch; t = time.time(); from fla.ops.kda import chunk_kda; print(time.time() - t)"
code_lean = ("import time, torch; t = time.time(); from genolc.model.ops.kda.fla import _fla_chunk_kda; "
             "f = _fla_chunk_kda(); import sys; print(time.time() - t, 'fla.layers' in sys.modules, 'transformers' in sys.modules)")
rows = []
for run in range(2):
    for name, code in (("full", code_full), ("lean", code_lean)):
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
        rows.append({"run": run, "way": name, "stdout": out.stdout.strip(), "rc": out.returncode, "stderr": out.stderr[-300:]})
        print(rows[-1], flush=True)
json.dump({"git_sha": os.environ.get("GENOLC_GIT_SHA"), "rows": rows}, open(os.environ["OUT"] + "/fla_import_times.json", "w"), indent=1)
