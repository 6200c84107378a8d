#!/usr/bin/env bash
# Issue 40 on the GPU machine, one call: the cuda device computing (GPU kernels where they take
# the launch, the host twin elsewhere) against --device cpu (losses, gradients) and --device sim
# (memory_stats and iteration rows), per workload, with the launches' split and the times.
# Needs target/release/gpumem carried. WORKLOADS="a.toml b.toml" to pick; defaults below.
set -uo pipefail
G=target/release/gpumem
mkdir -p "$OUT"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
echo "== selftest"
$G selftest --device cuda --json > "$OUT/selftest.json"; echo "selftest rc=$?"
python3 - "$OUT/selftest.json" <<'PY' 2>&1
import json, sys
r = json.load(open(sys.argv[1]))
bad = [c for c in r["checks"] if not c["ok"]]
print(r["gpu"], len(r["checks"]), "checks,", len(bad), "off")
for c in r["checks"]:
    print(f"  {c['op']:<30} {c['case'][:40]:<40} {c['dtype']:<9} {c['max_rel_error']:.2e} "
          f"{'ok ' if c['ok'] else 'OFF'} gpu={c['gpu_launches']} host={c['host_launches']} "
          f"{','.join(c['host_kernels'])} {'' if c['ok'] else c['worst'][:200]}")
PY
W=${WORKLOADS:-"$(ls fixtures/cpu/*.toml) fixtures/hf/workloads/llama_t_sdpa_adamw_fp32.toml fixtures/hf/workloads/llama_t_sdpa_adamw_bf16w.toml fixtures/hf/workloads/llama_t_generate_bf16.toml fixtures/hf/workloads/llama_t_generate_fp32.toml fixtures/hf/workloads/llama_t_nograd_fp32.toml fixtures/hf/workloads/gpt2_t_sdpa_adamw_fp32.toml fixtures/hf/workloads/llama_t_lora_adamw_fp32.toml fixtures/hf/workloads/llama_t_ckpt_adamw_fp32.toml fixtures/hf/workloads/llama_s_sdpa_adamw_bf16amp.toml"}
echo "== cpu / cuda / sim"
python3 - "$G" "$OUT" $W <<'PY' | tee "$OUT/compare.txt"
import json, subprocess, sys, time
g, out, ws = sys.argv[1], sys.argv[2], sys.argv[3:]
def run(w, dev, extra=()):
    t = time.time()
    p = subprocess.run([g, "run", w, "--device", dev, "--json", "--no-remedies", *extra],
                       capture_output=True, text=True)
    dt = time.time() - t
    if p.returncode not in (0, 1):
        return None, dt, p.stderr.strip()[-600:]
    return json.loads(p.stdout), dt, None
import safetensors.numpy as stn, numpy as np
fields = ["start", "after_forward", "after_backward", "after_step", "end", "after_generate",
          "peak_allocated", "peak_reserved", "reserved_end"]
for w in ws:
    tag = w.split("/")[-1]
    res = {}
    for dev in ("sim", "cpu", "cuda"):
        extra = ("--save-grads", f"/tmp/{tag}.{dev}.grads.safetensors") if dev != "sim" else ()
        res[dev] = run(w, dev, extra)
    errs = {d: r[2] for d, r in res.items() if r[0] is None}
    if errs:
        print(f"{tag}: ERROR {errs}")
        continue
    s, c, k = res["sim"][0], res["cpu"][0], res["cuda"][0]
    lc = [i.get("loss") for i in c["iterations"]]
    lk = [i.get("loss") for i in k["iterations"]]
    dl = max((abs(a - b) / max(abs(a), 1e-30) for a, b in zip(lc, lk) if a is not None and b is not None), default=None)
    rows = sum(1 for x, y in zip(s["iterations"], k["iterations"]) for f in fields if x.get(f) != y.get(f))
    ms = [m for m in s["memory_stats"] if s["memory_stats"][m] != k["memory_stats"].get(m)]
    gdiff = None
    try:
        gc = stn.load_file(f"/tmp/{tag}.cpu.grads.safetensors")
        gk = stn.load_file(f"/tmp/{tag}.cuda.grads.safetensors")
        # each parameter's largest difference over its largest gradient, that floored at 1e-3
        # of the model's largest (a gradient near zero is all rounding: Llama's q/k at init)
        top = max(float(np.max(np.abs(gc[n].astype(np.float64)))) for n in gc)
        per = sorted(((float(np.max(np.abs(gc[n].astype(np.float64) - gk[n].astype(np.float64))) / max(float(np.max(np.abs(gc[n].astype(np.float64)))), 1e-3 * top, 1e-30)), n) for n in gc), reverse=True)
        gdiff = per[0][0]
        if gdiff > 1e-4:
            print(f"  {tag}: worst gradients {per[:6]}")
    except Exception as e:
        gdiff = f"n/a ({type(e).__name__}: {e})"
    gpu = sum(x["count"] for x in k.get("launches", []) if x["ran"] == "gpu")
    host = sum(x["count"] for x in k.get("launches", []) if x["ran"] == "host")
    hostk = sorted({x["kernel"] for x in k.get("launches", []) if x["ran"] == "host"})
    gpuk = sorted({x["kernel"] for x in k.get("launches", []) if x["ran"] == "gpu"})
    print(f"{tag}: losses cpu={lc} cuda={lk} max_rel={dl} grads_max_rel={gdiff} "
          f"rows_vs_sim={rows} stats_vs_sim={len(ms)} {ms[:4]} launches gpu={gpu} host={host} "
          f"host_kernels={hostk} gpu_kernels={gpuk} t_sim={res['sim'][1]:.2f}s t_cpu={res['cpu'][1]:.2f}s t_cuda={res['cuda'][1]:.2f}s")
PY
echo "== text report (first lines)"
$G run fixtures/cpu/gpt_tiny_sdpa_adamw.toml --device cuda --no-remedies 2>&1 | head -8
if [ -n "${BISECT:-}" ]; then
  echo "== bisect $BISECT: each GPU kernel sent to the host twin in turn"
  for k in none unary unary_backward binary scalar copy softmax softmax_backward gemm fill adam_step layer_norm layer_norm_backward embedding embedding_backward attention; do
    GPUMEM_CUDA_HOST_KERNELS=$k WORKLOADS=$BISECT python3 - "$G" "$OUT" $BISECT <<'PY'
import json, os, subprocess, sys
import safetensors.numpy as stn, numpy as np
g, out, w = sys.argv[1], sys.argv[2], sys.argv[3]
for dev in ("cpu", "cuda"):
    subprocess.run([g, "run", w, "--device", dev, "--json", "--no-remedies", "--save-grads", f"/tmp/b.{dev}.safetensors"], capture_output=True)
gc = stn.load_file("/tmp/b.cpu.safetensors"); gk = stn.load_file("/tmp/b.cuda.safetensors")
per = sorted(((float(np.max(np.abs(gc[n].astype(np.float64) - gk[n].astype(np.float64))) / max(float(np.max(np.abs(gc[n].astype(np.float64)))), 1e-30)), n) for n in gc), reverse=True)
print(os.environ["GPUMEM_CUDA_HOST_KERNELS"], "worst", per[:2])
PY
  done
fi
if [ -n "${SPEED:-}" ]; then
  echo "== speed: $SPEED on cuda and sim (wall seconds, launches)"
  for w in $SPEED; do
    /usr/bin/time -f "cuda wall %e s, max RSS %M KB" $G run "$w" --device cuda --json --no-remedies > "$OUT/speed.json" 2> "$OUT/speed.err"
    tail -1 "$OUT/speed.err"
    python3 - "$OUT/speed.json" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
gpu = sum(x["count"] for x in r.get("launches", []) if x["ran"] == "gpu")
host = [(x["kernel"], x["count"]) for x in r.get("launches", []) if x["ran"] == "host"]
print("iterations", [(i["iteration"], i.get("loss"), i["peak_allocated"]) for i in r["iterations"]])
print("launches on the GPU", gpu, "on the host", sorted(host, key=lambda k: -k[1]))
PY
    /usr/bin/time -f "sim wall %e s" $G run "$w" --json --no-remedies > "$OUT/speed_sim.json" 2> "$OUT/speed_sim.err"; tail -1 "$OUT/speed_sim.err"
    python3 -c "
import json; a=json.load(open('$OUT/speed.json')); b=json.load(open('$OUT/speed_sim.json'))
print('memory_stats equal to sim:', a['memory_stats']==b['memory_stats'], 'rows equal:', [{k:v for k,v in i.items() if k!='loss'} for i in a['iterations']]==[{k:v for k,v in i.items() if k!='loss'} for i in b['iterations']])"
  done
fi
