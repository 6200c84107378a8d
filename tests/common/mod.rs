//! What the integration tests of issues 5 and 6 share: the executable, the repository root, a
//! scratch directory, and `gpumem ... --json` read back.

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
