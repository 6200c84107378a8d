//! `gpumem mcp`: gpumem as a Model Context Protocol server over stdio, for coding agents.
//!
//! The protocol is the official Rust SDK's (`rmcp`): initialization, `tools/list` and
//! `tools/call`. Each tool runs gpumem itself, as a child process with `--json`, and returns
//! that document as the call's structured content, so an agent gets exactly what `gpumem ...
//! --json` prints (versioned: `"schema": "gpumem.summary/1"`), and a failure (a bad path, a
//! refused flag) as a tool error with gpumem's message. The tools' output schemas are the
//! committed schemas of those documents (`mcp/*.json`, checked by `tests/schemas.rs`).

use std::io::Write;
use std::sync::Arc;

use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, ContentBlock, Implementation,
    JsonObject, ListToolsResult, PaginatedRequestParams, ServerCapabilities, ServerConfig, Tool,
    ToolAnnotations,
};
use rmcp::service::RequestContext;
use rmcp::{ErrorData, RoleServer, ServerHandler, ServiceExt};
use serde_json::{json, Value};

use crate::cli::McpArgs;
use crate::commands::Outcome;
use crate::error::{Error, Result};

/// The documents' schemas, by name (`gpumem.NAME/VERSION`).
pub const SCHEMAS: [(&str, &str); 8] = [
    (
        "gpumem.summary/1",
        include_str!("mcp/gpumem.summary.1.json"),
    ),
    (
        "gpumem.explain_oom/1",
        include_str!("mcp/gpumem.explain_oom.1.json"),
    ),
    ("gpumem.run/1", include_str!("mcp/gpumem.run.1.json")),
    // 2: `launches` (the cuda device's kernels by where they ran)
    ("gpumem.run/2", include_str!("mcp/gpumem.run.2.json")),
    // 3: `kv_cache.sliding_layers` (how many layers the sliding window caps)
    ("gpumem.run/3", include_str!("mcp/gpumem.run.3.json")),
    ("gpumem.fit/1", include_str!("mcp/gpumem.fit.1.json")),
    ("gpumem.diff/1", include_str!("mcp/gpumem.diff.1.json")),
    ("gpumem.check/1", include_str!("mcp/gpumem.check.1.json")),
];

/// The schema name each command's `--json` document carries.
pub mod schema {
    pub const SUMMARY: &str = "gpumem.summary/1";
    pub const RANKS: &str = "gpumem.ranks/1";
    pub const EXPLAIN_OOM: &str = "gpumem.explain_oom/1";
    pub const RUN: &str = "gpumem.run/3";
    pub const FIT: &str = "gpumem.fit/1";
    pub const DIFF: &str = "gpumem.diff/1";
    pub const CHECK: &str = "gpumem.check/1";
}

pub fn run(_args: &McpArgs, _out: &mut dyn Write) -> Result<Outcome> {
    // the protocol owns stdout; gpumem's own messages go to stderr
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| {
            Error::Output(std::io::Error::other(format!(
                "the MCP server's runtime: {e}"
            )))
        })?;
    rt.block_on(async {
        let service = Server
            .serve(rmcp::transport::stdio())
            .await
            .map_err(|e| Error::Output(std::io::Error::other(format!("MCP: {e}"))))?;
        service
            .waiting()
            .await
            .map_err(|e| Error::Output(std::io::Error::other(format!("MCP: {e}"))))?;
        Ok(Outcome::Ok)
    })
}

#[derive(Clone, Copy)]
struct Server;

/// The model flags `run`, `fit` and `explain_oom` take, as (argument, flag, JSON type).
const MODEL_FLAGS: [(&str, &str, &str); 13] = [
    ("preset", "--preset", "string"),
    ("batch", "--batch", "integer"),
    ("seq", "--seq", "integer"),
    ("dtype", "--dtype", "string"),
    ("optimizer", "--optimizer", "string"),
    ("mode", "--mode", "string"),
    ("new_tokens", "--new-tokens", "integer"),
    ("lora_r", "--lora-r", "integer"),
    (
        "gradient_checkpointing",
        "--gradient-checkpointing",
        "boolean",
    ),
    ("attention", "--attention", "string"),
    ("capacity", "--capacity", "string"),
    ("iterations", "--iterations", "integer"),
    ("alloc_conf", "--alloc-conf", "string"),
];

fn model_properties() -> serde_json::Map<String, Value> {
    let doc = |name: &str| match name {
        "preset" => "a built-in model instead of a workload (gpt2-small, mlp-adam, ...)",
        "batch" => "samples per step (a bare config's batch)",
        "seq" => "tokens per sample",
        "dtype" => "the weights' dtype: fp32, bf16 or fp16",
        "optimizer" => "adamw, adam, sgd, adamw8bit, ...",
        "mode" => "train, inference or generate (a bare config)",
        "new_tokens" => "tokens generate() makes after the prompt",
        "lora_r" => "LoRA rank (peft on q/k/v/o unless the workload says)",
        "gradient_checkpointing" => "Hugging Face gradient checkpointing",
        "attention" => "sdpa or eager",
        "capacity" => "the GPU's memory, e.g. 24GiB or 80GiB",
        "iterations" => "training steps to run",
        "alloc_conf" => "PYTORCH_CUDA_ALLOC_CONF, e.g. expandable_segments:True",
        _ => "",
    };
    MODEL_FLAGS
        .iter()
        .map(|(name, _, ty)| {
            (
                name.to_string(),
                json!({"type": ty, "description": doc(name)}),
            )
        })
        .collect()
}

fn object(properties: serde_json::Map<String, Value>, required: &[&str]) -> Arc<JsonObject> {
    let v = json!({"type": "object", "properties": properties, "required": required});
    Arc::new(v.as_object().expect("an object").clone())
}

fn output(name: &str) -> Arc<JsonObject> {
    let text = SCHEMAS
        .iter()
        .find(|(n, _)| *n == name)
        .map(|(_, t)| *t)
        .expect("every tool's document has a schema");
    let v: Value = serde_json::from_str(text).expect("the committed schemas are JSON");
    Arc::new(v.as_object().expect("a schema is an object").clone())
}

fn tool(name: &'static str, description: &'static str, input: Arc<JsonObject>, out: &str) -> Tool {
    let read_only = ToolAnnotations::new().read_only(true).open_world(false);
    Tool::new(name, description, input)
        .with_raw_output_schema(output(out))
        .with_annotations(read_only)
}

/// The tools, built once.
fn tools() -> &'static [Tool] {
    static TOOLS: std::sync::OnceLock<Vec<Tool>> = std::sync::OnceLock::new();
    TOOLS.get_or_init(build_tools)
}

fn build_tools() -> Vec<Tool> {
    let path = |d: &str| json!({"type": "string", "description": d});
    let mut summary = serde_json::Map::new();
    summary.insert(
        "snapshot".into(),
        path("a snapshot file: PyTorch's _dump_snapshot pickle, its JSON, or gpumem's"),
    );
    summary.insert(
        "device".into(),
        json!({"type": "integer", "description": "only this cuda:N of a snapshot of several"}),
    );
    summary.insert(
        "top".into(),
        json!({"type": "integer", "description": "sites (or --by rows) to list; default 10"}),
    );
    summary.insert(
        "by".into(),
        json!({"type": "string", "enum": ["op", "module", "line", "annotation"],
               "description": "add the profiler's table: memory per op, module, line of code or record_function range"}),
    );
    let mut explain = model_properties();
    explain.insert(
        "snapshot".into(),
        path("a snapshot that recorded an out-of-memory (give this or workload)"),
    );
    explain.insert(
        "workload".into(),
        path("a workload .toml or a Hugging Face config.json to run (give this or snapshot)"),
    );
    let mut run = model_properties();
    run.insert(
        "workload".into(),
        path("a workload .toml or a Hugging Face config.json (or give preset)"),
    );
    run.insert(
        "by".into(),
        json!({"type": "string", "enum": ["op", "module", "annotation"],
               "description": "add the profiler's table: memory per op, module scope or phase"}),
    );
    let mut fit = model_properties();
    fit.insert(
        "workload".into(),
        path("a workload .toml or a Hugging Face config.json (or give preset)"),
    );
    fit.insert(
        "param".into(),
        json!({"type": "string", "description": "the integer to search: batch (default), seq, new_tokens, ..."}),
    );
    fit.insert(
        "max".into(),
        json!({"type": "integer", "description": "the largest value to try"}),
    );
    let mut diff = serde_json::Map::new();
    diff.insert("a".into(), path("the first snapshot or workload"));
    diff.insert("b".into(), path("the second snapshot or workload"));
    let mut check = serde_json::Map::new();
    check.insert(
        "inputs".into(),
        json!({"type": "array", "items": {"type": "string"},
               "description": "workloads, configs or snapshots to check"}),
    );
    check.insert(
        "baseline".into(),
        path("the baseline file (gpumem check --update wrote it)"),
    );
    check.insert(
        "budget".into(),
        json!({"type": "array", "items": {"type": "string"},
               "description": "budgets, e.g. peak_reserved=20GiB"}),
    );
    vec![
        tool(
            "summary",
            "Summarize a GPU memory snapshot (PyTorch's torch.cuda.memory._dump_snapshot pickle, \
             or gpumem's): allocator state, the peak and what held it, leaks across \
             iterations, fragmentation, each out-of-memory with its verdict.",
            object(summary, &["snapshot"]),
            schema::SUMMARY,
        ),
        tool(
            "explain_oom",
            "Why did this run out of memory, and what makes it fit? For a snapshot: each \
             out-of-memory's verdict (capacity or fragmentation, settled by replaying the trace \
             with expandable segments). For a workload or config: it is run on the simulated \
             GPU and the remedies (allocator settings, gradient checkpointing, smaller batch, \
             8-bit optimizer, LoRA, ...) are re-run to see which fit.",
            object(explain, &[]),
            schema::EXPLAIN_OOM,
        ),
        tool(
            "run",
            "Run a workload or a Hugging Face config on gpumem's simulated GPU (no GPU needed; \
             PyTorch's caching allocator to the byte): per-iteration memory, the peak by \
             category, memory_stats, the verdict for the capacity.",
            object(run, &[]),
            schema::RUN,
        ),
        tool(
            "fit",
            "The largest batch (or seq, new_tokens, ...) that fits a capacity, searched by \
             running the workload on the simulated GPU.",
            object(fit, &["capacity"]),
            schema::FIT,
        ),
        tool(
            "diff",
            "Compare two snapshots or workloads: peaks, categories at the peak, sites, segments.",
            object(diff, &["a", "b"]),
            schema::DIFF,
        ),
        tool(
            "check",
            "Check workloads or snapshots against a baseline and budgets (gpumem check): which \
             metric regressed and by how much.",
            object(check, &["inputs"]),
            schema::CHECK,
        ),
    ]
}

/// An argument the tool was given, or why it cannot be used.
fn arg_str(args: &JsonObject, key: &str) -> std::result::Result<Option<String>, String> {
    match args.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => Ok(Some(s.clone())),
        Some(Value::Number(n)) => Ok(Some(n.to_string())),
        Some(Value::Bool(b)) => Ok(Some(b.to_string())),
        Some(other) => Err(format!("'{key}' must be a string or a number, not {other}")),
    }
}

fn model_args(args: &JsonObject, cmd: &mut Vec<String>) -> std::result::Result<(), String> {
    for (name, flag, ty) in MODEL_FLAGS {
        match (ty, args.get(name)) {
            (_, None | Some(Value::Null)) => {}
            ("boolean", Some(Value::Bool(b))) => {
                if *b {
                    cmd.push(flag.to_string());
                }
            }
            ("boolean", Some(other)) => {
                return Err(format!("'{name}' must be true or false, not {other}"))
            }
            _ => {
                if let Some(v) = arg_str(args, name)? {
                    cmd.push(flag.to_string());
                    cmd.push(v);
                }
            }
        }
    }
    Ok(())
}

/// The gpumem command line a tool call runs.
fn command_line(name: &str, args: &JsonObject) -> std::result::Result<Vec<String>, String> {
    // the arguments a tool takes are its input schema's properties
    let tool = tools()
        .iter()
        .find(|t| t.name == name)
        .ok_or_else(|| format!("no tool named '{name}'"))?;
    let known = tool
        .input_schema
        .get("properties")
        .and_then(Value::as_object);
    for k in args.keys() {
        if !known.is_some_and(|p| p.contains_key(k)) {
            return Err(format!("'{name}' takes no argument '{k}'"));
        }
    }
    let need = |k: &str| -> std::result::Result<String, String> {
        arg_str(args, k)?.ok_or_else(|| format!("'{name}' needs '{k}'"))
    };
    let mut cmd: Vec<String> = Vec::new();
    let opt = |cmd: &mut Vec<String>, k: &str, flag: &str| -> std::result::Result<(), String> {
        if let Some(v) = arg_str(args, k)? {
            cmd.push(flag.into());
            cmd.push(v);
        }
        Ok(())
    };
    let list = |k: &str| -> std::result::Result<Vec<String>, String> {
        match args.get(k) {
            None | Some(Value::Null) => Ok(Vec::new()),
            Some(Value::Array(a)) => a
                .iter()
                .map(|v| {
                    v.as_str()
                        .map(str::to_string)
                        .ok_or_else(|| format!("'{k}' must be a list of strings"))
                })
                .collect(),
            Some(Value::String(s)) => Ok(vec![s.clone()]),
            Some(_) => Err(format!("'{k}' must be a list of strings")),
        }
    };
    match name {
        "summary" => {
            cmd.extend(["summary".into(), need("snapshot")?]);
            opt(&mut cmd, "device", "--device")?;
            opt(&mut cmd, "top", "--top")?;
            opt(&mut cmd, "by", "--by")?;
        }
        "explain_oom" => match (arg_str(args, "snapshot")?, arg_str(args, "workload")?) {
            (Some(s), None) => {
                if args.keys().any(|k| k != "snapshot") {
                    return Err("a snapshot's out-of-memory is what it recorded: give \
                                'snapshot' alone (the model flags go with 'workload')"
                        .into());
                }
                cmd.extend(["summary".into(), s]);
            }
            (None, w) => {
                cmd.push("run".into());
                cmd.extend(w);
                model_args(args, &mut cmd)?;
            }
            (Some(_), Some(_)) => return Err("give 'snapshot' or 'workload', not both".into()),
        },
        "run" | "fit" => {
            cmd.push(name.into());
            cmd.extend(arg_str(args, "workload")?);
            model_args(args, &mut cmd)?;
            if name == "run" {
                opt(&mut cmd, "by", "--by")?;
            } else {
                opt(&mut cmd, "param", "--param")?;
                opt(&mut cmd, "max", "--max")?;
            }
        }
        "diff" => cmd.extend(["diff".into(), need("a")?, need("b")?]),
        "check" => {
            cmd.push("check".into());
            let inputs = list("inputs")?;
            if inputs.is_empty() {
                return Err("'check' needs 'inputs'".into());
            }
            cmd.extend(inputs);
            opt(&mut cmd, "baseline", "--baseline")?;
            for b in list("budget")? {
                cmd.extend(["--budget".into(), b]);
            }
        }
        _ => unreachable!("names were checked"),
    }
    cmd.push("--json".into());
    Ok(cmd)
}

/// What `explain_oom` returns: the out-of-memory parts of a summary's or a run's document.
fn explain(cmd: &[String], doc: &Value) -> Value {
    if cmd[0] == "summary" {
        let ooms: Vec<Value> = doc["per_device"]
            .as_array()
            .into_iter()
            .flatten()
            .flat_map(|d| {
                let device = d["device"].clone();
                d["ooms"]
                    .as_array()
                    .cloned()
                    .unwrap_or_default()
                    .into_iter()
                    .map(move |mut o| {
                        o["device"] = device.clone();
                        o
                    })
            })
            .collect();
        json!({
            "schema": schema::EXPLAIN_OOM,
            "source": "snapshot",
            "file": doc["file"],
            "verdict": doc["verdict"],
            "ooms": ooms,
            "run": Value::Null,
        })
    } else {
        json!({
            "schema": schema::EXPLAIN_OOM,
            "source": "run",
            "file": doc["workload"],
            "verdict": doc["verdict"],
            "ooms": Vec::<Value>::new(),
            "run": {
                "name": doc["name"],
                "capacity": doc["capacity"],
                "peak": doc["peak"],
                "oom": doc["oom"],
            },
        })
    }
}

/// Runs gpumem `cmd` as a child process: its JSON document, or gpumem's message.
fn call(cmd: &[String]) -> std::result::Result<Value, String> {
    let exe = std::env::current_exe().map_err(|e| format!("gpumem's own path: {e}"))?;
    let out = std::process::Command::new(exe)
        .args(cmd)
        .env("NO_COLOR", "1")
        .stdin(std::process::Stdio::null())
        .output()
        .map_err(|e| format!("running gpumem: {e}"))?;
    let stderr = String::from_utf8_lossy(&out.stderr);
    match out.status.code() {
        // 1: a finding (a check that regressed, an out-of-memory asked to fail on): a result
        Some(0 | 1) => serde_json::from_slice(&out.stdout)
            .map_err(|e| format!("gpumem {} printed no JSON ({e}): {stderr}", cmd.join(" "))),
        _ => Err(stderr
            .lines()
            .filter(|l| !l.trim().is_empty())
            .collect::<Vec<_>>()
            .join("\n")),
    }
}

impl ServerHandler for Server {
    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(ServerCapabilities::builder().enable_tools().build())
            .with_server_info(
                Implementation::new("gpumem", env!("CARGO_PKG_VERSION"))
                    .with_title("gpumem: GPU memory profiler and out-of-memory diagnoser"),
            )
            .with_instructions(
                "gpumem answers GPU memory questions about PyTorch training and inference: \
                 `summary` reads a snapshot (torch.cuda.memory._dump_snapshot), `explain_oom` \
                 says why a run or snapshot ran out of memory and which remedies fit, `run` and \
                 `fit` simulate a workload or a Hugging Face config.json on any GPU size \
                 without a GPU, `diff` compares two, `check` gates a change on a baseline. \
                 Paths are relative to the directory the server was started in. Sizes in the \
                 documents are bytes.",
            )
    }

    async fn list_tools(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> std::result::Result<ListToolsResult, ErrorData> {
        Ok(ListToolsResult::with_all_items(tools().to_vec()))
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        _context: RequestContext<RoleServer>,
    ) -> std::result::Result<CallToolResponse, ErrorData> {
        let name = request.name.to_string();
        if !tools().iter().any(|t| t.name == name.as_str()) {
            return Err(ErrorData::invalid_params(
                format!("no tool named '{name}'"),
                None,
            ));
        }
        let args = request.arguments.unwrap_or_default();
        let cmd = match command_line(&name, &args) {
            Ok(c) => c,
            Err(why) => {
                return Ok(CallToolResult::error(vec![ContentBlock::text(why)]).into());
            }
        };
        tracing::debug!(tool = %name, command = %cmd.join(" "), "tool call");
        let ran = tokio::task::spawn_blocking({
            let cmd = cmd.clone();
            move || call(&cmd)
        })
        .await
        .map_err(|e| ErrorData::internal_error(format!("the tool's worker: {e}"), None))?;
        Ok(match ran {
            Ok(doc) => {
                let doc = if name == "explain_oom" {
                    explain(&cmd, &doc)
                } else {
                    doc
                };
                CallToolResult::structured(doc).into()
            }
            Err(why) => CallToolResult::error(vec![ContentBlock::text(why)]).into(),
        })
    }

    fn get_tool(&self, name: &str) -> Option<Tool> {
        tools().iter().find(|t| t.name == name).cloned()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(v: Value) -> JsonObject {
        v.as_object().unwrap().clone()
    }

    #[test]
    fn command_lines() {
        let c = command_line(
            "run",
            &args(json!({"workload": "c.json", "batch": 2, "gradient_checkpointing": true, "capacity": "24GiB"})),
        )
        .unwrap();
        assert_eq!(
            c,
            [
                "run",
                "c.json",
                "--batch",
                "2",
                "--gradient-checkpointing",
                "--capacity",
                "24GiB",
                "--json"
            ]
        );
        let s = command_line(
            "summary",
            &args(json!({"snapshot": "s.pickle", "by": "line"})),
        )
        .unwrap();
        assert_eq!(s, ["summary", "s.pickle", "--by", "line", "--json"]);
        let e = command_line("explain_oom", &args(json!({"snapshot": "s.pickle"}))).unwrap();
        assert_eq!(e, ["summary", "s.pickle", "--json"]);
        let k = command_line(
            "check",
            &args(json!({"inputs": ["a.toml", "b.toml"], "budget": ["peak_reserved=20GiB"]})),
        )
        .unwrap();
        assert_eq!(
            k,
            [
                "check",
                "a.toml",
                "b.toml",
                "--budget",
                "peak_reserved=20GiB",
                "--json"
            ]
        );
        for (tool, bad, want) in [
            ("summary", json!({}), "needs 'snapshot'"),
            ("run", json!({"wat": 1}), "no argument 'wat'"),
            ("explain_oom", json!({"snapshot": "s", "batch": 2}), "alone"),
            (
                "run",
                json!({"gradient_checkpointing": "yes"}),
                "true or false",
            ),
            ("check", json!({}), "needs 'inputs'"),
        ] {
            let e = command_line(tool, &args(bad)).unwrap_err();
            assert!(e.contains(want), "{tool}: {e}");
        }
    }

    #[test]
    fn every_tool_has_its_schemas() {
        let t = tools();
        assert_eq!(t.len(), 6);
        for tool in t {
            assert_eq!(tool.input_schema["type"], "object");
            assert_eq!(tool.output_schema.as_ref().unwrap()["type"], "object");
        }
    }
}
