//! The profiler's table (`--by op|module|line|annotation`, issue 42 point 2): its columns add up
//! to what the trace says (the peak, the allocations, the net over the trace), its keys are
//! what each grouping promises, and bad requests are refused by flag.

mod common;

use common::{at_root, refused, run_json, u};
use serde_json::Value;

const GPT2: &str = "fixtures/workloads/presets/gpt2_small_sdpa_adamw.toml";
const SNAPS: [&str; 4] = [
    "fixtures/snapshots/snapshot_gpt2s_b8_sdpa_adamw_bf16.pickle",
    "fixtures/snapshots/snapshot_mlp_adam.pickle",
    "fixtures/snapshots/snapshot_mlp_leak.pickle",
    "fixtures/snapshots/snapshot_gpt_tiny_math_adam.pickle",
];

fn rows(p: &Value) -> &Vec<Value> {
    p["rows"].as_array().expect("rows")
}

fn row<'a>(p: &'a Value, key: &str) -> &'a Value {
    rows(p)
        .iter()
        .find(|r| r["key"] == key)
        .unwrap_or_else(|| panic!("no row {key}"))
}

/// Every row's columns are consistent and the rows are sorted by the column asked for.
fn check_rows(p: &Value, sort: &str) {
    let col = match sort {
        "peak" => "at_peak_bytes".to_string(),
        "allocs" | "net_bytes" => sort.to_string(),
        "net" => "net_bytes".to_string(),
        c => format!("{c}_bytes"),
    };
    let v: Vec<i64> = rows(p).iter().map(|r| r[&col].as_i64().unwrap()).collect();
    assert!(v.windows(2).all(|w| w[0] >= w[1]), "sorted by {col}: {v:?}");
    let sum = |c: &str| rows(p).iter().map(|r| r[c].as_i64().unwrap()).sum::<i64>();
    for c in [
        "allocs",
        "frees",
        "allocated_bytes",
        "freed_bytes",
        "at_peak_bytes",
    ] {
        assert_eq!(sum(c), p["total"][c].as_i64().unwrap(), "{c}");
    }
    for r in rows(p) {
        assert_eq!(
            r["net_bytes"].as_i64().unwrap(),
            u(&r["allocated_bytes"]) as i64 - u(&r["freed_bytes"]) as i64
        );
        assert!(u(&r["largest_bytes"]) <= u(&r["allocated_bytes"]));
    }
    // every byte alive at the peak belongs to one row
    assert_eq!(
        u(&p["total"]["at_peak_bytes"]),
        u(&p["peak_allocated_bytes"])
    );
}

#[test]
fn run_by_module_and_op_add_up_to_the_run() {
    let (code, v) = run_json(&["run", GPT2, "--by", "module", "--no-remedies"]);
    assert_eq!(code, Some(0));
    let p = &v["profile"];
    assert_eq!(p["by"], "module");
    check_rows(p, "peak");
    assert_eq!(
        u(&p["peak_allocated_bytes"]),
        u(&v["peak"]["peak_allocated"])
    );
    // the twelve blocks allocate alike
    let blocks: Vec<&Value> = (0..12).map(|i| row(p, &format!("blocks.{i}"))).collect();
    assert!(blocks
        .iter()
        .all(|b| b["allocated_bytes"] == blocks[0]["allocated_bytes"]));
    assert!(u(&blocks[0]["allocs"]) > 0);
    // the head's logits (batch 8 x 1,024 tokens x 50,257 in float32) are alive at the peak
    assert_eq!(u(&row(p, "head")["largest_bytes"]), 8 * 1024 * 50257 * 4);
    assert_eq!(u(&row(p, "head")["at_peak_bytes"]), 8 * 1024 * 50257 * 4);
    // the backward's ops have no scope
    assert!(u(&row(p, "(backward)")["allocs"]) > 0);

    let (_, o) = run_json(&["run", GPT2, "--by", "op", "--sort", "net", "--no-remedies"]);
    let p = &o["profile"];
    check_rows(p, "net");
    assert_eq!(p["total"], v["profile"]["total"].clone());
    assert!(u(&row(p, "linear")["allocs"]) > 0);
    assert!(u(&row(p, "linear_backward")["allocs"]) > 0);

    let text = at_root(&["run", GPT2, "--by", "op", "--top", "5", "--no-remedies"]);
    let text = String::from_utf8_lossy(&text.stdout);
    assert!(text.starts_with("fits on"), "{text}");
    assert!(text.contains("Memory by op"), "{text}");
    assert!(text.contains("total ("), "{text}");
    assert!(text.contains("more rows"), "{text}");
    assert!(
        !text.contains("memory_stats"),
        "the table replaces the report: {text}"
    );
}

#[test]
fn snapshot_tables_add_up_to_the_trace() {
    for snap in SNAPS {
        let (code, sum) = run_json(&["summary", snap]);
        assert_eq!(code, Some(0));
        let t = &sum["per_device"][0]["trace"];
        for (by, sort) in [
            ("line", "peak"),
            ("module", "allocated"),
            ("op", "allocs"),
            ("annotation", "freed"),
        ] {
            let (code, v) = run_json(&["summary", snap, "--by", by, "--sort", sort]);
            assert_eq!(code, Some(0), "{snap} --by {by}");
            let p = &v["profiles"][0];
            assert_eq!(p["by"], by);
            check_rows(p, sort);
            assert_eq!(
                u(&p["peak_allocated_bytes"]),
                u(&t["peak_allocated_bytes"]),
                "{snap}"
            );
            assert_eq!(u(&p["total"]["allocs"]), u(&t["allocs"]), "{snap} {by}");
            assert_eq!(u(&p["total"]["frees"]), u(&t["frees"]), "{snap} {by}");
            // what the trace allocated less what it freed is what it added
            let end = u(&v["per_device"][0]["allocated_bytes"]) as i64;
            let start = u(&t["allocated_at_start"]) as i64;
            assert_eq!(
                p["total"]["net_bytes"].as_i64().unwrap(),
                end - start,
                "{snap} {by}"
            );
        }
    }
}

#[test]
fn lines_are_the_users_and_annotations_the_ranges() {
    let snap = SNAPS[0];
    let (_, v) = run_json(&["summary", snap, "--by", "line"]);
    let p = &v["profiles"][0];
    for r in rows(p) {
        let k = r["key"].as_str().unwrap();
        // PyTorch's own files are never the line
        for lib in [
            "module.py:",
            "functional.py:",
            "linear.py:",
            "optimizer.py:",
            "adam",
        ] {
            assert!(!k.starts_with(lib), "{k}");
        }
    }
    assert!(rows(p).iter().any(|r| r["key"]
        .as_str()
        .unwrap()
        .starts_with("reference_models.py:")));
    // the module chains are the lines that called nn.Modules
    let (_, m) = run_json(&["summary", snap, "--by", "module"]);
    assert!(rows(&m["profiles"][0])
        .iter()
        .any(|r| r["key"].as_str().unwrap().contains(" › ")));
    // ops from C++ frames, not the allocation helpers inside them
    let (_, o) = run_json(&["summary", snap, "--by", "op"]);
    assert!(u(&row(&o["profiles"][0], "aten::addmm")["allocs"]) > 0);

    let (_, a) = run_json(&["summary", SNAPS[1], "--by", "annotation"]);
    let p = &a["profiles"][0];
    let step = rows(p)
        .iter()
        .find(|r| r["key"].as_str().unwrap().starts_with("Optimizer.step#"))
        .expect("the optimizer's step");
    assert!(u(&step["allocs"]) > 0);
    let zero = rows(p)
        .iter()
        .find(|r| {
            r["key"]
                .as_str()
                .unwrap()
                .starts_with("Optimizer.zero_grad#")
        })
        .expect("zero_grad");
    // zero_grad(set_to_none=True) frees the gradients and allocates nothing
    assert_eq!(u(&zero["allocs"]), 0);
    assert!(u(&zero["freed_bytes"]) > 0);
}

#[test]
fn bad_requests_name_the_flag() {
    refused(&["run", GPT2, "--by", "line"], "--by");
    refused(&["summary", SNAPS[1], SNAPS[2], "--by", "op"], "--by");
    refused(&["summary", SNAPS[1], "--sort", "net"], "--by");
    refused(&["run", GPT2, "--by", "op", "--top", "0"], "--top");
    refused(&["summary", SNAPS[1], "--by", "sideways"], "sideways");
}
