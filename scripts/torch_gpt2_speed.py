"""PyTorch's time for the GPT-2 small preset (fixtures/workloads/presets/gpt2_small_sdpa_adamw.toml):
12 layers of 768, 12 heads, vocabulary 50,257, 1,024 tokens, batch 8, float32 (no TF32), SDPA,
AdamW (foreach), 3 iterations of forward, backward and step, on the GPU of this machine.
Prints the process's wall time to the end of the last step and each iteration's time, beside
which scripts/gpu-cuda-compute.sh's SPEED= line gives gpumem's on --device cuda."""
import time

T0 = time.time()
import torch
import torch.nn as nn
import torch.nn.functional as F

torch.backends.cuda.matmul.allow_tf32 = False
torch.backends.cudnn.allow_tf32 = False
dev = "cuda"
V, S, D, H, L, B = 50257, 1024, 768, 12, 12, 8


class Layer(nn.Module):
    def __init__(self):
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(D), nn.LayerNorm(D)
        self.qkv, self.proj = nn.Linear(D, 3 * D), nn.Linear(D, D)
        self.up, self.down = nn.Linear(D, 4 * D), nn.Linear(4 * D, D)

    def forward(self, x):
        b, t, _ = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(D, dim=2)
        q, k, v = (z.view(b, t, H, D // H).transpose(1, 2) for z in (q, k, v))
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(a.transpose(1, 2).reshape(b, t, D))
        return x + self.down(F.gelu(self.up(self.ln2(x))))


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.tok, self.pos = nn.Embedding(V, D), nn.Embedding(S, D)
        self.layers = nn.ModuleList(Layer() for _ in range(L))
        self.ln = nn.LayerNorm(D)
        self.head = nn.Linear(D, V, bias=False)
        self.head.weight = self.tok.weight

    def forward(self, idx):
        x = self.tok(idx) + self.pos(torch.arange(idx.shape[1], device=idx.device))
        for layer in self.layers:
            x = layer(x)
        return self.head(self.ln(x))


model = Model().to(dev)
opt = torch.optim.AdamW(model.parameters(), lr=1e-4, foreach=True)
idx = torch.randint(0, V, (B, S), device=dev)
tgt = torch.randint(0, V, (B, S), device=dev)
times = []
for it in range(3):
    torch.cuda.synchronize()
    t = time.time()
    loss = F.cross_entropy(model(idx).view(-1, V), tgt.view(-1))
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    lv = loss.item()
    times.append(time.time() - t)
print(f"pytorch {torch.__version__}: wall to the end {time.time() - T0:.2f} s, "
      f"iterations {', '.join(f'{x:.3f}' for x in times)} s, "
      f"peak allocated {torch.cuda.max_memory_allocated()}")
