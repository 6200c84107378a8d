"""Records, on the GPU machine, what cuDNN 2-D convolution takes from PyTorch's caching allocator:
for each shape, every allocation made inside the forward (F.conv2d), the backward wrt the input
and the backward wrt the weight (one autograd backward of the output with a random gradient),
with its size, its origin (C++ frames of memory history recorded with stacks="all") and its order.
Each shape runs twice in a row (call 0: first use of the shape in this process, so cuDNN picks its
plan; call 1: the cached plan). Default settings: cudnn.benchmark False, TF32 flags as PyTorch sets
them.

Shapes: (a) every distinct convolution of torchvision resnet18/34/50/101, wide_resnet50_2 and
resnext50_32x4d at input 224, batches 1..128, in float32; (b) a shuffled generic grid in float32
(N, C, K, H=W, kernel 1/3/5/7 with pad k//2, stride 1/2), cut by a wall budget; (c) the resnet
shapes again in bfloat16 tensors while budget remains.

Output: one JSON line per shape: N, C, H, W, K, R, S, stride, pad, groups, dtype, set;
fwd / bwd_input / bwd_weight: the workspace sizes allocated inside raw_cudnn_convolution_*_out
(call 0); fwd_out / bi_out / bw_out: the result tensors; calls: per call the ordered events
[action ('a' alloc, 'f' free), size, tag]; tags: fwd_out fwd_ws bi_out bi_ws bw_out bw_ws, or
other:<innermost conv-related frame>; paths: the conv-related C++ frames seen. First line: meta.

Usage: python3 conv_workspace.py OUT.jsonl [--budget SECONDS]
"""
import itertools, json, os, random, sys, time

import torch
import torch.nn.functional as F

dev = "cuda"
T_START = time.time()
BUDGET = float(sys.argv[sys.argv.index("--budget") + 1]) if "--budget" in sys.argv else 300.0
OUTF = sys.argv[1]
# --all-batches: the resnet convs (ResNeXt-101's too) at every batch 1..128 not measured yet
# (not in the table given by --missing-from TSV, else not among the first sweep's batches 1, 2,
# 4, ..., 128), float32 then bf16, and no grid
ALL_BATCHES = "--all-batches" in sys.argv
MAX_BYTES = 4.0e9          # any one tensor
MAX_FLOPS = 3.0e12         # forward multiply-adds x2
CHUNK = 16                 # shapes per memory-history window (one snapshot each)
# marker ids are global (2 per shape), so a history buffer that outlives a window cannot confuse them
MARK = 512 * 15000         # marker allocation sizes: MARK + 512 * id (uint8; ids survive rounding to 512)
PRINT_FRAMES = 2           # shapes whose full frame lists go to the log

# innermost matching frame (last component of the C++ name) -> tag
TAGS = {"raw_cudnn_convolution_forward_out": "fwd_ws", "raw_cudnn_convolution_backward_input_out": "bi_ws",
        "raw_cudnn_convolution_backward_weight_out": "bw_ws", "cudnn_convolution_forward_out": "fwd_pre",
        "cudnn_convolution_backward_input": "bi_out", "cudnn_convolution_backward_weight": "bw_out",
        "cudnn_convolution": "fwd_out", "cudnn_convolution_backward": "bwd_pre"}


def short(n):
    return n.split("(")[0].strip()


def tag_of(frames):
    names = [short(f["name"]) for f in frames]
    for n in names:  # innermost first
        last = n.rsplit("::", 1)[-1]
        if last in TAGS:
            return TAGS[last]
    conv = [n for n in names if "conv" in n.lower() or "cudnn" in n.lower()]
    return "other:" + (conv[0] if conv else (names[0] if names else "?"))


def paths_of(frames):
    return {short(f["name"]) for f in frames if not f["filename"].endswith(".py")
            and ("conv" in f["name"].lower() or "cudnn" in f["name"].lower())}


def _gpumem_mark(i):
    m = torch.empty(MARK + 512 * i, dtype=torch.uint8, device=dev)
    del m


def out_hw(h, k, s, p):
    return (h + 2 * p - k) // s + 1


def feasible(N, C, H, K, k, s, g, esize):
    p = k // 2
    Ho = out_hw(H, k, s, p)
    if Ho < 1:
        return False
    b = max(N * C * H * H, N * K * Ho * Ho, K * (C // g) * k * k) * esize
    fl = 2 * N * Ho * Ho * K * (C // g) * k * k
    return b <= MAX_BYTES and fl <= MAX_FLOPS


def run_shape(i, sh):
    """Runs shape sh twice inside the current history window; returns the tensors' sizes."""
    N, C, H, K, k, s, g, dt = sh
    p = k // 2
    dtype = torch.float32 if dt == "fp32" else torch.bfloat16
    x = torch.randn(N, C, H, H, device=dev, dtype=dtype).requires_grad_()
    w = (torch.randn(K, C // g, k, k, device=dev, dtype=dtype) * 0.05).requires_grad_()
    Ho = out_hw(H, k, s, p)
    go = torch.randn(N, K, Ho, Ho, device=dev, dtype=dtype)
    torch.cuda.synchronize()
    for call in range(2):
        _gpumem_mark(2 * i + call)
        y = F.conv2d(x, w, None, s, p, 1, g)
        torch.cuda.synchronize()
        _gpumem_mark(2 * i + call)  # separates forward from backward
        y.backward(go)
        torch.cuda.synchronize()
        x.grad = None
        w.grad = None
        del y
    _gpumem_mark(2 * i + 1)
    del x, w, go


def analyse_window(snap, batch, base, rows_out, printed):
    """Splits a window's events at the marker allocations (2 per call plus one closing)."""
    evs = [e for tr in snap["device_traces"] for e in tr]
    addr_tag = {}
    marks = set()
    seq = []  # (action, size, tag, frames) between markers, marker = ("M", idx)
    for e in evs:
        a = e["action"]
        if a not in ("alloc", "free_completed"):
            continue
        fr = e.get("frames", [])
        if a == "alloc" and any(f["name"] == "_gpumem_mark" for f in fr):
            seq.append(("M", (e["size"] - MARK) // 512))
            marks.add(e["addr"])
            continue
        if a != "alloc" and e["addr"] in marks:  # the marker's own free (its address is reused later)
            marks.discard(e["addr"])
            continue
        if a == "alloc":
            t = tag_of(fr)
            addr_tag[e["addr"]] = (t, e["size"])
            seq.append(("a", e["size"], t, fr))
        else:
            t, sz = addr_tag.pop(e["addr"], ("pre", e["size"]))
            seq.append(("f", e["size"], t, None))
    # group by marker: segments between consecutive markers
    segs, cur, cur_id = [], None, None
    for it in seq:
        if it[0] == "M":
            if cur is not None:
                segs.append((cur_id, cur))
            cur, cur_id = [], it[1]
            continue
        if cur is not None:
            cur.append(it)
    # markers per shape i: 2i (fwd call0), 2i (bwd call0), 2i+1 (fwd call1), 2i+1 (bwd call1), 2i+1 (close)
    by_shape = {}
    for mid, items in segs:
        by_shape.setdefault(mid // 2, []).append(items)
    for i, sh in enumerate(batch):
        parts = by_shape.get(base + i, [])
        N, C, H, K, k, s, g, dt = sh
        row = dict(N=N, C=C, H=H, W=H, K=K, R=k, S=k, stride=s, pad=k // 2, groups=g, dtype=dt, set=sh_set.get(sh, "?"))
        if len(parts) < 4:
            row["error"] = f"found {len(parts)} parts"
            rows_out.append(row)
            continue
        calls = []
        paths = set()
        for c in range(2):
            ev = []
            for items in parts[2 * c: 2 * c + 2]:
                for it in items:
                    ev.append([it[0], it[1], it[2]])
                    if it[3]:
                        paths |= paths_of(it[3])
            calls.append(ev)
        c0 = calls[0]
        row["fwd"] = [e[1] for e in c0 if e[0] == "a" and e[2] == "fwd_ws"]
        row["bwd_input"] = [e[1] for e in c0 if e[0] == "a" and e[2] == "bi_ws"]
        row["bwd_weight"] = [e[1] for e in c0 if e[0] == "a" and e[2] == "bw_ws"]
        row["fwd_out"] = [e[1] for e in c0 if e[0] == "a" and e[2] == "fwd_out"]
        row["bi_out"] = [e[1] for e in c0 if e[0] == "a" and e[2] == "bi_out"]
        row["bw_out"] = [e[1] for e in c0 if e[0] == "a" and e[2] == "bw_out"]
        row["other"] = [e for e in c0 if e[0] == "a" and e[2] not in ("fwd_ws", "bi_ws", "bw_ws", "fwd_out", "bi_out", "bw_out")]
        row["same_second_call"] = calls[0] == calls[1]
        row["calls"] = calls
        row["paths"] = sorted(p for p in paths if len(p) < 200)[:20]
        rows_out.append(row)
        if printed[0] < PRINT_FRAMES:
            printed[0] += 1
            print("FRAMES for", row["N"], row["C"], row["H"], row["K"], row["R"], row["stride"], row["groups"], dt)
            for part in parts[:2]:
                for it in part:
                    if it[0] == "a":
                        print("  alloc", it[1], it[2])
                        for f in it[3]:
                            print("     ", f["name"][:160], "|", f["filename"].split("/")[-1], f["line"])


def resnet_convs():
    """(C, H, K, k, s, g) of every conv of the torchvision resnets at 224 (analytic, torchvision's v1.5)."""
    out = set()

    def add(C, H, K, k, s, g=1):
        out.add((C, H, K, k, s, g))
        return out_hw(H, k, s, k // 2)

    archs = [([2, 2, 2, 2], False, 1, 64), ([3, 4, 6, 3], False, 1, 64), ([3, 4, 6, 3], True, 1, 64),
             ([3, 4, 23, 3], True, 1, 64), ([3, 4, 6, 3], True, 1, 128), ([3, 4, 6, 3], True, 32, 4)]
    if ALL_BATCHES:
        archs += [([3, 4, 23, 3], True, 32, 8), ([3, 4, 23, 3], True, 64, 4)]
    for blocks, bottleneck, groups, width_per_group in archs:
        H = add(3, 224, 64, 7, 2)
        H = out_hw(H, 3, 2, 1)  # maxpool
        inplanes = 64
        for planes, n, stride in zip([64, 128, 256, 512], blocks, [1, 2, 2, 2]):
            for b in range(n):
                s = stride if b == 0 else 1
                if bottleneck:
                    width = int(planes * (width_per_group / 64.0)) * groups
                    add(inplanes, H, width, 1, 1)
                    Ho = add(width, H, width, 3, s, groups)
                    add(width, Ho, planes * 4, 1, 1)
                    if s != 1 or inplanes != planes * 4:
                        add(inplanes, H, planes * 4, 1, s)
                    inplanes = planes * 4
                else:
                    Ho = add(inplanes, H, planes, 3, s)
                    add(planes, Ho, planes, 3, 1)
                    if s != 1 or inplanes != planes:
                        add(inplanes, H, planes, 1, s)
                    inplanes = planes
                H = Ho
    return sorted(out)


def resnet_convs_first():
    """The convs of the first sweep (without ResNeXt-101's)."""
    global ALL_BATCHES
    was, ALL_BATCHES = ALL_BATCHES, False
    try:
        return resnet_convs()
    finally:
        ALL_BATCHES = was


def resnet_convs_meta():
    """The same from torchvision's modules on the meta device (a check of the analytic list)."""
    import torchvision
    seen = set()
    for name in ["resnet18", "resnet34", "resnet50", "resnet101", "wide_resnet50_2", "resnext50_32x4d"]:
        with torch.device("meta"):
            m = getattr(torchvision.models, name)()
        hooks = []
        for mod in m.modules():
            if isinstance(mod, torch.nn.Conv2d):
                def h(mod, inp, outp):
                    x = inp[0]
                    seen.add((x.shape[1], x.shape[2], mod.out_channels, mod.kernel_size[0], mod.stride[0], mod.groups))
                hooks.append(mod.register_forward_hook(h))
        with torch.no_grad():
            m(torch.empty(1, 3, 224, 224, device="meta"))
    return sorted(seen)


sh_set = {}


def main():
    meta = {"meta": True, "torch": torch.__version__, "cudnn": torch.backends.cudnn.version(),
            "device": torch.cuda.get_device_name(0), "benchmark": torch.backends.cudnn.benchmark,
            "cudnn_allow_tf32": torch.backends.cudnn.allow_tf32,
            "matmul_allow_tf32": torch.backends.cuda.matmul.allow_tf32,
            "deterministic": torch.backends.cudnn.deterministic, "budget": BUDGET}
    convs = resnet_convs()
    try:
        mc = resnet_convs_meta()
        meta["meta_check"] = "same" if mc == convs else {"analytic_only": sorted(set(convs) - set(mc)),
                                                          "meta_only": sorted(set(mc) - set(convs))}
        convs = sorted(set(convs) | set(mc))
    except Exception as e:
        meta["meta_check"] = repr(e)[:300]
    meta["resnet_convs"] = convs
    print(json.dumps(meta)[:3000], flush=True)
    fout = open(OUTF, "w")
    fout.write(json.dumps(meta) + "\n")

    shapes = []
    for N in [64, 1, 16, 128, 2, 32, 4, 8]:
        for (C, H, K, k, s, g) in convs:
            sh = (N, C, H, K, k, s, g, "fp32")
            if feasible(N, C, H, K, k, s, g, 4) and sh not in sh_set:
                sh_set[sh] = "resnet"
                shapes.append(sh)
    grid = []
    for N, C, H, k, s in itertools.product([1, 4, 16, 64], [3, 16, 32, 64, 96, 128, 256, 512, 1024, 2048],
                                           [7, 13, 14, 28, 31, 56, 112, 224], [1, 3, 5, 7], [1, 2]):
        Ks = {64, 256} | {x for x in (C // 2, C, 2 * C, 4 * C) if x >= 8}
        for K in sorted(Ks):
            sh = (N, C, H, K, k, s, 1, "fp32")
            if feasible(N, C, H, K, k, s, 1, 4) and sh not in sh_set:
                grid.append(sh)
    random.Random(1).shuffle(grid)
    for sh in grid:
        sh_set[sh] = "grid"
    bf = []
    for N in [64, 16, 128, 1, 32, 4, 8, 2]:
        for (C, H, K, k, s, g) in convs:
            sh = (N, C, H, K, k, s, g, "bf16")
            if feasible(N, C, H, K, k, s, g, 2):
                sh_set[sh] = "resnet_bf16"
                bf.append(sh)
    if ALL_BATCHES:
        # every (batch, conv, dtype) not measured yet: not in the table given with --missing-from
        # (src/engine/op/cudnn_conv_h200.tsv), else not in the first sweep's batches
        have = set()
        if "--missing-from" in sys.argv:
            for line in open(sys.argv[sys.argv.index("--missing-from") + 1]):
                f = line.split()
                if f and not line.startswith("#"):
                    # N C H W K R S stride pad groups dtype
                    have.add((int(f[0]), int(f[1]), int(f[2]), int(f[4]), int(f[5]), int(f[7]), int(f[9]), f[10]))
        else:
            first_convs = set(resnet_convs_first())
            have = {(N, C, H, K, k, s, g, dt) for N in (1, 2, 4, 8, 16, 32, 64, 128)
                    for (C, H, K, k, s, g) in first_convs for dt in ("fp32", "bf16")}
        sh_set.clear()
        shapes, grid, bf = [], [], []
        for dt, e, lst in (("fp32", 4, shapes), ("bf16", 2, bf)):
            for N in range(1, 129):
                for (C, H, K, k, s, g) in convs:
                    sh = (N, C, H, K, k, s, g, dt)
                    if sh in have:
                        continue
                    if feasible(N, C, H, K, k, s, g, e) and sh not in sh_set:
                        sh_set[sh] = "resnet_all" if dt == "fp32" else "resnet_all_bf16"
                        lst.append(sh)
    print(f"shapes: resnet fp32 {len(shapes)}, grid {len(grid)}, resnet bf16 {len(bf)}", flush=True)

    # phases: resnet fp32 (all), grid until 72% of the budget, bf16 resnet until the end
    phases = [(shapes, 1.0), (grid, 0.72), (bf, 1.0)]
    if ALL_BATCHES:
        phases = [(shapes, 0.75), (bf, 1.0)]
    printed = [0]
    done = 0
    for lst, frac in phases:
        pos = 0
        while pos < len(lst):
            if time.time() - T_START > BUDGET * frac:
                print(f"budget: stopped phase at {pos}/{len(lst)}", flush=True)
                break
            batch = lst[pos: pos + CHUNK]
            pos += len(batch)
            t0 = time.time()
            torch.cuda.memory._record_memory_history(max_entries=200000, stacks="all")
            ran = []
            for i, sh in enumerate(batch):
                try:
                    run_shape(done + i, sh)
                    ran.append(sh)
                except Exception as e:
                    torch.cuda.synchronize()
                    fout.write(json.dumps({"shape": list(sh), "error": repr(e)[:300]}) + "\n")
                    ran.append(None)
            torch.cuda.synchronize()
            t1 = time.time()
            snap = torch.cuda.memory._snapshot()
            torch.cuda.memory._record_memory_history(enabled=None)
            t2 = time.time()
            rows = []
            analyse_window(snap, batch, done, rows, printed)
            for sh, r in zip(batch, rows):
                if sh in ran:
                    fout.write(json.dumps(r) + "\n")
            fout.flush()
            done += len(batch)
            del snap
            torch.cuda.empty_cache()
            print(f"chunk of {len(batch)}: run {t1 - t0:.2f}s snapshot {t2 - t1:.2f}s analyse {time.time() - t2:.2f}s; "
                  f"done {done}, elapsed {time.time() - T_START:.0f}s; last {rows[-1].get('fwd')} {rows[-1].get('bwd_input')} "
                  f"{rows[-1].get('bwd_weight')}", flush=True)
    fout.close()
    print("done", done, "shapes in", round(time.time() - T_START), "s")


if __name__ == "__main__":
    main()
