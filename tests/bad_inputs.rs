//! Issue 16: the bad-input corpus (fixtures/bad/corpus/, written by
//! scripts/make_bad_corpus.py). Every case runs from the repository root and must exit as its
//! manifest says, with a message that names what to fix, within 20 s. Cases marked `pending`
//! are gpumem's known gaps: they are listed, not run, and a pending case that starts passing
//! fails the test so that its mark is removed.

mod common;

use std::time::{Duration, Instant};

use common::{root, Scratch};
use serde_json::Value;

/// Runs one case: its exit code (None: killed past the limit) and its stderr.
fn run(case: &Value, tmp: &std::path::Path) -> (Option<i32>, String) {
    let args: Vec<String> = case["args"]
        .as_array()
        .expect("args")
        .iter()
        .map(|a| a.as_str().unwrap().replace("$TMP", tmp.to_str().unwrap()))
        .collect();
    let mut cmd = std::process::Command::new(assert_cmd::cargo::cargo_bin!("gpumem"));
    cmd.current_dir(root())
        .args(&args)
        .env_remove("PYTORCH_CUDA_ALLOC_CONF")
        .env_remove("PYTORCH_ALLOC_CONF")
        .env_remove("GPUMEM_THREADS")
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped());
    if let Some(env) = case["env"].as_object() {
        for (k, v) in env {
            cmd.env(k, v.as_str().unwrap());
        }
    }
    let mut child = cmd.spawn().unwrap();
    let mut err = child.stderr.take().unwrap();
    let reader = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = std::io::Read::read_to_string(&mut err, &mut s);
        s
    });
    let start = Instant::now();
    let code = loop {
        if let Some(st) = child.try_wait().unwrap() {
            break st.code();
        }
        if start.elapsed() > Duration::from_secs(20) {
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(5));
    };
    (code, reader.join().unwrap())
}

#[test]
fn every_bad_input_of_the_corpus_is_refused_by_name() {
    let manifest: Value = serde_json::from_str(
        &std::fs::read_to_string(root().join("fixtures/bad/corpus/manifest.json")).unwrap(),
    )
    .unwrap();
    let cases = manifest.as_array().unwrap();
    assert!(cases.len() >= 150, "{} cases", cases.len());
    let mut failures = Vec::new();
    let mut pending = Vec::new();
    for case in cases {
        let name = case["name"].as_str().unwrap();
        let tmp = Scratch::new(&format!("bad-{name}"));
        let (code, err) = run(case, &tmp.0);
        let want = case["exit"].as_i64().map(|c| c as i32);
        let contains = case["stderr_contains"].as_str().unwrap();
        let ok = code == want && err.contains(contains) && !err.contains("panicked");
        match (case["pending"].as_str(), ok) {
            (Some(why), false) => pending.push(format!("{name}: {why}")),
            (Some(_), true) => failures.push(format!("{name}: passes now: remove its pending mark")),
            (None, true) => {}
            (None, false) => failures.push(format!(
                "{name} {:?}: exit {code:?} (want {want:?}), stderr {:?} (want it to contain {contains:?})",
                case["args"],
                err.lines().next().unwrap_or("")
            )),
        }
    }
    eprintln!(
        "{} cases; pending ({}):\n  {}",
        cases.len(),
        pending.len(),
        pending.join("\n  ")
    );
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}
