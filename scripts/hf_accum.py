"""Gradient accumulation in a Hugging Face training loop, recorded on the GPU machine for
gpumem's `[train] grad_accum` (issue 37): a tiny Llama (fixtures/hf/cases/llama_t.config.json's
shape), AdamW, three iterations, each of `accum` micro-batches of `batch` sequences:
`out = model(input_ids=x, labels=x.clone())`, `loss = out.loss / accum` (with accum > 1),
`loss.backward()`, `loss.item()`, `del out, loss, x, y`, then `opt.step()` and
`opt.zero_grad(set_to_none=True)`. Per iteration: the peaks, allocated at the start and end.

Usage: python3 scripts/hf_accum.py OUT.json BATCH:SEQ:ACCUM...
"""
import json
import sys

import torch
import transformers

TINY = dict(vocab_size=16000, hidden_size=512, intermediate_size=1408, num_hidden_layers=4,
            num_attention_heads=8, num_key_value_heads=2, max_position_embeddings=2048)


def one(batch, seq, accum):
    torch.manual_seed(0)
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    cfg = transformers.LlamaConfig(**TINY)
    cfg._attn_implementation = "sdpa"
    model = transformers.LlamaForCausalLM(cfg).to("cuda")
    model.train()
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-4,
                            foreach=True)
    rows = []
    for it in range(3):
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        row = {"iter": it, "start": torch.cuda.memory_allocated()}
        for _ in range(accum):
            x = torch.randint(0, cfg.vocab_size, (batch, seq), device="cuda")
            y = x.clone()
            out = model(input_ids=x, labels=y)
            loss = out.loss / accum if accum > 1 else out.loss
            loss.backward()
            loss.item()
            del out, loss, x, y
        opt.step()
        opt.zero_grad(set_to_none=True)
        torch.cuda.synchronize()
        row["end"] = torch.cuda.memory_allocated()
        row["peak_allocated"] = torch.cuda.max_memory_allocated()
        row["peak_reserved"] = torch.cuda.max_memory_reserved()
        row["reserved_end"] = torch.cuda.memory_reserved()
        rows.append(row)
    return rows


def main():
    out = {"torch": torch.__version__, "transformers": transformers.__version__, "cases": {}}
    for spec in sys.argv[2:]:
        batch, seq, accum = (int(v) for v in spec.split(":"))
        out["cases"][spec] = one(batch, seq, accum)
        print(spec, [(r["peak_allocated"], r["peak_reserved"]) for r in out["cases"][spec]],
              flush=True)
    with open(sys.argv[1], "w") as f:
        json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
