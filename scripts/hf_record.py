"""Records a Hugging Face case on the GPU machine with ../shared/tools/hf_families.py (carried
in gpu_carry/), with two additions: LORA_TARGETS=a,b sets peft's target_modules (hf_models.py
fixes q_proj and v_proj, which Phi-3 does not have; "all-linear" is passed as it is) and
LORA_DROPOUT=p its dropout (default 0.05, as hf_models.py).

BERT_MLM=1 builds BertForMaskedLM (the case's "family" must be "bert_mlm", "model_type" "bert");
BERT_CLS=1 BertForSequenceClassification ("family" "bert", "model_type" "bert").

"opt" also takes torchao's low-bit optimizers (torchao.optim, lr 1e-4 and torchao's defaults):
"torchao_adamw8bit", "torchao_adam8bit", "torchao_adamw4bit", "torchao_adam4bit", "torchao_adamwfp8".

Usage: [SNAP=NAME] [LORA_TARGETS=...] [BERT_MLM=1] python3 hf_record.py OUTDIR CASE_JSON
"""
import os
import sys

here = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(here, "..", "gpu_carry"))

targets = os.environ.get("LORA_TARGETS")
dropout = os.environ.get("LORA_DROPOUT")
if targets or dropout:
    import peft

    real = peft.LoraConfig

    def patched(*a, **kw):
        if targets:
            kw["target_modules"] = targets if targets == "all-linear" else targets.split(",")
        if dropout:
            kw["lora_dropout"] = float(dropout)
        return real(*a, **kw)

    peft.LoraConfig = patched

if os.environ.get("BERT_MLM") or os.environ.get("BERT_CLS"):
    # BERT_MLM=1 with "model_type": "bert", "family": "bert_mlm": BertForMaskedLM in place of
    # the causal-LM class hf_families.py builds, its labels the inputs' clone (as a causal LM's);
    # BERT_CLS=1 with "family": "bert": BertForSequenceClassification, class labels
    import transformers

    head = (transformers.BertForMaskedLM if os.environ.get("BERT_MLM")
            else transformers.BertForSequenceClassification)

    def bert_head(cfg, attn_implementation=None, **kw):
        cfg._attn_implementation = attn_implementation or cfg._attn_implementation
        return head(cfg)

    transformers.AutoModelForCausalLM.from_config = bert_head

import hf_models  # noqa: E402  (gpu_carry; hf_families.py wraps its make_opt at import)

_base_make_opt = hf_models.make_opt
TORCHAO = {"torchao_adamw8bit": "AdamW8bit", "torchao_adam8bit": "Adam8bit",
           "torchao_adamw4bit": "AdamW4bit", "torchao_adam4bit": "Adam4bit",
           "torchao_adamwfp8": "AdamWFp8"}


def make_opt(name, params):
    if name in TORCHAO:
        import torchao.optim
        cls = getattr(torchao.optim, TORCHAO[name])
        return cls([p for p in params if p.requires_grad], lr=1e-4)
    return _base_make_opt(name, params)


hf_models.make_opt = make_opt

sys.argv = [os.path.join(here, "..", "gpu_carry", "hf_families.py")] + sys.argv[1:]
with open(sys.argv[0]) as f:
    code = compile(f.read(), sys.argv[0], "exec")
exec(code, {"__name__": "__main__", "__file__": sys.argv[0]})
