#!/usr/bin/env python3
"""The speed gate (issue 18): instructions counted by valgrind's callgrind, per simulated allocator
event and per snapshot byte, on fixed inputs, against a committed baseline.

Wall times flake on a shared machine; instruction counts do not (the same binary on the same
inputs counts the same, whatever else the machine does). Each metric is a difference of two runs,
so that start-up, parsing and reporting cancel out and what remains is the cost that grows with
the work:

- `sim_*`: `gpumem run W --iterations 4` minus `--iterations 1`, divided by the allocator events
  (allocations and frees, from memory_stats) that the three extra iterations made;
- `summary_*`: `gpumem summary BIG` minus `gpumem summary SMALL` on one core (GPUMEM_THREADS=1),
  divided by the difference in file size.

Usage:
  python3 scripts/perf_gate.py [--bin target/release/gpumem] [--update] [--tolerance 0.05]
                               [--only REGEX]

Fails (exit 1) when a metric is more than --tolerance (5%) above the baseline
(fixtures/perf/callgrind_baseline.json); --update writes the figures measured now as the new
baseline, on purpose, the way `gpumem check --update` does. Exit 2: valgrind missing, a run
failed, or the baseline is unreadable.
"""
import argparse
import json
import os
import re
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BASELINE = os.path.join(ROOT, "fixtures", "perf", "callgrind_baseline.json")

# (metric, workload) for instructions per allocator event
SIM = [
    ("sim_gpt2_small", "fixtures/workloads/presets/gpt2_small_sdpa_adamw.toml"),
    ("sim_llama_t", "fixtures/hf/workloads/llama_t_sdpa_adamw_fp32.toml"),
    ("sim_mlp_adam", "fixtures/workloads/presets/mlp_adam.toml"),
    # generation: decode steps of a Hugging Face Llama config (KV cache grown by `cat`)
    ("sim_llama_t_generate", "fixtures/hf/workloads/llama_t_generate_bf16.toml"),
]
# (metric, small snapshot, big snapshot) for instructions per byte; `None`: an empty snapshot
SUMMARY = [
    ("summary_mlp_leak_grown", "fixtures/snapshots/snapshot_mlp_leak.pickle",
     "fixtures/snapshots/grown_mlp_leak_x8.pickle"),
    ("summary_gpt2s", None, "fixtures/snapshots/snapshot_gpt2s_b8_sdpa_adamw_bf16.pickle"),
    # a Hugging Face model's snapshot: Python stacks of many frames per event
    ("summary_hf_llama_s", None, "fixtures/snapshots/snapshot_llama_s_sdpa_adamw_fp32.pickle"),
    # a public snapshot of another shape (issue 41's third): a Transformer's full step, 1,010
    # segments, short Python stacks; unpacked from .xz into the gate's folder
    ("summary_kkaitlyn_fullstep", None, "fixtures/external/kkaitlyn_memory_ctx128_fullstep.pickle.xz"),
    # the shapes of issue 41's grown snapshots, at a size callgrind can count: a snapshot
    # against itself with its trace repeated (`grow:K`), so the metric is the cost of a large
    # trace's body (the chunked reader, the conversion, the walk) per byte
    ("summary_hf_llama_s_grown", "fixtures/snapshots/snapshot_llama_s_sdpa_adamw_fp32.pickle",
     "grow:4"),
    ("summary_kkaitlyn_grown", "fixtures/external/kkaitlyn_memory_ctx128_fullstep.pickle.xz",
     "grow:2"),
]
# pickle.dumps({"segments": [], "device_traces": [[]]}, protocol=4)
EMPTY_SNAPSHOT = bytes.fromhex(
    "80049527000000000000007d94288c087365676d656e7473945d948c0d6465766963655f74726163657394"
    "5d945d9461752e")


def grown(src, dst, k):
    """Writes `src` with its first device's trace repeated `k` times: entries copied as new
    dicts (their frame lists shared, as PyTorch's files share them), segment events once."""
    import pickle
    with open(src, "rb") as fh:
        snap = pickle.load(fh)
    trace = snap["device_traces"][0]
    body = [e for e in trace if e.get("action") not in ("segment_alloc", "segment_free")]
    for _ in range(k - 1):
        trace.extend(dict(e) for e in body)
    with open(dst, "wb") as fh:
        pickle.dump(snap, fh, protocol=4)


def unpack(path, tmp):
    """`path` itself, or for an .xz file its contents written into `tmp`."""
    if not path.endswith(".xz"):
        return path
    import lzma
    unpacked = os.path.join(tmp, os.path.basename(path)[:-3])
    with lzma.open(os.path.join(ROOT, path)) as src, open(unpacked, "wb") as dst:
        dst.write(src.read())
    return unpacked


def fail(msg, code=2):
    print(f"perf_gate: {msg}", file=sys.stderr)
    sys.exit(code)


def instructions(cmd, env=None):
    """Runs `cmd` under callgrind; returns (instructions, stdout)."""
    with tempfile.TemporaryDirectory(prefix="gpumem-gate-") as tmp:
        out = os.path.join(tmp, "callgrind.out")
        full = ["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}",
                "--dump-instr=no", "--compress-strings=no"] + cmd
        e = dict(os.environ)
        for k in ("PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF", "RUST_LOG", "COLUMNS"):
            e.pop(k, None)
        e["NO_COLOR"] = "1"
        e.update(env or {})
        p = subprocess.run(full, cwd=ROOT, env=e, capture_output=True, text=True)
        if p.returncode != 0:
            fail(f"{' '.join(cmd)} exited {p.returncode}:\n{p.stderr[-2000:]}")
        m = re.search(r"Collected\s*:\s*(\d+)", p.stderr)
        if not m:
            with open(out) as fh:
                m = re.search(r"^(?:summary|totals):\s*(\d+)", fh.read(), re.M)
        if not m:
            fail(f"no instruction count in callgrind's output for {' '.join(cmd)}")
        return int(m.group(1)), p.stdout


def events(stdout):
    s = json.loads(stdout)["memory_stats"]
    return s["allocation.all.allocated"] + s["allocation.all.freed"]


def measure(binary, only=None):
    got = {}
    for name, w in SIM:
        if only and not re.search(only, name):
            continue
        i1, o1 = instructions([binary, "run", w, "--iterations", "1", "--json"])
        i4, o4 = instructions([binary, "run", w, "--iterations", "4", "--json"])
        ev = events(o4) - events(o1)
        if ev <= 0:
            fail(f"{w}: no allocator events in iterations 2 to 4")
        got[name] = round((i4 - i1) / ev, 2)
        print(f"  {name:<24} {got[name]:>10.2f} instructions per allocator event "
              f"({ev} events)", flush=True)
    one = {"GPUMEM_THREADS": "1"}
    with tempfile.TemporaryDirectory(prefix="gpumem-gate-") as tmp:
        empty = os.path.join(tmp, "empty.pickle")
        with open(empty, "wb") as fh:
            fh.write(EMPTY_SNAPSHOT)
        for name, small, big in SUMMARY:
            if only and not re.search(only, name):
                continue
            small = unpack(small or empty, tmp)
            if big.startswith("grow:"):
                out = os.path.join(tmp, name + ".pickle")
                grown(os.path.join(ROOT, small), out, int(big.split(":")[1]))
                big = out
            big = unpack(big, tmp)
            i_s, _ = instructions([binary, "summary", small, "--json"], one)
            i_b, _ = instructions([binary, "summary", big, "--json"], one)
            nbytes = os.path.getsize(os.path.join(ROOT, big)) - os.path.getsize(
                os.path.join(ROOT, small))
            got[name] = round((i_b - i_s) / nbytes, 2)
            print(f"  {name:<24} {got[name]:>10.2f} instructions per snapshot byte "
                  f"({nbytes} bytes)", flush=True)
    return got


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--bin", default=os.path.join(ROOT, "target", "release", "gpumem"))
    ap.add_argument("--update", action="store_true", help="write the measured figures as the baseline")
    ap.add_argument("--tolerance", type=float, default=0.05,
                    help="the growth over the baseline that fails (default 0.05: 5%%)")
    ap.add_argument("--baseline", default=BASELINE)
    ap.add_argument("--only", metavar="REGEX",
                    help="measure only the metrics whose names match (not with --update)")
    a = ap.parse_args()
    if a.only and a.update:
        fail("--update writes every metric: run it without --only")
    if subprocess.run(["valgrind", "--version"], capture_output=True).returncode != 0:
        fail("valgrind is not installed (apt-get install valgrind)")
    if not os.path.exists(a.bin):
        fail(f"{a.bin}: no such binary (cargo build --release)")
    print(f"perf gate: instructions counted by callgrind ({a.bin})", flush=True)
    got = measure(a.bin, a.only)
    if a.update:
        doc = {"gpumem_perf_baseline": 1,
               "how": "python3 scripts/perf_gate.py --update (instructions per allocator event "
                      "and per snapshot byte, counted by callgrind)",
               "metrics": got}
        os.makedirs(os.path.dirname(a.baseline), exist_ok=True)
        tmp = a.baseline + ".tmp"
        with open(tmp, "w") as fh:
            json.dump(doc, fh, indent=1)
            fh.write("\n")
        os.replace(tmp, a.baseline)
        print(f"wrote {os.path.relpath(a.baseline, ROOT)}")
        return 0
    try:
        with open(a.baseline) as fh:
            base = json.load(fh)["metrics"]
    except (OSError, ValueError, KeyError) as e:
        fail(f"{a.baseline}: {e} (write one with --update)")
    worse = []
    print(f"  {'metric':<24} {'baseline':>10} {'now':>10}  ratio")
    for k, v in got.items():
        b = base.get(k)
        if b is None:
            print(f"  {k:<24} {'-':>10} {v:>10.2f}  (not in the baseline: --update adds it)")
            continue
        r = v / b
        flag = "  SLOWER" if r > 1 + a.tolerance else ("  faster: --update to keep it" if r < 0.95 else "")
        print(f"  {k:<24} {b:>10.2f} {v:>10.2f}  {r:.3f}{flag}")
        if r > 1 + a.tolerance:
            worse.append(k)
    if worse:
        print(f"perf gate: {', '.join(worse)} grew more than {a.tolerance:.0%} over "
              f"{os.path.relpath(a.baseline, ROOT)}; if that is meant, run "
              "python3 scripts/perf_gate.py --update and commit the baseline", file=sys.stderr)
        return 1
    print("perf gate: every metric within the tolerance")
    return 0


if __name__ == "__main__":
    sys.exit(main())
