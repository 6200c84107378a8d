//! Issue 15: PyTorch snapshots from other people's runs (fixtures/external), read as PyTorch's
//! own figures say, on every device of every file.

mod common;

use common::{export, external, external_expected, gpumem, u, Scratch};
use serde_json::Value;

/// The files that are snapshots, with their expected figures.
fn snapshots() -> Vec<(String, Value)> {
    let exp = external_expected();
    exp.as_object()
        .unwrap()
        .iter()
        .filter(|(_, v)| v.get("per_device").is_some())
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect()
}

fn summary_json(path: &std::path::Path, extra: &[&str]) -> (Option<i32>, Value) {
    let out = gpumem()
        .arg("summary")
        .arg(path)
        .args(extra)
        .arg("--json")
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    let v = serde_json::from_str(&text).unwrap_or_else(|e| {
        panic!(
            "{}: not JSON ({e}): {text}{}",
            path.display(),
            String::from_utf8_lossy(&out.stderr)
        )
    });
    (out.status.code(), v)
}

/// Python's figures (expected.json's names) from one device's (or all devices') JSON.
fn figures(d: &Value, pools: Option<&Value>) -> Vec<(&'static str, u64)> {
    let f = |k: &str| u(&d[k]);
    let mut v = vec![
        ("segments", f("segments")),
        ("reserved", f("reserved_bytes")),
        ("allocated", f("allocated_bytes")),
        ("active", f("active_bytes")),
        ("requested", f("requested_bytes")),
        ("internal", f("allocated_bytes") - f("requested_bytes")),
        ("free", f("free_bytes")),
        ("largest_free", f("largest_free_bytes")),
    ];
    if let Some(p) = pools {
        v.extend([
            ("inactive_split", u(&p["all"]["inactive_split_bytes"])),
            (
                "inactive_split_blocks",
                u(&p["all"]["inactive_split_blocks"]),
            ),
            ("allocations", u(&p["all"]["allocations"])),
            ("large_reserved", u(&p["large"]["reserved_bytes"])),
            ("small_reserved", u(&p["small"]["reserved_bytes"])),
        ]);
    } else {
        v.extend([
            ("inactive_split", f("inactive_split_bytes")),
            ("inactive_split_blocks", f("inactive_split_blocks")),
            ("allocations", f("allocations")),
        ]);
    }
    v
}

#[test]
fn issue15_every_device_of_every_real_snapshot_reads_as_python_computes_it() {
    let dir = Scratch::new("external-figures");
    let mut checked = 0;
    for (name, exp) in snapshots() {
        let path = external(&dir, &name);
        let (code, v) = summary_json(&path, &[]);
        assert_eq!(code, Some(0), "{name}: {v}");
        let per = v["per_device"].as_array().unwrap();
        let devices: Vec<u64> = per.iter().map(|d| u(&d["device"])).collect();
        let want: Vec<u64> = exp["devices"].as_array().unwrap().iter().map(u).collect();
        assert_eq!(devices, want, "{name}: devices");
        for d in per {
            let dev = u(&d["device"]).to_string();
            let e = &exp["per_device"][&dev];
            for (k, got) in figures(d, Some(&d["pools"])) {
                assert_eq!(got, u(&e[k]), "{name} cuda:{dev} {k}");
                checked += 1;
            }
        }
        for (k, got) in figures(&v["all_devices"], None) {
            if k == "largest_free" || exp["all_devices"].get(k).is_some() {
                assert_eq!(got, u(&exp["all_devices"][k]), "{name} all devices {k}");
            }
        }
        // --device N shows that device alone, with the same figures
        let last = devices.last().unwrap().to_string();
        let (code, one) = summary_json(&path, &["--device", &last]);
        assert_eq!(code, Some(0));
        assert_eq!(one["per_device"].as_array().unwrap().len(), 1);
        assert_eq!(
            u(&one["reserved_bytes"]),
            u(&exp["per_device"][&last]["reserved"]),
            "{name} --device {last}"
        );
    }
    assert!(checked > 200, "{checked} figures checked");
}

/// The 3-GPU snapshot's out-of-memory error is on cuda:1, not the device with the longest
/// trace: it is reported, and `--fail-on oom` fails on it.
#[test]
fn issue15_an_oom_on_another_device_is_found_and_failed_on() {
    let dir = Scratch::new("external-oom");
    let path = external(&dir, "codeloc_memory_snapshot.pickle");
    let (code, v) = summary_json(&path, &["--fail-on", "oom"]);
    assert_eq!(code, Some(1), "{v}");
    let ooms = v["ooms"].as_array().unwrap();
    assert_eq!(ooms.len(), 1);
    assert_eq!(ooms[0]["device"], 1);
    let text = gpumem().arg("summary").arg(&path).output().unwrap();
    let text = String::from_utf8_lossy(&text.stdout);
    for d in ["cuda:0", "cuda:1", "cuda:2", "all devices", "== cuda:1 =="] {
        assert!(text.contains(d), "{d} missing:\n{text}");
    }
    // a device the file has nothing on names the flag and what the file holds
    let out = gpumem()
        .arg("summary")
        .arg(&path)
        .args(["--device", "5"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("--device") && err.contains("cuda:0, cuda:1, cuda:2"),
        "{err}"
    );
}

/// A snapshot whose memory is all on cuda:1 shows it, not zeros.
#[test]
fn issue15_memory_on_the_second_gpu_is_shown() {
    let dir = Scratch::new("external-cuda1");
    let path = external(&dir, "layoutedit_dump_snapshot.pickle");
    let (_, v) = summary_json(&path, &[]);
    let exp = external_expected();
    let want = u(&exp["layoutedit_dump_snapshot.pickle"]["all_devices"]["reserved"]);
    assert_eq!(u(&v["all_devices"]["reserved_bytes"]), want);
    assert!(want > 10 << 30);
}

/// Not a snapshot: refused with exit 2, saying what the file is not.
#[test]
fn issue15_a_pickle_that_is_not_a_snapshot_is_refused() {
    let dir = Scratch::new("external-not");
    let path = external(&dir, "mygpt_memory.pickle");
    let out = gpumem().arg("summary").arg(&path).output().unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("mygpt_memory.pickle") && err.contains("segments"),
        "{err}"
    );
}

/// Several files (one per rank): a row per file and device, and the spread across them.
#[test]
fn issue15_several_files_give_a_table_of_ranks() {
    let dir = Scratch::new("external-ranks");
    let names = [
        "selectn_1f2f54_snapshot.pickle",
        "selectn_04d383_snapshot.pickle",
        "codeloc_memory_snapshot.pickle",
    ];
    let paths: Vec<_> = names.iter().map(|n| external(&dir, n)).collect();
    let out = gpumem()
        .arg("summary")
        .args(&paths)
        .args(["--json", "--fail-on", "oom"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1), "the OOM on codeloc's cuda:1");
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    let rows = v["rows"].as_array().unwrap();
    assert_eq!(rows.len(), 5, "1 + 1 + 3 devices");
    let exp = external_expected();
    let mut reserved = Vec::new();
    for r in rows {
        let f = r["file"].as_str().unwrap();
        let name = std::path::Path::new(f)
            .file_name()
            .unwrap()
            .to_str()
            .unwrap();
        let dev = u(&r["device"]).to_string();
        let want = u(&exp[name]["per_device"][&dev]["reserved"]);
        assert_eq!(u(&r["state"]["reserved_bytes"]), want, "{name} cuda:{dev}");
        reserved.push(want);
    }
    let across = v["across_rows"].as_array().unwrap();
    let res = across.iter().find(|c| c["column"] == "reserved").unwrap();
    let (max, min) = (
        *reserved.iter().max().unwrap(),
        *reserved.iter().min().unwrap(),
    );
    assert_eq!((u(&res["max"]), u(&res["min"])), (max, min));
    assert_eq!(u(&res["spread"]), max - min);
    assert_eq!(reserved[u(&res["max_row"]) as usize], max);
    // the text table names each file and the spread
    let out = gpumem().arg("summary").args(&paths).output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("across ranks") && text.contains("spread"),
        "{text}"
    );
    assert!(text.contains("selectn_04d383_snapshot.pickle"), "{text}");
    // --capacity: the rows over it, highest first, and the first to run out (the highest peak)
    let peaks: Vec<u64> = rows.iter().map(|r| u(&r["peak_reserved_bytes"])).collect();
    let mut sorted = peaks.clone();
    sorted.sort_unstable();
    let cap = (sorted[sorted.len() / 2] >> 20) << 20;
    let out = gpumem()
        .arg("summary")
        .args(&paths)
        .args(["--json", "--capacity", &format!("{}MiB", cap >> 20)])
        .output()
        .unwrap();
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    let over: Vec<usize> = v["over_capacity"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| u(i) as usize)
        .collect();
    let want: Vec<usize> = (0..peaks.len()).filter(|&i| peaks[i] > cap).collect();
    assert_eq!(over.len(), want.len(), "{over:?} vs {want:?}");
    assert!(over.iter().all(|i| want.contains(i)));
    let first = u(&v["first_to_run_out"]) as usize;
    assert_eq!(peaks[first], *sorted.last().unwrap());
    // the answer comes first: the text opens with it, and -q prints only it (the JSON's line)
    let line = v["verdict"]["line"].as_str().unwrap().to_string();
    assert!(
        line.starts_with(&format!("{} of {} over", want.len(), peaks.len())),
        "{line}"
    );
    let cap_arg = format!("{}MiB", cap >> 20);
    let out = gpumem()
        .arg("summary")
        .args(&paths)
        .args(["--capacity", &cap_arg])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.starts_with(&format!("{} of {} over", want.len(), peaks.len())),
        "{text}"
    );
    let out = gpumem()
        .arg("summary")
        .args(&paths)
        .args(["-q", "--capacity", &cap_arg])
        .output()
        .unwrap();
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim_end(), line);
    // one snapshot has its own verdict: --capacity is refused naming itself
    let out = gpumem()
        .arg("summary")
        .arg(&paths[0])
        .args(["--capacity", "1GiB"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("--capacity"));
    // and what only one snapshot's report shows is refused with several, never ignored
    for flags in [
        &["--stacks"][..],
        &["--top", "5"],
        &["--by", "op"],
        &["--top", "3", "--json"],
    ] {
        let out = gpumem()
            .arg("summary")
            .args(&paths)
            .args(flags)
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{flags:?}: {err}");
        assert!(
            err.contains(flags[0]) && err.contains("give one file"),
            "{flags:?}: {err}"
        );
    }
}

/// The sites of a summary's `live_by_site`.
fn sites(v: &Value) -> Vec<String> {
    v["live_by_site"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["site"].as_str().unwrap().to_string())
        .collect()
}

/// PyTorch 2.0 kept each block's stack in its `history`, not in `frames`: they are read.
#[test]
fn issue15_pytorch_2_0_history_stacks_are_read() {
    let dir = Scratch::new("external-history");
    let path = external(&dir, "llminf_1.3b_snapshot.pickle");
    let (_, v) = summary_json(&path, &[]);
    let s = sites(&v);
    assert!(!s.is_empty());
    for site in &s {
        assert!(
            site.contains("pytorch_backend.py:") || site.contains("flex_opt.py:"),
            "{site}"
        );
    }
}

/// Windows paths: sites are shortened to the file's name, and the plot labels by site.
#[test]
fn issue15_windows_paths_make_short_sites_and_labelled_plots() {
    let dir = Scratch::new("external-windows");
    for name in ["decomfl_memory.pickle", "magma27_memory_snapshot.pickle"] {
        let path = external(&dir, name);
        let (_, v) = summary_json(&path, &[]);
        // blocks allocated before recording started have no frames
        for site in sites(&v)
            .into_iter()
            .filter(|s| s != "(no frames recorded)")
        {
            assert!(
                !site.contains('\\') && !site.contains(":\\"),
                "{name}: {site}"
            );
            assert!(site.contains(".py:"), "{name}: {site}");
        }
        let text = gpumem().arg("summary").arg(&path).output().unwrap();
        let text = String::from_utf8_lossy(&text.stdout);
        assert!(
            !text.contains("C:\\") && !text.contains("(C++ frames only)"),
            "{name}"
        );
        let svg = dir.path(&format!("{name}.svg"));
        let out = gpumem()
            .arg("plot")
            .arg(&path)
            .arg("-o")
            .arg(&svg)
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(0));
        let svg = std::fs::read_to_string(&svg).unwrap();
        assert!(
            !svg.contains("C++ frames only"),
            "{name}: the plot files sites as C++ frames only"
        );
        assert!(svg.contains(".py:"), "{name}: no site in the legend");
    }
}

/// Export keeps everything: every device, frames as frames, every key, no field added, and a
/// memory-viz file about the size of what it came from.
#[test]
fn issue15_exports_of_real_snapshots_lose_nothing() {
    let dir = Scratch::new("external-export");
    let exp = external_expected();
    for name in [
        "codeloc_memory_snapshot.pickle", // 3 devices, compile_context
        "magma27_memory_snapshot.pickle", // user_metadata, Windows paths
        "selectn_1f2f54_snapshot.pickle", // no time_us
    ] {
        let path = external(&dir, name);
        let original = std::fs::read(&path).unwrap();
        // memory-viz of a pickle is the pickle
        let viz = dir.path(&format!("{name}.viz.pickle"));
        export(&path, "memory-viz", &viz);
        assert_eq!(std::fs::read(&viz).unwrap(), original, "{name}");
        // torch-json keeps the document as it is
        let js = dir.path(&format!("{name}.json"));
        export(&path, "torch-json", &js);
        let doc: Value = serde_json::from_str(&std::fs::read_to_string(&js).unwrap()).unwrap();
        let traces = doc["device_traces"].as_array().unwrap();
        let entries: Vec<&Value> = traces.iter().flat_map(|t| t.as_array().unwrap()).collect();
        let frames: Vec<&Value> = entries
            .iter()
            .flat_map(|e| e["frames"].as_array().into_iter().flatten())
            .collect();
        assert!(!frames.is_empty(), "{name}");
        for f in &frames {
            assert_ne!(f["filename"], "gpumem", "{name}: {f}");
            assert!(f["line"].as_i64().is_some(), "{name}: {f}");
        }
        if name.starts_with("selectn") {
            assert!(
                entries.iter().all(|e| e.get("time_us").is_none()),
                "{name}: time_us invented"
            );
        }
        if name.starts_with("magma27") {
            assert!(
                entries.iter().any(|e| e.get("user_metadata").is_some()),
                "{name}"
            );
        }
        if name.starts_with("codeloc") {
            assert!(
                entries.iter().any(|e| e.get("compile_context").is_some()),
                "{name}"
            );
            assert!(doc.get("allocator_settings").is_some());
        }
        // and back to memory-viz: the same figures on every device, within 1.2x the size
        let back = dir.path(&format!("{name}.back.pickle"));
        export(&js, "memory-viz", &back);
        let size = std::fs::metadata(&back).unwrap().len() as f64;
        assert!(size <= 1.2 * original.len() as f64, "{name}: {size} bytes");
        let (_, v) = summary_json(&back, &[]);
        for d in v["per_device"].as_array().unwrap() {
            let dev = u(&d["device"]).to_string();
            assert_eq!(
                u(&d["reserved_bytes"]),
                u(&exp[name]["per_device"][&dev]["reserved"]),
                "{name} cuda:{dev}"
            );
        }
    }
    // Perfetto: a process per device, no copy of the snapshot inside
    let path = external(&dir, "codeloc_memory_snapshot.pickle");
    let pf = dir.path("p.json");
    export(&path, "perfetto", &pf);
    let v: Value = serde_json::from_str(&std::fs::read_to_string(&pf).unwrap()).unwrap();
    assert!(v["otherData"].get("gpumem_snapshot").is_none());
    let procs: Vec<&Value> = v["traceEvents"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["name"] == "process_name")
        .collect();
    assert_eq!(procs.len(), 3);
}

/// diff, plot and replay show one device of a multi-GPU snapshot: they say which, and
/// `--device` picks another.
#[test]
fn issue15_one_device_commands_say_which_device_they_show() {
    let dir = Scratch::new("external-onedev");
    let path = external(&dir, "codeloc_memory_snapshot.pickle");
    let svg = dir.path("p.svg");
    let run = |args: &[&str]| {
        let o = gpumem().args(args).output().unwrap();
        (
            o.status.code(),
            String::from_utf8_lossy(&o.stdout).into_owned(),
        )
    };
    let p = path.to_str().unwrap();
    let (code, text) = run(&["plot", p, "-o", svg.to_str().unwrap(), "--device", "2"]);
    assert_eq!(code, Some(0), "{text}");
    assert!(
        text.contains("showing cuda:2 of cuda:0, cuda:1, cuda:2"),
        "{text}"
    );
    let (_, text) = run(&["diff", p, p, "--device", "1"]);
    assert!(text.contains("showing cuda:1 of"), "{text}");
    let (_, text) = run(&["replay", p, "--capacity", "139GiB", "--device", "1"]);
    assert!(text.contains("showing cuda:1 of"), "{text}");
    let (_, text) = run(&[
        "replay",
        p,
        "--capacity",
        "139GiB",
        "--device",
        "1",
        "--json",
    ]);
    let v: Value = serde_json::from_str(&text).unwrap();
    assert_eq!(v["device"], 1);
    let (code, _) = run(&["diff", p, p, "--device", "7"]);
    assert_eq!(code, Some(2));
    // without --device, replay answers for the device that ran out (cuda:1), not the one
    // with the longest trace
    let (_, text) = run(&["replay", p, "--alloc-conf", "expandable_segments:True"]);
    assert!(text.contains("showing cuda:1 of"), "{text}");
    assert!(!text.contains("no out-of-memory either way"), "{text}");
}

/// A trace recorded from after its first `zero_grad` has no iteration 0: `summary` counts the
/// iterations that allocated, as `plot` marks them (it said 2 where the plot showed 1).
#[test]
fn summary_and_plot_count_the_same_iterations() {
    let dir = Scratch::new("iterations-agree");
    let path = external(&dir, "kkaitlyn_memory_ctx128_fullstep.pickle");
    let (_, v) = summary_json(&path, &[]);
    assert_eq!(v["iterations_from"], "annotations");
    let n = u(&v["trace"]["iterations"]);
    let svg = dir.path("k.svg");
    let o = gpumem()
        .args(["plot", path.to_str().unwrap(), "-o", svg.to_str().unwrap()])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&o.stdout);
    let want = if n == 1 {
        "1 iteration,".to_string()
    } else {
        format!("{n} iterations,")
    };
    assert!(text.contains(&want), "summary {n}: {text}");
    assert_eq!(n, 1);
}

/// `replay --capacity` below what the run needs: the recorded settings run out at that
/// capacity too, so a setting is not blamed for the errors (it was: "this setting causes 44
/// out-of-memory errors" against the recording's none on its own device).
#[test]
fn replay_at_a_smaller_capacity_judges_a_setting_against_the_recorded_settings() {
    let dir = Scratch::new("replay-capacity");
    let path = external(&dir, "kkaitlyn_memory_ctx128_fullstep.pickle");
    let replay = |json: bool| {
        let mut args = vec![
            "replay",
            path.to_str().unwrap(),
            "--alloc-conf",
            "expandable_segments:True",
            "--capacity",
            "50GiB",
        ];
        if json {
            args.push("--json");
        }
        gpumem().args(args).output().unwrap().stdout
    };
    let text = String::from_utf8_lossy(&replay(false)).into_owned();
    let verdict = text.lines().find(|l| l.starts_with("verdict:")).unwrap();
    assert!(
        verdict.starts_with("verdict: no: at 50.00 GiB the recorded settings run out too"),
        "{verdict}"
    );
    let v: Value = serde_json::from_slice(&replay(true)).unwrap();
    assert!(v["recorded_settings_ooms"].as_u64().unwrap() > 0, "{v}");
}

/// Finding 6: entries are numbered as in the file (PyTorch's viewer numbers them so), counting
/// the `snapshot` markers gpumem skips: eornn has one before its peak, at entry 582.
#[test]
fn issue15_entry_numbers_count_skipped_markers() {
    let dir = Scratch::new("entries");
    let p = external(&dir, "eornn_snapshot.pickle");
    let (_, v) = summary_json(&p, &[]);
    let t = &v["trace"];
    assert_eq!(u(&t["peak_event"]), 758, "{t}");
    assert_eq!(
        u(&t["peak_entry"]),
        759,
        "one marker (entry 582) comes before"
    );
    let text = gpumem().arg("summary").arg(&p).output().unwrap();
    assert!(String::from_utf8_lossy(&text.stdout).contains("at entry 759"));
}

/// Finding 6: a `free_completed` with no `free_requested` before it (the request fell before
/// the trace began) frees its block: llminf_1.3b's only trace entry is one.
#[test]
fn issue15_a_lone_free_completed_is_a_free() {
    let dir = Scratch::new("lone-free");
    let p = external(&dir, "llminf_1.3b_snapshot.pickle");
    let (_, v) = summary_json(&p, &[]);
    let t = &v["trace"];
    assert_eq!(u(&t["frees"]), 1, "{t}");
    // the block it frees was allocated when the trace started, and is not at the end
    assert_eq!(
        u(&t["allocated_at_start"]),
        u(&v["allocated_bytes"]) + 2_224_128,
        "{t}"
    );
}

/// Finding 6: `plot` shows what `summary` says: the same peak (the band of what was allocated
/// before the trace shrinks as the trace frees it); a snapshot without a trace is said to have
/// none, with what it holds, never "peak 0 B"; legend labels fit the picture.
#[test]
fn issue15_plot_agrees_with_summary_and_fits() {
    let dir = Scratch::new("plot-agrees");
    let p = external(&dir, "magma27_memory_snapshot.pickle");
    let (_, v) = summary_json(&p, &[]);
    let peak = gpumem::units::format_bytes(u(&v["trace"]["peak_allocated_bytes"]));
    let svg = dir.path("m.svg");
    let out = gpumem()
        .arg("plot")
        .arg(&p)
        .arg("-o")
        .arg(&svg)
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(
        said.contains(&format!("peak {peak}")),
        "summary's {peak}: {said}"
    );
    // legend labels: each fits between the legend's x and the picture's right edge
    let text = std::fs::read_to_string(&svg).unwrap();
    let legend = &text[text.find("id=\"legend\"").unwrap()..];
    for (x, label) in svg_texts(legend) {
        let est = (label.chars().count() as f64 * 16.0 / 1.24 * 0.7) as i32;
        assert!(
            x + est <= 1200,
            "legend label '{label}' at x {x} runs off the picture"
        );
    }
    // no trace: a message with the state, not "peak 0 B"
    let bare = external(&dir, "kkaitlyn_memory_snapshot.pickle");
    let out = gpumem()
        .arg("plot")
        .arg(&bare)
        .arg("-o")
        .arg(&svg)
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(0));
    assert!(!said.contains("peak 0 B"), "{said}");
    assert!(
        said.contains("no allocation in the trace") && said.contains("allocated"),
        "{said}"
    );
    assert!(std::fs::read_to_string(&svg)
        .unwrap()
        .contains("no allocation in the trace"));
}

/// (x, text) of each <text> element of an SVG fragment, entities decoded.
fn svg_texts(svg: &str) -> Vec<(i32, String)> {
    let mut out = Vec::new();
    let mut rest = svg;
    while let Some(i) = rest.find("<text") {
        rest = &rest[i..];
        let x = rest
            .split("x=\"")
            .nth(1)
            .and_then(|s| s.split('"').next())
            .and_then(|s| s.parse::<f64>().ok())
            .unwrap_or(0.0) as i32;
        let body_start = rest.find('>').unwrap() + 1;
        let body_end = rest.find("</text>").unwrap();
        let body = rest[body_start..body_end]
            .trim()
            .replace("&lt;", "<")
            .replace("&gt;", ">")
            .replace("&amp;", "&");
        out.push((x, body));
        rest = &rest[body_end + 7..];
    }
    out
}

/// A block freed by the program but still used by a stream (`active_pending_free`, as in a
/// verl snapshot checked for this issue) is active, not allocated: the fragmentation line's
/// allocated and internal slack leave it out, as the state table does.
#[test]
fn issue15_pending_free_blocks_are_not_allocated() {
    let dir = Scratch::new("pending");
    let mib = 1u64 << 20;
    let doc = serde_json::json!({
        "segments": [{
            "device": 0, "address": 1u64 << 32, "total_size": 4 * mib, "stream": 0,
            "segment_type": "large", "allocated_size": 2 * mib, "active_size": 3 * mib,
            "requested_size": 2 * mib - 100,
            "blocks": [
                {"address": 1u64 << 32, "size": 2 * mib, "requested_size": 2 * mib - 100,
                 "state": "active_allocated"},
                {"address": (1u64 << 32) + 2 * mib, "size": mib, "requested_size": 1000,
                 "state": "active_pending_free"},
                {"address": (1u64 << 32) + 3 * mib, "size": mib, "requested_size": 0,
                 "state": "inactive"},
            ],
        }],
        "device_traces": [[]],
    });
    let p = dir.path("pending.json");
    std::fs::write(&p, doc.to_string()).unwrap();
    let (code, v) = summary_json(&p, &[]);
    assert_eq!(code, Some(0));
    assert_eq!(u(&v["allocated_bytes"]), 2 * mib);
    assert_eq!(u(&v["active_bytes"]), 3 * mib);
    let f = &v["fragmentation"];
    assert_eq!(u(&f["allocated"]), 2 * mib, "{f}");
    assert_eq!(u(&f["internal"]), 100, "{f}");
}

/// A snapshot without a trace has no peak, but what it holds reserved is a floor of one: with
/// `--capacity`, a rank over it that way is over (and may run out first), said as the
/// snapshot's figure, never left out.
#[test]
fn a_rank_without_a_trace_counts_by_what_its_snapshot_holds() {
    let dir = Scratch::new("external-no-trace-rank");
    let a = external(&dir, "kkaitlyn_memory_snapshot.pickle");
    let b = external(&dir, "kkaitlyn_memory_ctx128_fullstep.pickle");
    let out = gpumem()
        .arg("summary")
        .args([&a, &b])
        .args(["--json", "--capacity", "60GiB"])
        .output()
        .unwrap();
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    // #0 holds 70.69 GiB reserved and has no trace; #1 peaks at 56.91 GiB
    assert_eq!(v["over_capacity"], serde_json::json!([0]), "{v}");
    assert_eq!(v["first_to_run_out"], 0);
    let line = v["verdict"]["line"].as_str().unwrap();
    assert!(
        line.starts_with("1 of 2 over 60.00 GiB in reserved memory: #0")
            && line.contains("70.69 GiB held in the snapshot; no trace"),
        "{line}"
    );
}
