//! Issue 16: hostile and mistaken inputs get exit 2 with a message that names what to fix, in
//! bounded time and memory; never a panic, a hang or a wrong answer with exit 0.

mod common;

use common::{at_root, refused, Scratch};

const MLP: &str = "fixtures/workloads/presets/mlp_sgd.toml";

/// A script workload of one body.
fn script(dir: &Scratch, body: &str) -> String {
    let text = format!("[workload]\nname = \"t\"\nbody = \"\"\"\n{body}\n\"\"\"\n");
    dir.write("w.toml", &text).to_string_lossy().into_owned()
}

#[test]
fn capacities_past_the_simulated_address_space_are_refused_not_a_panic() {
    // these panicked: addresses wrapped past 2^64 from about 1 PiB
    refused(
        &[
            "run",
            MLP,
            "--param",
            "batch=4294967296",
            "--capacity",
            "1024TiB",
        ],
        "--capacity: 1.00 PiB is more than the simulated device can hold: at most 64.00 TiB",
    );
    refused(
        &[
            "fit",
            MLP,
            "--no-remedies",
            "--max",
            "4611686018427387904",
            "--capacity",
            "18446744073709551615",
        ],
        "--capacity",
    );
    // replay replayed with every allocation failing where run refuses a zero capacity
    refused(
        &[
            "replay",
            "fixtures/snapshots/iterations/eval_keep_losses.pickle",
            "--capacity",
            "0",
        ],
        "--capacity: must be more than 0 bytes",
    );
    let d = Scratch::new("capacity_key");
    let w = d.write(
        "w.toml",
        "[workload]\nname = \"t\"\ncapacity = \"100TiB\"\nbody = \"x = zeros(4)\"\n",
    );
    refused(
        &["run", w.to_str().unwrap()],
        "'capacity' 100.00 TiB is more",
    );
}

#[test]
fn the_largest_capacity_runs_out_of_memory_through_pytorchs_path() {
    // 2^32 samples of 1024 floats: more than 64 TiB, so an out-of-memory finding (exit 1 when
    // asked to fail on it), with the allocator's message
    let out = at_root(&[
        "run",
        MLP,
        "--param",
        "batch=4294967296",
        "--capacity",
        "64TiB",
        "--fail-on",
        "oom",
    ]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "{text}");
    assert!(text.contains("CUDA out of memory"), "{text}");
}

#[test]
fn element_counts_past_int64_are_refused_as_pytorch_refuses_them() {
    // these allocated 0 bytes and exited 0 (the element-count product wrapped)
    let d = Scratch::new("storage_overflow");
    for (body, sizes) in [
        ("x = randn(2**62, 4)", "[4611686018427387904, 4]"),
        ("x = randn(2**32, 2**32)", "[4294967296, 4294967296]"),
        ("x = zeros(2**61, dtype=f64)", "[2305843009213693952]"),
    ] {
        let w = script(&d, body);
        refused(
            &["run", &w],
            &format!("Storage size calculation overflowed with sizes={sizes}"),
        );
    }
    // batch 2^62 reported a 1 GiB peak
    refused(
        &["run", MLP, "--param", "batch=4611686018427387904"],
        "Storage size calculation overflowed",
    );
}

#[test]
fn negative_sizes_and_counts_name_their_flag() {
    // clap read these as unknown flags ("unexpected argument '-5' found")
    refused(
        &["run", MLP, "--capacity", "-5GiB"],
        "--capacity: size '-5GiB' cannot be negative",
    );
    refused(
        &[
            "summary",
            "fixtures/snapshots/iterations/eval_keep_losses.pickle",
            "--top",
            "-1",
        ],
        "'--top <N>'",
    );
}

/// A PyTorch snapshot saved as JSON with one segment of 64 MiB holding `blocks`.
fn torch_json(dir: &Scratch, blocks: &str) -> String {
    let text = format!(
        r#"{{"segments": [{{"device": 0, "address": 1099511627776, "total_size": 67108864,
        "stream": 0, "segment_type": "large", "blocks": [{blocks}]}}], "device_traces": [[]]}}"#
    );
    dir.write("s.json", &text).to_string_lossy().into_owned()
}

#[test]
fn blocks_outside_their_segment_are_refused_not_painted_forever() {
    let d = Scratch::new("block_outside");
    // one block of 2^63-1 bytes in a 64 MiB segment: the fragmentation map never finished
    let s = torch_json(
        &d,
        r#"{"address": 1099511627776, "size": 9223372036854775807, "requested_size": 8, "state": "active_allocated"}"#,
    );
    refused(&["summary", &s], "segments[0].blocks[0] (address 0x10000000000, 9223372036854775807 bytes) lies outside its segment");
    // the block-size sum wrapped: two blocks whose sizes add past 2^64
    let s = torch_json(
        &d,
        r#"{"address": 1099511627776, "size": 33554432, "state": "inactive"},
           {"address": 1099545182208, "size": 18446744073709551000, "state": "active_allocated"}"#,
    );
    refused(&["summary", &s], "segments[0].blocks[1]");
    // "requested 16384.00 PiB": a negative requested size was cast
    let s = torch_json(
        &d,
        r#"{"address": 1099511627776, "size": 67108864, "requested_size": -1, "state": "active_allocated"}"#,
    );
    refused(
        &["summary", &s],
        "segments[0].blocks[0].requested_size is negative",
    );
    let s = torch_json(
        &d,
        r#"{"address": -5, "size": 67108864, "state": "active_allocated"}"#,
    );
    refused(
        &["summary", &s],
        "segments[0].blocks[0].address is negative",
    );
}

#[test]
fn shared_objects_in_a_pickle_are_refused_before_they_are_copied() {
    // 400 KB on disk, gigabytes once each reference is copied (scripts/make_bad_inputs.py)
    refused(
        &["summary", "fixtures/bad/shared_segment_200k.pickle"],
        "segments[1] (address 0x7f0000000000, 67108864 bytes) overlaps segments[0]",
    );
    refused(
        &["summary", "fixtures/bad/shared_block_200k.pickle"],
        "segments[0].blocks[1] (address 0x7f0000000000, 1048576 bytes) overlaps the block before it",
    );
}

#[test]
fn a_site_of_a_hundred_thousand_tags_is_cut_not_wrapped_for_minutes() {
    // a gpumem snapshot whose blocks share one stack of 100,000 tags took 51 s to print: the
    // table wrapped a 700 KB cell
    let d = Scratch::new("long_site");
    let snap = d.path("s.json");
    let out = at_root(&["run", MLP, "--snapshot", snap.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(0));
    let mut v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&snap).unwrap()).unwrap();
    let long: Vec<String> = (0..100_000).map(|i| format!("t{i}")).collect();
    let stacks = v["stacks"].as_array_mut().unwrap();
    stacks.push(serde_json::json!(long));
    let k = stacks.len() - 1;
    for s in v["segments"].as_array_mut().unwrap() {
        for b in s["blocks"].as_array_mut().unwrap() {
            b["stack"] = k.into();
        }
    }
    std::fs::write(&snap, v.to_string()).unwrap();
    let out = at_root(&["summary", snap.to_str().unwrap()]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(0));
    assert!(text.contains("more characters)"), "the site is not cut");
    assert!(text.lines().all(|l| l.chars().count() < 40_000));
}

#[cfg(target_os = "linux")]
#[test]
fn devices_given_as_files_are_refused_without_reading_them_whole() {
    // /dev/zero was read to 2.1 GB before it was refused
    refused(&["summary", "/dev/zero"], "it starts with byte 0x00");
    refused(&["replay", "/dev/zero"], "it starts with byte 0x00");
    refused(&["run", "/dev/zero"], "more than 256.00 MiB");
    refused(
        &["check", MLP, "--baseline", "/dev/zero"],
        "more than 256.00 MiB",
    );
}
