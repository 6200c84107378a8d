"""Record PyTorch snapshots for gpumem's iteration finding (issue 15), on a GPU.

Usage: python3 record_iteration_snapshots.py OUT_DIR

- eval_keep_losses.pickle: an evaluation loop of 8 iterations, no optimizer (so no
  Optimizer.step annotations), that appends each loss to a list with its graph, so each
  iteration's activations stay allocated: a leak of the same size per iteration.
- train_layers_1step.pickle: one training step (forward, backward, SGD step) of a 12-block MLP:
  its blocks repeat within the step, which are not iterations.
- train_layers_6steps.pickle: the same for 6 steps (Adam).
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


record("eval_keep_losses", eval_keep_losses)
eval_keep_losses.kept = None
record("train_layers_1step", lambda: train(1, "sgd"))
train.kept = None
record("train_layers_6steps", lambda: train(6, "adam"))
