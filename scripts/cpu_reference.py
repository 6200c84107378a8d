"""Record PyTorch CPU references for gpumem's CPU backend (fixtures/cpu/).

Usage: python3 scripts/cpu_reference.py [OUTDIR]   (default: fixtures/cpu)

For each case: a tiny MLP or GPT preset (the models of ../shared/tools/reference_models.py,
written here again with the same state_dict names), PyTorch's default initialization from a
fixed seed, saved as CASE.weights.safetensors (a tied head stored once, as Hugging Face files
do); random batches saved as CASE.batch.safetensors (stacked, one per iteration); three
training iterations in float32 on PyTorch's CPU with the preset's optimizer and learning rate;
each iteration's loss.item() and every parameter's .grad just before the first
optimizer.step() (CASE.grads.safetensors). The gpumem workload CASE.toml points at the files.
Run with any PyTorch >= 2.1; the numbers are deterministic on one machine.
"""
import json, math, os, sys

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint
from safetensors.torch import save_file

torch.set_num_threads(1)
torch.use_deterministic_algorithms(True)


class MLP(nn.Module):
    def __init__(self, d_in, hidden, layers, d_out):
        super().__init__()
        dims = [d_in] + [hidden] * layers
        self.layers = nn.ModuleList(nn.Linear(a, b) for a, b in zip(dims[:-1], dims[1:]))
        self.head = nn.Linear(hidden, d_out)

    def forward(self, x):
        for layer in self.layers:
            x = F.relu(layer(x))
        return self.head(x)


class Block(nn.Module):
    def __init__(self, d, h, attention):
        super().__init__()
        self.h, self.attention = h, attention
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.fc, self.fc_proj = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(C, dim=2)
        shape = (B, T, self.h, C // self.h)
        q, k, v = (t.view(shape).transpose(1, 2) for t in (q, k, v))
        if self.attention == "math":
            att = (q @ k.transpose(2, 3)) * (1.0 / math.sqrt(C // self.h))
            mask = torch.ones(T, T, dtype=torch.bool).tril()
            att = F.softmax(att.masked_fill(~mask, float("-inf")), dim=-1)
            y = att @ v
        else:
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        y = y.transpose(1, 2).contiguous().view(B, T, C)
        x = x + self.proj(y)
        return x + self.fc_proj(F.gelu(self.fc(self.ln2(x))))


class GPT(nn.Module):
    def __init__(self, vocab, seq, d, heads, layers, attention):
        super().__init__()
        self.wte, self.wpe = nn.Embedding(vocab, d), nn.Embedding(seq, d)
        self.blocks = nn.ModuleList(Block(d, heads, attention) for _ in range(layers))
        self.ln_f = nn.LayerNorm(d)
        self.head = nn.Linear(d, vocab, bias=False)
        self.head.weight = self.wte.weight

    def forward(self, idx, ckpt=False):
        x = self.wte(idx) + self.wpe(torch.arange(idx.shape[1]))
        for b in self.blocks:
            x = checkpoint(b, x, use_reentrant=False) if ckpt else b(x)
        return self.head(self.ln_f(x))


def optimizer(name, params):
    return {
        "sgd": lambda: torch.optim.SGD(params, lr=1e-3),
        "sgd_momentum": lambda: torch.optim.SGD(params, lr=1e-3, momentum=0.9),
        "adam": lambda: torch.optim.Adam(params, lr=1e-4, foreach=True),
        "adamw": lambda: torch.optim.AdamW(params, lr=1e-4, foreach=True),
    }[name]()


MLP_TINY = dict(kind="mlp", d_in=13, hidden=37, layers=2, d_out=5)
GPT_TINY = dict(kind="gpt", vocab=61, seq=16, d_model=32, heads=4, layers=2)
CASES = {}
for opt in ["sgd", "sgd_momentum", "adam", "adamw"]:
    CASES[f"mlp_tiny_{opt}"] = dict(model=MLP_TINY, batch=7, optimizer=opt, seed=1)
    CASES[f"gpt_tiny_sdpa_{opt}"] = dict(model=dict(GPT_TINY, attention="sdpa"), batch=3, optimizer=opt, seed=2)
CASES["gpt_tiny_math_adamw"] = dict(model=dict(GPT_TINY, attention="math"), batch=3, optimizer="adamw", seed=3)
CASES["gpt_tiny_sdpa_adamw_ckpt"] = dict(model=dict(GPT_TINY, attention="sdpa"), batch=3, optimizer="adamw", seed=4, checkpointing=True)
CASES["mlp_wide_adam_accum2"] = dict(model=dict(kind="mlp", d_in=64, hidden=96, layers=3, d_out=10), batch=16, optimizer="adam", seed=5, grad_accum=2)
ITERS = 3


def run(name, c, out):
    torch.manual_seed(c["seed"])
    m = c["model"]
    accum = c.get("grad_accum", 1)
    n = ITERS * accum
    if m["kind"] == "mlp":
        model = MLP(m["d_in"], m["hidden"], m["layers"], m["d_out"])
        batch = {"x": torch.randn(n, c["batch"], m["d_in"]),
                 "labels": torch.randint(0, m["d_out"], (n, c["batch"]))}
    else:
        model = GPT(m["vocab"], m["seq"], m["d_model"], m["heads"], m["layers"], m["attention"])
        batch = {"input_ids": torch.randint(0, m["vocab"], (n, c["batch"], m["seq"])),
                 "labels": torch.randint(0, m["vocab"], (n, c["batch"], m["seq"]))}
    state = {k: v.detach().clone().contiguous() for k, v in model.state_dict().items() if k != "head.weight" or m["kind"] == "mlp"}
    save_file(state, os.path.join(out, f"{name}.weights.safetensors"))
    save_file({k: v.contiguous() for k, v in batch.items()}, os.path.join(out, f"{name}.batch.safetensors"))
    opt = optimizer(c["optimizer"], model.parameters())
    losses, grads = [], None
    mb = 0
    for it in range(ITERS):
        total = 0.0
        for _ in range(accum):
            if m["kind"] == "mlp":
                outp = model(batch["x"][mb])
                loss = F.cross_entropy(outp.float(), batch["labels"][mb]) / accum
            else:
                outp = model(batch["input_ids"][mb], ckpt=c.get("checkpointing", False))
                V = m["vocab"]
                loss = F.cross_entropy(outp.view(-1, V).float(), batch["labels"][mb].view(-1)) / accum
            loss.backward()
            total += loss.item()
            mb += 1
        if grads is None:
            grads = {k: p.grad.detach().clone() for k, p in model.named_parameters()}
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(total)
    save_file(grads, os.path.join(out, f"{name}.grads.safetensors"))
    # the workload
    lines = [f"# PyTorch {torch.__version__} CPU reference: scripts/cpu_reference.py (expected.json)",
             "[workload]", f'name = "cpu_{name}"', 'device = "cpu"', "", "[model]"]
    for k, v in m.items():
        lines.append(f'{k} = "{v}"' if isinstance(v, str) else f"{k} = {v}")
    lines.append(f'weights = "{name}.weights.safetensors"')
    lines += ["", "[train]", f"batch = {c['batch']}", f"iterations = {ITERS}", f'optimizer = "{c["optimizer"]}"']
    if accum > 1:
        lines.append(f"grad_accum = {accum}")
    if c.get("checkpointing"):
        lines.append("checkpointing = true")
    lines += ["", "[data]", f'file = "{name}.batch.safetensors"', ""]
    with open(os.path.join(out, f"{name}.toml"), "w") as f:
        f.write("\n".join(lines))
    return {"losses": losses, "torch": torch.__version__}


def main():
    out = sys.argv[1] if len(sys.argv) > 1 else "fixtures/cpu"
    os.makedirs(out, exist_ok=True)
    res = {name: run(name, c, out) for name, c in CASES.items()}
    with open(os.path.join(out, "expected.json"), "w") as f:
        json.dump(res, f, indent=1, sort_keys=True)
        f.write("\n")
    for k, v in res.items():
        print(k, ["%.6f" % x for x in v["losses"]])


if __name__ == "__main__":
    main()
