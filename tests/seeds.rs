//! Issue 3: the memory effects the seed articles (../shared/seeds) describe, each written as a
//! workload in fixtures/seeds/ and checked through `gpumem run --json`.

use std::collections::HashMap;
use std::path::PathBuf;

use assert_cmd::Command;
use serde_json::Value;

fn run(name: &str) -> (i32, Value, String) {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("fixtures/seeds")
        .join(name);
    let out = Command::new(assert_cmd::cargo::cargo_bin!("gpumem"))
        .arg("run")
        .arg(&path)
        .arg("--json")
        .output()
        .expect("gpumem runs");
    let code = out.status.code().unwrap_or(-1);
    let stderr = String::from_utf8_lossy(&out.stderr).to_string();
    assert!(!stderr.contains("panicked"), "{name}: {stderr}");
    let v = serde_json::from_slice(&out.stdout).unwrap_or(Value::Null);
    (code, v, stderr)
}

/// (allocated, reserved) at each mark, by label (the last one wins for repeated labels).
fn marks(v: &Value) -> HashMap<String, (u64, u64)> {
    v["marks"]
        .as_array()
        .expect("marks")
        .iter()
        .map(|m| {
            (
                m["label"].as_str().unwrap().to_string(),
                (
                    m["allocated"].as_u64().unwrap(),
                    m["reserved"].as_u64().unwrap(),
                ),
            )
        })
        .collect()
}

fn ok(name: &str) -> (Value, HashMap<String, (u64, u64)>) {
    let (code, v, err) = run(name);
    assert_eq!(code, 0, "{name}: {err}");
    let m = marks(&v);
    (v, m)
}

#[test]
fn issue3_seed000_transpose_is_a_view_and_contiguous_copies() {
    let (_, m) = ok("000_contiguity.toml");
    assert_eq!(m["after t()"].0, m["a"].0, "a transpose allocates nothing");
    assert_eq!(
        m["after contiguous()"].0,
        m["after t()"].0 + 512,
        "contiguous() of a transpose copies (48 B -> 512 B)"
    );
    assert_eq!(
        m["after slice"].0, m["after contiguous()"].0,
        "a slice shares storage"
    );
}

#[test]
fn issue3_seed000_view_of_a_transpose_fails_with_pytorchs_reason() {
    let (code, _, err) = run("000_view_of_transpose_fails.toml");
    assert_eq!(code, 2);
    assert!(
        err.contains("000_view_of_transpose_fails.toml: line 8 column 5"),
        "{err}"
    );
    assert!(
        err.contains("view size is not compatible with input tensor's size and stride"),
        "{err}"
    );
    assert!(err.contains("Use .reshape(...) instead."), "{err}");
}

#[test]
fn issue3_seed000_dtype_sizes() {
    let (_, m) = ok("000_dtype_sizes.toml");
    assert_eq!(m["float32"].0, 4 << 20);
    assert_eq!(m["float16"].0 - m["float32"].0, 2 << 20);
    assert_eq!(m["int64"].0 - m["float16"].0, 8 << 20);
}

#[test]
fn issue3_seed000_del_keeps_reserved_and_empty_cache_returns_it() {
    let (_, m) = ok("000_del_and_empty_cache.toml");
    assert_eq!(m["initial"], (0, 0));
    assert_eq!(m["after allocation"].0, (4 << 20) + (1 << 20));
    assert_eq!(m["after del"].0, 0, "del drops allocated");
    assert_eq!(
        m["after del"].1, m["after allocation"].1,
        "but not reserved"
    );
    assert_eq!(
        m["after empty_cache"],
        (0, 0),
        "empty_cache returns reserved"
    );
}

#[test]
fn issue3_seed000_autograd_keeps_activations_and_no_grad_does_not() {
    let (_, m) = ok("000_autograd_and_no_grad.toml");
    let t = 40448; // 100 x 100 float32, rounded to 512 B
    assert_eq!(m["inputs"].0, 2 * t);
    assert_eq!(
        m["forward, names deleted"].0,
        2 * t + t + 512,
        "c is kept for sin's backward (and a, b for mul's) though its name is gone; d is freed"
    );
    assert_eq!(
        m["after backward"].0,
        2 * t + 2 * t + 512,
        "backward frees c and adds a.grad and b.grad"
    );
    assert_eq!(
        m["no_grad forward, names deleted"].0,
        m["after del loss"].0 + 512,
        "no_grad keeps only the result"
    );
}

#[test]
fn issue3_seed000_del_of_an_intermediate_frees_it() {
    let (_, m) = ok("000_del_intermediate.toml");
    assert_eq!(
        m["intermediate alive"].0 - m["after del intermediate"].0,
        4_000_256
    );
}

#[test]
fn issue3_seed000_in_place_add_allocates_nothing() {
    let (_, m) = ok("000_inplace.toml");
    assert_eq!(m["after z = x + y"].0 - m["x, y"].0, 4_000_256);
    assert_eq!(m["after x.add_(y)"].0, m["after z = x + y"].0);
}

#[test]
fn issue3_seed000_keeping_the_loss_grows_every_iteration_and_item_does_not() {
    let (leak, _) = ok("000_loss_list_leak.toml");
    let ends: Vec<u64> = leak["iterations"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| i["end"].as_u64().unwrap())
        .collect();
    let growth: Vec<u64> = ends.windows(2).map(|w| w[1] - w[0]).collect();
    assert!(
        growth.iter().all(|&g| g == growth[0] && g >= 1 << 20),
        "steady growth of the kept graph: {ends:?}"
    );
    let (fixed, _) = ok("000_loss_item_no_leak.toml");
    let ends: Vec<u64> = fixed["iterations"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| i["end"].as_u64().unwrap())
        .collect();
    assert!(
        ends.windows(2).all(|w| w[0] == w[1]),
        "no growth with .item(): {ends:?}"
    );
}

#[test]
fn issue3_seed001_freed_memory_stays_reserved_until_empty_cache() {
    let (_, m) = ok("001_caching_allocator.toml");
    assert_eq!(m["after zeros"].0, 800_000_000);
    assert_eq!(
        m["after del"],
        (0, 801_112_064),
        "the seed's numbers: allocated 0, reserved 801112064"
    );
    assert_eq!(m["after empty_cache"], (0, 0));
}

#[test]
fn issue3_seed002_detach_shares_storage() {
    let (_, m) = ok("002_detach.toml");
    assert_eq!(m["after detach"].0, m["x"].0, "detach allocates nothing");
    assert_eq!(m["after del x"].0, m["x"].0, "y still holds the storage");
    assert_eq!(m["after del y"].0, 0);
    assert_eq!(m["after empty_cache"].1, 0);
}

#[test]
fn issue3_seed003_inference_under_no_grad_keeps_no_activations() {
    let (_, m) = ok("003_no_grad_inference.toml");
    let kept_with_grad = m["forward with grad"].0 - m["weights"].0;
    let kept_no_grad = m["forward under no_grad"].0 - m["after del out"].0;
    assert_eq!(kept_no_grad, 512, "only the scalar result");
    assert!(
        kept_with_grad > (8 << 20),
        "the relu output is kept for backward: {kept_with_grad}"
    );
}

#[test]
fn issue3_seed004_gradient_accumulation_adds_no_memory_after_the_first_micro_batch() {
    let (v, m) = ok("004_grad_accumulation.toml");
    let ends: Vec<u64> = v["iterations"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| i["end"].as_u64().unwrap())
        .collect();
    assert!(ends.windows(2).all(|w| w[0] == w[1]), "{ends:?}");
    assert!(m.contains_key("after micro-batch"));
    let first = &v["iterations"][0];
    assert!(
        first["after_forward"].as_u64().is_some() && first["after_backward"].as_u64().is_some()
    );
}

#[test]
fn issue3_retain_graph_keeps_activations_until_a_plain_backward() {
    let (_, m) = ok("004_retain_graph.toml");
    let grad = 4_194_304; // w.grad
    assert_eq!(
        m["after backward(retain_graph=true)"].0,
        m["forward"].0 + grad + (32 << 20),
        "nothing freed; w.grad and the autograd thread's cuBLAS workspace added"
    );
    assert_eq!(
        m["after second backward"].0,
        m["after backward(retain_graph=true)"].0 - 2_097_152,
        "the plain backward frees the saved input of sin"
    );
}

fn gpumem() -> Command {
    Command::new(assert_cmd::cargo::cargo_bin!("gpumem"))
}

#[test]
fn issue3_snapshot_is_versioned_json_written_atomically() {
    let dir = std::env::temp_dir().join(format!("gpumem-snap-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let snap = dir.join("run.json");
    std::fs::write(&snap, "previous contents").unwrap();
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("fixtures/seeds/000_autograd_and_no_grad.toml");
    gpumem()
        .arg("run")
        .arg(&path)
        .arg("--snapshot")
        .arg(&snap)
        .assert()
        .success();
    let v: Value = serde_json::from_slice(&std::fs::read(&snap).unwrap()).unwrap();
    assert_eq!(
        (v["format"].as_str(), v["version"].as_u64()),
        (Some("gpumem-snapshot"), Some(2))
    );
    assert_eq!(v["memory_stats"].as_object().unwrap().len(), 122);
    let stacks = v["stacks"].as_array().unwrap();
    let events = v["trace"]["events"].as_array().unwrap();
    assert!(events.iter().any(|e| e["action"] == "alloc"));
    let tagged = |tag: &str| {
        events.iter().any(|e| {
            e["action"] == "alloc"
                && stacks[e["stack"].as_u64().unwrap() as usize]
                    .as_array()
                    .unwrap()
                    .iter()
                    .any(|t| t == tag)
        })
    };
    assert!(
        tagged("category:parameter") && tagged("category:gradient") && tagged("sin"),
        "{stacks:?}"
    );
    // no temporary file is left beside it
    let leftovers: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .filter_map(|e| e.ok())
        .collect();
    assert_eq!(leftovers.len(), 1, "{leftovers:?}");
    // an unwritable destination is an error that names it, and nothing is lost
    let bad = dir.join("no/such/dir/x.json");
    let out = gpumem()
        .arg("run")
        .arg(&path)
        .arg("--snapshot")
        .arg(&bad)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("no/such/dir/x.json"));
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn issue3_script_errors_are_located_and_oom_stops_the_run() {
    let dir = std::env::temp_dir().join(format!("gpumem-script-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let bad = dir.join("bad.toml");
    std::fs::write(
        &bad,
        "[workload]\nname = \"x\"\nsetup = \"\"\"\na = randn(4, 4)\nb = frobnicate(a)\n\"\"\"\n",
    )
    .unwrap();
    let out = gpumem().arg("run").arg(&bad).output().unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("bad.toml: line 5 column 5: unknown function 'frobnicate'"),
        "{err}"
    );
    let oom = dir.join("oom.toml");
    std::fs::write(&oom, "[workload]\nname = \"too big\"\ncapacity = \"1536MiB\"\nsetup = \"\"\"\na = zeros(1024, 1024, 256)\nb = zeros(1024, 1024, 256)\n\"\"\"\n").unwrap();
    let out = gpumem()
        .arg("run")
        .arg(&oom)
        .arg("--json")
        .output()
        .unwrap();
    // an OOM is reported and diagnosed; it fails the command only with --fail-on oom
    assert_eq!(out.status.code(), Some(0));
    let failing = gpumem()
        .arg("run")
        .arg(&oom)
        .args(["--fail-on", "oom"])
        .output()
        .unwrap();
    assert_eq!(
        failing.status.code(),
        Some(1),
        "--fail-on oom makes an OOM a finding"
    );
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["oom"]["line"], 6);
    assert!(v["oom"]["message"]
        .as_str()
        .unwrap()
        .starts_with("CUDA out of memory. Tried to allocate 1024.00 MiB."));
    let out = gpumem()
        .arg("run")
        .arg(&oom)
        .arg("--capacity")
        .arg("3GiB")
        .output()
        .unwrap();
    assert_eq!(
        out.status.code(),
        Some(0),
        "--capacity overrides the workload's"
    );
    let out = gpumem()
        .arg("run")
        .arg(&oom)
        .arg("--capacity")
        .arg("lots")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn issue3_every_seed_fixture_runs() {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("fixtures/seeds");
    let mut n = 0;
    for e in std::fs::read_dir(&dir).unwrap() {
        let p = e.unwrap().path();
        if p.extension().is_some_and(|x| x == "toml") {
            let name = p.file_name().unwrap().to_string_lossy().to_string();
            let (code, _, err) = run(&name);
            let expected = if name.contains("fails") { 2 } else { 0 };
            assert_eq!(code, expected, "{name}: {err}");
            n += 1;
        }
    }
    assert!(n >= 14, "{n}");
}

/// A GPT-2 small training step with AdamW: parameters, then Adam's state (two tensors per
/// parameter) and the cuBLAS workspace from the first iteration on, and a steady state after.
#[test]
fn issue3_gpt2_small_adamw_runs_and_settles() {
    let path =
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("fixtures/workloads/gpt2_small_adamw.toml");
    let out = gpumem()
        .arg("run")
        .arg(&path)
        .arg("--json")
        .output()
        .unwrap();
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    let it = v["iterations"].as_array().unwrap();
    let u = |i: usize, k: &str| it[i][k].as_u64().unwrap();
    // 124,439,808 float32 parameters (497,759,232 bytes; the allocator hands some tensors a
    // whole unsplit block, so allow 1%)
    let near = |got: u64, want: u64| got >= want && got - want <= want / 100;
    let params = u(0, "start");
    assert!(near(params, 497_759_232), "{params}");
    // workspaces: cuBLAS (32 MiB) and cuBLASLt (1 MiB) at the first product, and the autograd
    // thread's cuBLAS one (32 MiB) at backward's first product
    let state = u(0, "end") - params - 65 * 1024 * 1024;
    assert!(
        near(state, 2 * 497_759_232),
        "Adam's state: two tensors per parameter: {state}"
    );
    assert_eq!(u(1, "end"), u(2, "end"), "steady after the first step");
    let grads = u(1, "after_step") - u(1, "end");
    assert!(
        near(grads, 497_759_232),
        "zero_grad(set_to_none) drops one gradient per parameter: {grads}"
    );
    let cats = v["peak"]["by_category"].as_object().unwrap();
    assert!(cats["activation"].as_u64().unwrap() > cats["parameter"].as_u64().unwrap());
}

#[test]
fn issue3_seed000_in_place_write_to_a_saved_tensor_is_refused_at_backward() {
    let (code, _, err) = run("000_inplace_clobbers_saved_fails.toml");
    assert_eq!(code, 2);
    assert!(err.contains("line 11 column 1"), "{err}");
    assert!(
        err.contains("modified by an inplace operation")
            && err.contains("is at version 1; expected version 0 instead"),
        "{err}"
    );
}

#[test]
fn issue3_seed004_autocast_keeps_bf16_activations() {
    let (_, m) = ok("004_autocast_halves_activations.toml");
    let fp32 = m["float32 forward"].0 - m["start"].0;
    let bf16 = m["bf16 forward"].0 - m["float32 freed"].0;
    // three relu outputs of 16384 x 1024 in float32 (64 MiB each) against bfloat16 ones, plus
    // the bf16 copy of x and of the two weights whose products need them for backward
    assert_eq!(fp32, 3 * (64 << 20) + 512);
    assert_eq!(bf16, (32 << 20) + 3 * (32 << 20) + 2 * (2 << 20) + 512);
    assert!(
        bf16 * 4 < fp32 * 3,
        "autocast keeps well under 3/4 of the float32 activations"
    );
}

#[test]
fn issue3_checkpointing_keeps_only_inputs_and_recomputes_in_backward() {
    let (v, m) = ok("004_checkpointing.toml");
    let acts = 3 * (32 << 20); // three relu outputs of 8192 x 1024 float32
    assert_eq!(m["plain forward"].0 - m["start"].0, acts + 512);
    assert_eq!(
        m["checkpointed forward"].0 - m["plain backward"].0,
        512,
        "the checkpointed region kept nothing"
    );
    assert_eq!(m["checkpointed backward"].0, m["plain backward"].0);
    let recompute = v["peak"]["top_tags"]
        .as_array()
        .unwrap()
        .iter()
        .find(|t| {
            t["tags"]
                .as_str()
                .unwrap()
                .ends_with("checkpoint_recompute")
        })
        .expect("the recompute is tagged");
    // the recompute runs the block's forward again: at its height the three activations and
    // the last product's output, which the relu is about to replace
    assert_eq!(
        recompute["bytes"].as_u64().unwrap(),
        acts + (32 << 20),
        "backward recomputed the same activations"
    );
}

#[test]
fn issue3_seed000_a_small_tensor_takes_one_512_byte_block() {
    let (_, m) = ok("000_tensor_basics.toml");
    assert_eq!(m["x"].0, 512);
}

#[test]
fn issue3_seed003_a_preallocated_buffer_keeps_memory_flat() {
    let (v, m) = ok("003_preallocate.toml");
    assert_eq!(m["pre-allocated"].0, 64 * 3 * 224 * 224 * 4);
    let marks: Vec<u64> = v["marks"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["allocated"].as_u64().unwrap())
        .collect();
    assert!(marks.iter().all(|&a| a == marks[0]), "{marks:?}");
}

#[test]
fn issue3_seed004_adam_keeps_two_states_momentum_one_sgd_none() {
    let (_, m) = ok("004_optimizer_state.toml");
    let p = 4 << 20; // one 1024 x 1024 float32 parameter
    assert_eq!(
        m["after sgd step"].0, m["gradients"].0,
        "plain SGD keeps no state"
    );
    assert_eq!(
        m["after momentum step"].0 - m["after sgd step"].0,
        p,
        "a momentum buffer"
    );
    assert_eq!(
        m["after adam step"].0 - m["after momentum step"].0,
        2 * p,
        "exp_avg and exp_avg_sq"
    );
}
