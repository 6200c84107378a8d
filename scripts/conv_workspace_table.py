"""Writes src/engine/op/cudnn_conv_h200.tsv, the table gpumem's engine reads for cuDNN's
convolution workspaces, from the sweep recorded on the H200 (fixtures/vision/conv_workspace.json.xz,
made by scripts/conv_workspace.py): one line per measured shape,
N C H W K R S stride pad groups dtype fwd bwd_input bwd_weight (bytes; 0: no workspace).

Usage: python3 conv_workspace_table.py fixtures/vision/conv_workspace.json.xz src/engine/op/cudnn_conv_h200.tsv
"""
import json
import lzma
import sys

d = json.load(lzma.open(sys.argv[1], "rt") if sys.argv[1].endswith(".xz") else open(sys.argv[1]))
meta = d["meta"]
seen = {}
for r in d["rows"]:
    key = (r["N"], r["C"], r["H"], r["W"], r["K"], r["R"], r["S"], r["stride"], r["pad"], r["groups"], r["dtype"])
    ws = tuple((r[k] or [0])[0] for k in ("fwd", "bwd_input", "bwd_weight"))
    if key in seen and seen[key] != ws:
        sys.exit(f"two measurements disagree for {key}: {seen[key]} and {ws}")
    seen[key] = ws
with open(sys.argv[2], "w") as f:
    f.write(f"# cuDNN {meta['cudnn']} on an {meta['device']}, PyTorch {meta['torch']}, benchmark=False: "
            f"workspace bytes per convolution (scripts/conv_workspace_table.py)\n")
    f.write("# N C H W K R S stride pad groups dtype fwd bwd_input bwd_weight\n")
    for key in sorted(seen):
        f.write(" ".join(map(str, key + seen[key])) + "\n")
print(len(seen), "shapes")
