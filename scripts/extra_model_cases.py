"""Cases beyond the ten of ../shared/groundtruth/models/models.json, recorded with the same
model definitions and loop (.gpu/reference_models.py, a copy of ../shared/tools'), one fresh
process per case: `python3 extra_model_cases.py OUTDIR CASE` (or `--list`)."""
import sys

import reference_models as R

MLP_S = dict(model="mlp", d_in=512, hidden=2048, layers=4, d_out=100, batch=256)
MLP = dict(model="mlp", d_in=1024, hidden=4096, layers=8, d_out=1000, batch=512)
R.CASES.clear()
R.case("x_mlp_s_sgd_momentum", **MLP_S, opt="sgd_momentum")
R.case("x_mlp_s_adamw", **MLP_S, opt="adamw")
R.case("x_mlp_adamw_bf16", **MLP, opt="adamw", amp="bf16")
R.case("x_mlp_adam_accum2", **dict(MLP, batch=128), opt="adam", accum=2)
R.case("x_mlp_sgd_retain", **MLP_S, opt="sgd", retain=True, iters=4)
R.case("x_mlp_inference_bf16", **MLP, opt="none", no_grad=True, amp="bf16")
R.case("x_mlp_odd_adam", model="mlp", d_in=1000, hidden=3000, layers=3, d_out=10, batch=100, opt="adam")
R.case("x_mlp_tiny_adamw", model="mlp", d_in=13, hidden=37, layers=2, d_out=5, batch=7, opt="adamw")
R.case("x_mlp_sgd_bf16_accum3", **MLP_S, opt="sgd", amp="bf16", accum=3)
R.case("x_gpt_tiny_sdpa_adamw", model="gpt", vocab=1000, seq=64, d=128, h=4, L=2, batch=4, attn="sdpa", opt="adamw")
R.case("x_gpt_small_math_sgd", model="gpt", vocab=5000, seq=128, d=256, h=8, L=4, batch=2, attn="math", opt="sgd")
R.case("x_gpt_tiny_sdpa_bf16_ckpt", model="gpt", vocab=1000, seq=64, d=128, h=4, L=2, batch=4, attn="sdpa", opt="adamw", amp="bf16", ckpt=True)
# second batch: GPT modes, optimizers, accumulation, precisions, a GPT-2 medium
TINY = dict(model="gpt", vocab=1000, seq=64, d=128, h=4, L=2, batch=4)
MID = dict(model="gpt", vocab=8000, seq=256, d=384, h=6, L=3, batch=4)
R.case("x_gpt_tiny_math_inference", **TINY, attn="math", opt="none", no_grad=True)
R.case("x_gpt_tiny_sdpa_eval_leak", **TINY, attn="sdpa", opt="none", eval_leak=True, iters=4)
R.case("x_gpt_tiny_sdpa_leak_sgd", **TINY, attn="sdpa", opt="sgd", leak=True, iters=4)
R.case("x_gpt_tiny_math_retain_sgd", **TINY, attn="math", opt="sgd", retain=True)
R.case("x_gpt_mid_sdpa_sgdm_accum2", **MID, attn="sdpa", opt="sgd_momentum", accum=2)
R.case("x_gpt_mid_math_bf16_adam", **MID, attn="math", opt="adam", amp="bf16")
R.case("x_gpt_mid_sdpa_ckpt_adamw", **MID, attn="sdpa", opt="adamw", ckpt=True)
R.case("x_gpt_mid_sdpa_bf16_inference", **MID, attn="sdpa", opt="none", no_grad=True, amp="bf16")
R.case("x_gpt2m_b2_sdpa_adamw", model="gpt", vocab=50257, seq=1024, d=1024, h=16, L=24, batch=2, attn="sdpa", opt="adamw")
# third batch (recorded after the autograd rework, to check it on shapes it was not built from):
# a sequence length off the 64 grid, a head size of 32, math with checkpointing, bf16 with
# accumulation and momentum, math bf16 inference, 8,192-row bias sums of narrow layers, an MLP
# whose bias sums split across blocks, a kept-loss math GPT
R.case("x3_gpt_t200_sdpa_adamw", model="gpt", vocab=3000, seq=200, d=192, h=3, L=2, batch=3, attn="sdpa", opt="adamw")
R.case("x3_gpt_d96_sdpa_sgd", model="gpt", vocab=2000, seq=128, d=96, h=3, L=3, batch=8, attn="sdpa", opt="sgd")
R.case("x3_gpt_math_ckpt_adam", model="gpt", vocab=4000, seq=128, d=256, h=4, L=3, batch=4, attn="math", opt="adam", ckpt=True)
R.case("x3_gpt_sdpa_bf16_sgdm_accum2", model="gpt", vocab=10000, seq=256, d=512, h=8, L=2, batch=2, attn="sdpa", opt="sgd_momentum", amp="bf16", accum=2)
R.case("x3_gpt_math_bf16_inference", model="gpt", vocab=2000, seq=128, d=256, h=4, L=2, batch=8, attn="math", opt="none", no_grad=True, amp="bf16")
R.case("x3_gpt_rows8k_sdpa_adamw", model="gpt", vocab=8192, seq=512, d=256, h=4, L=2, batch=16, attn="sdpa", opt="adamw")
R.case("x3_mlp_b2048_sgdm", model="mlp", d_in=256, hidden=1024, layers=3, d_out=10, batch=2048, opt="sgd_momentum")
R.case("x3_gpt_math_leak_sgd", model="gpt", vocab=1500, seq=96, d=160, h=5, L=2, batch=3, attn="math", opt="sgd", leak=True, iters=4)

if __name__ == "__main__":
    if sys.argv[1:2] == ["--list"]:
        print(" ".join(R.CASES))
    else:
        R.main()
