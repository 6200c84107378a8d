"""Runs a gpumem workload and compares its per-iteration figures with a case recorded by
../shared/tools/hf_models.py or hf_families.py (the fields tests/hf.rs checks).

Usage: python3 hf_compare.py WORKLOAD.toml CASE.json [GPUMEM]
Prints, per iteration, each field that differs (gpumem minus PyTorch), and the worst allocated
and reserved errors (reserved beyond the 2 MiB slack).
"""
import json
import subprocess
import sys

FIELDS = ["start", "after_forward", "after_backward", "after_step", "end", "peak_allocated",
          "peak_reserved", "reserved_end", "after_generate"]


def main():
    w, case = sys.argv[1], sys.argv[2]
    exe = sys.argv[3] if len(sys.argv) > 3 else "target/release/gpumem"
    out = subprocess.run([exe, "run", w, "--json"], capture_output=True, text=True)
    if out.returncode != 0:
        print(out.stderr)
        return 2
    g = json.loads(out.stdout)["iterations"]
    t = json.load(open(case))["cases"][0]["iterations"]
    worst_a = worst_r = 0.0
    exact = True
    for k, (a, b) in enumerate(zip(g, t)):
        for f in FIELDS:
            if f not in b or f not in a:
                continue
            x, y = int(a[f]), int(b[f])
            if x != y:
                exact = False
                print(f"iter {k} {f}: gpumem {x} torch {y} ({x - y:+})")
            if "reserved" in f:
                worst_r = max(worst_r, max(abs(x - y) - (2 << 20), 0) / max(y, 1))
            else:
                worst_a = max(worst_a, abs(x - y) / max(y, 1))
    print(f"{'exact' if exact else 'differs'}: worst allocated {worst_a * 100:.4f}%, "
          f"reserved {worst_r * 100:.4f}% beyond 2 MiB; iterations {len(g)} vs {len(t)}")
    return 0


sys.exit(main())
