//! Issue 15, findings 9 and 10: the conventions of a command-line tool. `gpumem help CMD`,
//! shell completions, logs through `-v`/`RUST_LOG`, colour only where wanted, tables that fit
//! the terminal, `PYTORCH_CUDA_ALLOC_CONF` honoured as PyTorch does, budget-only checks,
//! located errors, help text that is each command's own, JUnit XML from quick-junit.

mod common;

use common::{at_root, external, gpumem, root, Scratch};

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// `gpumem help run` is `gpumem run --help`; every subcommand has its page.
#[test]
fn issue15_help_subcommand() {
    for cmd in ["run", "summary", "check", "completions"] {
        let a = gpumem().args(["help", cmd]).output().unwrap();
        let b = gpumem().args([cmd, "--help"]).output().unwrap();
        assert_eq!(a.status.code(), Some(0), "gpumem help {cmd}");
        assert_eq!(text(&a.stdout), text(&b.stdout), "gpumem help {cmd}");
    }
}

/// Completion scripts for bash, zsh and fish name every subcommand and the flags of `run`.
#[test]
fn issue15_completions_for_three_shells() {
    for (shell, marker) in [
        ("bash", "_gpumem()"),
        ("zsh", "#compdef gpumem"),
        ("fish", "complete -c gpumem"),
    ] {
        let out = gpumem().args(["completions", shell]).output().unwrap();
        assert_eq!(out.status.code(), Some(0), "{shell}");
        let s = text(&out.stdout);
        assert!(s.contains(marker), "{shell}: {}", &s[..s.len().min(300)]);
        for word in [
            "summary",
            "replay",
            "compare-torch",
            "alloc-conf",
            "fail-on",
        ] {
            assert!(s.contains(word), "{shell} completion lacks {word}");
        }
        // the committed copy is the same script
        let name = match shell {
            "bash" => "gpumem.bash",
            "zsh" => "_gpumem",
            _ => "gpumem.fish",
        };
        let committed = std::fs::read(root().join("man/completions").join(name)).unwrap();
        assert!(
            committed == out.stdout,
            "man/completions/{name} is stale: GPUMEM_BLESS=1 cargo test --test cli man_pages"
        );
    }
    let bad = gpumem().args(["completions", "tcsh"]).output().unwrap();
    assert_eq!(bad.status.code(), Some(2));
}

/// -v logs what the runner and the allocator do (debug), -vv each statement (trace), RUST_LOG
/// picks targets and beats -v; the report on stdout is the same either way; a bad RUST_LOG is
/// a usage error naming it.
#[test]
fn issue15_logging_through_tracing() {
    let w = "fixtures/workloads/presets/mlp_sgd.toml";
    let quiet = at_root(&["run", w]);
    assert!(quiet.stderr.is_empty(), "{}", text(&quiet.stderr));
    let v = gpumem()
        .current_dir(root())
        .env_remove("RUST_LOG")
        .args(["-v", "run", w])
        .output()
        .unwrap();
    let err = text(&v.stderr);
    assert_eq!(v.stdout, quiet.stdout, "logging must not change the report");
    assert!(
        err.contains("DEBUG gpumem::runner: running workload=mlp_sgd"),
        "{err}"
    );
    assert!(err.contains("segment allocated (cudaMalloc)"), "{err}");
    assert!(err.contains("iteration done"), "{err}");
    assert!(!err.contains("TRACE"), "{err}");
    let vv = gpumem()
        .current_dir(root())
        .env_remove("RUST_LOG")
        .args(["-vv", "run", w])
        .output()
        .unwrap();
    assert!(text(&vv.stderr).contains("TRACE gpumem::runner: statement"));
    // RUST_LOG: only the snapshot reader
    let r = gpumem()
        .current_dir(root())
        .env("RUST_LOG", "gpumem::snapshot=debug")
        .args(["summary", "fixtures/snapshots/snapshot_mlp_adam.pickle"])
        .output()
        .unwrap();
    let err = text(&r.stderr);
    assert!(
        err.contains("snapshot read") && err.contains("segments=49"),
        "{err}"
    );
    assert!(!err.contains("gpumem::alloc"), "{err}");
    let bad = gpumem()
        .current_dir(root())
        .env("RUST_LOG", "gpumem=loud")
        .args(["summary", "fixtures/snapshots/snapshot_mlp_adam.pickle"])
        .output()
        .unwrap();
    assert_eq!(bad.status.code(), Some(2));
    assert!(text(&bad.stderr).contains("RUST_LOG"));
}

/// No colour when the output is not a terminal or NO_COLOR is set; `--color always` colours
/// anyway, `--color never` never.
#[test]
fn issue15_colour_only_where_wanted() {
    let w = "fixtures/workloads/presets/mlp_sgd.toml";
    let esc = |o: &std::process::Output| o.stdout.contains(&0x1b);
    let run = |args: &[&str], no_color: bool| {
        let mut c = gpumem();
        c.current_dir(root()).env_remove("CLICOLOR_FORCE");
        if no_color {
            c.env("NO_COLOR", "1");
        } else {
            c.env_remove("NO_COLOR");
        }
        c.args(args).output().unwrap()
    };
    assert!(!esc(&run(&["run", w], false)), "piped output has no colour");
    let always = run(&["--color", "always", "run", w], false);
    assert!(esc(&always), "--color always colours");
    assert!(text(&always.stdout).contains("\x1b[1mthe caching allocator at the end"));
    assert!(!esc(&run(&["run", w, "--color", "never"], false)));
    assert!(!esc(&run(&["run", w], true)));
    // the flag is global: after the subcommand too, and its values are checked
    let bad = run(&["run", w, "--color", "sometimes"], false);
    assert_eq!(bad.status.code(), Some(2));
}

/// With COLUMNS=80, every table of a real snapshot's summary (sites with long paths, the
/// device table of a 3-GPU file) and of a run fits in 80 columns; the long sentences wrap.
#[test]
fn issue15_tables_fit_the_terminal_width() {
    let dir = Scratch::new("width");
    for name in ["decomfl_memory.pickle", "codeloc_memory_snapshot.pickle"] {
        let p = external(&dir, name);
        for cols in [80usize, 100] {
            let out = gpumem()
                .env("COLUMNS", cols.to_string())
                .args(["summary"])
                .arg(&p)
                .output()
                .unwrap();
            assert_eq!(out.status.code(), Some(0));
            let s = text(&out.stdout);
            // (a file path given whole is the one thing that may stay wider)
            let path = p.display().to_string();
            for line in s.lines().filter(|l| !l.contains(&path)) {
                assert!(
                    line.chars().count() <= cols,
                    "{name} at {cols} columns: {} wide:\n{line}",
                    line.chars().count()
                );
            }
        }
        // without COLUMNS (piped): the content's own width, as before
        let wide = gpumem()
            .env_remove("COLUMNS")
            .args(["summary"])
            .arg(&p)
            .output()
            .unwrap();
        assert!(text(&wide.stdout).lines().any(|l| l.chars().count() > 100));
    }
    let run = gpumem()
        .current_dir(root())
        .env("COLUMNS", "80")
        .args([
            "run",
            "fixtures/workloads/presets/gpt2_small_sdpa_adamw.toml",
        ])
        .output()
        .unwrap();
    for line in text(&run.stdout).lines() {
        assert!(line.chars().count() <= 80, "{line}");
    }
    // a run's iterations, too many figure columns for 60 (or 80): on its side, every figure
    // whole on its line, the iterations as columns
    for cols in ["60", "80"] {
        let run = gpumem()
            .current_dir(root())
            .env("COLUMNS", cols)
            .args(["run", "--preset", "gpt2-small"])
            .output()
            .unwrap();
        let s = text(&run.stdout);
        let row = |label: &str| {
            s.lines()
                .find(|l| l.contains(&format!(" {label} ")))
                .unwrap_or_else(|| panic!("no '{label}' row at {cols} columns:\n{s}"))
                .to_string()
        };
        let head = row("iteration");
        assert!(head.contains(" 0 ") && head.contains(" 2 "), "{head}");
        let peak = row("peak allocated");
        assert!(
            peak.contains("11.18 GiB") && peak.contains("12.14 GiB"),
            "{peak}"
        );
    }
}

/// PYTORCH_CUDA_ALLOC_CONF (and PyTorch 2.9's PYTORCH_ALLOC_CONF, which wins) sets the
/// allocator of a run as in PyTorch; the report says where the settings came from;
/// --alloc-conf and the workload's alloc_conf beat it; a value PyTorch refuses is exit 2.
#[test]
fn issue15_pytorch_cuda_alloc_conf_is_honoured() {
    let w = "fixtures/workloads/presets/mlp_adam.toml";
    let run = |env: &[(&str, &str)], args: &[&str]| {
        let mut c = gpumem();
        c.current_dir(root())
            .env_remove("PYTORCH_CUDA_ALLOC_CONF")
            .env_remove("PYTORCH_ALLOC_CONF");
        for (k, v) in env {
            c.env(k, v);
        }
        c.args(["run", w, "--json"]).args(args).output().unwrap()
    };
    let reserved = |o: &std::process::Output| -> (u64, serde_json::Value) {
        assert_eq!(o.status.code(), Some(0), "{}", text(&o.stderr));
        let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
        (
            v["memory_stats"]["reserved_bytes.all.peak"]
                .as_u64()
                .unwrap(),
            v["alloc_conf"].clone(),
        )
    };
    let (plain, conf) = reserved(&run(&[], &[]));
    assert_eq!(conf["from"], "default");
    let env = [("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True")];
    let (expandable, conf) = reserved(&run(&env, &[]));
    assert_eq!(conf["from"], "PYTORCH_CUDA_ALLOC_CONF");
    assert_eq!(conf["value"], "expandable_segments:True");
    let (flag, _) = reserved(&run(&[], &["--alloc-conf", "expandable_segments:True"]));
    assert_eq!(expandable, flag, "the variable does what the flag does");
    assert_ne!(
        expandable, plain,
        "expandable segments change mlp_adam's peak reserved"
    );
    // the flag beats the variable
    let (over, conf) = reserved(&run(&env, &["--alloc-conf", "expandable_segments:False"]));
    assert_eq!((over, conf["from"].as_str()), (plain, Some("--alloc-conf")));
    // PYTORCH_ALLOC_CONF is read first
    let both = [
        ("PYTORCH_ALLOC_CONF", "expandable_segments:False"),
        ("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True"),
    ];
    let (p, conf) = reserved(&run(&both, &[]));
    assert_eq!(
        (p, conf["from"].as_str()),
        (plain, Some("PYTORCH_ALLOC_CONF"))
    );
    // shown in the text report
    let t = gpumem()
        .current_dir(root())
        .env_remove("PYTORCH_ALLOC_CONF")
        .env("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True")
        .args(["run", w])
        .output()
        .unwrap();
    assert!(text(&t.stdout).contains(
        "allocator settings: expandable_segments:True (from PYTORCH_CUDA_ALLOC_CONF in the \
         environment)"
    ));
    let bad = run(
        &[("PYTORCH_CUDA_ALLOC_CONF", "expandable_segment:True")],
        &[],
    );
    assert_eq!(bad.status.code(), Some(2));
    assert!(text(&bad.stderr).contains("PYTORCH_CUDA_ALLOC_CONF"));
}

/// A budget needs no baseline file: `check INPUT --budget ...` judges the budget alone
/// (exit 1 over it, 0 within); with nothing to judge it says what to give; --allow-new with a
/// baseline file not yet written checks the budgets too.
#[test]
fn issue15_budget_only_check_needs_no_baseline() {
    let w = "fixtures/workloads/presets/mlp_sgd.toml";
    let ok = at_root(&["check", w, "--budget", "peak_reserved=20GiB"]);
    assert_eq!(ok.status.code(), Some(0), "{}", text(&ok.stderr));
    assert!(text(&ok.stdout).contains("budgets only"));
    let over = at_root(&["check", w, "--budget", "peak_reserved=1MiB"]);
    assert_eq!(over.status.code(), Some(1));
    assert!(text(&over.stdout).contains("OVER BUDGET"));
    let none = at_root(&["check", w]);
    assert_eq!(none.status.code(), Some(2));
    assert!(text(&none.stderr).contains("--baseline"));
    let dir = Scratch::new("budget-only");
    let missing = dir.path("not-yet.json");
    let o = gpumem()
        .current_dir(root())
        .args([
            "check",
            w,
            "--allow-new",
            "--budget",
            "peak_reserved=1MiB",
            "--baseline",
        ])
        .arg(&missing)
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(1), "{}", text(&o.stderr));
    assert!(!missing.exists(), "a check never writes the baseline");
}

/// A preset without its [train] table is located at [model], not at line 1 column 1.
#[test]
fn issue15_missing_train_table_is_located() {
    let dir = Scratch::new("missing-train");
    let p = dir.write(
        "w.toml",
        "[workload]\nname = \"x\"\n\n[model]\nkind = \"mlp\"\nd_in = 64\nhidden = 64\nlayers = 1\nd_out = 4\n",
    );
    let o = gpumem().arg("run").arg(&p).output().unwrap();
    assert_eq!(o.status.code(), Some(2));
    let e = text(&o.stderr);
    assert!(
        e.contains("line 4 column 1") && e.contains("no [train] table"),
        "{e}"
    );
}

/// Each command's --help has its own examples (one per line) and its own exit codes.
#[test]
fn issue15_each_help_is_its_own() {
    let help = |cmd: &str| text(&gpumem().args([cmd, "--help"]).output().unwrap().stdout);
    let run = help("run");
    let ex: Vec<&str> = run
        .lines()
        .skip_while(|l| *l != "Examples:")
        .skip(1)
        .take_while(|l| !l.is_empty())
        .collect();
    assert_eq!(ex.len(), 4, "{run}");
    assert!(ex.iter().all(|l| l.starts_with("  gpumem run ")), "{ex:?}");
    for cmd in [
        "export",
        "diff",
        "plot",
        "bench",
        "fit",
        "summary",
        "check",
        "run",
        "replay",
        "compare-torch",
        "devices",
        "selftest",
        "completions",
    ] {
        let h = help(cmd);
        // examples one to a line, under their heading, never run together into a paragraph
        for (i, l) in h.lines().enumerate() {
            if l.starts_with("Example:") || l.starts_with("Examples:") {
                assert!(l.ends_with(':'), "{cmd} --help: examples run together: {l}");
                let next = h.lines().nth(i + 1).unwrap_or("");
                assert!(next.starts_with("  gpumem "), "{cmd} --help: {next}");
                for e in h.lines().skip(i + 1).take_while(|x| !x.is_empty()) {
                    assert!(e.starts_with("  gpumem "), "{cmd} --help: {e}");
                }
            }
        }
        assert!(
            !h.contains("for replay"),
            "{cmd} --help shows replay's exit codes"
        );
        assert!(!h.contains("../shared"), "{cmd} --help cites ../shared");
    }
}

/// JUnit XML (quick-junit) escapes what it carries and parses as the schema CI tools read.
#[test]
fn issue15_junit_from_quick_junit() {
    let dir = Scratch::new("junit");
    let xml = dir.path("r.xml");
    let o = gpumem()
        .current_dir(root())
        .args([
            "check",
            "fixtures/workloads/presets/mlp_sgd.toml",
            "--budget",
            "peak_reserved=1MiB",
            "--junit",
        ])
        .arg(&xml)
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(1));
    let s = std::fs::read_to_string(&xml).unwrap();
    assert!(s.starts_with("<?xml"), "{s}");
    let suites = s
        .lines()
        .find(|l| l.contains("<testsuites "))
        .unwrap_or_default();
    for attr in ["name=\"gpumem check\"", "tests=\"1\"", "failures=\"1\""] {
        assert!(suites.contains(attr), "{suites}");
    }
    assert!(s.contains("classname=\"mlp_sgd\"") && s.contains("name=\"peak_reserved\""));
    assert!(
        s.contains("<failure message=") && s.contains("type=\"over-budget\""),
        "{s}"
    );
    assert!(
        s.contains("baseline: none") && s.contains("</failure>"),
        "{s}"
    );
}

/// Finding 8: `replay TRACE --alloc-conf OTHER` is a what-if (recorded against replayed, no
/// mismatch dump); `replay SNAPSHOT --alloc-conf` works without --capacity and says the limit
/// is unknown.
#[test]
fn issue15_replay_what_ifs_work_as_the_readme_shows() {
    let t = at_root(&[
        "replay",
        "fixtures/allocator/trace_mixed_default.json",
        "--alloc-conf",
        "expandable_segments:True",
    ]);
    let s = text(&t.stdout);
    assert_eq!(t.status.code(), Some(0), "{s}");
    assert!(
        s.contains("what-if") && s.contains("recorded (PyTorch)"),
        "{s}"
    );
    assert!(!s.contains("MISMATCH") && !s.contains("<-- differs"), "{s}");
    let j = at_root(&[
        "replay",
        "fixtures/allocator/trace_mixed_default.json",
        "--alloc-conf",
        "expandable_segments:True",
        "--json",
    ]);
    let v: serde_json::Value = serde_json::from_slice(&j.stdout).unwrap();
    assert_eq!(v["what_if"], true);
    assert!(v["replayed"]["peak_reserved"].as_u64() < v["original"]["peak_reserved"].as_u64());
    // the recording's own settings given again: still a step-by-step comparison
    let same = at_root(&[
        "replay",
        "fixtures/allocator/trace_mixed_default.json",
        "--alloc-conf",
        "",
    ]);
    assert!(
        text(&same.stdout).starts_with("MATCH"),
        "{}",
        text(&same.stdout)
    );
    let snap = at_root(&[
        "replay",
        "fixtures/snapshots/snapshot_mlp_adam.pickle",
        "--alloc-conf",
        "expandable_segments:True",
    ]);
    assert_eq!(snap.status.code(), Some(0), "{}", text(&snap.stderr));
    assert!(text(&snap.stdout).contains("no memory limit"));
}
