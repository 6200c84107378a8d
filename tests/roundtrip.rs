//! Issue 42 point 4: every snapshot in fixtures/ survives a round trip: read, written back in
//! PyTorch's format from gpumem's model of it (`report::export::torch_snapshot`), read again:
//! the segments and blocks with their stacks, every trace entry (actions gpumem does not model
//! included, in place), times, annotations, allocator settings, `user_metadata`,
//! `compile_context` and pool ids are equal. And `gpumem export --to torch-json` of each file
//! summarizes as the file does.

mod common;

use std::path::{Path, PathBuf};

use common::{root, run_json, Scratch};
use gpumem::snapshot::{load_devices, Snapshot, Which};

fn fixtures(s: &Scratch) -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(root().join("fixtures/snapshots"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "pickle"))
        .filter(|p| {
            !p.file_name()
                .unwrap()
                .to_string_lossy()
                .starts_with("grown_")
        })
        .collect();
    for e in std::fs::read_dir(root().join("fixtures/external")).unwrap() {
        let p = e.unwrap().path();
        let name = p.file_name().unwrap().to_string_lossy().to_string();
        if let Some(n) = name.strip_suffix(".xz") {
            files.push(common::external(s, n));
        }
    }
    // the model-family recordings not modelled yet (their snapshots, xz-compressed)
    for e in std::fs::read_dir(root().join("fixtures/hf2/recorded")).unwrap() {
        let p = e.unwrap().path();
        let name = p.file_name().unwrap().to_string_lossy().to_string();
        if let Some(n) = name.strip_suffix(".xz").filter(|n| n.ends_with(".pickle")) {
            let mut input = std::io::BufReader::new(std::fs::File::open(&p).unwrap());
            let mut bytes = Vec::new();
            lzma_rs::xz_decompress(&mut input, &mut bytes).unwrap();
            let out = s.path(n);
            std::fs::write(&out, bytes).unwrap();
            files.push(out);
        }
    }
    files.push(root().join("fixtures/bad/corpus/_ok_snapshot.pickle"));
    files.sort();
    files
}

fn stack(s: &Snapshot, id: gpumem::trace::StackId) -> Vec<String> {
    s.tags.resolve(id).into_iter().map(str::to_string).collect()
}

/// Where `b` (read back) differs from `a`.
fn differences(a: &Snapshot, b: &Snapshot) -> Vec<String> {
    let mut d = Vec::new();
    let mut check = |what: &str, same: bool| {
        if !same {
            d.push(what.to_string());
        }
    };
    check("segment count", a.segments.len() == b.segments.len());
    for (x, y) in a.segments.iter().zip(&b.segments) {
        let same = (
            x.address,
            x.total_size,
            x.stream,
            x.pool,
            x.is_expandable,
            x.blocks.len(),
        ) == (
            y.address,
            y.total_size,
            y.stream,
            y.pool,
            y.is_expandable,
            y.blocks.len(),
        );
        check(&format!("segment {:#x}", x.address), same);
        for (p, q) in x.blocks.iter().zip(&y.blocks) {
            let same = (p.address, p.size, p.requested_size, p.state)
                == (q.address, q.size, q.requested_size, q.state)
                && stack(a, p.stack) == stack(b, q.stack);
            check(&format!("block {:#x}", p.address), same);
        }
    }
    check("event count", a.events.len() == b.events.len());
    if let Some(i) = a.events.iter().zip(&b.events).position(|(x, y)| {
        (x.kind(), x.addr, x.size(), x.stream) != (y.kind(), y.addr, y.size(), y.stream)
            || stack(a, x.stack) != stack(b, y.stack)
    }) {
        check(
            &format!("event {i}: {:?} against {:?}", a.events[i], b.events[i]),
            false,
        );
    }
    check("times", a.times == b.times);
    check("annotations", a.annotations == b.annotations);
    check("allocator settings", a.conf == b.conf);
    check(
        "skipped entries",
        (&a.skipped, &a.skipped_at, &a.skipped_kind)
            == (&b.skipped, &b.skipped_at, &b.skipped_kind),
    );
    let meta = |s: &Snapshot| -> Vec<(u32, String, String)> {
        s.entry_meta
            .iter()
            .map(|m| {
                (
                    m.event,
                    s.meta_strings.text(m.user_metadata).to_string(),
                    s.meta_strings.text(m.compile_context).to_string(),
                )
            })
            .collect()
    };
    check("user_metadata and compile_context", meta(a) == meta(b));
    check("pool ids", a.segment_pools == b.segment_pools);
    check("iterations", a.iterations == b.iterations);
    d
}

fn round_trip(file: &Path, dir: &Scratch) -> Vec<String> {
    let mut out = Vec::new();
    let Ok(devices) = load_devices(file, Which::All) else {
        return out; // a file gpumem refuses is refused again (tests/external.rs)
    };
    for s in &devices {
        let w = gpumem::report::export::torch_snapshot(s);
        let mut bytes = Vec::new();
        gpumem::trace::pickle_write::write(&w, &mut bytes).unwrap();
        let back_file = dir.path(&format!(
            "{}.{}.back.pickle",
            file.file_name().unwrap().to_string_lossy(),
            s.device
        ));
        std::fs::write(&back_file, bytes).unwrap();
        let back = load_devices(&back_file, Which::Device(s.device)).unwrap();
        assert_eq!(back.len(), 1);
        for e in differences(s, &back[0]) {
            out.push(format!("{} (device {}): {e}", file.display(), s.device));
        }
    }
    out
}

#[test]
fn every_fixture_snapshot_round_trips() {
    let s = Scratch::new("roundtrip");
    let files = fixtures(&s);
    assert!(files.len() >= 38, "{} files: {files:?}", files.len());
    let mut failures = Vec::new();
    for f in &files {
        failures.extend(round_trip(f, &s));
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn torch_json_export_summarizes_as_the_file() {
    let s = Scratch::new("roundtrip-cli");
    for f in fixtures(&s).iter().take(8) {
        let (code, a) = run_json(&["summary", f.to_str().unwrap()]);
        if code != Some(0) {
            continue;
        }
        let out = s.path("t.json");
        let e = common::at_root(&[
            "export",
            f.to_str().unwrap(),
            "--to",
            "torch-json",
            "-o",
            out.to_str().unwrap(),
        ]);
        assert!(e.status.success(), "{}", String::from_utf8_lossy(&e.stderr));
        let (_, b) = run_json(&["summary", out.to_str().unwrap()]);
        for k in [
            "reserved_bytes",
            "allocated_bytes",
            "segments",
            "peak_allocated_bytes",
            "leaks",
        ] {
            assert_eq!(a[k], b[k], "{}: {k}", f.display());
        }
    }
}

/// The newest fields, in a snapshot written as PyTorch 2.11 writes them (as JSON): they are
/// read, kept through the round trip, and shown.
#[test]
fn user_metadata_compile_context_and_pools_are_kept() {
    let s = Scratch::new("roundtrip-fields");
    let frames = serde_json::json!([{"filename": "/home/me/train.py", "line": 7, "name": "step"}]);
    let entry = |action: &str, addr: u64, size: u64, t: u64, meta: &str, ctx: &str| {
        serde_json::json!({"action": action, "addr": addr, "size": size, "stream": 0,
            "time_us": t, "compile_context": ctx, "user_metadata": meta, "frames": frames})
    };
    let g = 0x7f00_0000_0000u64;
    let p = 0x7f00_0020_0000u64;
    let doc = serde_json::json!({
        "segments": [
            {"device": 0, "address": g, "total_size": 2097152, "allocated_size": 1048576,
             "active_size": 1048576, "requested_size": 1048576, "stream": 0,
             "segment_type": "large", "segment_pool_id": [1, 0], "is_expandable": false,
             "frames": [], "blocks": [
                {"address": g, "size": 1048576, "requested_size": 1048576,
                 "state": "active_allocated", "frames": frames},
                {"address": g + 1048576, "size": 1048576, "requested_size": 0,
                 "state": "inactive", "frames": []}]},
            {"device": 0, "address": p, "total_size": 2097152, "allocated_size": 0,
             "active_size": 0, "requested_size": 0, "stream": 0, "segment_type": "large",
             "segment_pool_id": [0, 1], "is_expandable": false, "frames": [], "blocks": [
                {"address": p, "size": 2097152, "requested_size": 0, "state": "inactive",
                 "frames": []}]}
        ],
        "device_traces": [[
            entry("segment_alloc", g, 2097152, 10, "", "N/A"),
            entry("alloc", g, 1048576, 11, "phase=load", "N/A"),
            entry("snapshot", 0, 0, 12, "", "N/A"),
            entry("segment_alloc", p, 2097152, 13, "", "N/A"),
            entry("alloc", p, 1024, 14, "", "Torch-Compiled Region: 0/0"),
            entry("free_requested", p, 1024, 15, "", "Torch-Compiled Region: 0/0"),
            entry("free_completed", p, 1024, 16, "", "Torch-Compiled Region: 0/0")
        ]],
        "allocator_settings": {"PYTORCH_CUDA_ALLOC_CONF": "max_split_size_mb:256",
            "max_split_size": 268435456, "garbage_collection_threshold": 0.0,
            "expandable_segments": false},
        "external_annotations": [
            {"stage": "START", "name": "load", "device": 0, "time_us": 9},
            {"stage": "END", "name": "load", "device": 0, "time_us": 12}
        ]
    });
    let f = s.write("fields.json", &doc.to_string());
    let snaps = load_devices(&f, Which::All).unwrap();
    let snap = &snaps[0];
    assert_eq!(snap.segment_pools, vec![(g, [1, 0]), (p, [0, 1])]);
    let metas: Vec<(u32, &str, &str)> = snap
        .entry_meta
        .iter()
        .map(|m| {
            (
                m.event,
                snap.meta_strings.text(m.user_metadata),
                snap.meta_strings.text(m.compile_context),
            )
        })
        .collect();
    assert_eq!(
        metas,
        vec![
            (1, "phase=load", ""),
            (3, "", "Torch-Compiled Region: 0/0"),
            (4, "", "Torch-Compiled Region: 0/0"),
            (5, "", "Torch-Compiled Region: 0/0"),
        ]
    );
    assert_eq!(snap.skipped, vec![("snapshot".to_string(), 1)]);
    assert_eq!(snap.skipped_at, vec![2]);
    assert!(round_trip(&f, &s).is_empty(), "{:?}", round_trip(&f, &s));
    // the summary shows the private pools and the metadata
    let (code, v) = run_json(&["summary", f.to_str().unwrap()]);
    assert_eq!(code, Some(0));
    let pools = v["per_device"][0]["private_pools"]
        .as_array()
        .expect("private pools");
    assert_eq!(pools.len(), 2);
    // sorted by pool id: the MemPool's (0, 1), then the graph's (1, 0)
    assert_eq!(pools[0]["kind"], "mem_pool");
    assert_eq!(pools[0]["allocated_bytes"], 0);
    assert_eq!(pools[1]["pool_id"], serde_json::json!([1, 0]));
    assert_eq!(pools[1]["kind"], "cuda_graph");
    assert_eq!(pools[1]["reserved_bytes"], 2097152);
    assert_eq!(pools[1]["allocated_bytes"], 1048576);
    let text = common::at_root(&["summary", f.to_str().unwrap()]);
    let text = String::from_utf8_lossy(&text.stdout);
    assert!(text.contains("CUDA graph"), "{text}");
    // --by annotation: the ranges, and the user_metadata beside them
    let (_, a) = run_json(&["summary", f.to_str().unwrap(), "--by", "annotation"]);
    let keys: Vec<&str> = a["profiles"][0]["rows"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["key"].as_str().unwrap())
        .collect();
    assert!(
        keys.contains(&"load · user_metadata=phase=load"),
        "{keys:?}"
    );
}

/// The same fields as PyTorch 2.11 recorded them on the H200 (scripts/record_new_fields.py).
#[test]
fn the_recorded_new_fields_are_read() {
    let f = root().join("fixtures/snapshots/new_fields.pickle");
    let snap = &load_devices(&f, Which::All).unwrap()[0];
    let texts: std::collections::BTreeSet<&str> = snap
        .entry_meta
        .iter()
        .flat_map(|m| [m.user_metadata, m.compile_context])
        .map(|i| snap.meta_strings.text(i))
        .collect();
    assert!(texts.contains("phase=load"), "{texts:?}");
    assert!(texts.contains("Torch-Compiled Region: 0/0"), "{texts:?}");
    let kinds: Vec<[i64; 2]> = snap.segment_pools.iter().map(|p| p.1).collect();
    assert!(
        kinds.contains(&[1, 0]) && kinds.contains(&[0, 1]),
        "{kinds:?}"
    );
    let names: Vec<&str> = snap.annotations.iter().map(|a| a.name.as_str()).collect();
    assert!(names.contains(&"inner"), "{names:?}");
    assert_eq!(
        snap.conf.raw,
        "max_split_size_mb:256,garbage_collection_threshold:0.8"
    );
}

/// An out-of-memory entry's `device_free` (a key only `oom` entries have, so not among the
/// trace's columns) is read from PyTorch's file and from gpumem's export of its own run alike:
/// the verdicts of the run's snapshot and of its export agree.
#[test]
fn an_ooms_free_device_memory_is_read_from_pickles() {
    let s = Scratch::new("roundtrip-oom");
    // PyTorch's own file: its device 1 ran out with 95,682,560 bytes free (Python's reading)
    let f = common::external(&s, "codeloc_memory_snapshot.pickle");
    let (_, v) = run_json(&["summary", f.to_str().unwrap(), "--device", "1"]);
    assert_eq!(v["ooms"][0]["device_free"], 95_682_560u64, "{}", v["ooms"]);
    // a run's snapshot and its memory_viz export
    let json = s.path("fo.json");
    let out = common::at_root(&[
        "run",
        "--preset",
        "fragmentation-oom",
        "--no-remedies",
        "-q",
        "--snapshot",
        json.to_str().unwrap(),
    ]);
    assert!(json.exists(), "{}", String::from_utf8_lossy(&out.stderr));
    let pickle = s.path("fo.pickle");
    common::export(&json, "memory-viz", &pickle);
    let (_, a) = run_json(&["summary", json.to_str().unwrap()]);
    let (_, b) = run_json(&["summary", pickle.to_str().unwrap()]);
    let free = &a["ooms"][0]["device_free"];
    assert!(free.as_u64().is_some_and(|f| f > 0), "{}", a["ooms"]);
    assert_eq!(&b["ooms"][0]["device_free"], free);
    assert_eq!(a["ooms"][0]["verdict"], b["ooms"][0]["verdict"]);
    assert_eq!(a["verdict"]["line"], b["verdict"]["line"]);
}

/// A gpumem snapshot exported to PyTorch's formats keeps its iterations: its `iter:N` tags,
/// written as frames of file `gpumem`, are read back as the iterations (not looked for again
/// in annotations or repetition), so the leaks found and the report agree with the original.
#[test]
fn an_exported_gpumem_snapshot_keeps_its_iterations() {
    let s = Scratch::new("roundtrip-iterations");
    let json = s.path("leak.json");
    let out = common::at_root(&[
        "run",
        "--preset",
        "mlp-leak",
        "--iterations",
        "6",
        "-q",
        "--snapshot",
        json.to_str().unwrap(),
    ]);
    assert!(json.exists(), "{}", String::from_utf8_lossy(&out.stderr));
    let (_, a) = run_json(&["summary", json.to_str().unwrap()]);
    assert_eq!(a["iterations_from"], "tags", "{}", a["iterations_from"]);
    let leaks = a["leaks"].as_array().expect("leaks looked for");
    assert!(!leaks.is_empty(), "mlp-leak leaks");
    for (to, name) in [("memory-viz", "leak.pickle"), ("torch-json", "leak_t.json")] {
        let f = s.path(name);
        common::export(&json, to, &f);
        let (_, b) = run_json(&["summary", f.to_str().unwrap()]);
        assert_eq!(b["iterations_from"], "tags", "{to}");
        assert_eq!(b["leaks"], a["leaks"], "{to}");
        assert_eq!(b["leak_check"], a["leak_check"], "{to}");
    }
}
