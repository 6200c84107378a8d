//! Issue 14: models from a Hugging Face config.json against PyTorch 2.11 and transformers 5.17
//! on an H200 (fixtures/hf: the cases' per-iteration figures and allocator traces).

mod common;

use common::{at_root, refused, run_json, u, Scratch};
use serde_json::Value;

// The fields hf_models.py records per training iteration: compare-torch's own list.
use gpumem::commands::compare_torch::FIELDS;

/// (workload, case, exact): the cases with a workload; `exact` ones match every field of every
/// iteration to the byte.
const CASES: [(&str, &str, bool); 21] = [
    (
        "llama_t_eager_adamw_fp32",
        "llama_t_eager_adamw_fp32",
        false,
    ),
    ("llama_s_sdpa_adamw_fp32", "llama_s_sdpa_adamw_fp32", true),
    (
        "llama_s_sdpa_adamw_bf16amp",
        "llama_s_sdpa_adamw_bf16amp",
        true,
    ),
    ("llama_t_nograd_fp32", "llama_t_nograd_fp32", true),
    ("llama_t_sdpa_adamw_fp32", "llama_t_sdpa_adamw_fp32", false),
    ("qwen2_t_sdpa_adamw_fp32", "qwen2_t_sdpa_adamw_fp32", false),
    ("gpt2_hf_sdpa_adamw_fp32", "gpt2_hf_sdpa_adamw_fp32", true),
    ("gpt2_t_sdpa_adamw_fp32", "gpt2_t_sdpa_adamw_fp32", false),
    ("bert_base_cls_adamw_fp32", "bert_base_cls_adamw_fp32", true),
    ("bert_t_cls_adamw_fp32", "bert_t_cls_adamw_fp32", true),
    ("llama_t_lora_adamw_fp32", "llama_t_lora_adamw_fp32", true),
    ("llama_t_sdpa_adamw_bf16w", "llama_t_sdpa_adamw_bf16w", true),
    ("llama_t_ckpt_adamw_fp32", "llama_t_ckpt_adamw_fp32", false),
    // Mistral's sliding window (256 of 512 tokens): its mask, repeat_kv, SDPA's float bias
    (
        "mistral_t_sdpa_adamw_fp32",
        "mistral_t_sdpa_adamw_fp32",
        false,
    ),
    // generation: the given case's second call peaks 1 MiB low (a block left unsplit by a
    // best-fit tie that the driver's addresses break the other way); the others are exact
    ("llama_s_generate_bf16", "llama_s_generate_bf16", false),
    ("llama_t_generate_bf16", "llama_t_generate_bf16", true),
    ("llama_t_generate_fp32", "llama_t_generate_fp32", true),
    ("llama_t_generate_b1_bf16", "llama_t_generate_b1_bf16", true),
    ("qwen2_t_generate_bf16", "qwen2_t_generate_bf16", true),
    (
        "llama_v128k_generate_bf16",
        "llama_v128k_generate_bf16",
        true,
    ),
    ("llama_m_generate_bf16", "llama_m_generate_bf16", true),
];

fn case(name: &str) -> Value {
    let p = common::root().join(format!("fixtures/hf/cases/hf_{name}.json"));
    let v: Value = serde_json::from_str(&std::fs::read_to_string(p).unwrap()).unwrap();
    v["cases"][0].clone()
}

/// Per-iteration differences (gpumem minus PyTorch) of every field, and the worst relative
/// error of the allocated fields and of the reserved ones.
fn differences(workload: &str, name: &str) -> (Vec<(u64, &'static str, i64)>, f64, f64) {
    common::case_differences("fixtures/hf", workload, name, &FIELDS)
}

#[test]
fn hf_cases_match_pytorch() {
    let mut report = Vec::new();
    for (w, name, exact) in CASES {
        let (diffs, alloc, reserved) = differences(w, name);
        report.push(format!(
            "{name}: {} fields differ; worst allocated error {:.4}%, reserved {:.4}% beyond 2 MiB",
            diffs.len(),
            alloc * 100.0,
            reserved * 100.0
        ));
        if exact {
            assert!(diffs.is_empty(), "{name} was exact to the byte: {diffs:?}");
        }
        assert!(
            reserved <= 0.01,
            "{name}: reserved off by more than 1% or 2 MiB: {diffs:?}"
        );
        // The tiny cases run PyTorch's events exactly (the test below) but some of their
        // iteration marks differ by blocks left unsplit: best-fit ties fall on the driver's
        // addresses (see issue 14's closing note). They are reported, not passed off as exact.
        if exact {
            assert!(
                alloc <= 0.001,
                "{name}: allocated off by {:.4}%",
                alloc * 100.0
            );
        }
    }
    eprintln!("{}", report.join("\n"));
}

/// Every allocation and free of three iterations, in PyTorch's order, releasing the same
/// allocations: the model runs transformers' ops, autograd's backward and AdamW's foreach
/// step as they ran on the H200.
#[test]
fn hf_cases_allocate_and_free_as_pytorch_does() {
    for (w, name, _) in CASES {
        let p = common::root().join(format!("fixtures/hf/traces/events_{name}.json"));
        let t: Vec<(String, i64)> =
            serde_json::from_str(&std::fs::read_to_string(p).unwrap()).unwrap();
        let g = common::allocator_events(&format!("fixtures/hf/workloads/{w}.toml"));
        let first = g.iter().zip(&t).position(|(a, b)| a != b);
        assert_eq!(first, None, "{name}: first difference at event {first:?}");
        assert_eq!(g.len(), t.len(), "{name}: event count");
    }
}

#[test]
fn hf_configs_are_refused_by_name() {
    let s = Scratch::new("hf-refuse");
    let llama: Vec<(&str, Value, &str)> = vec![
        (
            "quantization_config",
            serde_json::json!({"bits": 4}),
            "'quantization_config'",
        ),
        (
            "model_type",
            Value::from("qwen2_moe"),
            "mixture-of-experts layers",
        ),
        (
            "model_type",
            Value::from("t5"),
            "not a family gpumem models (llama, mistral, mixtral, qwen2, qwen3, qwen3_moe, gemma, \
             gemma2, gemma3_text, phi3, gpt2 and bert)",
        ),
        ("hidden_act", Value::from("gelu"), "hidden_act"),
        // transformers loads float16 as float16, which gpumem does not model
        ("dtype", Value::from("float16"), "key 'dtype': float16"),
        (
            "num_key_value_heads",
            Value::from(3),
            "multiple of num_key_value_heads",
        ),
        (
            "rope_scaling",
            serde_json::json!({"rope_type": "dynamic", "factor": 2.0}),
            "dynamic",
        ),
    ];
    let gpt2: Vec<(&str, Value, &str)> = vec![
        (
            "reorder_and_upcast_attn",
            Value::from(true),
            "reorder_and_upcast_attn",
        ),
        (
            "activation_function",
            Value::from("relu"),
            "activation_function",
        ),
        (
            "add_cross_attention",
            Value::from(true),
            "add_cross_attention",
        ),
        ("resid_pdrop", Value::from(1.5), "probability"),
        (
            "num_key_value_heads",
            Value::from(2),
            "'num_key_value_heads'",
        ),
    ];
    let bert: Vec<(&str, Value, &str)> = vec![
        ("is_decoder", Value::from(true), "is_decoder"),
        (
            "position_embedding_type",
            Value::from("relative_key"),
            "position_embedding_type",
        ),
        ("hidden_act", Value::from("relu"), "hidden_act"),
        ("rope_theta", Value::from(10000.0), "'rope_theta'"),
    ];
    for (file, cases) in [("llama_t", llama), ("gpt2_t", gpt2), ("bert_t", bert)] {
        let base = std::fs::read_to_string(
            common::root().join(format!("fixtures/hf/cases/{file}.config.json")),
        )
        .unwrap();
        let mut cfg: serde_json::Map<String, Value> = serde_json::from_str(&base).unwrap();
        for (key, value, want) in cases {
            let old = cfg.insert(key.to_string(), value);
            let c = s.write(
                "config.json",
                &serde_json::to_string(&Value::Object(cfg.clone())).unwrap(),
            );
            let w = s.write(
                "w.toml",
                &format!(
                    "[model]\nhf_config = \"{}\"\n[train]\nbatch = 1\nseq = 8\n",
                    c.file_name().unwrap().to_str().unwrap()
                ),
            );
            let err = refused(&["run", w.to_str().unwrap()], want);
            assert!(err.contains("config.json"), "{key}: {err}");
            assert!(
                err.contains("line 2"),
                "{key}: the error points at hf_config: {err}"
            );
            match old {
                Some(v) => cfg.insert(key.to_string(), v),
                None => cfg.remove(key),
            };
        }
    }
    // a missing file and a key of [model] that is not for configs
    let w = s.write(
        "w2.toml",
        "[model]\nhf_config = \"nope.json\"\n[train]\nbatch = 1\nseq = 8\n",
    );
    refused(&["run", w.to_str().unwrap()], "cannot read the config");
    let w = s.write(
        "w3.toml",
        "[model]\nhf_config = \"config.json\"\nd_model = 4\n[train]\nbatch = 1\nseq = 8\n",
    );
    refused(&["run", w.to_str().unwrap()], "unknown key 'd_model'");
    // [model.lora]: a linear the family does not have, a bad rank, an unknown key
    s.write(
        "config.json",
        &std::fs::read_to_string(common::root().join("fixtures/hf/cases/llama_t.config.json"))
            .unwrap(),
    );
    for (lora, want) in [
        ("target_modules = [\"c_attn\"]", "c_attn"),
        ("r = 0", "'r' in [model.lora]"),
        ("rank = 4", "unknown key 'rank' in [model.lora]"),
        ("dropout = 1.0", "'dropout' in [model.lora]"),
    ] {
        let w = s.write(
            "w4.toml",
            &format!(
                "[model]\nhf_config = \"config.json\"\n[model.lora]\n{lora}\n[train]\nbatch = 1\nseq = 8\n"
            ),
        );
        let err = refused(&["run", w.to_str().unwrap()], want);
        assert!(err.contains("w4.toml"), "{lora}: {err}");
    }
}

/// The CPU device runs the same model with real numbers: every allocator figure is the
/// simulated device's (all of memory_stats and the iteration rows), and the loss is finite.
#[test]
fn llama_on_the_cpu_device_allocates_as_simulated() {
    // llama (GQA's math path), gpt2 (Conv1D's addmm, dropout inside SDPA) and bert (strided
    // token-type indices, attention that is not causal)
    for w in [
        "llama_t_sdpa_adamw_fp32",
        "gpt2_t_sdpa_adamw_fp32",
        "bert_t_cls_adamw_fp32",
        "mistral_t_sdpa_adamw_fp32",
    ] {
        let w = format!("fixtures/hf/workloads/{w}.toml");
        let (c1, sim) = run_json(&["run", &w, "--iterations", "1"]);
        let (c2, cpu) = run_json(&["run", &w, "--iterations", "1", "--device", "cpu"]);
        assert_eq!((c1, c2), (Some(0), Some(0)), "{w}");
        assert_eq!(sim["memory_stats"], cpu["memory_stats"], "{w}");
        let row = |v: &Value| {
            let mut r = v["iterations"][0].clone();
            r.as_object_mut().unwrap().remove("loss");
            r
        };
        assert_eq!(row(&sim), row(&cpu), "{w}");
        let loss = cpu["iterations"][0]["loss"]
            .as_f64()
            .expect("a loss on cpu");
        assert!(loss.is_finite() && loss > 0.0, "{w}: {loss}");
    }
}

/// Hugging Face gradient checkpointing on a data device: the recompute feeds every backward
/// kernel (RMSNorm's `weight * hidden`, whose weight gradient is made in the broadcast shape
/// and summed after the node's recomputed tensors are released), so three iterations give the
/// losses of the same model without checkpointing, and the allocator figures of sim.
#[test]
fn checkpointed_llama_trains_on_the_cpu_device() {
    let w = "fixtures/hf/workloads/llama_t_ckpt_adamw_fp32.toml";
    let plain = "fixtures/hf/workloads/llama_t_sdpa_adamw_fp32.toml";
    let short = ["--seq", "64", "--iterations", "3"];
    let run = |w: &str, dev: &str| {
        let mut a = vec!["run", w, "--device", dev];
        a.extend(short);
        let (c, v) = run_json(&a);
        assert_eq!(c, Some(0), "{w} on {dev}: {v}");
        v
    };
    let (sim, cpu, cpu_plain) = (run(w, "sim"), run(w, "cpu"), run(plain, "cpu"));
    assert_eq!(sim["memory_stats"], cpu["memory_stats"]);
    let losses = |v: &Value| -> Vec<f64> {
        v["iterations"]
            .as_array()
            .unwrap()
            .iter()
            .map(|i| i["loss"].as_f64().expect("a loss on cpu"))
            .collect()
    };
    let (a, b) = (losses(&cpu), losses(&cpu_plain));
    assert_eq!(a.len(), 3);
    // the recompute is the forward's own arithmetic: equal, not close
    assert_eq!(a, b, "checkpointed {a:?} vs plain {b:?}");
    assert!(a[2] < a[0], "the loss falls: {a:?}");
}

/// `compare-torch` takes hf_models.py's files: the given llama case runs from its recorded
/// config and is exact, beside accelerate's and MemTracker's estimates with their errors.
#[test]
fn compare_torch_takes_hf_cases_with_other_estimators() {
    let out = at_root(&[
        "compare-torch",
        "fixtures/hf/cases/hf_llama_s_sdpa_adamw_fp32.json",
        "fixtures/hf/cases/hf_resnet50_sgdm_fp32.json",
    ]);
    let text = String::from_utf8_lossy(&out.stdout);
    // both given cases are exact (resnet50 is torchvision's, tests/vision.rs)
    assert_eq!(out.status.code(), Some(0), "{text}");
    let row = text
        .lines()
        .find(|l| l.contains("llama_s_sdpa_adamw_fp32") && l.contains("exact"))
        .unwrap_or_else(|| panic!("{text}"));
    assert!(row.contains("24/24"), "{row}");
    let est = text
        .lines()
        .skip_while(|l| !l.starts_with("Estimators"))
        .find(|l| l.contains("llama_s_sdpa_adamw_fp32"))
        .unwrap_or_else(|| panic!("{text}"));
    assert!(
        est.contains("-72.8148%") && est.contains("-7.7107%"),
        "{est}"
    );
    let resnet = text
        .lines()
        .find(|l| l.contains("resnet50_sgdm_fp32") && l.contains("exact"))
        .unwrap_or_else(|| panic!("{text}"));
    assert!(resnet.contains("24/24"), "{resnet}");
    let (code, v) = run_json(&[
        "compare-torch",
        "fixtures/hf/cases/hf_llama_s_sdpa_adamw_fp32.json",
    ]);
    assert_eq!(code, Some(0));
    let e = v["cases"][0]["estimates"].as_array().unwrap();
    assert_eq!(e.len(), 2, "{v}");
    assert_eq!(
        u(&e[0]["peak"]),
        2491696128,
        "accelerate's float32 step: 4x the parameters"
    );
}

/// A bare config.json runs as it is (`gpumem run config.json --batch 4 --seq 1024`): the same
/// figures as its workload; without --batch and --seq, a usage error naming them.
#[test]
fn a_bare_config_runs_with_batch_and_seq() {
    let cfg = "fixtures/hf/cases/llama_s_sdpa_adamw_fp32.config.json";
    let (code, v) = run_json(&["run", cfg, "--batch", "4", "--seq", "1024"]);
    assert_eq!(code, Some(0), "{v}");
    let t = case("llama_s_sdpa_adamw_fp32");
    for (a, b) in v["iterations"]
        .as_array()
        .unwrap()
        .iter()
        .zip(t["iterations"].as_array().unwrap())
    {
        for f in FIELDS {
            assert_eq!(a[f], b[f], "{f}");
        }
    }
    let out = at_root(&["run", cfg, "--batch", "4"]);
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("--seq") && err.contains("Hugging Face config"),
        "{err}"
    );
}

/// `fit` on a config's workload: the largest batch that fits, and remedies that change the
/// loop (bf16 autocast fits a larger batch than the float32 run as written).
#[test]
fn fit_finds_the_batch_and_its_remedies_apply_to_configs() {
    let out = at_root(&[
        "fit",
        "fixtures/hf/workloads/llama_t_sdpa_adamw_fp32.toml",
        "--capacity",
        "4GiB",
    ]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let batch = |label: &str| -> u64 {
        let row = text
            .lines()
            .find(|l| l.contains(label))
            .unwrap_or_else(|| panic!("no {label} row: {text}"));
        row.split('┆').nth(1).unwrap().trim().parse().unwrap()
    };
    let (plain, bf16) = (batch("as written"), batch("bf16 autocast"));
    assert!(plain >= 1 && bf16 > plain, "{plain} {bf16}: {text}");
}

/// The script language's `for i in range(N) { }` runs its body N times with `i` bound (a decode
/// loop needs no generated file), and `x ** e` is `x.pow(e)`: each gives exactly the events of
/// the statements it stands for.
#[test]
fn loops_and_powers_are_what_they_stand_for() {
    let s = Scratch::new("hf-script");
    let run = |name: &str, body: &str| {
        let w = s.write(
            name,
            &format!(
                "[workload]\nname = \"{name}\"\niterations = 2\nsetup = \"\"\"\nw = randn(64, 64, requires_grad=true)\n\"\"\"\nbody = \"\"\"\n{body}\n\"\"\"\n"
            ),
        );
        let (code, v) = run_json(&["run", w.to_str().unwrap()]);
        assert_eq!(code, Some(0), "{name}: {v}");
        v["memory_stats"].clone()
    };
    let unrolled: String = (0..4)
        .map(|i| {
            format!(
                "k = randn(1, 4, {}, 16)\nkc = cat([kc, k], -2)\ndel k\n",
                i + 1
            )
        })
        .collect();
    let looped = run(
        "loop.toml",
        "kc = zeros(1, 4, 0, 16)\nfor i in range(4) {\n  k = randn(1, 4, i + 1, 16)\n  kc = cat([kc, k], -2)\n  del k\n}\nloss = (w ** 2).sum() + kc.sum()\nloss.backward()",
    );
    let flat = run(
        "flat.toml",
        &format!(
            "kc = zeros(1, 4, 0, 16)\n{unrolled}loss = w.pow(2).sum() + kc.sum()\nloss.backward()"
        ),
    );
    assert_eq!(looped, flat);
    // stack is cat of unsqueezed views; repeat_interleave an expand and a flattening copy
    let composed = run(
        "stack.toml",
        "s = stack([w, w * 2.0], 1)\nr = w.repeat_interleave(3, 0)\nloss = s.sum() + r.sum()\nloss.backward()",
    );
    let spelled = run(
        "spelled.toml",
        "w2 = w * 2.0\ns = cat([w.unsqueeze(1), w2.unsqueeze(1)], 1)\ndel w2\nr = w.unsqueeze(1).expand(64, 3, 64).reshape(192, 64)\nloss = s.sum() + r.sum()\nloss.backward()",
    );
    assert_eq!(composed, spelled);
    assert!(u(&looped["allocation.all.allocated"]) > 20, "{looped}");
    // a count that is not a non-negative integer is refused at its position
    let w = s.write(
        "bad.toml",
        "[workload]\nname = \"bad\"\nbody = \"\"\"\nfor i in range(-1) {\n}\n\"\"\"\n",
    );
    refused(&["run", w.to_str().unwrap()], "line 4 column 16: range(-1)");
}

/// A bare config takes every key of its workload as a flag: the LoRA case's flags give the
/// LoRA workload's figures; the flags are refused with a workload file (its tables hold them).
#[test]
fn a_bare_config_takes_the_workload_keys_as_flags() {
    let cfg = "fixtures/hf/cases/llama_t.config.json";
    let (c1, bare) = run_json(&[
        "run",
        cfg,
        "--batch",
        "2",
        "--seq",
        "512",
        "--lora-r",
        "16",
        "--lora-alpha",
        "32",
        "--lora-dropout",
        "0.05",
        "--lora-targets",
        "q_proj,v_proj",
        "--optimizer",
        "adamw",
    ]);
    let (c2, file) = run_json(&["run", "fixtures/hf/workloads/llama_t_lora_adamw_fp32.toml"]);
    assert_eq!((c1, c2), (Some(0), Some(0)));
    assert_eq!(bare["iterations"], file["iterations"]);
    assert_eq!(bare["memory_stats"], file["memory_stats"]);
    let (c, ckpt) = run_json(&[
        "run",
        cfg,
        "--batch",
        "2",
        "--seq",
        "512",
        "--gradient-checkpointing",
    ]);
    let (_, ckpt_file) = run_json(&["run", "fixtures/hf/workloads/llama_t_ckpt_adamw_fp32.toml"]);
    assert_eq!(c, Some(0));
    assert_eq!(ckpt["iterations"], ckpt_file["iterations"]);
    refused(
        &[
            "run",
            "fixtures/hf/workloads/llama_t_lora_adamw_fp32.toml",
            "--mode",
            "inference",
        ],
        "--mode sets a bare Hugging Face config's key",
    );
}

/// `x[...] = value` and `x.copy_(src)` write in place, outside autograd: a static cache
/// filled step by step holds exactly what was written (checked with real numbers on the CPU
/// device), a broadcast that does not fit and an assignment in the graph are refused.
#[test]
fn element_assignment_writes_in_place() {
    let s = Scratch::new("hf-setitem");
    let body = "no_grad {\n  kc = zeros(1, 2, 8, 4)\n  for t in range(8) {\n    k = ones(1, 2, 1, 4) * t\n    kc[:, :, t:t + 1] = k\n    del k\n  }\n  kc[0, 0, 0] = 5.0\n  v = zeros(3)\n  v.copy_(ones(3) * 2.0)\n  u = (kc.sum() + v.sum() * 1000.0).item()\n}";
    let w = s.write(
        "cache.toml",
        &format!("[workload]\nname = \"cache\"\niterations = 1\nbody = \"\"\"\n{body}\n\"\"\"\n"),
    );
    let (code, v) = run_json(&["run", w.to_str().unwrap(), "--device", "cpu"]);
    assert_eq!(code, Some(0), "{v}");
    // 8 elements of value t for t in 0..8 (224), four of them (t = 0) set to 5, and 3 x 2
    assert_eq!(v["iterations"][0]["loss"].as_f64(), Some(244.0 + 6000.0));
    // no allocation for the writes: the cache, the steps' k and their products, v, its source
    let (_, sim) = run_json(&["run", w.to_str().unwrap()]);
    assert_eq!(sim["memory_stats"], v["memory_stats"]);
    for (bad, want) in [
        (
            "x = zeros(4)\nx[0:2] = zeros(3)",
            "cannot be broadcast to the destination's [2]",
        ),
        (
            "w = randn(4, requires_grad=true)\nx = w * 2.0\nx[0:2] = zeros(2)",
            "not modelled: write it out of place, or run it under no_grad",
        ),
    ] {
        let w = s.write(
            "bad.toml",
            &format!("[workload]\nname = \"bad\"\nbody = \"\"\"\n{bad}\n\"\"\"\n"),
        );
        refused(&["run", w.to_str().unwrap()], want);
    }
}

/// `mode = "generate"`: its table and its limits are checked by name, exit 2.
#[test]
fn generation_is_refused_where_it_is_not_modelled() {
    let s = Scratch::new("hf-generate-refuse");
    let cfg = common::root().join("fixtures/hf/cases");
    let w = |name: &str, config: &str, model: &str, train: &str, generate: &str| {
        s.write(
            name,
            &format!(
                "[model]\nhf_config = \"{}\"\n{model}\n[train]\nbatch = 2\nseq = 16\n{train}\n{generate}",
                cfg.join(config).display()
            ),
        )
    };
    let gen = "[generate]\nnew_tokens = 4\n";
    // (past the window runs, from any prompt, in bf16 past a window of more than 512 keys too:
    // a window of 520 here)
    let mistral = std::fs::read_to_string(cfg.join("mistral_t.config.json")).unwrap();
    let wide = mistral.replace("\"sliding_window\": 256", "\"sliding_window\": 520");
    assert_ne!(wide, mistral, "mistral_t has a window of 256");
    let wide = s.write("mistral_w520.config.json", &wide);
    let past = w(
        "g0.toml",
        wide.to_str().unwrap(),
        "dtype = \"bf16\"",
        "mode = \"generate\"",
        "[generate]\nnew_tokens = 510\n",
    );
    let (code, v) = common::run_json(&["run", past.to_str().unwrap(), "--no-remedies"]);
    assert_eq!(code, Some(0), "{v}");
    let cases = [
        (
            w(
                "g1.toml",
                "gpt2_t.config.json",
                "",
                "mode = \"generate\"\nprecision = \"bf16-autocast\"",
                gen,
            ),
            "generation under bf16 autocast",
        ),
        (
            w(
                "g2.toml",
                "llama_t.config.json",
                "",
                "mode = \"generate\"",
                "",
            ),
            "needs a [generate] table",
        ),
        (
            w("g3.toml", "llama_t.config.json", "", "", gen),
            "[generate] is read with mode = \"generate\"",
        ),
        (
            w(
                "g4.toml",
                "llama_t.config.json",
                "",
                "mode = \"generate\"",
                "[generate]\nnew_tokens = 4\nmin_new_tokens = 5\n",
            ),
            "min_new_tokens = 5 is more than new_tokens = 4",
        ),
        (
            w(
                "g5.toml",
                "mistral_t.config.json",
                "attention = \"eager\"",
                "mode = \"generate\"",
                gen,
            ),
            "generation with eager attention (for gpt2 or with sliding-window layers)",
        ),
        (
            w(
                "g6.toml",
                "llama_t.config.json",
                "",
                "mode = \"generate\"",
                "[generate]\nnew_tokens = 4\ntop_k = 5\n",
            ),
            "top_k",
        ),
    ];
    for (path, want) in &cases {
        refused(&["run", path.to_str().unwrap()], want);
    }
    let preset = s.write(
        "g7.toml",
        "[model]\nkind = \"mlp\"\nd_in = 8\nhidden = 8\nlayers = 1\nd_out = 2\n[train]\nbatch = 2\n[generate]\nnew_tokens = 4\n",
    );
    refused(
        &["run", preset.to_str().unwrap()],
        "[generate] describes model.generate for a Hugging Face config",
    );
}

/// A small generation on the CPU device (real numbers: the cache, the masks, argmax, the
/// stopping flags) allocates exactly as on the simulated one.
#[test]
fn generation_on_the_cpu_device_allocates_as_simulated() {
    let s = Scratch::new("hf-generate-cpu");
    let cfg = s.write(
        "config.json",
        r#"{"model_type": "llama", "vocab_size": 300, "hidden_size": 64, "intermediate_size": 128,
            "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
            "eos_token_id": [2, 3]}"#,
    );
    let c = cfg.to_str().unwrap();
    for dtype in ["bf16", "fp32"] {
        let args = [
            "run",
            c,
            "--batch",
            "2",
            "--seq",
            "9",
            "--mode",
            "generate",
            "--new-tokens",
            "5",
            "--dtype",
            dtype,
            "--iterations",
            "2",
        ];
        let (c1, sim) = run_json(&args);
        let mut cpu_args = args.to_vec();
        cpu_args.extend(["--device", "cpu"]);
        let (c2, cpu) = run_json(&cpu_args);
        assert_eq!((c1, c2), (Some(0), Some(0)), "{dtype}: {sim} {cpu}");
        assert_eq!(sim["memory_stats"], cpu["memory_stats"], "{dtype}");
        assert_eq!(sim["iterations"], cpu["iterations"], "{dtype}");
        let it = &sim["iterations"][0];
        assert!(it["after_generate"].is_u64() && it.get("after_forward").is_none());
    }
}

/// The ops generation needs compute what they stand for on the CPU device: each `.item()`
/// below is weighted so that the iteration's sum of them checks every one.
#[test]
fn generation_ops_compute_what_they_stand_for() {
    let s = Scratch::new("hf-generate-ops");
    let w = s.write(
        "ops.toml",
        r#"[workload]
name = "ops"
device = "cpu"
iterations = 1
body = """
v = arange(10).float()
v[3] = 20
a = argmax(v, -1)
e = zeros(2, dtype=int64)
e[0] = 3
e[1] = 7
m = isin(arange(10), e)
c = m.sum()
x = full([], fill_value=6, dtype=int64)
y = full([], fill_value=3, dtype=int64)
n = full([], fill_value=v.numel())
r1 = (a * 1).item()
r2 = (c * 10).item()
r3 = (bitwise_and(x, y) * 100).item()
r4 = (bitwise_or(x, y) * 1000).item()
r5 = (v.max() * 10000).item()
r6 = (n * 1000000).item()
"""
"#,
    );
    let (code, v) = run_json(&["run", w.to_str().unwrap()]);
    assert_eq!(code, Some(0), "{v}");
    // argmax 3, two of 0..9 in {3, 7}, 6 & 3 = 2, 6 | 3 = 7, max 20, numel 10
    let want = 3.0 + 20.0 + 200.0 + 7000.0 + 200000.0 + 10000000.0;
    assert_eq!(v["iterations"][0]["loss"].as_f64(), Some(want), "{v}");
    // a sum of bools is int64, and a mean of them is refused as PyTorch refuses it
    let bad = s.write(
        "mean.toml",
        "[workload]\nname = \"m\"\nbody = \"\"\"\nm = arange(4).eq(1)\nq = m.mean()\n\"\"\"\n",
    );
    refused(
        &["run", bad.to_str().unwrap()],
        "mean(): could not infer output dtype",
    );
}

/// An additive `attn_mask` hides the keys it masks with -inf: attention over 8 keys with the
/// first 4 masked is attention over the last 4 (the CPU device's numbers).
#[test]
fn an_attention_mask_hides_the_keys_it_masks() {
    let s = Scratch::new("hf-attn-mask");
    let w = s.write(
        "mask.toml",
        r#"[workload]
name = "mask"
device = "cpu"
iterations = 1
body = """
q = randn(1, 2, 3, 4)
k = randn(1, 2, 8, 4)
v = randn(1, 2, 8, 4)
m = zeros(1, 1, 3, 8)
m[:, :, :, :4] = -inf
a = scaled_dot_product_attention(q, k, v, is_causal=false, attn_mask=m)
b = scaled_dot_product_attention(q, k[:, :, 4:], v[:, :, 4:], is_causal=false)
d = a - b
e = (d * d).sum() * 1000000
f = (a * a).sum()
r1 = e.item()
r2 = f.item()
"""
"#,
    );
    let (code, v) = run_json(&["run", w.to_str().unwrap()]);
    assert_eq!(code, Some(0), "{v}");
    let loss = v["iterations"][0]["loss"].as_f64().unwrap();
    // the difference is 0; the output itself is not
    let out = {
        let w2 = s.write(
            "plain.toml",
            &std::fs::read_to_string(&w)
                .unwrap()
                .replace("r1 = e.item()\n", ""),
        );
        let (_, v2) = run_json(&["run", w2.to_str().unwrap()]);
        v2["iterations"][0]["loss"].as_f64().unwrap()
    };
    assert!(out > 0.0, "{v}");
    assert!(
        (loss - out).abs() < 1e-9,
        "masked attention differs: {loss} vs {out}"
    );
}

/// `fit --param new_tokens` finds the most tokens a generation fits: that many run within
/// the capacity, one more runs out of memory.
#[test]
fn fit_finds_the_most_new_tokens() {
    let w = "fixtures/hf/workloads/llama_t_generate_bf16.toml";
    let out = at_root(&[
        "fit",
        w,
        "--param",
        "new_tokens",
        "--capacity",
        "110MiB",
        "--no-remedies",
        "--iterations",
        "1",
        "--exact",
    ]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}");
    let n: u64 = text
        .lines()
        .find(|l| l.contains("as written"))
        .and_then(|row| row.split('┆').nth(1))
        .and_then(|c| c.trim().parse().ok())
        .unwrap_or_else(|| panic!("{text}"));
    assert!(n > 16, "{text}");
    let run = |tokens: u64| {
        run_json(&[
            "run",
            w,
            "--new-tokens",
            &tokens.to_string(),
            "--capacity",
            "110MiB",
            "--iterations",
            "1",
        ])
    };
    let (fits, v) = run(n);
    assert_eq!(fits, Some(0), "{v}");
    assert!(v["oom"].is_null(), "{n} tokens: {}", v["oom"]);
    let (_, v) = run(n + 1);
    assert!(!v["oom"].is_null(), "{} tokens fit too", n + 1);
    // the failure names the token it was generating: the one past the answer
    let line = v["verdict"]["line"].as_str().unwrap_or_default();
    assert!(
        line.replace(',', "")
            .contains(&format!("generating token {}", n + 1)),
        "{line}"
    );
}

/// `sum` and `mean` take a list of dims (`dim=[0, 2]`): one reduction, one output, and the
/// values of that reduction (the CPU device's numbers); a repeated dim is refused.
#[test]
fn reductions_take_a_list_of_dims() {
    let s = Scratch::new("hf-dims");
    let w = s.write(
        "dims.toml",
        r#"[workload]
name = "dims"
device = "cpu"
iterations = 1
body = """
x = arange(24).float().view(2, 3, 4)
y = x.sum(dim=[0, 2])
m = x.mean([1, -1], keepdim=true)
r1 = y[0].item()
r2 = (y[2] * 1000).item()
r3 = (m[1, 0, 0] * 1000000).item()
w = randn(2, 3, 4, requires_grad=true)
l = w.sum(dim=[0, 2]).sum()
l.backward()
"""
"#,
    );
    let (code, v) = run_json(&[
        "run",
        w.to_str().unwrap(),
        "--snapshot",
        s.path("snap.json").to_str().unwrap(),
    ]);
    assert_eq!(code, Some(0), "{v}");
    // y = [60, 92, 124]; m[1] = mean(12..24) = 17.5; plus l's value is not taken
    let loss = v["iterations"][0]["loss"].as_f64().unwrap();
    assert_eq!(loss, 60.0 + 124000.0 + 17500000.0, "{v}");
    // requested sizes: one allocation for y (3 floats) right after x's float copy, then one
    // for m (2 floats): no intermediate reductions
    let snap: Value =
        serde_json::from_str(&std::fs::read_to_string(s.path("snap.json")).unwrap()).unwrap();
    let sizes: Vec<u64> = snap["trace"]["events"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["action"] == "alloc")
        .map(|e| u(&e["size"]))
        .collect();
    // arange (24 int64), its float copy, y, then m
    assert_eq!(&sizes[..4], &[192, 96, 12, 8], "{sizes:?}");
    let bad = s.write(
        "twice.toml",
        "[workload]\nname = \"t\"\nbody = \"\"\"\nx = randn(2, 3)\ny = x.sum(dim=[1, -1])\n\"\"\"\n",
    );
    refused(
        &["run", bad.to_str().unwrap()],
        "dim 1 appears multiple times",
    );
}

/// The Llama-style combinations that run modelled but unrecorded (issue 38), over bf16 weights:
/// under bf16 autocast every cast is to the dtype its tensor has already, so the run
/// allocates as bf16 weights alone; eager attention converts the bf16 scores before its
/// softmax and saves the float32 probabilities besides their bf16 cast. Each says it is
/// unrecorded; and eager generation.
#[test]
fn llama_over_bf16_weights_with_autocast_or_eager_attention() {
    const CFG: &str = "fixtures/hf/cases/llama_t.config.json";
    let run = |extra: &[&str]| {
        let mut args = vec![
            "run",
            CFG,
            "--batch",
            "2",
            "--seq",
            "512",
            "--iterations",
            "2",
            "--dtype",
            "bf16",
        ];
        args.extend_from_slice(extra);
        let (code, v) = run_json(&args);
        assert_eq!(code, Some(0), "{extra:?}: {v}");
        v
    };
    let field = |v: &Value, f: &str| -> Vec<u64> {
        (v["iterations"].as_array().unwrap().iter())
            .map(|i| u(&i[f]))
            .collect()
    };
    let warnings = |v: &Value| v["warnings"].to_string();
    let plain = run(&[]);
    assert!(!warnings(&plain).contains("not yet checked"), "{plain}");
    let amp = run(&["--precision", "bf16-autocast"]);
    assert!(
        warnings(&amp).contains("bf16 weights under bf16 autocast follows"),
        "{}",
        warnings(&amp)
    );
    for f in [
        "after_forward",
        "after_backward",
        "peak_allocated",
        "peak_reserved",
        "end",
    ] {
        assert_eq!(field(&amp, f), field(&plain, f), "{f}");
    }
    let eager = run(&["--attention", "eager"]);
    assert!(
        warnings(&eager).contains("bf16 weights with eager attention follows"),
        "{}",
        warnings(&eager)
    );
    // per layer (4) the float32 probabilities and their bf16 copy, 2 x 8 heads x 512 x 512
    // each, where sdpa saves its output and log-sum-exp
    let probs = 4 * 2 * 8 * 512 * 512 * (4 + 2);
    let (e, p) = (
        field(&eager, "after_forward"),
        field(&plain, "after_forward"),
    );
    assert!(e[0] >= p[0] + probs, "eager {} sdpa {}", e[0], p[0]);
    // eager generation: every step makes its [B, 1, 1, L] mask and repeats the cache's keys
    // and values for the 8 heads (2 x 2 x 8 x 144 x 64 bf16 at the last step, one layer at a
    // time), which sdpa's GQA kernel does not
    let gen = |w: &str| {
        let (code, v) = run_json(&["run", &format!("fixtures/hf/workloads/{w}.toml")]);
        assert_eq!(code, Some(0), "{w}: {v}");
        v
    };
    let (eg, sg) = (
        gen("llama_t_eager_generate_bf16"),
        gen("llama_t_generate_bf16"),
    );
    assert!(
        warnings(&eg).contains("generation with eager attention"),
        "{}",
        warnings(&eg)
    );
    let (e, p) = (field(&eg, "peak_allocated"), field(&sg, "peak_allocated"));
    assert!(
        e[0] >= p[0] + 2 * 2 * 8 * 144 * 64 * 2,
        "eager {} sdpa {}",
        e[0],
        p[0]
    );
    // generation with LoRA (peft's model.generate): the adapters' dropout is the identity in
    // eval, so its probability changes nothing
    let lora_gen = |p: &str| {
        let (code, v) = run_json(&[
            "run",
            CFG,
            "--batch",
            "2",
            "--seq",
            "128",
            "--mode",
            "generate",
            "--new-tokens",
            "8",
            "--dtype",
            "bf16",
            "--lora-r",
            "16",
            "--lora-dropout",
            p,
        ]);
        assert_eq!(code, Some(0), "{v}");
        v
    };
    let (l0, l5) = (lora_gen("0"), lora_gen("0.05"));
    assert!(
        warnings(&l5).contains("generation with LoRA adapters"),
        "{}",
        warnings(&l5)
    );
    for f in ["after_generate", "peak_allocated", "peak_reserved"] {
        assert_eq!(field(&l0, f), field(&l5, f), "{f}");
    }
    let allocations = |v: &Value| u(&v["memory_stats"]["allocation.all.allocated"]);
    assert_eq!(allocations(&l0), allocations(&l5));
    // Mistral's eager attention takes Gemma-2's float window mask: modelled, unrecorded
    let me = gen("mistral_t_eager_adamw_fp32");
    assert!(
        warnings(&me).contains("eager attention with a sliding window follows"),
        "{}",
        warnings(&me)
    );
    // GPT-2's float32 layer norms under autocast would cast bf16 weights: still refused
    refused(
        &[
            "run",
            "fixtures/hf/cases/gpt2_t.config.json",
            "--batch",
            "2",
            "--seq",
            "64",
            "--dtype",
            "bf16",
            "--precision",
            "bf16-autocast",
        ],
        "bf16 weights under bf16 autocast for gpt2",
    );
}
