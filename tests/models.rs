//! Issue 4: model workloads whose per-iteration memory matches PyTorch 2.11 on an H200 to the
//! byte. The reference figures are fixtures/models/case_<name>.json (recorded with
//! ../shared/tools/reference_models.py; identical to ../shared/groundtruth/models/models.json).

use std::path::PathBuf;

use assert_cmd::Command;
use serde_json::Value;

const FIELDS: [&str; 8] = [
    "start",
    "after_forward",
    "after_backward",
    "after_step",
    "end",
    "peak_allocated",
    "peak_reserved",
    "reserved_end",
];

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// (fields compared, fields equal, first differences)
fn compare(name: &str) -> (usize, usize, Vec<String>) {
    let reference: Value = serde_json::from_slice(
        &std::fs::read(root().join(format!("fixtures/models/case_{name}.json"))).unwrap(),
    )
    .unwrap();
    let theirs = reference["cases"][0]["iterations"]
        .as_array()
        .unwrap()
        .clone();
    let out = Command::new(assert_cmd::cargo::cargo_bin!("gpumem"))
        .arg("run")
        .arg(root().join(format!("fixtures/workloads/models/{name}.toml")))
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
    let ours = v["iterations"].as_array().unwrap();
    assert_eq!(ours.len(), theirs.len(), "{name}: iteration count");
    let (mut n, mut eq, mut diffs) = (0, 0, Vec::new());
    for (o, t) in ours.iter().zip(&theirs) {
        for k in FIELDS {
            if t.get(k).is_some() {
                n += 1;
                if o.get(k) == t.get(k) {
                    eq += 1;
                } else {
                    diffs.push(format!(
                        "iteration {} {k}: gpumem {} PyTorch {}",
                        t["iter"], o[k], t[k]
                    ));
                }
            }
        }
    }
    (n, eq, diffs)
}

#[test]
fn issue4_mlp_cases_match_pytorch_to_the_byte() {
    for name in [
        "mlp_sgd",
        "mlp_adam",
        "mlp_inference",
        "mlp_eval_leak",
        "mlp_leak",
    ] {
        let (n, eq, diffs) = compare(name);
        assert!(n >= 18, "{name}: {n} fields");
        assert_eq!(eq, n, "{name}: {diffs:?}");
    }
}
