//! Issue 15, finding 4: iterations of a PyTorch snapshot come from the Optimizer.step
//! annotations, from the user (`--iteration-marker`), or from repetition only where the repeat
//! is the whole step; when none gives them, the report says why and how to give them. Checked
//! on snapshots recorded on an H200 (fixtures/snapshots/iterations/) and on a real QLoRA
//! snapshot from a public repository (fixtures/external/ftcourse).

mod common;

use std::path::PathBuf;

use common::{export, external, gpumem, root, u, Scratch};
use serde_json::Value;

const DIR: &str = "fixtures/snapshots/iterations";

fn summary(args: &[&str]) -> (Option<i32>, Value, String) {
    let out = gpumem()
        .current_dir(root())
        .arg("summary")
        .args(args)
        .arg("--json")
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    let v = serde_json::from_slice(&out.stdout).unwrap_or(Value::Null);
    (out.status.code(), v, err)
}

/// The snapshot as PyTorch's JSON without its annotations: what a run without an optimizer
/// (or one whose annotations were not recorded) gives.
fn without_annotations(dir: &Scratch, name: &str) -> PathBuf {
    without_annotations_of(dir, &format!("{DIR}/{name}.pickle"), name)
}

fn without_annotations_of(dir: &Scratch, path: &str, name: &str) -> PathBuf {
    let j = dir.path(&format!("{name}.json"));
    export(std::path::Path::new(path), "torch-json", &j);
    let mut v: Value = serde_json::from_str(&std::fs::read_to_string(&j).unwrap()).unwrap();
    v.as_object_mut().unwrap().remove("external_annotations");
    let bare = dir.path(&format!("{name}_bare.json"));
    std::fs::write(&bare, serde_json::to_vec(&v).unwrap()).unwrap();
    bare
}

/// The held-out case of the issue: an evaluation loop that keeps its losses with their graphs,
/// no optimizer. Its iterations come from the repeated forward and its leak is found: the
/// leaked bytes per iteration add up to the 108 MiB of activations each iteration keeps, and
/// the loss.
#[test]
fn issue15_eval_loop_keeping_losses_leaks_by_repetition() {
    let (code, v, err) = summary(&[&format!("{DIR}/eval_keep_losses.pickle")]);
    assert_eq!(code, Some(0), "{err}");
    assert_eq!(v["iterations_from"], "repetition", "{}", v["trace"]);
    // the loop's 8 passes: the first (with cuBLAS's workspace) together with the setup
    assert_eq!(u(&v["trace"]["iterations"]), 8, "{}", v["trace"]);
    let leaks = v["leaks"].as_array().unwrap();
    assert!(!leaks.is_empty(), "the leak is found");
    // the steady per-iteration figures of all leak rows add up to what one iteration keeps
    let steady: u64 = leaks
        .iter()
        .map(|l| u(l["per_iteration"].as_array().unwrap().last().unwrap()))
        .sum();
    // (and the loss itself: a 4-byte tensor in a 512-byte block)
    assert_eq!(
        steady,
        ((6 * (8 + 8 + 2)) << 20) + 512,
        "{} leak rows",
        leaks.len()
    );
    // and --fail-on leak fails on it
    let out = gpumem()
        .current_dir(root())
        .args([
            "summary",
            &format!("{DIR}/eval_keep_losses.pickle"),
            "--fail-on",
            "leak",
        ])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
}

/// Layers repeat within one step: never iterations. One training step of 12 blocks (its
/// annotations removed) and a real QLoRA forward and backward (ftcourse, which the old rule
/// called 39 iterations) get "iterations not found", with the reason and the flag to use.
#[test]
fn issue15_layers_within_a_step_are_not_iterations() {
    let dir = Scratch::new("layers");
    let one = without_annotations(&dir, "train_layers_1step");
    let ft = external(&dir, "ftcourse_memory_snapshot.pickle");
    for p in [one, ft] {
        let (code, v, err) = summary(&[p.to_str().unwrap()]);
        assert_eq!(code, Some(0), "{err}");
        assert_eq!(
            v["iterations_from"],
            "none",
            "{}: {}",
            p.display(),
            v["trace"]
        );
        let text = gpumem().arg("summary").arg(&p).output().unwrap();
        let text = String::from_utf8_lossy(&text.stdout);
        assert!(
            text.contains("iterations not found") && text.contains("--iteration-marker"),
            "{text}"
        );
    }
    // six real steps of the same model, without their annotations: six iterations
    let six = without_annotations(&dir, "train_layers_6steps");
    let (_, v, _) = summary(&[six.to_str().unwrap()]);
    assert_eq!(v["iterations_from"], "repetition");
    assert_eq!(u(&v["trace"]["iterations"]), 6);
    // with them: the annotations
    let (_, v, _) = summary(&[&format!("{DIR}/train_layers_6steps.pickle")]);
    assert_eq!(v["iterations_from"], "annotations");
    assert_eq!(u(&v["trace"]["iterations"]), 6);
}

/// `--iteration-marker FUNCTION`: the calls of the model's `forward` (allocations inside it,
/// after allocations outside it: the backward runs on autograd's thread) are the 6 steps; it
/// beats repetition; a function the trace never calls is a usage error naming the flag.
#[test]
fn issue15_iteration_marker_names_the_step() {
    let dir = Scratch::new("marker");
    let six = without_annotations(&dir, "train_layers_6steps");
    let (code, v, err) = summary(&[six.to_str().unwrap(), "--iteration-marker", "forward"]);
    assert_eq!(code, Some(0), "{err}");
    assert_eq!(v["iterations_from"], "marker");
    assert_eq!(u(&v["trace"]["iterations"]), 6);
    assert_eq!(v["leak_check"]["checked"], serde_json::json!([1, 4]));
    let (code, _, err) = summary(&[six.to_str().unwrap(), "--iteration-marker", "no_such_fn"]);
    assert_eq!(code, Some(2));
    assert!(
        err.contains("--iteration-marker") && err.contains("no_such_fn"),
        "{err}"
    );
}

/// `plot --iteration-marker` marks the same 6 steps on the time axis.
#[test]
fn issue15_plot_takes_the_iteration_marker() {
    let dir = Scratch::new("marker-plot");
    let six = without_annotations(&dir, "train_layers_6steps");
    let svg = dir.path("t.svg");
    let out = gpumem()
        .arg("plot")
        .arg(&six)
        .args(["--iteration-marker", "forward", "-o"])
        .arg(&svg)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0));
    assert!(String::from_utf8_lossy(&out.stdout).contains("6 iterations"));
    let text = std::fs::read_to_string(&svg).unwrap();
    assert!(text.contains("iter 5") && !text.contains("iter 6"));
}

/// Three training steps whose first differs from the other two (the optimizer's state, cuBLAS's
/// workspace), without their annotations: two equal periods are enough where the Python frames
/// show each beginning at the training loop's top, and the iterations are the annotations' own
/// (every figure of the summary, leak check included, is the same).
#[test]
fn issue15_three_steps_without_annotations_are_found_from_their_frames() {
    let dir = Scratch::new("three");
    for name in [
        "snapshot_mlp_adam",
        "snapshot_gpt_tiny_math_adam",
        "snapshot_gpt2s_b8_sdpa_adamw_bf16",
    ] {
        let path = format!("fixtures/snapshots/{name}.pickle");
        let bare = without_annotations_of(&dir, &path, name);
        let (code, mut with, err) = summary(&[&path]);
        assert_eq!(code, Some(0), "{err}");
        let (code, mut without, err) = summary(&[bare.to_str().unwrap()]);
        assert_eq!(code, Some(0), "{err}");
        assert_eq!(with["iterations_from"], "annotations");
        assert_eq!(without["iterations_from"], "repetition", "{name}");
        assert_eq!(u(&without["trace"]["iterations"]), 3, "{name}");
        for v in [&mut with, &mut without] {
            for k in [
                "file",
                "format",
                "name",
                "iterations_from",
                "iterations_not_found",
            ] {
                v.as_object_mut().unwrap().remove(k);
            }
        }
        assert_eq!(with["leak_check"], without["leak_check"], "{name}");
        assert_eq!(with["trace"], without["trace"], "{name}");
        assert_eq!(with["leaks"], without["leaks"], "{name}");
    }
}

/// Further loops recorded on the H200 (fixtures/snapshots/iterations/README.md): an evaluation
/// loop of other sizes keeping its losses (4 iterations, the first with cuBLAS's workspace),
/// and an inference loop over 5 batches, are found with their own counts and leaks; a
/// layer-by-layer loop that moves each block onto the GPU, and one forward of 24 blocks, are
/// not iterations, and the report says why; `--iteration-marker` at the line it names counts
/// the layer passes.
#[test]
fn issue15_loops_and_layers_recorded_on_the_gpu() {
    let (_, v, err) = summary(&[&format!("{DIR}/eval_keep_losses_4it.pickle")]);
    assert_eq!(v["iterations_from"], "repetition", "{err}");
    assert_eq!(u(&v["trace"]["iterations"]), 4);
    let leaks = v["leaks"].as_array().unwrap();
    let steady: u64 = leaks
        .iter()
        .map(|l| u(l["per_iteration"].as_array().unwrap().last().unwrap()))
        .sum();
    // 4 x (4.5 + 4.5 + 1.125) MiB of activations, and the loss's 512-byte block
    assert_eq!(steady, 4 * (4_718_592 + 4_718_592 + 1_179_648) + 512);

    let (_, v, _) = summary(&[&format!("{DIR}/infer_loop_5batches.pickle")]);
    assert_eq!(v["iterations_from"], "repetition");
    assert_eq!(u(&v["trace"]["iterations"]), 5);
    assert!(v["leaks"].as_array().unwrap().is_empty());

    let (_, v, _) = summary(&[&format!("{DIR}/layerwise_offload.pickle")]);
    assert_eq!(v["iterations_from"], "none", "{}", v["trace"]);
    let why = v["iterations_not_found"].as_str().unwrap();
    assert!(
        why.contains("moves a module onto the device")
            && why.contains("--iteration-marker record_iteration_snapshots.py:110"),
        "{why}"
    );
    let (_, v, _) = summary(&[
        &format!("{DIR}/layerwise_offload.pickle"),
        "--iteration-marker",
        "record_iteration_snapshots.py:110",
    ]);
    assert_eq!(v["iterations_from"], "marker");
    assert_eq!(u(&v["trace"]["iterations"]), 12);
    assert!(v["iterations_not_found"].is_null());

    let (_, v, _) = summary(&[&format!("{DIR}/infer_layers_1pass.pickle")]);
    assert_eq!(v["iterations_from"], "none");
    assert!(v["iterations_not_found"].as_str().is_some());
}
