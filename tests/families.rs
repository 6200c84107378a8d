//! Issue 38: the model families of 2026 (Qwen3, Gemma 1-3, Phi-3/4, Mixtral, Qwen3-MoE) against
//! PyTorch 2.11 and transformers 5.17 on an H200 (fixtures/hf2: ../shared/groundtruth/hf2's
//! cases, their allocator traces and gpumem's workloads), and every published config of
//! fixtures/hf/configs run as a user would.

mod common;

use common::{run_json, u};
use serde_json::Value;

use gpumem::commands::compare_torch::FIELDS;

/// (case, exact, events): `exact` cases match every field of every iteration to the byte;
/// `events` cases allocate and free as PyTorch did, event for event.
const CASES: &[(&str, bool, bool)] = &[
    ("qwen3_06b_4l_b2_s512_adamw_fp32", true, true),
    ("gemma_2b_2l_b2_s512_adamw_fp32", true, true),
    ("phi3_mini_2l_b2_s512_adamw_fp32", true, true),
    ("gemma3_1b_4l_b2_s512_adamw_fp32", true, true),
    ("gemma2_2b_2l_b2_s512_adamw_fp32_eager", true, true),
    ("mixtral_2l_b2_s512_adamw_fp32", true, true),
    ("qwen3moe_2l_b2_s512_adamw_fp32", true, true),
    // 8,192 routed pairs a layer: cub's radix sort past sort's in-place limit, index_put_'s
    // onesweep storage (recorded after it was modelled, scripts/gpu-families-cases.sh)
    ("qwen3moe_t_s1024_fp32", true, true),
    // bf16 weights: CUTLASS's grouped GEMM scratch per product, the float32 routing weights;
    // the same events as the snapshot's run, whose own figures were not recorded: the
    // figures' run placed one block differently (a best-fit tie, 512 KiB more allocated)
    ("mixtral_t_bf16w", false, true),
    // LoRA over bf16 weights: cuDNN's attention backward writes a frozen key's gradient too
    ("mixtral_t_lora_bf16w", true, true),
    // bf16 generation: the decode steps switch the experts to batched_mm
    ("mixtral_t_generate_bf16", true, true),
    // Qwen3-MoE's router hands back bf16 weights; its rotary embedding expands first
    ("qwen3moe_t_generate_bf16", true, true),
    // HF gradient checkpointing: the recompute starts at the first node that unpacks (a
    // view's backward copies before it) and stops once the last saved input is packed, before
    // its op allocates; what the early stop frees comes in another order (Python's frames)
    ("mixtral_t_ckpt_fp32", true, false),
    // `output_router_logits`: the router logits kept, the load-balancing loss (bincount of the
    // chosen experts), a full sum's gradient an expanded view
    ("mixtral_t_aux_fp32", true, true),
    // recorded after they were modelled (2026-12-05, scripts/gpu-families-cases.sh): Gemma-2's
    // sliding window on alternate layers in sdpa, Phi-3's sliding window, LoRA over bf16
    // weights in Qwen3 and Gemma, LoRA on GPT-2's Conv1D layers, Gemma-3 with both layer types
    ("gemma2_t_sdpa_fp32", true, true),
    ("phi3_t_sw_fp32", true, true),
    // (Qwen3's frees in another order than PyTorch from one point on, with the same figures:
    // PyTorch frees its allocation #2 (2 MiB) as the decoder returns, at event 300; not yet
    // followed up. Gemma's RMSNorm frees the weight's temporary first; GPT-2's block frees
    // ln_1's and ln_2's outputs as `hidden_states` is rebound, its input as it returns)
    ("qwen3_t_lora_bf16w", true, false),
    ("gemma_t_lora_bf16w", true, true),
    ("gpt2_t_lora_fp32", true, true),
    // GPT-2 over bf16 weights: its Conv1D's addmm in bf16, float32 adapters
    ("gpt2_t_lora_bf16w", true, true),
    // GPT-2's generation (bf16 weights, 128 + 32 tokens): the position embedding per row, the
    // cache grown per step, the query's fused projection held until the attention returns
    ("gpt2_t_generate_bf16", true, true),
    // one best-fit tie in the third iteration's peak (1,024 bytes; the events part at 931)
    ("gemma3_6l_sdpa_fp32", false, false),
    // bf16 weights with a sliding window: SDPA turns the bool window mask into a bf16 bias
    // (two bf16 scalars, `where`) that cuDNN's kernel takes and keeps for backward, with its
    // 256-byte scratch; Gemma's RMSNorm frees the weight's temporary before its input. Gemma-3
    // runs PyTorch's events, but a best-fit tie from the second iteration on leaves 2.6 MiB
    // more allocated after the forward (0.097%)
    ("gemma2_t_lora_bf16w", true, true),
    ("gemma3_t_lora_bf16w", false, true),
    // Phi-3 rotates its query through a `cat` (partial rotary), so the query is contiguous,
    // cuDNN's output follows its layout, and `transpose(1, 2).contiguous()` copies it
    ("phi3_t_lora_bf16w", true, true),
    ("phi3_t_sw_lora_bf16w", true, true),
    // bf16 generation past a 256-token window (240 + 32 tokens): the sliding layers' cache
    // (`DynamicSlidingWindowLayer`: both full states, then the kept views; its int64 length),
    // the sliding mask's builder beside the causal one, skipped within the window; from the
    // step that reaches it, the 4-D window mask from the 2-D one (past it, the ignore check
    // first indexes the 2-D mask's last w columns), the keys and values repeated, the bool
    // mask made a bf16 bias for cuDNN (no scratch for one query); Gemma-3's local rotary
    // pair, and its causal mask sized by a sliding layer (it has no full one)
    ("gemma2_t_generate_bf16", true, true),
    ("gemma3_t_generate_bf16", true, true),
    ("phi3_t_sw_generate_bf16", true, true),
    // held out: recorded on an H100 after the modes above were modelled (2026-12-05, second
    // session), each compared once as it came: other windows, batches and prompt lengths in
    // generation (Mistral's sliding-only mask, Gemma-2 at window 128 and batch 3, Gemma-3 with
    // a full layer among five sliding ones), LoRA over bf16 weights with Phi-4's grouped heads
    // and Mistral's window, Qwen3 with checkpointing, bf16 generation of Qwen3, Gemma and
    // Phi-3, Phi-4 in float32, Gemma-3's eager attention. Gemma's rotary embedding expands
    // the frequencies to the batch before its float32 copy (seen first here); the two
    // six-layer Gemma-3 cases run PyTorch's events with one best-fit tie each (1,024 bytes)
    ("mistral_t_sw_generate_bf16", true, true),
    ("gemma2_t_w128_b3_generate_bf16", true, true),
    ("gemma3_6l_generate_bf16", false, true),
    ("phi4_t_lora_bf16w", true, true),
    ("mistral_t_sw_lora_bf16w", true, true),
    ("qwen3_t_generate_bf16", true, true),
    ("gemma_t_generate_bf16", true, true),
    ("phi3_t_generate_bf16", true, true),
    ("phi4_t_sdpa_fp32", true, true),
    ("qwen3_t_ckpt_fp32", true, true),
    ("gemma3_6l_eager_fp32", false, true),
    // BERT's masked-LM head (recorded on the H200 with the config naming `BertForMaskedLM`):
    // the transform, the decoder tied to the word embeddings, the loss over every position; the
    // embeddings' and layers' locals freed as Python frees them (seen under LoRA, where the
    // frozen weights keep nothing); the memory-efficient and cuDNN kernels write a frozen
    // key's gradient too; cuDNN's 256-byte forward scratch without a mask or causality
    ("bert_t_mlm_fp32", true, true),
    ("bert_base_mlm_b4_s512_fp32", true, true),
    ("bert_t_mlm_lora_fp32", true, true),
    ("bert_t_mlm_lora_bf16w", true, true),
    // float32 generation past Gemma-3's 256-token window (240 + 32): the memory-efficient
    // kernel takes the window's mask as a float32 bias in the decode steps (exact once the
    // refusal was lifted: the bf16 path's mask, repeat and cache rules hold)
    ("gemma3_t_generate_fp32", true, true),
    // prompts that reach the sliding window (recorded on an H100 while refused): the
    // prefill's window mask over the prompt (the decode steps' rule over T queries and keys),
    // the cache's views of the prompt's last `sliding_window - 1` positions; in float32 the
    // memory-efficient kernel's mask padded to a multiple of 8 keys (300 to 304), the unpadded
    // one dropped before the kernel
    ("gemma3_t_p300_generate_bf16", true, true),
    ("gemma3_t_p300_generate_fp32", true, true),
    ("mistral_t_p200_generate_bf16", true, true),
    ("gemma2_t_p300_generate_bf16", true, true),
    // held out (recorded on an H100 after BERT's bf16 weights were allowed): its classifier
    // fully trained over bf16 weights, bert-base's masked LM with LoRA over bf16 weights at
    // batch 8 x 512 (both exact at once)
    ("bert_t_cls_bf16w", true, true),
    ("bert_base_mlm_lora_bf16w_b8_s512", true, true),
    // held-out long generations (recorded on an H100 on 2026-12-06, no snapshots,
    // scripts/gpu-long-generate.sh), the KV cache grown into the large pool and the ids past
    // many 512-byte blocks: what `fit --param new_tokens` fast-forwards. Qwen3 at batch 2,
    // 200 + 2,500 tokens, exact; a Llama with 16 x 128 key/value heads at batch 1, 64 + 3,000
    // tokens, exact but for the second iteration's peak (4,096 bytes low: a best-fit tie)
    ("qwen3_t_b2_g2500_bf16", true, false),
    ("llama_wide_b1_g3000_bf16", false, false),
    // Mixtral under bf16 autocast and with eager attention (recorded on an H100 while refused,
    // exact once the refusal was lifted): the experts as already modelled; under autocast one
    // free in the router weights' cast backward comes a step early (same figures)
    ("mixtral_t_amp_bf16", true, false),
    ("mixtral_t_eager_fp32", true, true),
    // BERT with HF gradient checkpointing (each layer recomputed; recorded on an H100 without
    // a snapshot, whose recording breaks the recompute under dropout): the masked LM exact, the
    // classifier's allocated figures exact and its reserved 4 MiB short (0.32% beyond 2 MiB)
    ("bert_t_mlm_ckpt_fp32", true, false),
    ("bert_t_cls_ckpt_fp32", false, false),
    // held out: GPT-2's eager attention at another width, batch and length (exact at once)
    ("gpt2_m2_eager_b1_s256_fp32", true, true),
    // bf16 generation past windows of more than 512 keys (recorded on an H100 while refused,
    // 2026-12-06): each decode step past the window takes cuDNN's split-key workspace with the
    // bias, the rule of the unmasked decode step with its parts padded to 128 bytes
    // (scripts/sdpa_mask_workspace.py: 1,440 of 1,440 masked shapes)
    ("gemma2_t_w640_p600_generate_bf16", true, true),
    ("gemma3_t_w600_p560_generate_bf16", true, true),
    ("mistral_t_w1024_p1000_generate_bf16", true, true),
];

/// The fields that differ (iteration, field, gpumem minus PyTorch) and the worst allocated
/// error and reserved error beyond 2 MiB, relative.
fn differences(name: &str) -> (Vec<(u64, &'static str, i64)>, f64, f64) {
    common::case_differences("fixtures/hf2", name, name, &FIELDS)
}

#[test]
fn new_families_match_pytorch() {
    let mut report = Vec::new();
    for &(name, exact, _) in CASES {
        let (diffs, alloc, reserved) = differences(name);
        report.push(format!(
            "{name}: {} fields differ; worst allocated {:.4}%, reserved {:.4}% beyond 2 MiB",
            diffs.len(),
            alloc * 100.0,
            reserved * 100.0
        ));
        if exact {
            assert!(diffs.is_empty(), "{name} was exact to the byte: {diffs:?}");
        }
        assert!(
            alloc <= 0.001,
            "{name}: allocated off by {:.4}%",
            alloc * 100.0
        );
        assert!(reserved <= 0.01, "{name}: reserved off: {diffs:?}");
    }
    eprintln!("{}", report.join("\n"));
}

/// Every allocation and free of the three iterations in PyTorch's order: the families' ops,
/// autograd's backward (gradients laid out as TensorIterator lays them out) and AdamW.
#[test]
fn new_families_allocate_and_free_as_pytorch_does() {
    for &(name, _, events) in CASES {
        if !events {
            continue;
        }
        let p = common::root().join(format!("fixtures/hf2/traces/events_{name}.json"));
        let t = common::recorded_events(&p);
        let g = common::allocator_events(&format!("fixtures/hf2/workloads/{name}.toml"));
        let first = g.iter().zip(&t).position(|(a, b)| a != b);
        assert_eq!(first, None, "{name}: first difference at event {first:?}");
        assert_eq!(g.len(), t.len(), "{name}: event count");
    }
}

/// Each run of consecutive frees sorted: PyTorch clears its autocast cache at a region's exit
/// in hash-map order (host addresses), so those frees are compared as a set.
fn free_runs_sorted(events: &[(String, i64)]) -> Vec<(String, i64)> {
    let mut out = Vec::with_capacity(events.len());
    let mut run: Vec<(String, i64)> = Vec::new();
    for e in events {
        if e.0 == "f" {
            run.push(e.clone());
            continue;
        }
        run.sort_by_key(|f| f.1);
        out.append(&mut run);
        out.push(e.clone());
    }
    run.sort_by_key(|f| f.1);
    out.append(&mut run);
    out
}

/// GPT-2 under bf16 autocast and with eager attention (fixtures/hf2/recorded: their figures
/// are within 0.51%, 0.26% and 0.64% from best-fit ties the driver's addresses break; the second
/// autocast case held out, recorded after it was modelled), event for event
/// and free for free. Autocast: the casts in the order of each call's arguments (addmm's
/// weight, input, bias), `gelu_new`'s `pow` on a float32 copy, the cache in bf16; its exit's
/// frees compared as a set. Eager: the float32 causal mask, the query's copy for the product,
/// the keys and values viewed as heads before the query (the order of their views' backward).
#[test]
fn gpt2_autocast_and_eager_allocate_and_free_as_pytorch_does() {
    for (name, exit_as_set) in [
        ("gpt2_t_amp_bf16", true),
        ("gpt2_m2_amp_b3_s384", true),
        ("gpt2_t_eager_fp32", false),
    ] {
        let p = common::root().join(format!("fixtures/hf2/traces/events_{name}.json"));
        let t = common::recorded_events(&p);
        let g = common::allocator_events(&format!("fixtures/hf2/workloads/{name}.toml"));
        let (g, t) = if exit_as_set {
            (free_runs_sorted(&g), free_runs_sorted(&t))
        } else {
            (g, t)
        };
        let first = g.iter().zip(&t).position(|(a, b)| a != b);
        assert_eq!(first, None, "{name}: first difference at event {first:?}");
        assert_eq!(g.len(), t.len(), "{name}: event count");
    }
}

/// The profiler tutorial's GPT-2 case (HF `gpt2`, batch 4 x 512, AdamW), with and without HF
/// activation checkpointing (fixtures/hf2/recorded): both run. Without checkpointing it runs
/// PyTorch's events free for free and its figures are 0.18% off from best-fit ties; the
/// checkpointing half (recorded without a snapshot: recording the memory history breaks the
/// recompute under dropout) is within 0.14%. A guard on what they are today, not the goal
/// (equality): within 0.2% allocated, reserved within 1% beyond 2 MiB.
#[test]
fn the_tutorial_gpt2_case_runs_with_and_without_checkpointing() {
    for name in ["gpt2_tut_b4_s512_fp32", "gpt2_tut_b4_s512_ckpt_fp32"] {
        let (diffs, alloc, reserved) =
            common::case_differences_in("fixtures/hf2", "recorded", name, name, &FIELDS);
        assert!(
            alloc <= 0.002,
            "{name}: allocated off by {alloc}: {diffs:?}"
        );
        assert!(
            reserved <= 0.01,
            "{name}: reserved off by {reserved}: {diffs:?}"
        );
    }
}

/// What the published-config test runs: a LoRA fine-tune (bf16 weights, batch 1, seq 2048,
/// r 16 on the attention's projections) and generation (batch 4, 512 + 256 tokens).
const MODES: [(&str, &[&str]); 2] = [
    (
        "LoRA bf16",
        &[
            "--batch",
            "1",
            "--seq",
            "2048",
            "--dtype",
            "bf16",
            "--lora-r",
            "16",
            "--lora-targets",
            "attention",
        ],
    ),
    (
        "generate",
        &[
            "--mode",
            "generate",
            "--batch",
            "4",
            "--seq",
            "512",
            "--new-tokens",
            "256",
        ],
    ),
];

/// (config, mode): what gpumem models today and must keep running. Every other pair must be
/// refused with exit 2 and a message that names the key or flag to change.
const MUST_RUN: &[(&str, &str)] = &[
    ("deepseek-r1-distill-qwen-7b", "LoRA bf16"),
    ("deepseek-r1-distill-qwen-7b", "generate"),
    ("gemma-2-2b", "LoRA bf16"),
    // (generation within the window: 768 positions of 4,096, and of Phi-3's 2,047)
    ("gemma-2-2b", "generate"),
    ("gemma-2-9b", "generate"),
    ("gemma-2-9b", "LoRA bf16"),
    ("gemma-3-1b", "LoRA bf16"),
    // (a 512-token prompt reaching its 512-token window, bf16 generation past it)
    ("gemma-3-1b", "generate"),
    ("gemma-7b", "LoRA bf16"),
    ("gemma-7b", "generate"),
    ("gpt2", "generate"),
    ("gpt2-medium", "generate"),
    ("llama-3.1-8b", "LoRA bf16"),
    ("llama-3.1-8b", "generate"),
    ("llama-3.2-1b", "LoRA bf16"),
    ("llama-3.2-1b", "generate"),
    ("mixtral-8x7b-v0.1", "LoRA bf16"),
    ("mixtral-8x7b-v0.1", "generate"),
    ("mistral-7b-v0.3", "LoRA bf16"),
    ("mistral-7b-v0.3", "generate"),
    ("phi-3-mini-4k", "LoRA bf16"),
    ("phi-3-mini-4k", "generate"),
    ("phi-4", "LoRA bf16"),
    ("phi-4", "generate"),
    ("qwen2.5-0.5b", "LoRA bf16"),
    ("qwen2.5-0.5b", "generate"),
    ("qwen2.5-7b", "LoRA bf16"),
    ("qwen2.5-7b", "generate"),
    ("qwen3-0.6b", "LoRA bf16"),
    ("qwen3-0.6b", "generate"),
    ("qwen3-30b-a3b", "LoRA bf16"),
    ("qwen3-30b-a3b", "generate"),
    ("qwen3-8b", "LoRA bf16"),
    ("qwen3-8b", "generate"),
    ("smollm2-1.7b", "LoRA bf16"),
    ("smollm2-1.7b", "generate"),
    ("tinyllama-1.1b", "LoRA bf16"),
    ("tinyllama-1.1b", "generate"),
];

#[test]
fn every_published_config_runs_or_is_refused_by_name() {
    let dir = common::root().join("fixtures/hf/configs");
    let mut names: Vec<String> = std::fs::read_dir(&dir)
        .unwrap()
        .filter_map(|e| {
            let n = e.unwrap().file_name().to_string_lossy().to_string();
            n.strip_suffix(".config.json").map(str::to_string)
        })
        .collect();
    names.sort();
    assert!(names.len() >= 21, "the published configs: {names:?}");
    let mut table = Vec::new();
    for name in &names {
        let path = format!("fixtures/hf/configs/{name}.config.json");
        for (mode, flags) in MODES {
            let mut args = vec!["run", path.as_str()];
            args.extend_from_slice(flags);
            args.extend_from_slice(&["--capacity", "1TiB", "--iterations", "1", "--no-remedies"]);
            let out = common::at_root(&args);
            let must = MUST_RUN.contains(&(name.as_str(), mode));
            let stderr = String::from_utf8_lossy(&out.stderr);
            match out.status.code() {
                Some(0) => {
                    table.push(format!("{name} {mode}: runs"));
                    assert!(must, "{name} {mode} now runs: add it to MUST_RUN");
                }
                Some(2) => {
                    assert!(!must, "{name} {mode} must run: {stderr}");
                    // the refusal names what to change: a config key in quotes or a flag
                    assert!(
                        stderr.contains('\'') || stderr.contains("--") || stderr.contains('"'),
                        "{name} {mode}: a refusal names the key or flag: {stderr}"
                    );
                    assert!(!stderr.contains("panicked"), "{name} {mode}: {stderr}");
                    table.push(format!(
                        "{name} {mode}: refused: {}",
                        stderr.lines().next().unwrap_or("")
                    ));
                }
                other => panic!("{name} {mode}: exit {other:?}: {stderr}"),
            }
        }
    }
    eprintln!("{}", table.join("\n"));
}

/// What a user's config or flags ask that gpumem does not model is refused with exit 2 and the
/// key or flag named; what it does model runs: a multimodal config, LongRoPE past its original
/// context (and within it), a LoRA target the family lacks, BERT and GPT-2 LoRA, GPT-2 with
/// gradient checkpointing.
#[test]
fn new_family_keys_run_or_are_refused_by_name() {
    let s = common::Scratch::new("families-refuse");
    let factors: Vec<f64> = vec![1.0; 48];
    let phi = serde_json::json!({
        "model_type": "phi3", "vocab_size": 32064, "hidden_size": 3072,
        "intermediate_size": 8192, "num_hidden_layers": 2, "num_attention_heads": 32,
        "num_key_value_heads": 32, "max_position_embeddings": 131072,
        "original_max_position_embeddings": 4096,
        "rope_scaling": {"type": "longrope", "long_factor": factors, "short_factor": factors},
        "pad_token_id": 32000
    });
    let phi = s.write("phi.json", &phi.to_string());
    let nested = serde_json::json!({
        "model_type": "gemma3", "text_config": {"model_type": "gemma3_text"},
        "vision_config": {"hidden_size": 1152}
    });
    let nested = s.write("nested.json", &nested.to_string());
    // mutations of the recorded cases' configs, each refused naming its key
    let mutate = |case: &str, key: &str, value: serde_json::Value, file: &str| {
        let p = common::root().join(format!("fixtures/hf2/cases/{case}.config.json"));
        let mut v: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(p).unwrap()).unwrap();
        v[key] = value;
        s.write(file, &v.to_string())
    };
    let mutated = [
        mutate(
            "gemma3_1b_4l_b2_s512_adamw_fp32",
            "layer_types",
            serde_json::json!(["sliding_attention", "full_attention"]),
            "m1.json",
        ),
        mutate(
            "gemma2_2b_2l_b2_s512_adamw_fp32_eager",
            "attn_logit_softcapping",
            serde_json::json!(-1.0),
            "m2.json",
        ),
        mutate(
            "phi3_mini_2l_b2_s512_adamw_fp32",
            "partial_rotary_factor",
            serde_json::json!(0.5),
            "m3.json",
        ),
        mutate(
            "qwen3_06b_4l_b2_s512_adamw_fp32",
            "layer_types",
            serde_json::json!(vec!["sliding_attention"; 4]),
            "m4.json",
        ),
        mutate(
            "gemma_2b_2l_b2_s512_adamw_fp32",
            "hidden_activation",
            serde_json::json!("relu"),
            "m5.json",
        ),
    ];
    for (file, key) in mutated.iter().zip([
        "layer_types",
        "attn_logit_softcapping",
        "partial_rotary_factor",
        "layer_types",
        "hidden_activation",
    ]) {
        let out = common::at_root(&["run", file.to_str().unwrap(), "--batch", "1", "--seq", "64"]);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{key}: {err}");
        assert!(err.contains(key), "{key} named: {err}");
        assert!(!err.contains("panicked"), "{err}");
    }
    let run = |args: &[&str]| {
        let out = common::at_root(args);
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stderr).to_string(),
        )
    };
    let (p, n) = (phi.to_str().unwrap(), nested.to_str().unwrap());
    let refused = [
        (
            vec!["run", n, "--batch", "1", "--seq", "128"],
            "'text_config'",
        ),
        (
            vec!["run", p, "--batch", "1", "--seq", "8192"],
            "original_max_position_embeddings",
        ),
        (
            vec![
                "run",
                p,
                "--batch",
                "1",
                "--seq",
                "128",
                "--lora-r",
                "8",
                "--lora-targets",
                "q_proj",
            ],
            "qkv_proj",
        ),
        (
            vec![
                "run",
                "fixtures/hf/cases/bert_t.config.json",
                "--batch",
                "2",
                "--seq",
                "64",
                "--lora-r",
                "8",
                "--lora-targets",
                "all-linear",
            ],
            "--lora-targets",
        ),
    ];
    for (args, named) in refused {
        let (code, err) = run(&args);
        assert_eq!(code, Some(2), "{args:?}: {err}");
        assert!(err.contains(named), "{args:?} names {named}: {err}");
    }
    let runs = [
        vec!["run", p, "--batch", "1", "--seq", "512", "--lora-r", "8"],
        vec![
            "run",
            "fixtures/hf/cases/bert_t.config.json",
            "--batch",
            "2",
            "--seq",
            "64",
            "--lora-r",
            "8",
        ],
        vec![
            "run",
            "fixtures/hf/configs/gpt2.config.json",
            "--batch",
            "2",
            "--seq",
            "128",
            "--gradient-checkpointing",
            "--lora-r",
            "8",
            "--lora-targets",
            "all-linear",
        ],
    ];
    for args in runs {
        let mut a = args.clone();
        a.extend(["--no-remedies", "--capacity", "80GiB", "-q"]);
        let (code, err) = run(&a);
        assert_eq!(code, Some(0), "{args:?}: {err}");
    }
}

/// LoRA trains only the adapters: the optimizer's state and the gradients are the adapters'
/// size, not the model's, for GPT-2's Conv1D layers and BERT's attention as for llama.
#[test]
fn lora_trains_the_adapters_alone_in_every_family() {
    for cfg in [
        "fixtures/hf/configs/gpt2.config.json",
        "fixtures/hf/cases/bert_t.config.json",
        "fixtures/hf2/cases/qwen3_06b_4l_b2_s512_adamw_fp32.config.json",
        "fixtures/hf2/cases/phi3_mini_2l_b2_s512_adamw_fp32.config.json",
    ] {
        let base = ["run", cfg, "--batch", "2", "--seq", "64", "--no-remedies"];
        let (c0, full) = run_json(&base);
        let mut lora = base.to_vec();
        lora.extend(["--lora-r", "8"]);
        let (c1, adapted) = run_json(&lora);
        assert_eq!((c0, c1), (Some(0), Some(0)), "{cfg}");
        // after the step: parameters + gradients-free + optimizer state; LoRA's is far less
        let step = |v: &Value| u(&v["iterations"][0]["after_step"]);
        assert!(
            step(&adapted) * 3 < step(&full) * 2,
            "{cfg}: LoRA after the step {} vs full {}",
            step(&adapted),
            step(&full)
        );
    }
}

/// peft's default `autocast_adapter_dtype=True`: on bf16 weights the adapters are float32, so
/// AdamW's two states of them are too (the tiny llama, r 8 on q_proj and v_proj: 53,248
/// adapter elements).
#[test]
fn lora_adapters_on_bf16_weights_are_float32() {
    let (code, v) = run_json(&[
        "run",
        "fixtures/hf/cases/llama_t.config.json",
        "--batch",
        "1",
        "--seq",
        "64",
        "--dtype",
        "bf16",
        "--lora-r",
        "8",
        "--no-remedies",
    ]);
    assert_eq!(code, Some(0), "{v}");
    // per layer: q's A [8, 512] and B [512, 8], v's A [8, 512] and B [128, 8]; 4 layers
    let elements = 4 * (8 * 512 + 512 * 8 + 8 * 512 + 128 * 8);
    assert_eq!(
        u(&v["peak"]["by_category"]["optimizer_state"]),
        2 * 4 * elements,
        "AdamW's exp_avg and exp_avg_sq of float32 adapters"
    );
}

/// `fit` over a length that reaches a sliding window's mask (not modelled in bf16 or with
/// checkpointing) answers with the largest modelled value that fits and says where the search
/// stopped, instead of failing.
#[test]
fn fit_stops_where_the_model_stops_and_says_so() {
    let (code, v) = run_json(&[
        "fit",
        "fixtures/hf/configs/gemma-2-2b.config.json",
        "--param",
        "seq",
        "--batch",
        "1",
        "--dtype",
        "bf16",
        "--lora-r",
        "16",
        "--capacity",
        "24GiB",
    ]);
    assert_eq!(code, Some(0), "{v}");
    let notes: Vec<&str> = v["notes"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(Value::as_str)
        .collect();
    assert!(
        notes
            .iter()
            .any(|n| n.contains("seq = 4,096 and above not modelled") && n.contains("sliding")),
        "{notes:?}"
    );
    let results = v["results"].as_array().unwrap();
    let ckpt = results
        .iter()
        .find(|r| r.to_string().contains("checkpointing"))
        .expect("the checkpointing row");
    assert!(ckpt.to_string().contains("4095"), "{ckpt}");
}

/// Mixtral's and Qwen3-MoE's keys: what is not modelled is refused naming the key or flag
/// (Qwen3-MoE's auxiliary loss, the router's jitter, a dense layer past the last, more experts per
/// token than experts); what is modelled runs (LoRA on the attention with the experts frozen,
/// generation, a dense layer among sparse ones), combinations not yet recorded with a warning.
#[test]
fn moe_keys_run_or_are_refused_by_name() {
    let s = common::Scratch::new("families-moe");
    let mutate = |case: &str, key: &str, value: serde_json::Value, file: &str| {
        let p = common::root().join(format!("fixtures/hf2/cases/{case}.config.json"));
        let mut v: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(p).unwrap()).unwrap();
        v[key] = value;
        s.write(file, &v.to_string())
    };
    let mix = "mixtral_2l_b2_s512_adamw_fp32";
    let q3 = "qwen3moe_2l_b2_s512_adamw_fp32";
    for (case, key, value) in [
        (q3, "output_router_logits", serde_json::json!(true)),
        (mix, "router_jitter_noise", serde_json::json!(0.1)),
        (q3, "mlp_only_layers", serde_json::json!([5])),
        (q3, "num_experts_per_tok", serde_json::json!(17)),
        (mix, "num_local_experts", serde_json::json!(0)),
    ] {
        let f = mutate(case, key, value, &format!("{key}.json"));
        let out = common::at_root(&["run", f.to_str().unwrap(), "--batch", "1", "--seq", "16"]);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{key}: {err}");
        assert!(err.contains(key), "{key} named: {err}");
        assert!(!err.contains("panicked"), "{err}");
    }
    let cfg = |case: &str| format!("fixtures/hf2/cases/{case}.config.json");
    let (mixc, q3c) = (cfg(mix), cfg(q3));
    // (bf16 autocast and eager attention run alone, as recorded; with checkpointing or bf16
    // weights they run modelled, the whole combination named in the warning)
    for args in [
        vec!["--precision", "bf16-autocast"],
        vec!["--attention", "eager"],
    ] {
        let mut a = vec!["run", mixc.as_str(), "--batch", "1", "--seq", "16"];
        a.extend(args.iter().copied());
        let out = common::at_root(&a);
        assert_eq!(out.status.code(), Some(0), "{args:?}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!err.contains("not yet checked"), "{args:?}: {err}");
    }
    for (args, named) in [
        (
            vec!["--precision", "bf16-autocast", "--gradient-checkpointing"],
            "bf16 autocast with gradient checkpointing in a mixture-of-experts model (mixtral)",
        ),
        (
            vec!["--attention", "eager", "--dtype", "bf16"],
            "eager attention with bf16 weights in a mixture-of-experts model (mixtral)",
        ),
    ] {
        let mut a = vec!["run", mixc.as_str(), "--batch", "1", "--seq", "16"];
        a.extend(args);
        let out = common::at_root(&a);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(0), "{named}: {err}");
        assert!(
            err.contains(&format!("{named} follows PyTorch 2.11's source")),
            "{err}"
        );
    }
    // a published config's own bf16 torch_dtype runs (bf16 experts are modelled): Mixtral
    // 8x7B's 93 GB of weights do not fit 80 GiB, said in the verdict
    let out = common::at_root(&[
        "run",
        "fixtures/hf/configs/mixtral-8x7b-v0.1.config.json",
        "--batch",
        "1",
        "--seq",
        "16",
        "--capacity",
        "80GiB",
        "--no-remedies",
        "-q",
    ]);
    let said = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{said}");
    assert!(said.starts_with("does not fit on 80.00 GiB"), "{said}");
    // Qwen3-MoE with layer 1 dense: its MLP is Qwen3MoeMLP (gate_proj, up_proj, down_proj of
    // intermediate_size), the others sparse; LoRA on every linear wraps that MLP too
    let dense = mutate(q3, "mlp_only_layers", serde_json::json!([1]), "dense.json");
    let dense = dense.to_str().unwrap();
    for args in [
        vec!["run", dense, "--batch", "1", "--seq", "16", "--json"],
        vec![
            "run",
            dense,
            "--batch",
            "1",
            "--seq",
            "16",
            "--json",
            "--lora-r",
            "8",
            "--lora-targets",
            "all-linear",
        ],
        vec![
            "run",
            mixc.as_str(),
            "--batch",
            "1",
            "--seq",
            "16",
            "--json",
            "--lora-r",
            "8",
        ],
        vec![
            "run",
            mixc.as_str(),
            "--batch",
            "1",
            "--seq",
            "16",
            "--json",
            "--mode",
            "generate",
            "--new-tokens",
            "4",
        ],
    ] {
        let out = common::at_root(&args);
        assert_eq!(
            out.status.code(),
            Some(0),
            "{args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    // the dense layer's MLP is there: more parameters than with every layer sparse of the
    // same experts, by its three linears
    let params = |f: &str| -> u64 {
        let out = common::at_root(&[
            "run",
            f,
            "--batch",
            "1",
            "--seq",
            "16",
            "--json",
            "--iterations",
            "1",
        ]);
        let v: Value = serde_json::from_slice(&out.stdout).unwrap();
        u(&v["iterations"][0]["start"])
    };
    let sparse_all = params(&q3c);
    let with_dense = params(dense);
    // (hidden 1024, intermediate 3072: 3 * 1024 * 3072 floats in; 2 * 16 * 768 * 1024 + 16 *
    // 1024 floats of experts and router out)
    let dense_mlp = 3 * 1024 * 3072 * 4;
    let experts = (16 * 2 * 768 * 1024 + 16 * 1024 * 768 + 16 * 1024) * 4;
    assert_eq!(
        with_dense as i64 - sparse_all as i64,
        dense_mlp as i64 - experts as i64,
        "{with_dense} vs {sparse_all}"
    );
}

/// BERT is an encoder: generating with it is refused for that reason, on `--mode`, before
/// anything asks for the tokens to generate.
#[test]
fn generation_with_an_encoder_is_refused_as_such() {
    let err = common::refused(
        &[
            "run",
            "fixtures/hf/configs/bert-base-uncased.config.json",
            "--batch",
            "2",
            "--seq",
            "128",
            "--mode",
            "generate",
        ],
        "--mode",
    );
    assert!(err.contains("encoder"), "{err}");
    assert!(!err.contains("[generate]"), "{err}");
}
