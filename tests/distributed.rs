//! Issue 39: data-parallel training per rank. DDP at world size 1 against PyTorch 2.11 on an
//! H200 (fixtures/dist1: ../shared/groundtruth/dist1's case, its allocator trace and gpumem's
//! workload), DeepSpeed ZeRO at world size 1 against DeepSpeed 0.19.6 on an H100
//! (fixtures/zero), and what `[distributed]` refuses.

mod common;

use common::{run_json, u};
use serde_json::Value;

use gpumem::commands::compare_torch::FIELDS;

const CASE: &str = "ddp_llama_s_adamw_fp32";

/// FSDP2 around the same Llama: bf16 parameters, float32 reduction.
const FSDP2_BF16: &str = "fsdp2_llama_s_adamw_bf16mp";

/// FSDP2 in float32 with `CPUOffloadPolicy(pin_memory=True)`.
const FSDP2_OFFLOAD: &str = "fsdp2_llama_s_adamw_fp32_offload";

/// The case's allocations and frees (the three iterations) against PyTorch's, in order.
fn events_match(case: &str) {
    let p = common::root().join(format!("fixtures/dist1/traces/events_{case}.json"));
    let t: Vec<(String, i64)> = serde_json::from_str(&std::fs::read_to_string(p).unwrap()).unwrap();
    let g = common::allocator_events(&format!("fixtures/dist1/workloads/{case}.toml"));
    let first = g.iter().zip(&t).position(|(a, b)| a != b);
    assert_eq!(first, None, "{case}: first difference at event {first:?}");
    assert_eq!(g.len(), t.len(), "{case}: event count");
}

/// The case's recorded fields: `exact` names those that must be equal to the byte (by
/// iteration and field); the others may be off by `tolerance` (a fraction).
fn fields_match(case: &str, exact: &dyn Fn(usize, &str) -> bool, tolerance: f64) {
    fields_match_in("dist1", case, exact, tolerance)
}

/// [`fields_match`] for a case of `fixtures/{dir}` (its record `cases/{dir}_{case}.json`).
fn fields_match_in(dir: &str, case: &str, exact: &dyn Fn(usize, &str) -> bool, tolerance: f64) {
    let (code, g) = run_json(&["run", &format!("fixtures/{dir}/workloads/{case}.toml")]);
    assert_eq!(code, Some(0), "{g}");
    let p = common::root().join(format!("fixtures/{dir}/cases/{dir}_{case}.json"));
    let doc: Value = serde_json::from_str(&std::fs::read_to_string(p).unwrap()).unwrap();
    let t = &doc["cases"][0];
    let (gi, ti) = (
        g["iterations"].as_array().unwrap(),
        t["iterations"].as_array().unwrap(),
    );
    assert_eq!(gi.len(), ti.len());
    assert_eq!(
        u(&gi[0]["start"]),
        u(&t["after_model_allocated"]),
        "{case}: after the model"
    );
    let mut worst = 0f64;
    for (k, (a, b)) in gi.iter().zip(ti).enumerate() {
        for &f in FIELDS.iter() {
            if b.get(f).is_none() {
                continue;
            }
            let (x, y) = (u(&a[f]), u(&b[f]));
            if exact(k, f) {
                assert_eq!(x, y, "{case}: iteration {k} {f}");
            } else {
                worst = worst.max((x as f64 - y as f64).abs() / y as f64);
            }
        }
    }
    assert!(
        worst <= tolerance,
        "{case}: allocated off by {:.4}%",
        worst * 100.0
    );
}

/// Every allocation and free of the three iterations in PyTorch's order and sizes: the
/// buffers' broadcast before each forward, the buckets rebuilt before the second (their
/// indices and sizes as int32 tensors, the first iteration's bucket freed, the new ones in the
/// order the first backward made the gradients final), and the training itself.
#[test]
fn ddp_allocates_and_frees_as_pytorch_does() {
    events_match(CASE);
}

/// Every recorded field: the model with its first bucket (and the construction's broadcast
/// groups, cached), reserved memory exact in every iteration; allocated memory exact through
/// the first backward, then within 0.3% (best-fit ties between blocks of equal size, which the
/// driver's address placement breaks: issue 38's point 4).
#[test]
fn ddp_matches_pytorch_per_iteration() {
    let exact = |k: usize, f: &str| {
        f.contains("reserved")
            || (k == 0 && ["start", "after_forward", "after_backward"].contains(&f))
    };
    fields_match(CASE, &exact, 0.003);
}

/// FSDP2 with bf16 parameters: each layer's parameters cast and unsharded before its forward
/// and again before its backward, resharded after both (the root's too), the gradients
/// reduced into the float32 shards (the output in the reduce-scatter stream's own pool): every
/// event in PyTorch's order and sizes.
#[test]
fn fsdp2_allocates_and_frees_as_pytorch_does() {
    events_match(FSDP2_BF16);
}

/// Configurations recorded after gpumem modelled them (scripts/dist_record.py): a smaller DDP
/// run, DDP with `gradient_as_bucket_view`, FSDP2 in float32, without resharding after
/// forward (bf16 and float32) and bf16 with CPU offload. Every field of every iteration to
/// the byte; every event in order, but for the bucket views, where PyTorch frees each
/// weight's autograd gradient (replaced by its bucket view) one node later than gpumem
/// (`TBackward0` between the product and `AccumulateGrad` waits for newer ready nodes): the
/// same allocations, 192 local reorderings of those frees.
#[test]
fn further_world_size_1_configurations_match_pytorch() {
    for case in [
        "ddp_llama_s_b2_s256_adamw_fp32",
        "fsdp2_llama_s_adamw_fp32",
        "fsdp2_llama_s_adamw_bf16mp_noreshard",
        "fsdp2_llama_s_adamw_fp32_noreshard",
        "fsdp2_llama_s_adamw_bf16mp_offload",
        // recorded on an H200 after they were modelled (2026-12-07): Hugging Face gradient
        // checkpointing under DDP and FSDP2 in float32, and the weights themselves in bf16
        // (no mixed precision policy: FSDP2 gathers, reduces and steps in bf16)
        "ddp_llama_s_adamw_fp32_ckpt",
        "fsdp2_llama_s_adamw_fp32_ckpt",
        "ddp_llama_s_adamw_bf16w",
        "fsdp2_llama_s_adamw_bf16w",
    ] {
        events_match(case);
        fields_match(case, &|_, _| true, 0.0);
    }
    let case = "ddp_llama_s_adamw_fp32_bucketview";
    fields_match(case, &|_, _| true, 0.0);
    let p = common::root().join(format!("fixtures/dist1/traces/events_{case}.json"));
    let t: Vec<(String, i64)> = serde_json::from_str(&std::fs::read_to_string(p).unwrap()).unwrap();
    let g = common::allocator_events(&format!("fixtures/dist1/workloads/{case}.toml"));
    let allocs = |v: &[(String, i64)]| {
        let mut a: Vec<i64> = v.iter().filter(|e| e.0 == "a").map(|e| e.1).collect();
        a.sort_unstable();
        a
    };
    assert_eq!(g.len(), t.len(), "{case}: event count");
    assert_eq!(allocs(&g), allocs(&t), "{case}: the same allocations");
}

/// With CPU offload: the model built on the host and moved to the device group by group at
/// `fully_shard` (segments the run then reuses), each shard copied to the device before its
/// unshard, the reduced gradients sent back (the device output freed at once), the optimizer's
/// step on the host: every event, and every field to the byte.
#[test]
fn fsdp2_with_cpu_offload_matches_pytorch() {
    events_match(FSDP2_OFFLOAD);
    fields_match(FSDP2_OFFLOAD, &|_, _| true, 0.0);
}

/// ... and every recorded field of the three iterations equal to the byte: the shards'
/// blocks after `fully_shard` (the model built in float32 first), the peaks, reserved memory.
#[test]
fn fsdp2_matches_pytorch_to_the_byte() {
    fields_match(FSDP2_BF16, &|_, _| true, 0.0);
}

/// What `[distributed]` does not model yet is refused naming its key; DDP's own keys run.
#[test]
fn distributed_keys_run_or_are_refused_by_name() {
    let s = common::Scratch::new("distributed");
    let base = std::fs::read_to_string(
        common::root().join(format!("fixtures/dist1/workloads/{CASE}.toml")),
    )
    .unwrap()
    .replace(
        "../cases/llama_s.config.json",
        common::root()
            .join("fixtures/dist1/cases/llama_s.config.json")
            .to_str()
            .unwrap(),
    )
    .replace("batch = 4", "batch = 1")
    .replace("seq = 1024", "seq = 64")
    .replace("iterations = 3", "iterations = 2");
    for (extra, key) in [
        ("strategy = \"zero4\"\n", "strategy"),
        (
            "strategy = \"zero2\"\nbucket_cap_mb = 25\n",
            "bucket_cap_mb",
        ),
        (
            "strategy = \"zero2\"\nreduce_bucket_size = 0\n",
            "reduce_bucket_size",
        ),
        (
            "strategy = \"zero1\"\nparam_dtype = \"bf16\"\n",
            "param_dtype",
        ),
        ("world_size = 0\n", "world_size"),
        ("gradient_as_bucket_view = 1\n", "gradient_as_bucket_view"),
        ("param_dtype = \"bf16\"\n", "param_dtype"),
        ("bucket_cap_mb = 0\n", "bucket_cap_mb"),
        ("bucket_size = 4\n", "bucket_size"),
    ] {
        let text = base
            .replace("world_size = 1\nstrategy = \"ddp\"\n", "")
            .replace(
                "[distributed]\n",
                &format!(
                    "[distributed]\n{}{extra}",
                    if key == "strategy" || key == "world_size" {
                        ""
                    } else {
                        "strategy = \"ddp\"\n"
                    }
                ),
            );
        let text = if key == "world_size" {
            text.replace("[distributed]\n", "[distributed]\nstrategy = \"ddp\"\n")
        } else {
            text
        };
        let w = s.write(&format!("{key}.toml"), &text);
        let out = common::at_root(&["run", w.to_str().unwrap()]);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{key}: {err}");
        assert!(err.contains(key), "{key} named: {err}");
    }
    // ZeRO-3 is modelled at world size 1 only (with or without the optimizer offloaded): the
    // rest is refused by key
    for (extra, key) in [
        ("world_size = 2\n", "world_size"),
        ("world_size = 2\ncpu_offload = true\n", "world_size"),
        ("world_size = 1\noverlap_comm = true\n", "overlap_comm"),
    ] {
        let text = base.replace(
            "world_size = 1\nstrategy = \"ddp\"\n",
            &format!("strategy = \"zero3\"\n{extra}"),
        );
        let w = s.write(&format!("zero3_{key}.toml"), &text);
        let out = common::at_root(&["run", w.to_str().unwrap()]);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "zero3 {key}: {err}");
        assert!(err.contains(key), "zero3 {key} named: {err}");
    }
    // a preset is refused, as is [distributed] without a model
    let preset = s.write(
        "preset.toml",
        "[model]\nkind = \"mlp\"\n[train]\nbatch = 2\n[distributed]\nstrategy = \"ddp\"\n",
    );
    let out = common::at_root(&["run", preset.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("[distributed]"));
    // a smaller cap rebuilds more buckets: more allocations before the second forward
    let small = s.write(
        "cap.toml",
        &base.replace(
            "strategy = \"ddp\"\n",
            "strategy = \"ddp\"\nbucket_cap_mb = 2\n",
        ),
    );
    let default = s.write("default.toml", &base);
    let allocs = |w: &std::path::Path| {
        common::allocator_events(w.to_str().unwrap())
            .iter()
            .filter(|(a, _)| a == "a")
            .count()
    };
    assert!(allocs(&small) > allocs(&default) + 5);
}

/// `--ddp` on a bare config: DDP's first bucket and broadcast groups on top of the same run
/// (the first iteration starts a bucket's worth of parameters higher), `--bucket-cap-mb`
/// only with it, a bad cap named by its flag.
#[test]
fn ddp_flag_on_a_bare_config() {
    let cfg = "fixtures/dist1/cases/llama_s.config.json";
    let args = |extra: &[&'static str]| {
        let mut a = vec!["run", cfg, "--batch", "1", "--seq", "64", "--dtype", "fp32"];
        a.extend_from_slice(extra);
        a
    };
    let (code, plain) = run_json(&args(&[]));
    assert_eq!(code, Some(0), "{plain}");
    let (code, ddp) = run_json(&args(&["--ddp"]));
    assert_eq!(code, Some(0), "{ddp}");
    let params = 622_923_776u64;
    assert_eq!(
        u(&ddp["iterations"][0]["start"]),
        u(&plain["iterations"][0]["start"]) + params
    );
    let out = common::at_root(&args(&["--bucket-cap-mb", "4"]));
    assert_eq!(out.status.code(), Some(2));
    let out = common::at_root(&args(&["--ddp", "--bucket-cap-mb", "0"]));
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains("--bucket-cap-mb"), "{err}");
}

/// `--fsdp2` and its flags on a bare config: each runs or is refused naming its flag; the
/// report carries NCCL's memory outside the allocator (named, with its source) and, with CPU
/// offload, the host memory the shards, gradients and optimizer state take.
#[test]
fn fsdp2_flags_on_a_bare_config() {
    let cfg = "fixtures/dist1/cases/llama_s.config.json";
    let args = |extra: &[&'static str]| {
        let mut a = vec!["run", cfg, "--batch", "1", "--seq", "64", "--dtype", "fp32"];
        a.extend_from_slice(extra);
        a
    };
    let params = 622_923_776u64;
    let (code, plain) = run_json(&args(&[]));
    assert_eq!(code, Some(0), "{plain}");
    assert_eq!(plain["outside_allocator"].as_array().unwrap().len(), 0);
    assert_eq!(u(&plain["host_memory_peak"]), 0);
    let (code, f) = run_json(&args(&["--fsdp2"]));
    assert_eq!(code, Some(0), "{f}");
    let nccl = &f["outside_allocator"][0];
    assert_eq!(u(&nccl["bytes"]), 558 << 20, "{nccl}");
    assert!(
        nccl["source"].as_str().unwrap().contains("measured"),
        "{nccl}"
    );
    assert!(u(&f["driver"]["process_used"]) >= u(&f["driver"]["reserved"]) + (558 << 20));
    // the shards are the model's parameters (the unsharded ones hold nothing between uses)
    assert!(u(&f["iterations"][0]["start"]) >= params);
    assert_eq!(u(&f["host_memory_peak"]), 0);
    // CPU offload: only the buffers on the device between iterations, the rest on the host
    let (code, off) = run_json(&args(&["--fsdp2", "--cpu-offload"]));
    assert_eq!(code, Some(0), "{off}");
    assert_eq!(u(&off["iterations"][0]["start"]), 1024);
    assert!(
        u(&off["host_memory_peak"]) >= 4 * params,
        "{}",
        off["host_memory_peak"]
    );
    // keeping each layer unsharded from forward to backward costs more than resharding it
    let (code, keep) = run_json(&args(&["--fsdp2", "--no-reshard-after-forward"]));
    assert_eq!(code, Some(0), "{keep}");
    assert!(
        u(&keep["peak"]["peak_allocated"]) > u(&f["peak"]["peak_allocated"]),
        "{} vs {}",
        keep["peak"]["peak_allocated"],
        f["peak"]["peak_allocated"]
    );
    for (extra, flag) in [
        (&["--fsdp2", "--reduce-dtype", "fp16"][..], "--reduce-dtype"),
        (&["--param-dtype", "bf16"][..], "--fsdp2"),
        (&["--fsdp2", "--ddp"][..], "--ddp"),
    ] {
        let out = common::at_root(&args(extra));
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{extra:?}: {err}");
        assert!(err.contains(flag), "{extra:?}: {err}");
    }
}

/// Allocations of a snapshot's trace whose tag stack holds `tag`: their sizes, in order.
fn tagged_allocs(snap: &Value, tag: &str) -> Vec<u64> {
    let stacks = snap["stacks"].as_array().unwrap();
    snap["trace"]["events"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["action"] == "alloc")
        .filter(|e| {
            e["stack"]
                .as_u64()
                .and_then(|k| stacks[k as usize].as_array())
                .is_some_and(|t| t.iter().any(|x| x.as_str() == Some(tag)))
        })
        .map(|e| u(&e["size"]))
        .collect()
}

/// FSDP2 with LoRA (modelled from PyTorch 2.11's fully_shard, said to be unrecorded): the
/// frozen base is sharded and gathered as the adapters are, but only the adapters' gradients
/// are reduced, and the root (embedding, final norm, lm_head: all frozen) reduces none.
/// Above world size 1, frozen bf16 weights and float32 adapters are gathered as bytes into
/// one uint8 buffer.
#[test]
fn fsdp2_with_lora_reduces_the_adapters_alone() {
    let cfg = "fixtures/dist1/cases/llama_s.config.json";
    let run = |strategy: &'static str, extra: &[&'static str]| {
        let mut a = vec![
            "run",
            cfg,
            "--batch",
            "1",
            "--seq",
            "64",
            "--iterations",
            "1",
            strategy,
        ];
        a.extend_from_slice(extra);
        a
    };
    let with = |extra: &[&'static str]| run("--fsdp2", extra);
    // what a quiet run prints on stderr (it must run)
    let warned = |args: Vec<&str>| {
        let out = common::at_root(&[&args[..], &["-q"]].concat());
        let err = String::from_utf8_lossy(&out.stderr).to_string();
        assert_eq!(out.status.code(), Some(0), "{args:?}: {err}");
        err
    };
    let err = warned(with(&["--dtype", "fp32", "--lora-r", "8"]));
    assert!(
        err.contains("FSDP2 with LoRA follows PyTorch 2.11's source but is not yet checked"),
        "{err}"
    );
    let err = warned(with(&["--dtype", "fp32", "--precision", "bf16-autocast"]));
    assert!(err.contains("FSDP2 under bf16 autocast follows"), "{err}");
    // (DDP with LoRA is said alike; without either, no warning)
    let err = warned(run("--ddp", &["--lora-r", "8"]));
    assert!(err.contains("DDP with LoRA follows"), "{err}");
    let err = warned(run("--ddp", &[]));
    assert!(err.is_empty(), "{err}");
    // fit says it among its notes
    let (code, v) = run_json(&[
        "fit",
        cfg,
        "--batch",
        "1",
        "--seq",
        "64",
        "--fsdp2",
        "--lora-r",
        "8",
        "--capacity",
        "80GiB",
        "--param",
        "batch",
        "--max",
        "2",
        "--no-remedies",
    ]);
    assert_eq!(code, Some(0), "{v}");
    assert!(
        v["notes"]
            .as_array()
            .unwrap()
            .iter()
            .any(|n| n.as_str().unwrap().starts_with("FSDP2 with LoRA follows")),
        "{}",
        v["notes"]
    );
    let full = common::run_snapshot(&with(&["--dtype", "fp32"]));
    let lora = common::run_snapshot(&with(&["--dtype", "fp32", "--lora-r", "8"]));
    // (each reduction: its input, _chunk_cat's metadata, its output)
    let full_rs = tagged_allocs(&full, "fsdp.reduce_scatter");
    let lora_rs = tagged_allocs(&lora, "fsdp.reduce_scatter");
    assert_eq!(full_rs.len(), 9 * 3, "{full_rs:?}");
    assert_eq!(lora_rs.len(), 8 * 3, "{lora_rs:?}");
    let (f, l): (u64, u64) = (full_rs.iter().sum(), lora_rs.iter().sum());
    assert!(l * 100 < f, "{l} of {f} bytes reduced");
    // the frozen parameters are unsharded as the trained ones are, forward and backward:
    // the same regrowths, and the four adapters of each layer's twice more
    assert_eq!(
        tagged_allocs(&full, "fsdp.unshard").len() + 8 * 4 * 2,
        tagged_allocs(&lora, "fsdp.unshard").len()
    );
    // world size 2, bf16 weights, float32 adapters (r 8 on q_proj and v_proj): a layer's
    // shards are 22,548,480 / 2 bytes of bf16 and 106,496 / 2 of float32, gathered as bytes
    let mixed = common::run_snapshot(&with(&[
        "--dtype",
        "bf16",
        "--lora-r",
        "8",
        "--world-size",
        "2",
    ]));
    let gathers = tagged_allocs(&mixed, "fsdp.all_gather");
    assert!(gathers.contains(&(22_548_480 + 106_496)), "{gathers:?}");
}

/// Above world size 1 each rank holds a 1/N shard (padded): the model between iterations
/// shrinks with N, while the all-gathers (input and output in the copy-in stream, the copy-out's
/// metadata) add allocations; the model is built on the meta device (no full copy first).
#[test]
fn fsdp2_shards_shrink_with_the_world_size() {
    let cfg = "fixtures/dist1/cases/llama_s.config.json";
    let run = |w: &'static str| {
        let (code, v) = run_json(&[
            "run",
            cfg,
            "--batch",
            "1",
            "--seq",
            "64",
            "--dtype",
            "fp32",
            "--fsdp2",
            "--param-dtype",
            "bf16",
            "--reduce-dtype",
            "fp32",
            "--world-size",
            w,
        ]);
        assert_eq!(code, Some(0), "{v}");
        v
    };
    let params = 622_923_776f64;
    let (one, two, eight) = (run("1"), run("2"), run("8"));
    for (v, n) in [(&one, 1.0), (&two, 2.0), (&eight, 8.0)] {
        let start = u(&v["iterations"][0]["start"]) as f64;
        assert!(
            start >= params / n && start <= params / n * 1.05,
            "world size {n}: {start} for {params} of parameters"
        );
    }
    assert!(u(&eight["peak"]["peak_allocated"]) < u(&two["peak"]["peak_allocated"]));
    assert!(u(&two["peak"]["peak_allocated"]) < u(&one["peak"]["peak_allocated"]));
    // the 70B benchmark's rank fits its shards (80 layers' worth, 1/64 each) and runs
    let (code, big) = run_json(&[
        "run",
        "fixtures/perf/fsdp2_llama70b_ws64.toml",
        "--iterations",
        "1",
    ]);
    assert_eq!(code, Some(0), "{big}");
    let start = u(&big["iterations"][0]["start"]) as f64;
    assert!(start < 70.6e9 * 4.0 / 64.0 * 1.05, "{start}");
    // (built on the meta device: nothing on the host either) and every rank alike
    assert_eq!(u(&big["host_memory_peak"]), 0);
    assert_eq!(u(&big["ranks"]["world_size"]), 64);
    assert_eq!(big["ranks"]["strategy"], "fsdp2");
}

/// The diagnosis of a wrapped model's out-of-memory tries the sharding remedies, each re-run:
/// DDP to FSDP2; under FSDP2, CPU offload and twice the ranks.
#[test]
fn sharding_remedies_are_tried_for_distributed_runs() {
    let names = |w: &str, cap: &str| -> Vec<(String, u64)> {
        let (code, v) = run_json(&["run", w, "--capacity", cap]);
        assert_eq!(code, Some(0), "{v}");
        v["oom"]["remedies"]
            .as_array()
            .unwrap_or_else(|| panic!("no remedies: {v}"))
            .iter()
            .map(|r| {
                (
                    r["name"].as_str().unwrap().to_string(),
                    u(&r["peak_reserved"]),
                )
            })
            .collect()
    };
    let ddp = names(&format!("fixtures/dist1/workloads/{CASE}.toml"), "9GiB");
    assert!(ddp.iter().any(|(n, r)| n == "FSDP2" && *r > 0), "{ddp:?}");
    let fsdp = names(
        &format!("fixtures/dist1/workloads/{FSDP2_BF16}.toml"),
        "5GiB",
    );
    for want in ["CPU offload", "world size 2"] {
        assert!(
            fsdp.iter().any(|(n, r)| n == want && *r > 0),
            "{want}: {fsdp:?}"
        );
    }
    assert!(!fsdp.iter().any(|(n, _)| n == "FSDP2"), "{fsdp:?}");
}

/// An out-of-memory under ZeRO is offered DeepSpeed's own fixes, each re-run: a smaller
/// reduction bucket (the one that fits here: 2 GB of float32 bucket at the default 5e8
/// elements), stage 2 over stage 1, the optimizer offloaded, more ranks; none of FSDP2's.
#[test]
fn zero_out_of_memory_is_offered_deepspeeds_remedies() {
    let (code, v) = run_json(&[
        "run",
        ZERO_CFG,
        "--batch",
        "1",
        "--seq",
        "64",
        "--dtype",
        "fp32",
        "--zero",
        "1",
        "--world-size",
        "2",
        // (what the context and NCCL's buffers leave of it: about 2.6 GiB)
        "--capacity",
        "3.6GiB",
    ]);
    assert_eq!(code, Some(0), "{v}");
    let tried: Vec<(String, bool)> = v["oom"]["remedies"]
        .as_array()
        .unwrap_or_else(|| panic!("no remedies: {v}"))
        .iter()
        .map(|r| (r["name"].as_str().unwrap().to_string(), r["fits"] == true))
        .collect();
    for want in ["ZeRO stage 2", "optimizer offload", "world size 4"] {
        assert!(tried.iter().any(|(n, _)| n == want), "{want}: {tried:?}");
    }
    assert!(
        tried.contains(&("reduce_bucket_size 50000000".to_string(), true)),
        "{tried:?}"
    );
    assert_eq!(
        v["oom"]["smallest_fitting_remedy"], "reduce_bucket_size 50000000",
        "{tried:?}"
    );
    for not in ["FSDP2", "CPU offload", "reshard after forward"] {
        assert!(!tried.iter().any(|(n, _)| n == not), "{not}: {tried:?}");
    }
    // stage 3 (world size 1) is offered the optimizer offload, which fits here, and no
    // remedy gpumem would only refuse under ZeRO (accumulation, autocast, other optimizers)
    let (code, v) = run_json(&[
        "run",
        ZERO_CFG,
        "--batch",
        "2",
        "--seq",
        "64",
        "--dtype",
        "fp32",
        "--zero",
        "3",
        "--capacity",
        "5GiB",
    ]);
    assert_eq!(code, Some(0), "{v}");
    let remedies = v["oom"]["remedies"].as_array().expect("remedies");
    let offload = remedies
        .iter()
        .find(|r| r["name"] == "optimizer offload")
        .unwrap_or_else(|| panic!("no optimizer offload: {remedies:?}"));
    assert_eq!(offload["fits"], true, "{offload}");
    for r in remedies {
        assert!(r["error"].is_null(), "{r}");
        assert!(!r["name"].as_str().unwrap().contains("accumulated"), "{r}");
    }
}

/// llama_s (fixtures/dist1) in float32, batch 1 x 64, with `extra` flags, as JSON; it must run.
fn zero_run(extra: &[&str]) -> Value {
    let mut args = vec![
        "run", ZERO_CFG, "--batch", "1", "--seq", "64", "--dtype", "fp32",
    ];
    args.extend_from_slice(extra);
    let (code, v) = run_json(&args);
    assert_eq!(code, Some(0), "{extra:?}: {}", v["verdict"]);
    v
}

const ZERO_CFG: &str = "fixtures/dist1/cases/llama_s.config.json";

/// DeepSpeed ZeRO stage 2 (DeepSpeed 0.19.6's code): the flat parameters replace the
/// parameters, each rank adds a float32 master partition at construction and Adam's two states
/// over it at the first step, and the reduction bucket (reduce_bucket_size elements of the
/// parameters' dtype, 2 GB in float32 at the default) lives through each backward.
#[test]
fn zero_partitions_the_master_weights_and_adams_state() {
    let run = zero_run;
    let start = |v: &Value, i: usize| u(&v["iterations"][i]["start"]);
    // llama_s: 155,730,944 float32 parameters, a multiple of 2 x 4 ranks: no padding
    let params = 622_923_776u64;
    let z4 = run(&["--zero", "2", "--world-size", "4"]);
    let z8 = run(&["--zero", "2", "--world-size", "8"]);
    let z1 = run(&["--zero", "1", "--world-size", "4"]);
    let small = run(&[
        "--zero",
        "2",
        "--world-size",
        "4",
        "--reduce-bucket-size",
        "1000000",
    ]);
    // the master partition at construction: a quarter of the parameters against an eighth
    assert_eq!(start(&z4, 0) - start(&z8, 0), params / 4 - params / 8);
    // Adam's state over the partition at the first step (beside the backward's cuBLAS
    // workspaces, the same at any world size): 2 x 1/4 of the parameters against 2 x 1/8
    let first_step = |v: &Value| start(v, 1) - start(v, 0);
    assert_eq!(
        first_step(&z4) - first_step(&z8),
        2 * params / 4 - 2 * params / 8
    );
    assert_eq!(first_step(&z1), first_step(&z4));
    for (v, strategy) in [
        (&z4, "zero2"),
        (&z1, "zero1"),
        (&small, "zero2"),
        (&z8, "zero2"),
    ] {
        assert_eq!(v["ranks"]["strategy"], strategy);
        assert_eq!(v["ranks"]["alike"], false);
    }
    // the flat parameters replace the parameters (and their segments' unsplit 1 MiB tails):
    // the model's parameters, the master partition and FusedAdam's int32 overflow flag (a
    // 512-byte block), no more
    assert_eq!(start(&z4, 0), params + params / 4 + 1024 + 512);
    // the default bucket: 500,000,000 float32 elements through backward
    let peak = |v: &Value| u(&v["peak"]["peak_allocated"]);
    assert!(
        peak(&z4) >= peak(&small) + 1_990_000_000,
        "{} against {}",
        peak(&z4),
        peak(&small)
    );
    // stage 1 keeps the full gradients through backward: a higher peak than stage 2's
    assert!(peak(&z1) > peak(&z4), "{} {}", peak(&z1), peak(&z4));
}

/// ZeRO's optimizer offload (`--cpu-offload` with `--zero`, DeepSpeed's `offload_optimizer`):
/// the float32 master partition, its gradient and Adam's state live on the host; the device
/// trades the master for a staging buffer of the largest parameter and never holds Adam's
/// state; the host holds the master, its gradient, the bit16 copy-back buffer, the pinned
/// staging buffer and, from the first step, Adam's two states.
#[test]
fn zero_offload_keeps_the_optimizer_on_the_host() {
    let run = zero_run;
    let start = |v: &Value, i: usize| u(&v["iterations"][i]["start"]);
    let params = 622_923_776u64;
    let part = params / 4;
    // the largest parameter: the embedding (and lm_head), 32,000 x 1,024 float32, in a
    // segment of its size rounded to 2 MiB whose last 1 MiB is not split off
    let largest = 32_000u64 * 1_024 * 4;
    let staging = largest.div_ceil(2 << 20) * (2 << 20);
    for stage in ["1", "2"] {
        let on = run(&["--zero", stage, "--world-size", "4"]);
        let off = run(&["--zero", stage, "--world-size", "4", "--cpu-offload"]);
        assert_eq!(u(&on["host_memory_peak"]), 0);
        // at construction: the staging buffer instead of the master partition, and no
        // FusedAdam (its overflow flag: 512 bytes)
        assert_eq!(
            start(&on, 0) - start(&off, 0),
            part - staging + 512,
            "stage {stage}"
        );
        // the first step adds Adam's state (and the kept gradient norm) on the device only
        // without offload
        let first_step = |v: &Value| start(v, 1) - start(v, 0);
        assert_eq!(
            first_step(&on) - first_step(&off),
            2 * part + 512,
            "stage {stage}"
        );
        // the host: master, its gradient, the bit16 buffer, Adam's two states (float32
        // partitions) and the pinned staging buffer
        assert_eq!(
            u(&off["host_memory_peak"]),
            5 * part + largest,
            "stage {stage}"
        );
        assert_eq!(off["ranks"]["strategy"], format!("zero{stage}"));
    }
    // stage 3 (world size 1): offloaded, the device keeps the parameters' buffer and the
    // bucket only: no float32 master, no gradient partitions, no FusedAdam flag, no overflow
    // tracker (each 512 bytes); the step keeps nothing there (no Adam state, no norm)
    let on = run(&["--zero", "3"]);
    let off = run(&["--zero", "3", "--cpu-offload"]);
    assert_eq!(start(&on, 0) - start(&off, 0), 2 * params + 1_024);
    let first_step = |v: &Value| start(v, 1) - start(v, 0);
    assert_eq!(first_step(&on) - first_step(&off), 2 * params + 512);
    // the host: the tracker's byte, the master, its pinned gradient, the pinned gradient
    // partitions and, from the first step, Adam's two states
    assert_eq!(u(&off["host_memory_peak"]), 5 * params + 1);
    assert_eq!(u(&on["host_memory_peak"]), 0);
    // in backward each gradient's norm is kept on the device until the step: one float64
    // scalar (a 512-byte block) for each of the 75 parameters, which the run without offload
    // does not hold between backward and step
    let kept = |v: &Value| u(&v["iterations"][1]["after_backward"]) - u(&v["iterations"][1]["end"]);
    assert_eq!(kept(&off) - kept(&on), 75 * 512);
    // the flag needs a sharded run
    let out = common::at_root(&[
        "run",
        ZERO_CFG,
        "--batch",
        "1",
        "--seq",
        "64",
        "--cpu-offload",
    ]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(
        err.contains("--cpu-offload") && err.contains("--zero"),
        "{err}"
    );
}

/// DeepSpeed 0.19.6's ZeRO at world size 1, recorded on an H100 (fixtures/zero,
/// scripts/zero_record.py): stages 1 and 2 in float32, stage 2 over bf16 parameters and with
/// the optimizer offloaded to the host; every recorded field of every iteration to the byte
/// (FusedAdam's overflow flag, engine.backward's divided and scaled losses, the kept
/// `_global_grad_norm` are each 512 bytes of it).
#[test]
fn zero_matches_deepspeed_to_the_byte() {
    for case in [
        "zero2_llama_s_adamw_fp32",
        "zero1_llama_s_adamw_fp32",
        "zero2_llama_s_adamw_bf16",
        "zero2_llama_s_offload_fp32",
        // held out: recorded after the model was fixed (40 MB buckets, reduced many times)
        "zero2_llama_s_bucket1e7_fp32",
        // stage 3 at world size 1 (H200), the partitioning recorded from the start
        "zero3_llama_s_adamw_fp32",
        "zero3_llama_s_adamw_bf16",
        // recorded after they were modelled (H100): offload at stage 1, in bf16 at stage 2, and
        // stage 3 with the optimizer offloaded (from DeepSpeed's source, ZERO3.md)
        "zero1_llama_s_offload_fp32",
        "zero2_llama_s_offload_bf16",
        "zero2_llama_s_b1_s64_fp32",
        "zero3_llama_s_offload_bf16",
        // two small runs whose peak falls inside the step: `scaled_global_grad_norm` (and
        // stage 3's `norm_groups`) alive to the step's end, the previous `_global_grad_norm`
        // held by the engine until the optimizer's step returns
        "zero1_llama_s_bucket1e7_bf16",
        "zero3_llama_s_b1_s64_fp32",
    ] {
        fields_match_in("zero", case, &|_, _| true, 0.0);
    }
}

/// The held-out ZeRO case gpumem matches all but one field of: stage 3 with the optimizer
/// offloaded in float32, whose third backward takes three more 2 MiB small-pool segments in
/// PyTorch (6 MiB more reserved, 0.06%; allocated is exact in every iteration). A timing
/// effect: at each of the three, two 1 MiB gradients freed on the default stream were still
/// in use by the reduce stream (`free_requested` without `free_completed` in the snapshot),
/// which the simulated device, with no clock, never sees.
#[test]
fn zero_held_out_cases_match_but_for_one_field() {
    fields_match_in(
        "zero",
        "zero3_llama_s_offload_fp32",
        &|k, f| !(k == 2 && (f == "peak_reserved" || f == "reserved_end")),
        0.0006,
    );
}

/// ZeRO-3's first backward step by step, as PyTorch recorded it (the first events from
/// `engine.backward`, fixtures/zero/traces/events_*_backward_start.json, taken from the
/// recorded snapshot): the loss divided and scaled, the seed, their gradients, the loss's
/// backward, then lm_head's under DeepSpeed's memory-efficient linear: the input's gradient,
/// the autograd thread's cuBLAS workspace, then the weight's (native `F.linear` makes the
/// weight's first).
#[test]
fn zero3_backward_starts_as_deepspeed_does() {
    let case = "zero3_llama_s_adamw_fp32";
    let want: Vec<(String, u64)> = serde_json::from_str(
        &std::fs::read_to_string(common::root().join(format!(
            "fixtures/zero/traces/events_{case}_backward_start.json"
        )))
        .unwrap(),
    )
    .unwrap();
    let v = common::run_snapshot(&[
        "run",
        &format!("fixtures/zero/workloads/{case}.toml"),
        "--iterations",
        "1",
    ]);
    let stacks = v["stacks"].as_array().unwrap();
    let got: Vec<(String, u64)> = v["trace"]["events"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| matches!(e["action"].as_str(), Some("alloc" | "free_completed")))
        .skip_while(|e| {
            !e["stack"]
                .as_u64()
                .and_then(|k| stacks[k as usize].as_array())
                .is_some_and(|t| t.iter().any(|x| x == "phase:backward"))
        })
        .take(want.len())
        .map(|e| {
            (
                e["action"].as_str().unwrap()[..1].to_string(),
                u(&e["size"]),
            )
        })
        .collect();
    assert!(want.len() >= 18, "{want:?}");
    assert_eq!(got, want);
}

/// FSDP2's bf16 mixed precision with Hugging Face gradient checkpointing (with and without
/// resharding after forward, and with CPU offload), recorded on an H200: every event and
/// every recorded field of every iteration. What it takes: the checkpoint holds each layer's
/// bf16 input, which no op of the layer saves (its RMSNorm casts it to float32 first), and
/// frees it with the region's last saved tensor, after the rotary pair and the positions;
/// cuDNN attention writes the values' gradient in the order of their strides (a transposed
/// projection without a cache: no copy on the way back); the attention's unreturned outputs
/// go in the op's order (logsumexp, then the philox seed and offset), and what a recomputed
/// node saved goes as its unpacked locals do, in reverse.
#[test]
fn fsdp2_bf16_with_checkpointing_matches_pytorch() {
    for case in [
        "fsdp2_llama_s_adamw_bf16mp_ckpt",
        "fsdp2_llama_s_adamw_bf16mp_noreshard_ckpt",
        "fsdp2_llama_s_adamw_bf16mp_offload_ckpt",
    ] {
        events_match(case);
        fields_match(case, &|_, _| true, 0.0);
    }
}
