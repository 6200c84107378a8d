"""Record PyTorch snapshots for gpumem's iteration finding (issue 15), on a GPU.

- eval_keep_losses.pickle: an evaluation loop of 8 iterations, no optimizer (so no
  Optimizer.step annotations), that appends each loss to a list with its graph, so each
  iteration's activations stay allocated: a leak of the same size per iteration.
- train_layers_1step.pickle: one training step (forward, backward, SGD step) of a 12-block MLP:
  its blocks repeat within the step, which are not iterations.
- train_layers_6steps.pickle: the same for 6 steps (Adam).
- eval_keep_losses_4it.pickle: the same kind of loop at other sizes (4 blocks of 768/3072, batch
  384, 4 iterations): 4 x (4.5 + 4.5 + 1.125) MiB = 40.5 MiB kept per iteration.
- infer_layers_1pass.pickle: one no_grad forward of 24 blocks: each block frees what the one
  before made, so the blocks repeat in balance, but inside one call of the model: not iterations.
- infer_loop_5batches.pickle: a no_grad inference loop over 5 batches (no optimizer): 5 iterations.
- layerwise_offload.pickle: a layer-by-layer loop (as quantization calibration does): each of 12
  blocks is moved onto the GPU with .cuda(), run, and moved back: layers, not iterations.

Usage: python3 record_iteration_snapshots.py OUT_DIR [NAME ...] (all when no name is given).
Each in a fresh allocator state (empty_cache between), history on with Python and C++ stacks.
"""
import sys

import torch
import torch.nn as nn

out = sys.argv[1]
dev = "cuda"


def blocks(n, d=1024, h=4096):
    return nn.Sequential(
        *[nn.Sequential(nn.Linear(d, h), nn.GELU(), nn.Linear(h, d)) for _ in range(n)]
    ).to(dev)


def record(name, fn):
    torch.cuda.empty_cache()
    torch.cuda.memory._record_memory_history(max_entries=200000)
    fn()
    torch.cuda.synchronize()
    torch.cuda.memory._dump_snapshot(f"{out}/{name}.pickle")
    torch.cuda.memory._record_memory_history(enabled=None)
    print(name, "allocated", torch.cuda.memory_allocated())


def eval_keep_losses():
    torch.manual_seed(0)
    model = blocks(6)
    x = torch.randn(512, 1024, device=dev)
    losses = []
    for _ in range(8):
        y = model(x)
        loss = y.pow(2).mean()
        losses.append(loss)  # keeps the graph, and so the activations
    eval_keep_losses.kept = losses


def train(steps, opt_name):
    torch.manual_seed(0)
    model = blocks(12)
    opt = (torch.optim.SGD if opt_name == "sgd" else torch.optim.Adam)(
        model.parameters(), lr=1e-3
    )
    x = torch.randn(256, 1024, device=dev)
    for _ in range(steps):
        loss = model(x).pow(2).mean()
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    train.kept = (model, opt)


def eval_keep_losses_4it():
    torch.manual_seed(0)
    model = blocks(4, d=768, h=3072)
    x = torch.randn(384, 768, device=dev)
    losses = []
    for _ in range(4):
        loss = model(x).pow(2).mean()
        losses.append(loss)
    eval_keep_losses_4it.kept = losses


def infer_layers_1pass():
    torch.manual_seed(0)
    model = blocks(24)
    x = torch.randn(512, 1024, device=dev)
    with torch.no_grad():
        y = model(x)
    infer_layers_1pass.kept = (model, y)


def infer_loop_5batches():
    torch.manual_seed(0)
    model = blocks(6)
    xs = [torch.randn(512, 1024, device=dev) for _ in range(5)]
    sums = []
    with torch.no_grad():
        for x in xs:
            y = model(x)
            sums.append(y.float().sum().item())
    infer_loop_5batches.kept = (model, sums)


def layerwise_offload():
    torch.manual_seed(0)
    layers = [nn.Sequential(nn.Linear(1024, 4096), nn.GELU(), nn.Linear(4096, 1024)) for _ in range(12)]
    inp = torch.randn(512, 1024, device=dev)
    with torch.no_grad():
        for layer in layers:
            layer.cuda()
            inp = layer(inp)
            layer.cpu()
    layerwise_offload.kept = inp


CASES = {
    "eval_keep_losses": eval_keep_losses,
    "train_layers_1step": lambda: train(1, "sgd"),
    "train_layers_6steps": lambda: train(6, "adam"),
    "eval_keep_losses_4it": eval_keep_losses_4it,
    "infer_layers_1pass": infer_layers_1pass,
    "infer_loop_5batches": infer_loop_5batches,
    "layerwise_offload": layerwise_offload,
}
for name in sys.argv[2:] or CASES:
    record(name, CASES[name])
    for f in (eval_keep_losses, eval_keep_losses_4it, train, infer_layers_1pass, infer_loop_5batches, layerwise_offload):
        f.kept = None
