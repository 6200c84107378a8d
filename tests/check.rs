//! Issue 7: `gpumem check`, the CI gate on memory. The fixture workloads are checked against
//! the committed baseline (fixtures/check/gpumem-baseline.json) on every `cargo test`, so a
//! change to the engine that moves a number fails here, with the check's own report.

use std::path::{Path, PathBuf};

mod common;
use common::{gpumem, root, u, Scratch};
use serde_json::Value;

const BASELINE: &str = "fixtures/check/gpumem-baseline.json";
const GPT2: &str = "fixtures/workloads/presets/gpt2_small_sdpa_adamw.toml";
const GPT2_NAME: &str = "gpt2-small sdpa adamw b8";
const MLP: &str = "fixtures/workloads/presets/mlp_adam.toml";

/// The workloads CI checks: fixtures/workloads/*.toml and fixtures/workloads/presets/*.toml
/// (all of them run in under a second together, even in a debug build).
fn fixture_workloads() -> Vec<String> {
    let mut v = Vec::new();
    for dir in ["fixtures/workloads", "fixtures/workloads/presets"] {
        for e in std::fs::read_dir(root().join(dir)).unwrap() {
            let name = e.unwrap().file_name().to_string_lossy().into_owned();
            if name.ends_with(".toml") {
                v.push(format!("{dir}/{name}"));
            }
        }
    }
    v.sort();
    v
}

struct Out {
    code: Option<i32>,
    stdout: String,
    stderr: String,
}

fn check(args: &[&str]) -> Out {
    check_env(args, &[])
}

fn check_env(args: &[&str], env: &[(&str, &str)]) -> Out {
    let mut c = gpumem();
    c.current_dir(root()).arg("check").args(args);
    c.env_remove("GITHUB_ACTIONS");
    for (k, v) in env {
        c.env(k, v);
    }
    let o = c.output().unwrap();
    Out {
        code: o.status.code(),
        stdout: String::from_utf8_lossy(&o.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&o.stderr).into_owned(),
    }
}

fn read_json(p: &Path) -> Value {
    serde_json::from_str(&std::fs::read_to_string(p).unwrap()).unwrap()
}

fn write_json(p: &Path, v: &Value) {
    std::fs::write(p, serde_json::to_string_pretty(v).unwrap()).unwrap();
}

/// A copy of the committed baseline in `s`.
fn baseline_copy(s: &Scratch) -> PathBuf {
    let p = s.path("baseline.json");
    std::fs::copy(root().join(BASELINE), &p).unwrap();
    p
}

fn p(path: &Path) -> &str {
    path.to_str().unwrap()
}

/// The committed baseline's value of `metric` for entry `name`.
fn recorded(name: &str, metric: &str) -> u64 {
    u(&read_json(&root().join(BASELINE))["entries"][name][metric])
}

#[test]
fn issue7_fixture_workloads_match_the_committed_baseline() {
    let w = fixture_workloads();
    let mut args: Vec<&str> = w.iter().map(String::as_str).collect();
    args.extend(["--baseline", BASELINE]);
    let o = check(&args);
    assert_eq!(
        o.code,
        Some(0),
        "a fixture's memory moved: if that is intended, run\n  cargo run -- check \
         fixtures/workloads/*.toml fixtures/workloads/presets/*.toml --baseline {BASELINE} \
         --update\nand commit the baseline.\n{}{}",
        o.stdout,
        o.stderr
    );
    assert!(o.stdout.contains("gpumem check: passed"), "{}", o.stdout);
    // every entry of the baseline is a fixture that was checked, and --update reproduces the
    // committed file (stable order, same values) but for the gpumem version that wrote it
    let s = Scratch::new("check-update-same");
    let copy = s.path("b.json");
    let mut args: Vec<&str> = w.iter().map(String::as_str).collect();
    args.extend(["--baseline", p(&copy), "--update"]);
    assert_eq!(check(&args).code, Some(0));
    let strip = |t: String| {
        t.lines()
            .filter(|l| !l.contains("\"gpumem_version\""))
            .collect::<Vec<_>>()
            .join("\n")
    };
    assert_eq!(
        strip(std::fs::read_to_string(&copy).unwrap()),
        strip(std::fs::read_to_string(root().join(BASELINE)).unwrap()),
        "--update over the fixtures does not reproduce {BASELINE}"
    );
    // a second --update over the same fixtures finds nothing to change: the file is left as
    // it is (not rewritten) and the output says there is nothing to commit
    let before = std::fs::metadata(&copy).unwrap().modified().unwrap();
    std::thread::sleep(std::time::Duration::from_millis(20));
    let o = check(&args);
    assert_eq!(o.code, Some(0));
    assert!(
        o.stdout.contains("unchanged") && o.stdout.contains("nothing to commit"),
        "{}",
        o.stdout
    );
    assert!(!o.stdout.contains("commit it"), "{}", o.stdout);
    assert_eq!(
        std::fs::metadata(&copy).unwrap().modified().unwrap(),
        before
    );
}

#[test]
fn issue7_a_bigger_batch_fails_with_its_cause_then_update_passes() {
    let s = Scratch::new("check-batch");
    let base = baseline_copy(&s);
    // the pull request: the same workload (same name), batch 8 -> 16
    let text = std::fs::read_to_string(root().join(GPT2)).unwrap();
    assert!(text.contains("batch = 8"), "{text}");
    let w = s.write("gpt2.toml", &text.replace("batch = 8", "batch = 16"));
    // keep a tolerance setting in the baseline entry: --update must not drop it
    let mut b = read_json(&base);
    b["entries"][GPT2_NAME]["check"] = serde_json::json!({"tolerance": "1%"});
    write_json(&base, &b);
    let o = check(&[p(&w), "--baseline", p(&base)]);
    assert_eq!(o.code, Some(1), "{}{}", o.stdout, o.stderr);
    let out = &o.stdout;
    for want in [
        "REGRESSED",
        "gpt2-small sdpa adamw b8 peak_allocated regressed",
        "tolerance 1% from the baseline",
        "grew most:",
        "category activation: +6.09 GiB (6.09 GiB -> 12.17 GiB)",
        "gpumem check: FAILED",
        "--update",
    ] {
        assert!(out.contains(want), "no {want:?} in:\n{out}");
    }
    // regressing rows come first (after the verdict line and the table's head)
    let first_row = out.lines().nth(5).unwrap();
    assert!(first_row.contains("REGRESSED"), "{out}");
    println!("{out}");
    // the same through --param
    let o = check(&[GPT2, "--baseline", p(&base), "--param", "batch=16"]);
    assert_eq!(o.code, Some(1), "{}", o.stdout);
    // --update records the new figures, keeps the other entries and the settings
    let o = check(&[p(&w), "--baseline", p(&base), "--update"]);
    assert_eq!(o.code, Some(0), "{}{}", o.stdout, o.stderr);
    let after = read_json(&base);
    assert_eq!(after["entries"][GPT2_NAME]["check"]["tolerance"], "1%");
    assert_eq!(
        after["entries"].as_object().unwrap().len(),
        b["entries"].as_object().unwrap().len()
    );
    assert_eq!(after["entries"]["mlp_adam"], b["entries"]["mlp_adam"]);
    assert!(std::fs::read_to_string(&base).unwrap().ends_with("}\n"));
    let o = check(&[p(&w), "--baseline", p(&base)]);
    assert_eq!(o.code, Some(0), "{}", o.stdout);
    // and the original workload is now an improvement: it passes, suggesting --update
    let o = check(&[GPT2, "--baseline", p(&base)]);
    assert_eq!(o.code, Some(0), "{}", o.stdout);
    assert!(o.stdout.contains("improved"), "{}", o.stdout);
}

/// Just enough XML for a structural check of the JUnit report: elements, attributes, text.
#[derive(Debug)]
struct Element {
    name: String,
    attrs: Vec<(String, String)>,
    children: Vec<Element>,
    text: String,
}

impl Element {
    fn attr(&self, k: &str) -> Option<&str> {
        self.attrs
            .iter()
            .find(|(n, _)| n == k)
            .map(|(_, v)| v.as_str())
    }
    fn all(&self, name: &str) -> Vec<&Element> {
        self.children.iter().filter(|c| c.name == name).collect()
    }
}

fn unescape(s: &str) -> String {
    assert!(
        !s.contains('<') && s.matches('&').count() == s.matches(';').count(),
        "unescaped markup in {s:?}"
    );
    s.replace("&lt;", "<")
        .replace("&gt;", ">")
        .replace("&quot;", "\"")
        .replace("&apos;", "'")
        .replace("&amp;", "&")
}

fn parse_xml(text: &str) -> Element {
    let rest = text.trim_start();
    let rest = match rest.strip_prefix("<?xml") {
        Some(r) => &r[r.find("?>").expect("end of the declaration") + 2..],
        None => rest,
    };
    let (e, rest) = parse_element(rest.trim_start());
    assert!(rest.trim().is_empty(), "text after the root: {rest:?}");
    e
}

fn parse_element(s: &str) -> (Element, &str) {
    let s = s.strip_prefix('<').expect("an element");
    let end = s.find('>').expect("end of a tag");
    let (tag, mut rest) = (&s[..end], &s[end + 1..]);
    let self_closing = tag.ends_with('/');
    let tag = tag.trim_end_matches('/');
    let name_end = tag.find(char::is_whitespace).unwrap_or(tag.len());
    let mut e = Element {
        name: tag[..name_end].to_string(),
        attrs: Vec::new(),
        children: Vec::new(),
        text: String::new(),
    };
    let mut a = tag[name_end..].trim();
    while !a.is_empty() {
        let eq = a.find("=\"").expect("name=\"value\"");
        let close = a[eq + 2..].find('"').expect("closing quote") + eq + 2;
        e.attrs
            .push((a[..eq].trim().to_string(), unescape(&a[eq + 2..close])));
        a = a[close + 1..].trim_start();
    }
    if self_closing {
        return (e, rest);
    }
    loop {
        let lt = rest.find('<').expect("a closing tag");
        e.text += &unescape(&rest[..lt]);
        rest = &rest[lt..];
        if let Some(r) = rest.strip_prefix("</") {
            let end = r.find('>').unwrap();
            assert_eq!(&r[..end], e.name, "mismatched closing tag");
            return (e, &r[end + 1..]);
        }
        let (child, r) = parse_element(rest);
        e.children.push(child);
        rest = r;
    }
}

#[test]
fn issue7_junit_report_has_a_test_case_per_input_and_metric() {
    let s = Scratch::new("check-junit");
    let base = baseline_copy(&s);
    let report = s.path("report.xml");
    let o = check(&[
        GPT2,
        MLP,
        "--baseline",
        p(&base),
        "--param",
        "batch=16",
        "--junit",
        p(&report),
        "--json",
    ]);
    assert_eq!(o.code, Some(1), "{}{}", o.stdout, o.stderr);
    let v: Value = serde_json::from_str(&o.stdout).unwrap();
    let rows: Vec<&Value> = v["inputs"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|i| i["rows"].as_array().unwrap())
        .collect();
    let failing: Vec<&&Value> = rows
        .iter()
        .filter(|r| {
            ["regressed", "over_budget", "not_in_baseline"]
                .contains(&r["verdict"].as_str().unwrap())
        })
        .collect();
    assert!(!failing.is_empty());
    let x = parse_xml(&std::fs::read_to_string(&report).unwrap());
    assert_eq!(x.name, "testsuites");
    let suites = x.all("testsuite");
    assert_eq!(suites.len(), 1);
    let suite = suites[0];
    assert_eq!(suite.attr("name"), Some("gpumem check"));
    let cases = suite.all("testcase");
    assert_eq!(cases.len(), rows.len());
    assert_eq!(suite.attr("tests"), Some(rows.len().to_string().as_str()));
    assert_eq!(
        suite.attr("failures"),
        Some(failing.len().to_string().as_str())
    );
    assert_eq!(x.attr("failures"), suite.attr("failures"));
    for r in &rows {
        let c = cases
            .iter()
            .find(|c| {
                c.attr("classname") == r["name"].as_str() && c.attr("name") == r["metric"].as_str()
            })
            .unwrap_or_else(|| panic!("no test case for {r}"));
        let failure = c.all("failure");
        if failing.iter().any(|f| **f == *r) {
            assert_eq!(failure.len(), 1, "{r}");
            assert!(failure[0].attr("message").unwrap().contains("regressed"));
        } else {
            assert!(failure.is_empty(), "{r}");
        }
    }
    // the gpt2 workload regressed (activations grew), mlp_adam's peak_reserved too
    let gpt2_peak = cases
        .iter()
        .find(|c| {
            c.attr("classname") == Some(GPT2_NAME) && c.attr("name") == Some("peak_allocated")
        })
        .unwrap();
    assert!(gpt2_peak.all("failure")[0]
        .text
        .contains("category activation"));
    assert_eq!(gpt2_peak.attr("file"), Some(GPT2));
}

#[test]
fn issue7_budgets_hold_to_the_byte() {
    let peak = recorded("mlp_adam", "peak_allocated");
    let reserved = recorded("mlp_adam", "peak_reserved");
    // on the command line
    let at = format!("peak_allocated={peak}");
    let below = format!("peak_allocated={}", peak - 1);
    let o = check(&[MLP, "--baseline", BASELINE, "--budget", &at]);
    assert_eq!(o.code, Some(0), "{}", o.stdout);
    let o = check(&[MLP, "--baseline", BASELINE, "--budget", &below]);
    assert_eq!(o.code, Some(1), "{}", o.stdout);
    assert!(o.stdout.contains("OVER BUDGET"), "{}", o.stdout);
    assert!(o.stdout.contains("over its budget"), "{}", o.stdout);
    assert!(o.stdout.contains("by 1 byte "), "{}", o.stdout);
    // a small category's limit is the 1 MiB floor, and its label says so (65 MiB of
    // workspace: 1% would be 0.65 MiB)
    let ws = o
        .stdout
        .lines()
        .find(|l| l.contains("workspace_at_peak"))
        .unwrap();
    assert!(
        ws.contains("66.00 MiB (+1.00 MiB floor; +1% is less)"),
        "{ws}"
    );
    // without a baseline (budgets only) nothing grew against anything: the failure says
    // what held the most at the peak, no arrow from 0 B
    let o = check(&[MLP, "--budget", &below]);
    assert_eq!(o.code, Some(1), "{}", o.stdout);
    assert!(o.stdout.contains("held most at the peak:"), "{}", o.stdout);
    assert!(!o.stdout.contains("grew most"), "{}", o.stdout);
    assert!(!o.stdout.contains("0 B ->"), "{}", o.stdout);
    // in the workload's [check] table, as a size string and as bytes
    let s = Scratch::new("check-budget");
    let text = std::fs::read_to_string(root().join(MLP)).unwrap();
    for (budget, code) in [
        (format!("max_peak_allocated = {peak}"), 0),
        (format!("max_peak_allocated = {}", peak - 1), 1),
        (format!("max_peak_reserved = \"{}MiB\"", reserved >> 20), 0),
    ] {
        assert_eq!(reserved % (1 << 20), 0);
        let w = s.write("mlp.toml", &format!("{text}\n[check]\n{budget}\n"));
        let o = check(&[p(&w), "--baseline", BASELINE]);
        assert_eq!(o.code, Some(code), "{budget}: {}", o.stdout);
    }
    // the command line beats the workload
    let w = s.write(
        "mlp.toml",
        &format!("{text}\n[check]\nmax_peak_allocated = 1\n"),
    );
    let o = check(&[p(&w), "--baseline", BASELINE, "--budget", &at]);
    assert_eq!(o.code, Some(0), "{}", o.stdout);
    // in the baseline entry
    let base = baseline_copy(&s);
    for (budget, code) in [(reserved, 0), (reserved - 1, 1)] {
        let mut b = read_json(&base);
        b["entries"]["mlp_adam"]["check"] = serde_json::json!({ "max_peak_reserved": budget });
        write_json(&base, &b);
        let o = check(&[MLP, "--baseline", p(&base)]);
        assert_eq!(o.code, Some(code), "{budget}: {}", o.stdout);
    }
}

#[test]
fn issue7_tolerances_hold_to_the_byte() {
    let peak = recorded("mlp_adam", "peak_allocated");
    // baselines whose 1% limit lands exactly on the measured peak, and one byte below it
    let limit = |b: u64| b + b / 100;
    let exact = (peak * 100 / 101 - 200..peak).find(|b| limit(*b) == peak);
    let short = (peak * 100 / 101 - 200..peak).find(|b| limit(*b) == peak - 1);
    let (exact, short) = (exact.unwrap(), short.unwrap());
    let s = Scratch::new("check-tolerance");
    let base = baseline_copy(&s);
    let set = |b: u64, check: Value| {
        let mut v = read_json(&base);
        v["entries"]["mlp_adam"]["peak_allocated"] = b.into();
        v["entries"]["mlp_adam"]["check"] = check;
        write_json(&base, &v);
    };
    let none = serde_json::json!({});
    // --tolerance, per metric and for all
    for (b, code) in [(exact, 0), (short, 1)] {
        set(b, none.clone());
        for t in ["peak_allocated=1%", "1%"] {
            let o = check(&[MLP, "--baseline", p(&base), "--tolerance", t]);
            assert_eq!(
                o.code,
                Some(code),
                "baseline {b}, --tolerance {t}: {}",
                o.stdout
            );
        }
    }
    let o = check(&[MLP, "--baseline", p(&base), "--tolerance", "1%"]);
    assert!(o.stdout.contains("1 bytes over"), "{}", o.stdout);
    // the baseline's own tolerance; its metric key beats its `tolerance`
    set(
        exact,
        serde_json::json!({"tolerance": "0", "peak_allocated_tolerance": "1%"}),
    );
    assert_eq!(check(&[MLP, "--baseline", p(&base)]).code, Some(0));
    set(short, serde_json::json!({"peak_allocated_tolerance": "1%"}));
    assert_eq!(check(&[MLP, "--baseline", p(&base)]).code, Some(1));
    // the command line beats the baseline: 0 fails what the baseline's 1% passes
    set(exact, serde_json::json!({"tolerance": "1%"}));
    assert_eq!(check(&[MLP, "--baseline", p(&base)]).code, Some(0));
    let o = check(&[MLP, "--baseline", p(&base), "--tolerance", "0"]);
    assert_eq!(o.code, Some(1), "{}", o.stdout);
    // the workload's [check] beats the baseline
    let text = std::fs::read_to_string(root().join(MLP)).unwrap();
    let w = s.write(
        "mlp.toml",
        &format!("{text}\n[check]\npeak_allocated_tolerance = \"0%\"\n"),
    );
    let o = check(&[p(&w), "--baseline", p(&base)]);
    assert_eq!(o.code, Some(1), "{}", o.stdout);
    assert!(
        o.stdout.contains("tolerance 0% from the workload [check]"),
        "{}",
        o.stdout
    );
}

#[test]
fn issue7_an_input_missing_from_the_baseline_fails_unless_allowed() {
    let s = Scratch::new("check-new");
    let base = s.write("b.json", "{\"gpumem_baseline\": 1, \"entries\": {}}\n");
    let o = check(&[MLP, "--baseline", p(&base)]);
    assert_eq!(o.code, Some(1), "{}", o.stdout);
    assert!(
        o.stdout.contains("mlp_adam is not in the baseline"),
        "{}",
        o.stdout
    );
    assert!(o.stdout.contains("NOT IN BASELINE"), "{}", o.stdout);
    let o = check(&[MLP, "--baseline", p(&base), "--allow-new"]);
    assert_eq!(o.code, Some(0), "{}", o.stdout);
    assert!(o.stdout.contains("1 new"), "{}", o.stdout);
    // a missing file is an input error that says how to make one
    let o = check(&[MLP, "--baseline", p(&s.path("none.json"))]);
    assert_eq!(o.code, Some(2));
    assert!(
        o.stderr.contains("none.json") && o.stderr.contains("--update"),
        "{}",
        o.stderr
    );
    // --update creates it
    let o = check(&[MLP, "--baseline", p(&s.path("none.json")), "--update"]);
    assert_eq!(o.code, Some(0), "{}", o.stderr);
    let v = read_json(&s.path("none.json"));
    assert_eq!(v["gpumem_baseline"], 1);
    assert_eq!(
        v["entries"]["mlp_adam"]["peak_allocated"],
        recorded("mlp_adam", "peak_allocated")
    );
}

#[test]
fn issue7_an_out_of_memory_the_baseline_did_not_have_regresses() {
    let s = Scratch::new("check-oom");
    let base = baseline_copy(&s);
    let oom = "fixtures/workloads/capacity_oom.toml";
    let name = "mlp adam on a 2 GiB card";
    let mut b = read_json(&base);
    assert_eq!(b["entries"][name]["oom"], true);
    b["entries"][name]["oom"] = false.into();
    write_json(&base, &b);
    let o = check(&[oom, "--baseline", p(&base)]);
    assert_eq!(o.code, Some(1), "{}", o.stdout);
    assert!(o.stdout.contains("now runs out of memory"), "{}", o.stdout);
}

#[test]
fn issue7_bad_input_exits_2_naming_the_flag_or_key() {
    let s = Scratch::new("check-bad");
    let text = std::fs::read_to_string(root().join(MLP)).unwrap();
    let bad_size = s.write(
        "size.toml",
        &format!("{text}\n[check]\nmax_peak_reserved = \"20 GiBs\"\n"),
    );
    let bad_key = s.write(
        "key.toml",
        &format!("{text}\n[check]\nmax_peak = \"20GiB\"\n"),
    );
    let malformed = s.write("malformed.json", "{\"gpumem_baseline\": 1, \"entries\": {");
    let version = s.write("version.json", "{\"gpumem_baseline\": 2, \"entries\": {}}");
    let not_ours = s.write("other.json", "{\"entries\": {}}");
    let bad_entry = s.write(
        "entry.json",
        "{\"gpumem_baseline\": 1, \"entries\": {\"mlp_adam\": {\"check\": {\"bogus\": 1}}}}",
    );
    let dup_dir = s.path("dup");
    std::fs::create_dir_all(&dup_dir).unwrap();
    let dup = dup_dir.join("mlp_adam.toml");
    std::fs::write(&dup, &text).unwrap();
    let cases: Vec<(Vec<&str>, Vec<&str>)> = vec![
        (
            vec![MLP, "--baseline", BASELINE, "--tolerance", "2"],
            vec!["--tolerance", "percentage"],
        ),
        (
            vec![MLP, "--baseline", BASELINE, "--tolerance", "peak=1%"],
            vec!["--tolerance", "unknown metric 'peak'"],
        ),
        (
            vec![
                MLP,
                "--baseline",
                BASELINE,
                "--budget",
                "peak_reserved=lots",
            ],
            vec!["--budget", "lots"],
        ),
        (
            vec![MLP, "--baseline", BASELINE, "--budget", "20GiB"],
            vec!["--budget", "METRIC=SIZE"],
        ),
        (
            vec![MLP, "--baseline", BASELINE, "--param", "nope=3"],
            vec!["--param", "nope"],
        ),
        (
            vec![p(&bad_size), "--baseline", BASELINE],
            vec!["size.toml", "line", "max_peak_reserved"],
        ),
        (
            vec![p(&bad_key), "--baseline", BASELINE],
            vec!["key.toml", "unknown key 'max_peak'"],
        ),
        (
            vec![MLP, "--baseline", p(&malformed)],
            vec!["malformed.json", "line 1", "JSON"],
        ),
        (
            vec![MLP, "--baseline", p(&version)],
            vec!["version.json", "gpumem_baseline", "version 2"],
        ),
        (
            vec![MLP, "--baseline", p(&not_ours)],
            vec!["other.json", "not a gpumem baseline"],
        ),
        (
            vec![MLP, "--baseline", p(&bad_entry)],
            vec!["entry.json", "check.bogus", "unknown key"],
        ),
        (
            vec![MLP, p(&dup), "--baseline", BASELINE],
            vec!["mlp_adam", "also the name of"],
        ),
        (
            vec!["fixtures/none.toml", "--baseline", BASELINE],
            vec!["none.toml"],
        ),
    ];
    for (args, wants) in cases {
        let o = check(&args);
        assert_eq!(o.code, Some(2), "{args:?}: {}{}", o.stdout, o.stderr);
        assert!(!o.stderr.contains("panicked"), "{}", o.stderr);
        for want in wants {
            assert!(
                o.stderr.contains(want),
                "{args:?}: no {want:?} in {}",
                o.stderr
            );
        }
    }
}

#[test]
fn issue7_github_annotations_and_markdown() {
    let args = [GPT2, "--baseline", BASELINE, "--param", "batch=16"];
    let o = check_env(&args, &[("GITHUB_ACTIONS", "true")]);
    assert_eq!(o.code, Some(1));
    let errors: Vec<&str> = o
        .stdout
        .lines()
        .filter(|l| l.starts_with("::error "))
        .collect();
    assert!(!errors.is_empty(), "{}", o.stdout);
    for e in &errors {
        assert!(
            e.starts_with(&format!("::error file={GPT2},title=gpumem check%3A ")),
            "{e}"
        );
        assert!(!e[2..].contains('\n'));
    }
    assert!(errors.iter().any(|e| e.contains("peak_allocated regressed")
        && e.contains("%0Agrew most: category activation")));
    // not on other CI systems, nor in JSON
    let o = check(&args);
    assert!(!o.stdout.contains("::error"), "{}", o.stdout);
    let o = check_env(
        &[&args[..], &["--json"]].concat(),
        &[("GITHUB_ACTIONS", "true")],
    );
    serde_json::from_str::<Value>(&o.stdout).expect("pure JSON");
    // markdown for a pull-request comment
    let o = check(&[&args[..], &["--markdown"]].concat());
    assert_eq!(o.code, Some(1));
    assert!(
        o.stdout.starts_with("### gpumem check: failed"),
        "{}",
        o.stdout
    );
    assert!(o
        .stdout
        .contains("| input | metric | baseline | now | change | limit | verdict |"));
    assert!(o.stdout.contains("| **REGRESSED** |"), "{}", o.stdout);
    assert!(
        o.stdout.contains("  - category activation: +6.09 GiB"),
        "{}",
        o.stdout
    );
}

#[test]
fn issue7_a_pytorch_snapshot_is_checked_against_a_budget() {
    let snap = "fixtures/snapshots/snapshot_mlp_adam.pickle";
    let (code, v) = common::run_json(&["summary", snap]);
    assert_eq!(code, Some(0));
    let peak = u(&v["peak_allocated_bytes"]);
    let s = Scratch::new("check-snapshot");
    let base = s.path("b.json");
    for (budget, code) in [(peak, 0), (peak - 1, 1)] {
        // an entry that holds only a budget checks only that
        write_json(
            &base,
            &serde_json::json!({"gpumem_baseline": 1, "entries": {
                "snapshot_mlp_adam": {"check": {"max_peak_allocated": budget}}}}),
        );
        let o = check(&[snap, "--baseline", p(&base)]);
        assert_eq!(o.code, Some(code), "{budget}: {}{}", o.stdout, o.stderr);
        assert!(o.stdout.contains("snapshot_mlp_adam"), "{}", o.stdout);
        // a budget from the command line, with no entry at all
        let flag = format!("peak_allocated={budget}");
        let empty = s.write("empty.json", "{\"gpumem_baseline\": 1, \"entries\": {}}");
        let o = check(&[
            snap,
            "--baseline",
            p(&empty),
            "--allow-new",
            "--budget",
            &flag,
        ]);
        assert_eq!(o.code, Some(code), "{budget}: {}", o.stdout);
    }
    // --update records it like a workload, and it then passes against its own record
    let o = check(&[snap, "--baseline", p(&base), "--update"]);
    assert_eq!(o.code, Some(0), "{}", o.stderr);
    let v = read_json(&base);
    assert_eq!(
        u(&v["entries"]["snapshot_mlp_adam"]["peak_allocated"]),
        peak
    );
    assert_eq!(
        u(&v["entries"]["snapshot_mlp_adam"]["check"]["max_peak_allocated"]),
        peak - 1
    );
    let o = check(&[
        snap,
        "--baseline",
        p(&base),
        "--budget",
        &format!("peak_allocated={peak}"),
    ]);
    assert_eq!(o.code, Some(0), "{}", o.stdout);
}

/// A snapshot's tag stacks are Python call stacks dozens of frames deep: "grew most" shows
/// them as the summary shows sites (innermost frames first, abridged), the JSON whole.
#[test]
fn a_snapshots_grown_stacks_are_shown_abridged() {
    let s = Scratch::new("check-stacks");
    // two notebooks' snapshots under one name: the baseline's, then the grown one's
    std::fs::create_dir_all(s.path("a")).unwrap();
    std::fs::create_dir_all(s.path("b")).unwrap();
    let was = common::external(&s, "eornn_snapshot.pickle");
    let now = common::external(&s, "ftcourse_memory_snapshot.pickle");
    std::fs::rename(&was, s.path("a/x.pickle")).unwrap();
    std::fs::rename(&now, s.path("b/x.pickle")).unwrap();
    let base = s.path("base.json");
    let (a, b) = (s.path("a/x.pickle"), s.path("b/x.pickle"));
    let o = check(&[p(&a), "--baseline", p(&base), "--update"]);
    assert_eq!(o.code, Some(0), "{}", o.stderr);
    let o = check(&[p(&b), "--baseline", p(&base)]);
    assert_eq!(o.code, Some(1), "{}", o.stderr);
    let grown: Vec<&str> = o
        .stdout
        .lines()
        .filter(|l| l.trim_start().starts_with("tags ") && l.contains(".py:"))
        .collect();
    assert!(!grown.is_empty(), "{}", o.stdout);
    for l in &grown {
        assert!(
            l.contains(" < ") && l.contains("more)") && l.chars().count() < 400,
            "{l}"
        );
        assert!(!l.contains("runpy.py"), "the outermost frames: {l}");
    }
    let o = check(&[p(&b), "--baseline", p(&base), "--json"]);
    let v: Value = serde_json::from_str(&o.stdout).unwrap();
    assert!(
        v.to_string().contains("runpy.py:196:_run_module_as_main/"),
        "the JSON keeps whole stacks"
    );
}

/// The README's CI example: its `gpumem check` command over the fixtures runs and passes,
/// exactly as written (through a shell, which expands the globs).
#[test]
fn issue7_readme_example_runs_and_passes() {
    let readme = std::fs::read_to_string(root().join("README.md")).unwrap();
    let lines: Vec<&str> = readme
        .lines()
        .map(str::trim)
        .filter(|l| l.starts_with("gpumem check fixtures/"))
        .collect();
    assert!(
        !lines.is_empty(),
        "README.md has no `gpumem check fixtures/...` example"
    );
    let exe = assert_cmd::cargo::cargo_bin!("gpumem");
    for line in lines {
        let cmd = line.replacen("gpumem", &format!("'{}'", exe.display()), 1);
        let o = std::process::Command::new("sh")
            .current_dir(root())
            .env_remove("GITHUB_ACTIONS")
            .args(["-c", &cmd])
            .output()
            .unwrap();
        assert_eq!(
            o.status.code(),
            Some(0),
            "README example `{line}` failed:\n{}{}",
            String::from_utf8_lossy(&o.stdout),
            String::from_utf8_lossy(&o.stderr)
        );
    }
}

#[test]
fn issue7_a_new_leak_regresses_and_names_the_leaking_site() {
    // mlp_leak is mlp_sgd keeping each iteration's loss: under mlp_sgd's name, a new leak
    let s = Scratch::new("check-leak");
    let text = std::fs::read_to_string(root().join("fixtures/workloads/presets/mlp_leak.toml"))
        .unwrap()
        .replace("name = \"mlp_leak\"", "name = \"mlp_sgd\"");
    let w = s.write("leak.toml", &text);
    let o = check(&[p(&w), "--baseline", BASELINE]);
    assert_eq!(o.code, Some(1), "{}", o.stdout);
    assert!(
        o.stdout
            .contains("mlp_sgd leak_per_iteration regressed: 512 B (512 bytes) now"),
        "{}",
        o.stdout
    );
    assert!(
        o.stdout
            .contains("leaks phase:forward/div: 512 B per iteration"),
        "{}",
        o.stdout
    );
}
