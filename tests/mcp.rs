//! `gpumem mcp` (issue 42 point 3): a session over stdio as an MCP client drives it
//! (initialize, tools/list, a call of each tool), and the `--json` documents against their
//! committed, versioned schemas (src/commands/mcp/*.json): a field added, removed or retyped
//! fails here until the document's version is bumped (a published version's schema never
//! changes; `GPUMEM_BLESS=1` writes the schema of a new version only).

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::io::{BufRead, BufReader, Write};
use std::process::{Child, ChildStdin, Stdio};
use std::sync::mpsc::{channel, Receiver};
use std::time::Duration;

use common::{at_root, root, Scratch};
use serde_json::{json, Value};

/// An MCP client speaking to `gpumem mcp` over its stdin and stdout.
struct Session {
    child: Child,
    stdin: ChildStdin,
    lines: Receiver<String>,
    next: u64,
    /// Responses read while waiting for another id.
    early: BTreeMap<u64, Value>,
}

impl Session {
    fn start() -> Session {
        let mut child = std::process::Command::new(assert_cmd::cargo::cargo_bin!("gpumem"))
            .current_dir(root())
            .arg("mcp")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap();
        let stdin = child.stdin.take().unwrap();
        let stdout = child.stdout.take().unwrap();
        let (tx, lines) = channel();
        std::thread::spawn(move || {
            for l in BufReader::new(stdout).lines() {
                let Ok(l) = l else { break };
                if tx.send(l).is_err() {
                    break;
                }
            }
        });
        let mut s = Session {
            child,
            stdin,
            lines,
            next: 1,
            early: BTreeMap::new(),
        };
        let init = s.request(
            "initialize",
            json!({"protocolVersion": "2025-06-18", "capabilities": {},
                   "clientInfo": {"name": "gpumem-test", "version": "0"}}),
        );
        assert_eq!(init["result"]["serverInfo"]["name"], "gpumem", "{init}");
        assert!(
            init["result"]["capabilities"]["tools"].is_object(),
            "{init}"
        );
        s.send(&json!({"jsonrpc": "2.0", "method": "notifications/initialized"}));
        s
    }

    fn send(&mut self, v: &Value) {
        writeln!(self.stdin, "{v}").unwrap();
        self.stdin.flush().unwrap();
    }

    fn request(&mut self, method: &str, params: Value) -> Value {
        let id = self.next;
        self.next += 1;
        self.send(&json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params}));
        if let Some(v) = self.early.remove(&id) {
            return v;
        }
        loop {
            let line = self
                .lines
                .recv_timeout(Duration::from_secs(300))
                .unwrap_or_else(|e| panic!("no answer to {method}: {e}"));
            let v: Value = serde_json::from_str(&line)
                .unwrap_or_else(|e| panic!("not JSON-RPC ({e}): {line}"));
            match v["id"].as_u64() {
                Some(i) if i == id => return v,
                Some(i) => {
                    self.early.insert(i, v);
                }
                None => {} // a notification
            }
        }
    }

    fn call(&mut self, tool: &str, args: Value) -> Value {
        let r = self.request("tools/call", json!({"name": tool, "arguments": args}));
        r["result"].clone()
    }
}

impl Drop for Session {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A gpumem snapshot of a run that ran out of memory.
fn oom_snapshot(s: &Scratch) -> String {
    let p = s.path("oom.json");
    let out = at_root(&[
        "run",
        "--preset",
        "mlp-adam",
        "--capacity",
        "2GiB",
        "--no-remedies",
        "--snapshot",
        p.to_str().unwrap(),
    ]);
    assert!(out.status.success());
    p.to_str().unwrap().to_string()
}

#[test]
fn a_session_answers_every_tool() {
    let s = Scratch::new("mcp-session");
    let oom = oom_snapshot(&s);
    let mut m = Session::start();
    let list = m.request("tools/list", json!({}));
    let tools = list["result"]["tools"].as_array().expect("tools");
    let names: BTreeSet<&str> = tools.iter().map(|t| t["name"].as_str().unwrap()).collect();
    assert_eq!(
        names,
        ["check", "diff", "explain_oom", "fit", "run", "summary"].into()
    );
    let out_schema = |name: &str| -> Value {
        let t = tools.iter().find(|t| t["name"] == name).unwrap();
        assert_eq!(t["inputSchema"]["type"], "object");
        assert!(t["description"].as_str().unwrap().len() > 40);
        t["outputSchema"].clone()
    };
    let calls: Vec<(&str, Value, &str)> = vec![
        (
            "summary",
            json!({"snapshot": "fixtures/snapshots/snapshot_mlp_leak.pickle", "top": 3}),
            "gpumem.summary/1",
        ),
        (
            "explain_oom",
            json!({"snapshot": oom}),
            "gpumem.explain_oom/1",
        ),
        (
            "run",
            json!({"preset": "mlp-adam", "iterations": 2, "by": "op"}),
            "gpumem.run/3",
        ),
        (
            "fit",
            json!({"preset": "mlp-adam", "capacity": "4GiB", "max": 64}),
            "gpumem.fit/1",
        ),
        (
            "diff",
            json!({"a": "fixtures/snapshots/snapshot_mlp_adam.pickle",
                   "b": "fixtures/snapshots/snapshot_mlp_leak.pickle"}),
            "gpumem.diff/1",
        ),
        (
            "check",
            json!({"inputs": ["fixtures/workloads/presets/mlp_adam.toml"],
                   "budget": ["peak_reserved=1GiB"]}),
            "gpumem.check/1",
        ),
    ];
    let mut docs = BTreeMap::new();
    for (tool, args, schema) in calls {
        let r = m.call(tool, args);
        assert_eq!(r["isError"], false, "{tool}: {r}");
        let doc = &r["structuredContent"];
        assert_eq!(doc["schema"], schema, "{tool}");
        // the text content is the same document, for clients that read only text
        let text: Value = serde_json::from_str(r["content"][0]["text"].as_str().unwrap()).unwrap();
        assert_eq!(&text, doc);
        let errors = validate(doc, &out_schema(tool), "");
        assert!(errors.is_empty(), "{tool}: {errors:?}");
        docs.insert(tool, doc.clone());
    }
    // why did it run out: the snapshot's out-of-memory, its verdict
    let e = &docs["explain_oom"];
    assert_eq!(e["source"], "snapshot");
    assert!(e["verdict"]["oom"].as_bool().unwrap());
    let o = &e["ooms"][0];
    assert!(o["requested"].as_u64().unwrap() > 0, "{o}");
    assert!(o["explanation"].as_str().unwrap().len() > 20, "{o}");
    assert!(e["verdict"]["line"]
        .as_str()
        .unwrap()
        .starts_with("out of memory on device 0"));
    assert!(docs["summary"]["leaks"]
        .as_array()
        .is_some_and(|l| !l.is_empty()));
    assert!(docs["run"]["profile"]["rows"].as_array().is_some());
    // the check's budget is over: a finding, still a document
    assert_eq!(docs["check"]["verdict"]["passed"], false);

    // a workload: run, its out-of-memory diagnosed and the remedies re-run
    let r = m.call(
        "explain_oom",
        json!({"preset": "mlp-adam", "capacity": "2GiB", "iterations": 2}),
    );
    let doc = &r["structuredContent"];
    assert_eq!(doc["source"], "run");
    let remedies = doc["run"]["oom"]["remedies"].as_array().expect("remedies");
    assert!(remedies.iter().any(|x| x["fits"] == true), "{doc}");
    assert!(validate(doc, &out_schema("explain_oom"), "").is_empty());

    // errors come back as tool errors with gpumem's message
    let bad = m.call("summary", json!({"snapshot": "no/such.pickle"}));
    assert_eq!(bad["isError"], true);
    assert!(bad["content"][0]["text"]
        .as_str()
        .unwrap()
        .contains("no/such.pickle"));
    let bad = m.call("run", json!({"preset": "mlp-adam", "colour": "blue"}));
    assert_eq!(bad["isError"], true);
    assert!(bad["content"][0]["text"]
        .as_str()
        .unwrap()
        .contains("colour"));
    let unknown = m.request(
        "tools/call",
        json!({"name": "format_disk", "arguments": {}}),
    );
    assert!(unknown["error"].is_object(), "{unknown}");
}

// ---- the documents' schemas ----

/// Objects whose keys are data (category names, ...), not fields: their values share one
/// schema.
const MAPS: [&str; 4] = [
    ".peak.by_category",
    ".oom.live_by_category",
    ".run.peak.by_category",
    ".run.oom.live_by_category",
];

#[derive(Debug, Clone, Default, PartialEq)]
struct Shape {
    types: BTreeSet<String>,
    props: BTreeMap<String, Shape>,
    required: Option<BTreeSet<String>>,
    items: Option<Box<Shape>>,
    values: Option<Box<Shape>>,
}

fn infer(v: &Value, path: &str) -> Shape {
    let mut s = Shape::default();
    let ty = match v {
        Value::Null => "null",
        Value::Bool(_) => "boolean",
        Value::Number(n) if n.is_f64() => "number",
        Value::Number(_) => "integer",
        Value::String(_) => "string",
        Value::Array(a) => {
            let mut items: Option<Shape> = None;
            for x in a {
                let i = infer(x, &format!("{path}[]"));
                items = Some(match items {
                    Some(m) => merge(m, i),
                    None => i,
                });
            }
            s.items = items.map(Box::new);
            "array"
        }
        Value::Object(o) if MAPS.contains(&path) => {
            let mut values: Option<Shape> = None;
            for x in o.values() {
                let i = infer(x, &format!("{path}.*"));
                values = Some(match values {
                    Some(m) => merge(m, i),
                    None => i,
                });
            }
            s.values = Some(Box::new(values.unwrap_or_default()));
            "object"
        }
        Value::Object(o) => {
            for (k, x) in o {
                s.props.insert(k.clone(), infer(x, &format!("{path}.{k}")));
            }
            s.required = Some(o.keys().cloned().collect());
            "object"
        }
    };
    s.types.insert(ty.into());
    s
}

fn merge(mut a: Shape, b: Shape) -> Shape {
    a.types.extend(b.types);
    if a.types.contains("number") {
        a.types.remove("integer");
    }
    for (k, v) in b.props {
        let m = match a.props.remove(&k) {
            Some(x) => merge(x, v),
            None => v,
        };
        a.props.insert(k, m);
    }
    a.required = match (a.required, b.required) {
        (Some(x), Some(y)) => Some(x.intersection(&y).cloned().collect()),
        (x, None) => x,
        (None, y) => y,
    };
    a.items = match (a.items, b.items) {
        (Some(x), Some(y)) => Some(Box::new(merge(*x, *y))),
        (x, y) => x.or(y),
    };
    a.values = match (a.values, b.values) {
        (Some(x), Some(y)) => Some(Box::new(merge(*x, *y))),
        (x, y) => x.or(y),
    };
    a
}

fn to_json(s: &Shape) -> Value {
    let mut o = serde_json::Map::new();
    let types: Vec<&String> = s.types.iter().collect();
    if types.len() == 1 {
        o.insert("type".into(), json!(types[0]));
    } else if !types.is_empty() {
        o.insert("type".into(), json!(types));
    }
    if s.types.contains("object") {
        if let Some(v) = &s.values {
            o.insert("additionalProperties".into(), to_json(v));
        } else {
            let props: serde_json::Map<String, Value> = s
                .props
                .iter()
                .map(|(k, v)| (k.clone(), to_json(v)))
                .collect();
            o.insert("properties".into(), Value::Object(props));
            let req: Vec<&String> = s.required.iter().flatten().collect();
            o.insert("required".into(), json!(req));
        }
    }
    if s.types.contains("array") {
        o.insert(
            "items".into(),
            s.items.as_ref().map_or(json!({}), |i| to_json(i)),
        );
    }
    Value::Object(o)
}

/// Where `doc` breaks `schema`: a field the schema does not have, a required one missing, a
/// value of another type.
fn validate(doc: &Value, schema: &Value, path: &str) -> Vec<String> {
    let mut errors = Vec::new();
    let types: Vec<&str> = match &schema["type"] {
        Value::String(t) => vec![t.as_str()],
        Value::Array(a) => a.iter().filter_map(Value::as_str).collect(),
        _ => return errors, // {}: anything (an array's items never seen)
    };
    let ty = match doc {
        Value::Null => "null",
        Value::Bool(_) => "boolean",
        Value::Number(n) if n.is_f64() => "number",
        Value::Number(_) => "integer",
        Value::String(_) => "string",
        Value::Array(_) => "array",
        Value::Object(_) => "object",
    };
    let ok = types.contains(&ty) || (ty == "integer" && types.contains(&"number"));
    if !ok {
        errors.push(format!("{path}: a {ty}, the schema says {types:?}"));
        return errors;
    }
    match doc {
        Value::Object(o) => {
            if let Some(v) = schema.get("additionalProperties").filter(|v| v.is_object()) {
                for (k, x) in o {
                    errors.extend(validate(x, v, &format!("{path}.{k}")));
                }
                return errors;
            }
            let props = schema["properties"]
                .as_object()
                .cloned()
                .unwrap_or_default();
            for (k, x) in o {
                match props.get(k) {
                    Some(p) => errors.extend(validate(x, p, &format!("{path}.{k}"))),
                    None => errors.push(format!("{path}.{k}: a field the schema does not have")),
                }
            }
            for r in schema["required"].as_array().into_iter().flatten() {
                let r = r.as_str().unwrap();
                if !o.contains_key(r) {
                    errors.push(format!("{path}.{r}: required by the schema, missing"));
                }
            }
        }
        Value::Array(a) => {
            for x in a {
                errors.extend(validate(x, &schema["items"], &format!("{path}[]")));
            }
        }
        _ => {}
    }
    errors
}

/// The `--json` document of `gpumem args`.
fn doc(args: &[&str]) -> Value {
    let mut a = args.to_vec();
    a.push("--json");
    let out = at_root(&a);
    assert!(
        matches!(out.status.code(), Some(0 | 1)),
        "{args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

#[test]
fn documents_match_their_versioned_schemas() {
    let s = Scratch::new("mcp-schemas");
    let oom = oom_snapshot(&s);
    let gpt2 = "fixtures/workloads/presets/gpt2_small_sdpa_adamw.toml";
    let mut samples: BTreeMap<&str, Vec<Value>> = BTreeMap::new();
    samples.insert(
        "summary",
        vec![
            doc(&["summary", "fixtures/snapshots/snapshot_mlp_adam.pickle"]),
            doc(&[
                "summary",
                "fixtures/snapshots/snapshot_mlp_leak.pickle",
                "--by",
                "line",
            ]),
            doc(&[
                "summary",
                "fixtures/snapshots/snapshot_gpt2s_b8_sdpa_adamw_bf16.pickle",
            ]),
            doc(&["summary", &oom]),
        ],
    );
    samples.insert(
        "run",
        vec![
            doc(&["run", "--preset", "mlp-adam"]),
            doc(&["run", gpt2, "--by", "module"]),
            doc(&[
                "run",
                "--preset",
                "mlp-adam",
                "--capacity",
                "2GiB",
                "--iterations",
                "2",
            ]),
            doc(&[
                "run",
                "fixtures/hf/configs/qwen2.5-0.5b.config.json",
                "--mode",
                "generate",
                "--batch",
                "1",
                "--seq",
                "64",
                "--new-tokens",
                "4",
            ]),
            doc(&[
                "run",
                "fixtures/hf/configs/qwen2.5-0.5b.config.json",
                "--batch",
                "1",
                "--seq",
                "128",
                "--ddp",
                "--world-size",
                "2",
            ]),
        ],
    );
    samples.insert(
        "fit",
        vec![doc(&[
            "fit",
            "--preset",
            "mlp-adam",
            "--capacity",
            "4GiB",
            "--max",
            "64",
        ])],
    );
    samples.insert(
        "diff",
        vec![doc(&[
            "diff",
            "fixtures/snapshots/snapshot_mlp_adam.pickle",
            "fixtures/snapshots/snapshot_mlp_leak.pickle",
        ])],
    );
    samples.insert(
        "check",
        vec![
            doc(&[
                "check",
                "fixtures/workloads/presets/mlp_adam.toml",
                "--budget",
                "peak_reserved=1GiB",
            ]),
            doc(&[
                "check",
                "fixtures/workloads/presets/mlp_adam.toml",
                "--budget",
                "peak_reserved=100GiB",
            ]),
        ],
    );
    let mut m = Session::start();
    samples.insert(
        "explain_oom",
        vec![
            m.call("explain_oom", json!({"snapshot": oom}))["structuredContent"].clone(),
            m.call(
                "explain_oom",
                json!({"snapshot": "fixtures/snapshots/snapshot_mlp_adam.pickle"}),
            )["structuredContent"]
                .clone(),
            m.call(
                "explain_oom",
                json!({"preset": "mlp-adam", "capacity": "2GiB", "iterations": 2}),
            )["structuredContent"]
                .clone(),
        ],
    );
    let dir = root().join("src/commands/mcp");
    let bless = std::env::var_os("GPUMEM_BLESS").is_some();
    let mut failures = Vec::new();
    for (kind, docs) in &samples {
        let name = docs[0]["schema"]
            .as_str()
            .unwrap_or_else(|| panic!("{kind}: the document names no schema"))
            .to_string();
        assert!(
            name.starts_with(&format!("gpumem.{kind}/")),
            "{kind}: {name}"
        );
        assert!(docs.iter().all(|d| d["schema"] == name.as_str()));
        let file = dir.join(format!("{}.json", name.replace('/', ".")));
        let shape = docs.iter().map(|d| infer(d, "")).reduce(merge).unwrap();
        let mut fresh = to_json(&shape);
        fresh["$schema"] = json!("https://json-schema.org/draft/2020-12/schema");
        fresh["title"] = json!(name);
        let committed: Option<Value> = std::fs::read_to_string(&file)
            .ok()
            .map(|t| serde_json::from_str(&t).unwrap());
        // a placeholder (no fields yet) is not a published schema
        let published = committed.as_ref().filter(|c| c.get("properties").is_some());
        match published {
            Some(c) => {
                let errors: Vec<String> = docs.iter().flat_map(|d| validate(d, c, "")).collect();
                if !errors.is_empty() {
                    failures.push(format!(
                        "{name}: the document changed ({}): a published schema never \
                         changes, so give the document a new version (src/commands/mcp.rs \
                         `schema`, its SCHEMAS entry) and run GPUMEM_BLESS=1 cargo test --test \
                         mcp to write its schema",
                        errors.join("; ")
                    ));
                }
            }
            None if bless => {
                std::fs::write(&file, serde_json::to_string_pretty(&fresh).unwrap() + "\n")
                    .unwrap();
            }
            None => failures.push(format!(
                "{name}: no schema at {} (GPUMEM_BLESS=1 writes it)",
                file.display()
            )),
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// A document with a field added, one removed and one retyped breaks its committed schema.
#[test]
fn a_changed_document_breaks_its_schema() {
    let schema: Value = serde_json::from_str(
        &std::fs::read_to_string(root().join("src/commands/mcp/gpumem.run.2.json")).unwrap(),
    )
    .unwrap();
    let good = doc(&["run", "--preset", "mlp-adam"]);
    assert!(validate(&good, &schema, "").is_empty());
    let mut bad = good.clone();
    bad["new_field"] = json!(1);
    bad.as_object_mut().unwrap().remove("peak");
    bad["capacity"] = json!("80GiB");
    bad["iterations"][0]["peak_allocated"] = json!([1]);
    let errors = validate(&bad, &schema, "");
    for want in [
        ".new_field: a field the schema does not have",
        ".peak: required by the schema, missing",
        ".capacity: a string",
        ".iterations[].peak_allocated: a array",
    ] {
        assert!(
            errors.iter().any(|e| e.starts_with(want)),
            "{want}: {errors:?}"
        );
    }
}
