#!/usr/bin/env python3
"""Times the current build of gpumem against another one in the same run, interleaved, and
prints each figure with the ratio new/old (issue 18). Only ratios from one run mean anything:
machines and their load differ from run to run.

Usage:
  python3 scripts/bench_ab.py [REV] [--rounds 5] [--old-bin PATH] [--new-bin PATH]

REV (default: the newest tag `v*`, else HEAD) is built with `cargo build --release` in a git
worktree under target/bench-ab/ (kept, so a second run reuses it); the current tree is built as
usual (target/release/gpumem). --old-bin / --new-bin take prebuilt binaries instead.

Figures, each the median over the rounds:
- the allocator: `gpumem bench` (ns per alloc+free pair, patterns pairs and batch, recording
  off and on);
- simulation: `gpumem bench --workload` on GPT-2 small, the tiny Llama, and issue 14's
  Llama-3-8B LoRA step and 1,024-token generation (ms per iteration);
- snapshot reading: `gpumem summary` on the grown fixture snapshot, on all cores and on one
  (wall seconds of the process).
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
WORKLOADS = [
    ("gpt2_small", "fixtures/workloads/presets/gpt2_small_sdpa_adamw.toml"),
    ("llama_t", "fixtures/hf/workloads/llama_t_sdpa_adamw_fp32.toml"),
    # issue 14's two targets: a Llama-3-8B LoRA step, and generating 1,024 tokens on it
    ("llama3_8b_lora", "fixtures/hf/bench/llama3_8b_lora_bf16.toml"),
    ("llama3_8b_generate", "fixtures/hf/bench/llama3_8b_generate_bf16.toml"),
]
SNAPSHOT = "fixtures/snapshots/snapshot_gpt2s_b8_sdpa_adamw_bf16.pickle"


def sh(cmd, **kw):
    return subprocess.run(cmd, cwd=kw.pop("cwd", ROOT), check=True, capture_output=True,
                          text=True, **kw).stdout


def default_rev():
    tags = sh(["git", "tag", "--list", "v*", "--sort=-creatordate"]).split()
    return tags[0] if tags else "HEAD"


def build_rev(rev):
    commit = sh(["git", "rev-parse", "--verify", rev + "^{commit}"]).strip()
    wt = os.path.join(ROOT, "target", "bench-ab", commit[:12])
    binary = os.path.join(wt, "target", "release", "gpumem")
    if not os.path.exists(binary):
        if not os.path.isdir(wt):
            sh(["git", "worktree", "add", "--detach", wt, commit])
        print(f"building {rev} ({commit[:12]}) in {os.path.relpath(wt, ROOT)} ...", flush=True)
        subprocess.run(["cargo", "build", "--release", "--quiet"], cwd=wt, check=True)
    return binary


def figures(binary):
    """One round of every figure: {name: value}."""
    env = dict(os.environ, NO_COLOR="1")
    for k in ("PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF", "RUST_LOG"):
        env.pop(k, None)
    out = {}
    b = json.loads(sh([binary, "bench", "--repeat", "3", "--warmup-ms", "300", "--json"], env=env))
    for r in b["rows"]:
        name = f"alloc {r['pattern']} recording {'on' if r['recording'] else 'off'} (ns/pair)"
        out[name] = statistics.median(r["ns_per_pair"])
    for name, w in WORKLOADS:
        v = json.loads(sh([binary, "bench", "--workload", w, "--repeat", "3", "--json"], env=env))
        out[f"simulate {name} (ms/iteration)"] = v["median_ms_per_iteration"]
    for threads, label in ((None, "all cores"), ("1", "one core")):
        e = dict(env)
        if threads:
            e["GPUMEM_THREADS"] = threads
        t0 = time.perf_counter()
        sh([binary, "summary", SNAPSHOT, "--json"], env=e)
        out[f"summary {os.path.basename(SNAPSHOT)}, {label} (s)"] = time.perf_counter() - t0
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("rev", nargs="?", help="the build to compare with (default: newest v* tag, else HEAD)")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--old-bin")
    ap.add_argument("--new-bin")
    a = ap.parse_args()
    old = a.old_bin or build_rev(a.rev or default_rev())
    if a.new_bin:
        new = a.new_bin
    else:
        subprocess.run(["cargo", "build", "--release", "--quiet"], cwd=ROOT, check=True)
        new = os.path.join(ROOT, "target", "release", "gpumem")
    runs = {"old": [], "new": []}
    for k in range(a.rounds):
        # interleaved, the order alternating, so drift in the machine's speed hits both
        order = [("old", old), ("new", new)] if k % 2 == 0 else [("new", new), ("old", old)]
        for tag, binary in order:
            runs[tag].append(figures(binary))
        print(f"round {k + 1}/{a.rounds} done", file=sys.stderr, flush=True)
    print(f"old: {old}\nnew: {new}\nmedians of {a.rounds} interleaved rounds; ratio = new / old "
          "(below 1: the new build is faster)")
    w = max(len(n) for n in runs["old"][0])
    print(f"{'figure':<{w}}  {'old':>10}  {'new':>10}  ratio")
    for name in runs["old"][0]:
        o = statistics.median(r[name] for r in runs["old"])
        n = statistics.median(r[name] for r in runs["new"])
        print(f"{name:<{w}}  {o:>10.4g}  {n:>10.4g}  {n / o:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
