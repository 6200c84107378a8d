//! What the integration tests share: the executable, the repository root, a scratch
//! directory, `gpumem ... --json` read back, and a workload's allocator events as the model
//! comparisons read them.

#![allow(dead_code)]

use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};

use assert_cmd::Command;
use serde_json::Value;

pub fn gpumem() -> Command {
    Command::new(assert_cmd::cargo::cargo_bin!("gpumem"))
}

pub fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// A scratch directory for one test, removed afterwards.
pub struct Scratch(pub PathBuf);

impl Scratch {
    pub fn new(test: &str) -> Scratch {
        static N: AtomicUsize = AtomicUsize::new(0);
        let dir = std::env::temp_dir().join(format!(
            "gpumem-test-{test}-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        ));
        std::fs::create_dir_all(&dir).unwrap();
        Scratch(dir)
    }

    pub fn path(&self, name: &str) -> PathBuf {
        self.0.join(name)
    }

    pub fn write(&self, name: &str, text: &str) -> PathBuf {
        let p = self.path(name);
        std::fs::write(&p, text).unwrap();
        p
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// `gpumem ARGS --json` in the repository root: exit code and the JSON.
/// `gpumem ARGS` run in the repository root (fixture paths are relative to it).
pub fn at_root(args: &[&str]) -> std::process::Output {
    gpumem().current_dir(root()).args(args).output().unwrap()
}

pub fn run_json(args: &[&str]) -> (Option<i32>, Value) {
    let mut with_json = args.to_vec();
    with_json.push("--json");
    let out = at_root(&with_json);
    let text = String::from_utf8_lossy(&out.stdout);
    let v = serde_json::from_str(&text).unwrap_or_else(|e| {
        panic!(
            "gpumem {args:?}: not JSON ({e}): {text}{}",
            String::from_utf8_lossy(&out.stderr)
        )
    });
    (out.status.code(), v)
}

pub fn u(v: &Value) -> u64 {
    v.as_u64().unwrap_or_else(|| panic!("not an integer: {v}"))
}

/// gpumem's trace of a workload after its setup (PyTorch's traces start after the model is
/// built), as tests compare it with `scripts/hf_events.py`'s extracts: ["a", size] per
/// allocation and ["f", ordinal of the allocation it releases] per free.
pub fn allocator_events(workload: &str) -> Vec<(String, i64)> {
    let v = run_snapshot(&["run", workload]);
    let stacks = v["stacks"].as_array().unwrap();
    let (mut live, mut n, mut out) = (std::collections::HashMap::new(), 0i64, Vec::new());
    for e in v["trace"]["events"].as_array().unwrap() {
        let first = e["stack"]
            .as_u64()
            .and_then(|k| stacks[k as usize].as_array())
            .and_then(|t| t.first())
            .and_then(Value::as_str);
        if first == Some("setup") {
            continue;
        }
        match e["action"].as_str().unwrap() {
            "alloc" => {
                live.insert(u(&e["addr"]), n);
                out.push(("a".to_string(), u(&e["size"]) as i64));
                n += 1;
            }
            "free_completed" => out.push(("f".into(), live.remove(&u(&e["addr"])).unwrap_or(-1))),
            _ => {}
        }
    }
    out
}

/// Runs gpumem with `args` (a `run`) and `--snapshot`, which must succeed; the snapshot
/// gpumem wrote.
pub fn run_snapshot(args: &[&str]) -> Value {
    let s = Scratch::new("snapshot");
    let snap = s.path("snap.json");
    let mut all = args.to_vec();
    all.extend(["--snapshot", snap.to_str().unwrap()]);
    let out = at_root(&all);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_str(&std::fs::read_to_string(&snap).unwrap()).unwrap()
}

/// Runs gpumem with `args`, which it must refuse: exit 2 with `want` in the message (returned).
pub fn refused(args: &[&str], want: &str) -> String {
    let out = at_root(args);
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
    assert!(err.contains(want), "{args:?}: {err}");
    err
}

/// A real snapshot of fixtures/external (xz-compressed there), unpacked into `dir`.
pub fn external(dir: &Scratch, name: &str) -> PathBuf {
    let packed = root().join(format!("fixtures/external/{name}.xz"));
    let mut input = std::io::BufReader::new(std::fs::File::open(&packed).unwrap());
    let mut bytes = Vec::new();
    lzma_rs::xz_decompress(&mut input, &mut bytes).unwrap();
    let p = dir.path(name);
    std::fs::write(&p, bytes).unwrap();
    p
}

/// A recorded event list (`[["a", size], ["f", ordinal], ...]`) stored xz-compressed as
/// `path.xz` (fixtures/hf2/traces keeps them so: the carried tree stays small).
pub fn recorded_events(path: &std::path::Path) -> Vec<(String, i64)> {
    let mut packed = path.as_os_str().to_owned();
    packed.push(".xz");
    let mut input = std::io::BufReader::new(
        std::fs::File::open(&packed).unwrap_or_else(|e| panic!("{packed:?}: {e}")),
    );
    let mut bytes = Vec::new();
    lzma_rs::xz_decompress(&mut input, &mut bytes).unwrap();
    serde_json::from_slice(&bytes).unwrap()
}

/// fixtures/external/expected.json: per file, each device's figures as Python computed them.
pub fn external_expected() -> Value {
    let p = root().join("fixtures/external/expected.json");
    serde_json::from_str(&std::fs::read_to_string(p).unwrap()).unwrap()
}

/// `gpumem export INPUT --to FORMAT -o OUT` in the repository root, which must succeed.
pub fn export(input: &std::path::Path, to: &str, out: &std::path::Path) {
    let o = gpumem()
        .current_dir(root())
        .arg("export")
        .arg(input)
        .args(["--to", to, "-o"])
        .arg(out)
        .output()
        .unwrap();
    assert_eq!(
        o.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
}

/// A recorded Hugging Face case (`DIR/cases/hf_NAME.json`, hf_models.py's or
/// hf_families.py's output) against `gpumem run DIR/workloads/WORKLOAD.toml --json`: the
/// fields that differ per iteration (gpumem minus PyTorch), the worst relative error of the
/// allocated fields, and of the reserved ones beyond 2 MiB (the bound: 1% or 2 MiB).
pub fn case_differences(
    dir: &str,
    workload: &str,
    name: &str,
    fields: &[&'static str],
) -> (Vec<(u64, &'static str, i64)>, f64, f64) {
    case_differences_in(dir, "cases", workload, name, fields)
}

/// [`case_differences`] with the case's figures in `{dir}/{cases}/` (`recorded` for the
/// cases kept beside their snapshots).
pub fn case_differences_in(
    dir: &str,
    cases: &str,
    workload: &str,
    name: &str,
    fields: &[&'static str],
) -> (Vec<(u64, &'static str, i64)>, f64, f64) {
    let path = format!("{dir}/workloads/{workload}.toml");
    let (code, g) = run_json(&["run", &path]);
    assert_eq!(code, Some(0), "{path}: {g}");
    let p = root().join(format!("{dir}/{cases}/hf_{name}.json"));
    let doc: Value = serde_json::from_str(&std::fs::read_to_string(p).unwrap()).unwrap();
    let t = &doc["cases"][0];
    let (gi, ti) = (
        g["iterations"].as_array().unwrap(),
        t["iterations"].as_array().unwrap(),
    );
    assert_eq!(gi.len(), ti.len(), "{name}: iterations");
    let mut diffs = Vec::new();
    let (mut alloc, mut reserved) = (0f64, 0f64);
    for (k, (a, b)) in gi.iter().zip(ti).enumerate() {
        for &f in fields {
            // a no-grad case records no backward or step
            if b.get(f).is_none() {
                continue;
            }
            let (x, y) = (u(&a[f]) as i64, u(&b[f]) as i64);
            if x != y {
                diffs.push((k as u64, f, x - y));
            }
            let off = (x - y).unsigned_abs() as f64;
            if f.contains("reserved") {
                reserved = reserved.max((off - (2 << 20) as f64).max(0.0) / y.max(1) as f64);
            } else {
                alloc = alloc.max(off / y.max(1) as f64);
            }
        }
    }
    (diffs, alloc, reserved)
}

/// The Llama-3.1-8B config of issue 37's question.
pub const LLAMA_8B: &str = "fixtures/hf/configs/llama-3.1-8b.config.json";

/// The user's question, as typed: a LoRA fine-tune of Llama-3.1-8B in bf16 on a 24 GiB card.
pub const QUESTION: &[&str] = &[
    "--batch",
    "1",
    "--seq",
    "2048",
    "--dtype",
    "bf16",
    "--lora-r",
    "16",
    "--capacity",
    "24GiB",
];

/// `cmd` on the Llama-3.1-8B config with the question's flags, then `extra`.
pub fn args<'a>(cmd: &'a str, extra: &[&'a str]) -> Vec<&'a str> {
    let mut a = vec![cmd, LLAMA_8B];
    a.extend_from_slice(QUESTION);
    a.extend_from_slice(extra);
    a
}

/// A published config of fixtures/hf/configs by its name.
pub fn config(name: &str) -> String {
    format!("fixtures/hf/configs/{name}.config.json")
}
