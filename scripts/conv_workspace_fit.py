"""Analyses fixtures/vision/conv_workspace.json.xz (scripts/conv_workspace.py's sweep of cuDNN
convolution allocations): names each workspace by the formula that gives it from the shape
(a "family": none, a small constant, in+out+w+c, io+c, ..., N*w+c for the weight gradient, or one
of those plus a multiple of 256 KiB), counts the families per pass, scores compact rules, and
grows small decision trees (pure Python, no numpy) that pick a family from shape features:
trained on the generic grid, scored on the resnet rows, and the other way round.

Usage: python3 conv_workspace_fit.py [fixtures/vision/conv_workspace.json.xz] [--trees]
"""
import collections, json, lzma, sys

Q = 256 * 1024
PHASES = ["fwd", "bwd_input", "bwd_weight"]


def load(path):
    rows = json.load(lzma.open(path, "rt") if path.endswith(".xz") else open(path))["rows"]
    for r in rows:
        e = 4 if r["dtype"] == "fp32" else 2
        r["e"] = e
        r["Ho"] = (r["H"] + 2 * r["pad"] - r["R"]) // r["stride"] + 1
        r["inb"] = r["N"] * r["C"] * r["H"] * r["W"] * e
        r["outb"] = r["N"] * r["K"] * r["Ho"] * r["Ho"] * e
        r["wb"] = r["K"] * (r["C"] // r["groups"]) * r["R"] * r["S"] * e
        assert r["fwd_out"] == [r["outb"]] and r["bi_out"] == [r["inb"]] and r["bw_out"] == [r["wb"]]
    return rows


def family(r, ph):
    """(name, X, c): workspace = base(name) + X + c, X a multiple of 256 KiB, 0 <= c <= 1024.
    Bases: i, o, w = the fp-sized input, output, weight bytes; Nw = N * w in fp32 bytes."""
    if not r[ph]:
        return ("none", 0, 0)
    ws = r[ph][0]
    i, o, w, N = r["inb"], r["outb"], r["wb"], r["N"]
    if ws <= 1024:
        return ("const", 0, ws)
    combos = [("iow", i + o + w), ("io", i + o), ("iw", i + w), ("ow", o + w), ("i", i), ("o", o), ("w", w)]
    for name, base in combos:
        if 0 <= ws - base <= 1024:
            return (name, 0, ws - base)
    if ph == "bwd_weight":
        w32 = w * 4 // r["e"]
        if 0 <= ws - N * w32 <= 1024:
            return ("Nw32", 0, ws - N * w32)
        for m in range(1, 129):
            if m * w > 1024 and 0 <= ws - m * w <= 1024:
                return (f"{m}w", 0, ws - m * w)
    for name, base in combos + [("", 0)]:
        d = ws - base
        if d > 0 and (d % Q) <= 1024 and d >= Q:
            return (name + "+X", d - d % Q, d % Q)
    return ("other", 0, ws)


def label(r, ph):
    """A family with its constant: a formula of the shape, except *+X and other."""
    n, X, c = family(r, ph)
    if n in ("none", "other") or n.endswith("+X"):
        return n
    if n == "const":
        return f"c{c}"
    return f"{n}+{c}"


def predict_size(r, ph, lab):
    """The workspace size (None = no allocation) a label gives for a row; False where it gives none."""
    if lab == "none":
        return None
    if lab in ("other",) or lab.endswith("+X"):
        return False
    if lab.startswith("c"):
        return int(lab[1:])
    base, c = lab.rsplit("+", 1)
    i, o, w, N = r["inb"], r["outb"], r["wb"], r["N"]
    val = {"iow": i + o + w, "io": i + o, "iw": i + w, "ow": o + w, "i": i, "o": o, "w": w,
           "Nw32": N * w * 4 // r["e"]}.get(base)
    if val is None and base.endswith("w"):
        val = int(base[:-1]) * w
    return val + int(c)


def hit(r, ph, lab):
    p = predict_size(r, ph, lab)
    got = r[ph][0] if r[ph] else None
    return p is not False and p == got


def feats(r):
    N, C, H, K, R, s, g, Ho = r["N"], r["C"], r["H"], r["K"], r["R"], r["stride"], r["groups"], r["Ho"]
    return dict(N=N, C=C, H=H, K=K, R=R, stride=s, groups=g, Ho=Ho, M=N * Ho * Ho, NHW=N * H * H,
                CRS=C // g * R * R, Cg=C // g, in_b=r["inb"], out_b=r["outb"], w_b=r["wb"],
                io_b=r["inb"] + r["outb"], flops=N * Ho * Ho * K * (C // g) * R * R, CHW=C * H * H,
                KHoWo=K * Ho * Ho, HW=H * H, K_over_C=K / C, e=r["e"])


# --- a small CART (gini) -----------------------------------------------------------------------
def gini(cnt, n):
    return 1.0 - sum((v / n) ** 2 for v in cnt.values()) if n else 0.0


def grow(X, y, idx, depth, min_leaf=20):
    cnt = collections.Counter(y[i] for i in idx)
    maj = cnt.most_common(1)[0][0]
    if depth == 0 or len(cnt) == 1 or len(idx) < 2 * min_leaf:
        return ("leaf", maj, len(idx), cnt[maj])
    n = len(idx)
    parent = gini(cnt, n)
    best = (0.0, None, None)
    for f in X[idx[0]]:
        order = sorted(idx, key=lambda i: X[i][f])
        left = collections.Counter()
        right = collections.Counter(cnt)
        gl = 0.0
        for k in range(n - 1):
            yi = y[order[k]]
            left[yi] += 1
            right[yi] -= 1
            if k + 1 < min_leaf or n - k - 1 < min_leaf:
                continue
            a, b = X[order[k]][f], X[order[k + 1]][f]
            if a == b:
                continue
            nl, nr = k + 1, n - k - 1
            gain = parent - (nl * gini(left, nl) + nr * gini(right, nr)) / n
            if gain > best[0] + 1e-12:
                best = (gain, f, (a + b) / 2)
    if best[1] is None:
        return ("leaf", maj, len(idx), cnt[maj])
    f, t = best[1], best[2]
    li = [i for i in idx if X[i][f] <= t]
    ri = [i for i in idx if X[i][f] > t]
    return ("node", f, t, grow(X, y, li, depth - 1, min_leaf), grow(X, y, ri, depth - 1, min_leaf))


def classify(tree, x):
    while tree[0] == "node":
        tree = tree[3] if x[tree[1]] <= tree[2] else tree[4]
    return tree[1]


def show(tree, ind="  "):
    if tree[0] == "leaf":
        return [f"{ind}-> {tree[1]}   ({tree[3]}/{tree[2]} of the training rows)"]
    t = tree[2]
    ts = f"{t:g}" if isinstance(t, float) and t < 1e6 else f"{t:.4g}"
    return ([f"{ind}if {tree[1]} <= {ts}:"] + show(tree[3], ind + "    ") +
            [f"{ind}else:"] + show(tree[4], ind + "    "))


def tree_score(train, test, ph, depth):
    X = [feats(r) for r in train]
    y = [label(r, ph) for r in train]
    tree = grow(X, y, list(range(len(train))), depth)
    tr = sum(hit(r, ph, classify(tree, feats(r))) for r in train)
    te = sum(hit(r, ph, classify(tree, feats(r))) for r in test)
    return tree, tr, te


# --- compact hand rules ----------------------------------------------------------------------
# by (kernel, stride) alone: the most common family of the resnet rows of each class
def rule_fwd(r):
    if r["R"] == 1:
        return "none" if r["stride"] == 1 else "io+16"
    return "iow+16"


def rule_bi(r):
    if r["R"] == 1:
        return "none" if r["stride"] == 1 else "io+147"
    if r["R"] == 7:
        return "none"
    return "iow+147" if r["stride"] == 2 else "iow+16"


def rule_bw(r):
    if r["R"] == 1:
        return "Nw32+0" if r["stride"] == 1 else "io+16"
    return "iow+16"


def main():
    path = next((a for a in sys.argv[1:] if not a.startswith("--")), "fixtures/vision/conv_workspace.json.xz")
    rows = load(path)
    sets = collections.Counter((r["set"], r["dtype"]) for r in rows)
    print("rows:", len(rows), dict(sets))
    for dt in ["fp32", "bf16"]:
        R = [r for r in rows if r["dtype"] == dt]
        for ph in PHASES:
            c = collections.Counter(label(r, ph) for r in R)
            print(f"\n{dt} {ph}: {len(R)} rows; families (label: rows)")
            print("   " + ", ".join(f"{k}: {v}" for k, v in c.most_common(16)),
                  f"... ({len(c)} labels)" if len(c) > 16 else "")
    print("\nresnet fp32 rows, family by (kernel, stride):")
    for ph in PHASES:
        for key in sorted({(r["R"], r["stride"]) for r in rows if r["set"] == "resnet"}):
            sub = [r for r in rows if r["set"] == "resnet" and (r["R"], r["stride"]) == key]
            print(f"  {ph} k{key[0]} s{key[1]} ({len(sub)}):",
                  ", ".join(f"{k} {v}" for k, v in collections.Counter(label(r, ph) for r in sub).most_common(6)))
    print("\ncompact rules (exact size matches):")
    for ph, rule in zip(PHASES, [rule_fwd, rule_bi, rule_bw]):
        for name, sub in [("grid fp32", [r for r in rows if r["set"] == "grid"]),
                          ("resnet fp32", [r for r in rows if r["set"] == "resnet"]),
                          ("resnet bf16", [r for r in rows if r["set"] == "resnet_bf16"])]:
            print(f"  {ph:10s} {name:12s} {sum(hit(r, ph, rule(r)) for r in sub)}/{len(sub)}")
    print("\nbest possible for any rule that picks one fixed formula per row (rows not *+X / other):")
    for ph in PHASES:
        for name in ["grid", "resnet", "resnet_bf16"]:
            sub = [r for r in rows if r["set"] == name]
            ok = sum(1 for r in sub if not (label(r, ph) == "other" or label(r, ph).endswith("+X")))
            print(f"  {ph:10s} {name:12s} {ok}/{len(sub)}")
    if "--trees" in sys.argv:
        grid = [r for r in rows if r["set"] == "grid"]
        res = [r for r in rows if r["set"] == "resnet"]
        for ph in PHASES:
            for depth in [2, 4, 8]:
                _, tr, te = tree_score(grid, res, ph, depth)
                _, tr2, te2 = tree_score(res, grid, ph, depth)
                print(f"  tree {ph} depth {depth}: train grid {tr}/{len(grid)}, test resnet {te}/{len(res)}; "
                      f"train resnet {tr2}/{len(res)}, test grid {te2}/{len(grid)}", flush=True)
            tree, tr, te = tree_score(grid, res, ph, 3)
            print("\n".join(show(tree)))


if __name__ == "__main__":
    main()
