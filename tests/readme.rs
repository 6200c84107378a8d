//! Issue 15 (the first hour): every command README.md shows is run, as written, and must do
//! what the README says.
//!
//! - ```sh blocks: each line is a shell command (`gpumem ...`, with `&&` chains and
//!   environment assignments), run by `sh -c` in a scratch folder that links `fixtures/`, with
//!   the built `gpumem` first on PATH. It must exit 0, or the code its comment names
//!   (`# exit 1: ...`). `cargo run --release -- ARGS` runs as `gpumem ARGS`; `cargo test` and
//!   `cargo install` are what CI itself runs, so they are left out.
//! - ```text blocks right after `<!-- output of: COMMAND -->`: COMMAND's output holds every line
//!   of the block (spaces collapsed; `...` lines stand for what is left out).
//! - ```toml blocks that are whole workloads (a `[train]` table or a `body`): each runs with
//!   `gpumem run` on the default device and must not run out of memory (a `hf_config =
//!   "config.json"` gets a real config of the fixtures under that name).

mod common;

use std::process::Command;

use common::{root, Scratch};

struct Block {
    lang: String,
    text: String,
    /// The `<!-- output of: ... -->` marker just before the block, if any.
    output_of: Option<String>,
    line: usize,
}

fn blocks(readme: &str) -> Vec<Block> {
    let mut out = Vec::new();
    let lines: Vec<&str> = readme.lines().collect();
    let mut i = 0;
    while i < lines.len() {
        if let Some(lang) = lines[i].strip_prefix("```") {
            let start = i;
            let mut text = String::new();
            i += 1;
            while i < lines.len() && !lines[i].starts_with("```") {
                text.push_str(lines[i]);
                text.push('\n');
                i += 1;
            }
            let output_of = lines[..start]
                .iter()
                .rev()
                .find(|l| !l.trim().is_empty())
                .and_then(|l| l.trim().strip_prefix("<!-- output of:"))
                .and_then(|l| l.strip_suffix("-->"))
                .map(|c| c.trim().to_string());
            out.push(Block {
                lang: lang.trim().to_string(),
                text,
                output_of,
                line: start + 1,
            });
        }
        i += 1;
    }
    out
}

/// A scratch folder with `fixtures/` linked in, where README commands run.
fn workspace(name: &str) -> Scratch {
    let dir = Scratch::new(name);
    std::os::unix::fs::symlink(root().join("fixtures"), dir.path("fixtures")).unwrap();
    std::fs::copy(
        root().join("fixtures/hf/cases/llama_t.config.json"),
        dir.path("config.json"),
    )
    .unwrap();
    dir
}

fn shell(dir: &Scratch, command: &str) -> std::process::Output {
    let bin = std::path::PathBuf::from(assert_cmd::cargo::cargo_bin!("gpumem"));
    let path = format!(
        "{}:{}",
        bin.parent().unwrap().display(),
        std::env::var("PATH").unwrap_or_default()
    );
    Command::new("sh")
        .arg("-c")
        .arg(command)
        .current_dir(&dir.0)
        .env("PATH", path)
        .env_remove("PYTORCH_CUDA_ALLOC_CONF")
        .env_remove("PYTORCH_ALLOC_CONF")
        .env_remove("COLUMNS")
        .env_remove("GITHUB_ACTIONS")
        .output()
        .unwrap()
}

/// The command of a README line and the exit code its comment promises.
fn command_of(line: &str) -> Option<(String, i32)> {
    let line = line.trim();
    if line.is_empty() || line.starts_with('#') {
        return None;
    }
    let (cmd, comment) = match line.find("  #") {
        Some(i) => (line[..i].trim(), line[i..].trim()),
        None => (line, ""),
    };
    let cmd = match cmd.strip_prefix("cargo run --release -- ") {
        Some(rest) => format!("gpumem {rest}"),
        None if cmd.starts_with("cargo ") => return None,
        None => cmd.to_string(),
    };
    let code = comment
        .split("exit ")
        .nth(1)
        .and_then(|r| r.chars().next())
        .and_then(|c| c.to_digit(10))
        .filter(|_| comment.contains("# exit "))
        .map(|d| d as i32)
        .unwrap_or(0);
    Some((cmd, code))
}

fn squash(s: &str) -> String {
    s.split_whitespace().collect::<Vec<_>>().join(" ")
}

#[test]
fn issue15_every_readme_command_runs_as_written() {
    let readme = std::fs::read_to_string(root().join("README.md")).unwrap();
    let dir = workspace("readme-sh");
    let mut ran = 0;
    let mut failures = Vec::new();
    for b in blocks(&readme).iter().filter(|b| b.lang == "sh") {
        for (k, line) in b.text.lines().enumerate() {
            let Some((cmd, want)) = command_of(line) else {
                continue;
            };
            let out = shell(&dir, &cmd);
            ran += 1;
            if out.status.code() != Some(want) {
                failures.push(format!(
                    "README.md line {}: `{cmd}` exited {:?}, the README says {want}:\n{}{}",
                    b.line + 1 + k,
                    out.status.code(),
                    String::from_utf8_lossy(&out.stdout)
                        .lines()
                        .take(10)
                        .collect::<Vec<_>>()
                        .join("\n"),
                    String::from_utf8_lossy(&out.stderr)
                ));
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
    assert!(ran >= 30, "only {ran} README commands found");
}

#[test]
fn issue15_readme_outputs_are_what_the_commands_print() {
    let readme = std::fs::read_to_string(root().join("README.md")).unwrap();
    let dir = workspace("readme-out");
    let mut checked = 0;
    for b in blocks(&readme) {
        let Some(cmd) = &b.output_of else { continue };
        let out = shell(&dir, cmd);
        let got = squash(&String::from_utf8_lossy(&out.stdout));
        for l in b
            .text
            .lines()
            .filter(|l| l.trim() != "..." && !l.trim().is_empty())
        {
            assert!(
                got.contains(&squash(l)),
                "README.md block at line {}: `{cmd}` no longer prints\n{l}\nit printed:\n{}",
                b.line,
                String::from_utf8_lossy(&out.stdout)
            );
        }
        checked += 1;
    }
    assert!(checked >= 2, "only {checked} README outputs are marked");
}

#[test]
fn issue15_readme_workloads_run_without_running_out() {
    let readme = std::fs::read_to_string(root().join("README.md")).unwrap();
    let dir = workspace("readme-toml");
    let mut ran = 0;
    for b in blocks(&readme).iter().filter(|b| b.lang == "toml") {
        if !(b.text.contains("[train]") || b.text.contains("body =")) {
            continue;
        }
        let name = format!("readme_{}.toml", b.line);
        std::fs::write(dir.path(&name), &b.text).unwrap();
        let out = shell(&dir, &format!("gpumem run {name}"));
        let text = String::from_utf8_lossy(&out.stdout);
        assert_eq!(
            out.status.code(),
            Some(0),
            "README.md workload at line {}: {}",
            b.line,
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(
            !text.contains("out of memory at line"),
            "README.md workload at line {} runs out of memory on the default device:\n{text}",
            b.line
        );
        ran += 1;
    }
    assert!(ran >= 3, "only {ran} README workloads found");
}
