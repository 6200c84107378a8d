//! Issue 15, finding 5: what `gpumem export --to memory-viz` writes is what PyTorch's own viewer
//! (MemoryViz.js) reads. The viewer was run on these exports in headless Chromium (see the
//! CHANGELOG); this test checks the pickle opcodes its unpickler knows and the keys and shapes
//! it reads, for a gpumem run and for a real snapshot converted by gpumem's own writer.

mod common;

use std::path::Path;

use common::{export, external, gpumem, root, Scratch};
use serde_json::Value;

/// Walks a pickle's opcodes as MemoryViz.js's unpickler does: protocol 2 to 4, and only the
/// opcodes it implements (anything else makes it throw "UNKNOWN OPCODE").
fn viewer_can_unpickle(bytes: &[u8]) -> Result<(), String> {
    if bytes.len() < 2 || bytes[0] != 0x80 || !(2..=4).contains(&bytes[1]) {
        return Err(format!(
            "protocol {:?}: the viewer reads 2 to 4",
            bytes.get(1)
        ));
    }
    let mut i = 0usize;
    let le = |b: &[u8]| b.iter().rev().fold(0usize, |a, &x| a << 8 | x as usize);
    while i < bytes.len() {
        let op = bytes[i];
        i += 1;
        let arg = match op {
            0x80 | b'K' | b'q' | b'h' => 1,
            b'M' => 2,
            b'J' | b'r' | b'j' => 4,
            0x95 | b'G' => 8,
            0x8a | 0x8c => 1 + *bytes.get(i).ok_or("truncated")? as usize,
            b'X' => 4 + le(bytes.get(i..i + 4).ok_or("truncated")?),
            b'(' | b'}' | b']' | b')' | b'd' | b'l' | b't' | 0x85 | 0x86 | 0x87 | b's' | b'u'
            | b'a' | b'e' | b'N' | 0x88 | 0x89 | 0x94 => 0,
            b'.' => return Ok(()),
            other => return Err(format!("opcode {other:#04x} at byte {}", i - 1)),
        };
        i += arg;
    }
    Err("no STOP".into())
}

fn is_int(v: &Value) -> bool {
    v.is_i64() || v.is_u64()
}

/// The keys and shapes MemoryViz.js reads, checked on the document (as JSON).
fn viewer_can_draw(doc: &Value) -> Result<(), String> {
    let segments = doc["segments"].as_array().ok_or("no segments list")?;
    let traces = doc["device_traces"]
        .as_array()
        .ok_or("no device_traces list")?;
    for (k, s) in segments.iter().enumerate() {
        for key in ["device", "address", "total_size", "stream"] {
            if !is_int(&s[key]) {
                return Err(format!("segments[{k}].{key} is not an integer: {}", s[key]));
            }
        }
        let blocks = s["blocks"]
            .as_array()
            .ok_or(format!("segments[{k}].blocks"))?;
        // the viewer places blocks one after the other from the segment's address
        let sum: u64 = blocks.iter().map(|b| b["size"].as_u64().unwrap_or(0)).sum();
        if sum != s["total_size"].as_u64().unwrap() {
            return Err(format!(
                "segments[{k}]: blocks sum to {sum}, not total_size"
            ));
        }
        let mut at = s["address"].as_u64().unwrap();
        for (j, b) in blocks.iter().enumerate() {
            if !is_int(&b["size"]) || !b["state"].is_string() {
                return Err(format!("segments[{k}].blocks[{j}]: size/state"));
            }
            if let Some(a) = b.get("address").and_then(|a| a.as_u64()) {
                if a != at {
                    return Err(format!(
                        "segments[{k}].blocks[{j}] is not where the last ended"
                    ));
                }
            }
            at += b["size"].as_u64().unwrap();
            if b.get("frames").is_some() && !is_int(&b["requested_size"]) {
                return Err(format!(
                    "segments[{k}].blocks[{j}]: frames without requested_size"
                ));
            }
            frames_ok(&b["frames"], &format!("segments[{k}].blocks[{j}]"))?;
        }
    }
    let actions = [
        "alloc",
        "free_requested",
        "free_completed",
        "segment_alloc",
        "segment_free",
        "segment_map",
        "segment_unmap",
        "oom",
        "snapshot",
    ];
    for (d, t) in traces.iter().enumerate() {
        let t = t
            .as_array()
            .ok_or(format!("device_traces[{d}] is not a list"))?;
        for (k, e) in t.iter().enumerate() {
            let a = e["action"]
                .as_str()
                .ok_or(format!("device_traces[{d}][{k}].action"))?;
            if !actions.contains(&a) {
                return Err(format!(
                    "device_traces[{d}][{k}]: action '{a}' the viewer ignores"
                ));
            }
            // (an out-of-memory entry has no address: the viewer reads its device_free)
            let addr = if a == "oom" { "device_free" } else { "addr" };
            if !is_int(&e[addr]) || !is_int(&e["size"]) {
                return Err(format!("device_traces[{d}][{k}]: {addr}/size"));
            }
            if e.get("category").is_some() {
                return Err(format!(
                    "device_traces[{d}][{k}] has 'category', which breaks the viewer"
                ));
            }
            frames_ok(&e["frames"], &format!("device_traces[{d}][{k}]"))?;
        }
    }
    Ok(())
}

/// Frames, when present: a list of {filename: string, line: integer, name: string} (the
/// viewer's filter calls string methods on both names).
fn frames_ok(frames: &Value, at: &str) -> Result<(), String> {
    if frames.is_null() {
        return Ok(());
    }
    for (i, f) in frames
        .as_array()
        .ok_or(format!("{at}.frames"))?
        .iter()
        .enumerate()
    {
        if !f["filename"].is_string() || !f["name"].is_string() || !is_int(&f["line"]) {
            return Err(format!("{at}.frames[{i}]: {f}"));
        }
    }
    Ok(())
}

fn check(pickle: &Path, dir: &Scratch) {
    let bytes = std::fs::read(pickle).unwrap();
    viewer_can_unpickle(&bytes).unwrap_or_else(|e| panic!("{}: {e}", pickle.display()));
    let json = dir.path("doc.json");
    export(pickle, "torch-json", &json);
    let doc: Value = serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    viewer_can_draw(&doc).unwrap_or_else(|e| panic!("{}: {e}", pickle.display()));
}

#[test]
fn issue15_memory_viz_export_of_a_run_is_what_the_viewer_reads() {
    let dir = Scratch::new("viz-run");
    let snap = dir.path("run.json");
    let o = gpumem()
        .current_dir(root())
        .args([
            "run",
            "fixtures/workloads/presets/mlp_adam.toml",
            "--snapshot",
        ])
        .arg(&snap)
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(0));
    let viz = dir.path("run.pickle");
    export(&snap, "memory-viz", &viz);
    check(&viz, &dir);
}

/// A real snapshot through gpumem's own pickle writer (JSON in, pickle out): three GPUs.
#[test]
fn issue15_memory_viz_export_of_a_real_snapshot_is_what_the_viewer_reads() {
    let dir = Scratch::new("viz-real");
    let p = external(&dir, "codeloc_memory_snapshot.pickle");
    let json = dir.path("codeloc.json");
    export(&p, "torch-json", &json);
    let viz = dir.path("codeloc.viz.pickle");
    export(&json, "memory-viz", &viz);
    check(&viz, &dir);
    // the checks can fail: an unknown opcode and a gap between blocks are caught
    assert!(viewer_can_unpickle(&[0x80, 4, b'c', b'.']).is_err());
    let mut doc: Value = serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    doc["segments"][0]["blocks"][0]["size"] = 1.into();
    assert!(viewer_can_draw(&doc).is_err());
}

/// Issue 37: JSON writes a shared frame list out at every use (ftcourse: 51 times the pickle);
/// `-o FILE.json.gz` writes the same document compressed, within 1.5 times the pickle, and
/// `gpumem summary` reads it back to the same figures. memory-viz refuses `.gz`: the viewer
/// reads the pickle as it is.
#[test]
fn issue37_torch_json_export_compressed_keeps_shared_frames_small() {
    use std::io::Read as _;
    let dir = Scratch::new("viz-gz");
    let p = external(&dir, "ftcourse_memory_snapshot.pickle");
    let pickle_len = std::fs::metadata(&p).unwrap().len();
    let (json, gz) = (dir.path("ft.json"), dir.path("ft.json.gz"));
    export(&p, "torch-json", &json);
    export(&p, "torch-json", &gz);
    let plain = std::fs::read(&json).unwrap();
    let packed = std::fs::read(&gz).unwrap();
    assert!(plain.len() as u64 > 10 * pickle_len, "{}", plain.len());
    assert!(
        (packed.len() as u64) * 2 < pickle_len * 3,
        "{} bytes of gzip for a {pickle_len}-byte pickle",
        packed.len()
    );
    let mut unpacked = Vec::new();
    flate2::read::GzDecoder::new(&packed[..])
        .read_to_end(&mut unpacked)
        .unwrap();
    assert!(unpacked == plain, "the gzip holds another document");
    let figures = |f: &Path| -> Value {
        let (code, mut v) = common::run_json(&["summary", f.to_str().unwrap()]);
        assert_eq!(code, Some(0), "{v}");
        for k in ["file", "format", "name", "per_device"] {
            v.as_object_mut().unwrap().remove(k);
        }
        v
    };
    let (a, b) = (figures(&p), figures(&gz));
    assert!(a["peak_allocated_bytes"].as_u64().unwrap() > 1 << 30, "{a}");
    assert_eq!(a, b);
    // a corrupt stream is an input error naming the file, not a panic
    let bad = dir.path("bad.json.gz");
    std::fs::write(&bad, &packed[..packed.len() / 2]).unwrap();
    let o = gpumem().arg("summary").arg(&bad).output().unwrap();
    assert_eq!(o.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&o.stderr).contains("bad.json.gz"));
    let o = gpumem()
        .arg("export")
        .arg(&p)
        .args(["--to", "memory-viz", "-o"])
        .arg(dir.path("x.pickle.gz"))
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(2));
    assert!(!dir.path("x.pickle.gz").exists());
}
