//! Workload files: what `gpumem run` will execute, parsed and checked here (nothing is run).
//!
//! A workload is a TOML file with one table, `[workload]`:
//!
//! ```toml
//! [workload]
//! name = "eval loop keeps the loss"        # required, non-empty
//! iterations = 3                           # optional, default 1, at least 1: body runs this often
//! capacity = "24GiB"                       # optional: the device size, "24GiB" or bytes (25769803776)
//! alloc_conf = "expandable_segments:True"  # optional: PYTORCH_CUDA_ALLOC_CONF, PyTorch's syntax
//! device = "sim"                           # optional: "sim" (default), "cpu" or "cuda"
//! description = "..."                      # optional free text
//!
//! setup = """
//! w = randn(4096, 4096, dtype=bf16)        # statements run once
//! """
//! body = """
//! y = x @ w                                # statements run every iteration
//! """
//! ```
//!
//! Any other key, in `[workload]` or outside it, is an error naming the key. At least one of
//! `setup` and `body` must hold a statement. Instead of a script, `[model]` and `[train]`
//! describe a standard model (`preset`) or a Hugging Face config (`hf`); a bare config.json
//! given as the workload is one too (its batch and seq set as parameters).
//!
//! # The line language of `setup` and `body`
//!
//! One statement per line; `#` starts a comment; blank lines are ignored; a line that ends
//! inside open `(` or `[` continues on the next line.
//!
//! - `x = EXPR`, `a, b = EXPR` (plain names only on the left; several names unpack the value)
//! - `del x` or `del x, y`
//! - a bare expression: `loss.backward()`, `keep(loss)`, `mark("after forward")`
//! - blocks, each closed by a line `}`, nesting freely: `no_grad {`, `autocast {`,
//!   `autocast(bf16) {`, `autocast(dtype=f16) {`, `checkpoint {`, `scope "encoder.layer3" {`,
//!   `phase "forward" {`
//!
//! Expressions, from loosest to tightest: `+ -`; `* / @`; unary `-`; calls `f(a, k=v)`, methods
//! `x.f(a, k=v)`, attributes `x.T`, indexing `x[0, 1:3, ::2, ..., none]`; atoms: integers
//! (`1_024`), floats (`0.5`, `1e-3`), strings (`"..."`, escapes `\"` and `\\` only), `true`,
//! `false`, `none`, names, `(expr)` and lists `[a, b]`. Keyword arguments follow positional
//! ones and may not repeat. The block keywords are ordinary names elsewhere (`checkpoint(f, x)`);
//! `del`, `true`, `false` and `none` are reserved.
//!
//! Strings in the line language are the line language's: inside a TOML `"""` string write
//! `\"` as `\\"` (or use a `'''` string, where TOML leaves backslashes alone).
//!
//! # Positions and errors
//!
//! Every statement and expression has a [`Span`]: the line and column of its first character
//! in the TOML file (columns count characters from 1; a parenthesised expression starts at its
//! `(`, `a + b` at `a`, `x.f()` at `x`). Every error is an [`Error::Input`] that reads
//! `FILE: line L column C: what is wrong, and what was expected`.
//!
//! Layout: [`ast`] the types; `source` positions in the TOML text; `lexer` and `parser` the
//! line language; `file` the TOML keys.

/// What a workload's `optimizer` (and `--optimizer`) may name: each optimizer the engine
/// steps (`OptimKind::parse` takes every one of them; tests/optim8.rs checks it) and `"none"`.
pub const OPTIMIZER_NAMES: &[&str] = &[
    "sgd",
    "sgd_momentum",
    "adam",
    "adamw",
    "adam8bit",
    "adamw8bit",
    "paged_adamw8bit",
    "torchao_adam8bit",
    "torchao_adamw8bit",
    "torchao_adam4bit",
    "torchao_adamw4bit",
    "none",
];

pub mod ast;
pub mod builtin;
pub mod check;
mod error;
mod file;
mod hf;
mod lexer;
pub mod limits;
mod parser;
mod preset;
mod source;
pub mod transform;
mod vision;

#[cfg(test)]
mod tests;

use std::path::Path;

pub use ast::{
    BinOp, BlockKind, Device, Expr, ExprKind, IndexItem, Span, Stmt, StmtKind, Workload,
};
pub use check::CheckTable;
pub use file::KNOWN_KEYS;
pub use parser::{MAX_DEPTH, MAX_NESTING};
pub use preset::{KvCacheInfo, PresetInfo};
pub use transform::Overrides;

use crate::error::{Error, Result};

/// Reads and parses the workload file at `path`.
pub fn load(path: &Path) -> Result<Workload> {
    load_with(path, &Overrides::default())
}

/// Reads and parses the workload file at `path` with `overrides` applied (parameters,
/// allocator settings, remedies).
pub fn load_with(path: &Path, overrides: &Overrides) -> Result<Workload> {
    match builtin::lookup(path) {
        Ok(Some(text)) => return parse_with(text, path, overrides),
        Ok(None) => {}
        Err(m) => return Err(Error::input(path, "preset", m)),
    }
    if let Some(text) = config_workload(path, overrides) {
        // a config that is not there is the user's path to fix, not a line of the workload
        // gpumem writes around it
        let file = if path.is_dir() {
            path.join("config.json")
        } else {
            path.to_path_buf()
        };
        if let Err(source) = std::fs::metadata(&file) {
            return Err(Error::Read { path: file, source });
        }
        return parse_with(&text, path, overrides)
            .map_err(|e| flag_error(e, &text, path))
            .map_err(config_error);
    }
    if path.is_dir() {
        return Err(Error::input(
            path,
            "folder",
            "holds no config.json: give a workload file (.toml), a Hugging Face config.json, or \
             a folder holding one",
        ));
    }
    let bytes =
        crate::input::read(path, crate::input::Kind::Text).map_err(|source| Error::Read {
            path: path.to_path_buf(),
            source,
        })?;
    parse_bytes(&bytes, path, overrides)
}

/// The command-line flag that writes each key of a bare config's generated workload.
const KEY_FLAGS: &[(&str, &str)] = &[
    ("batch", "--batch"),
    ("seq", "--seq"),
    ("new_tokens", "--new-tokens"),
    ("mode", "--mode"),
    ("optimizer", "--optimizer"),
    ("precision", "--precision"),
    ("dtype", "--dtype"),
    ("attention", "--attention"),
    ("gradient_checkpointing", "--gradient-checkpointing"),
    ("lora", "--lora-r"),
    ("r", "--lora-r"),
    ("alpha", "--lora-alpha"),
    ("dropout", "--lora-dropout"),
    ("target_modules", "--lora-targets"),
    ("iterations", "--iterations"),
    ("strategy", "--ddp or --fsdp2"),
    ("bucket_cap_mb", "--bucket-cap-mb"),
    ("param_dtype", "--param-dtype"),
    ("reduce_dtype", "--reduce-dtype"),
    ("reshard_after_forward", "--no-reshard-after-forward"),
    ("cpu_offload", "--cpu-offload"),
    ("world_size", "--world-size"),
    ("init", "--world-size"),
];

/// An error located in a bare config's generated workload (`text`), which the user never
/// saw: a usage error naming the flag that wrote the line (`--mode`), else the error as it is.
fn flag_error(e: Error, text: &str, config: &Path) -> Error {
    let Error::Input {
        location, message, ..
    } = &e
    else {
        return e;
    };
    // "line L column C" (or "line L")
    let Some(line) = location
        .strip_prefix("line ")
        .and_then(|r| r.split_whitespace().next())
        .and_then(|n| n.parse::<usize>().ok())
    else {
        return e;
    };
    let Some(src) = text.lines().nth(line.saturating_sub(1)) else {
        return e;
    };
    let key = match src.split_once('=') {
        Some((k, _)) => k.trim(),
        // a table header: [model.lora] is --lora-r's, [generate] --new-tokens'
        None if src.trim() == "[model.lora]" => "lora",
        None if src.trim() == "[generate]" => "new_tokens",
        None => src.trim(),
    };
    // a message about the config file itself (`hf_config`) is located in it where it says
    // so ("the config PATH: line L column C: ..."), else it keeps its own location
    if key == "hf_config" {
        let own = message
            .strip_prefix(&format!("the config {}: ", config.display()))
            .filter(|r| r.starts_with("line ") || r.starts_with("key '"))
            .and_then(|r| r.split_once(": "));
        return match own {
            Some((at, why)) => Error::input(config.to_path_buf(), at, why),
            None => e,
        };
    }
    // a refusal located at a table's header ([model] when the key came from the config's
    // own defaults) names its key in quotes: the flag that sets it
    let key = if key.starts_with('[') {
        message
            .split('\'')
            .skip(1)
            .find(|k| KEY_FLAGS.iter().any(|(f, _)| f == k))
            .unwrap_or(key)
    } else {
        key
    };
    // [model.lora]'s keys are reported at the table
    let key = match key {
        "lora" => ["target_modules", "alpha", "dropout"]
            .into_iter()
            .find(|k| message.contains(k))
            .unwrap_or("lora"),
        k => k,
    };
    match KEY_FLAGS.iter().find(|(k, _)| *k == key) {
        // (the config named once: some messages name it already)
        Some((_, flag)) if message.contains(&config.display().to_string()) => {
            Error::usage(*flag, message.to_string())
        }
        Some((_, flag)) => Error::usage(
            *flag,
            format!("{message} (with the config {})", config.display()),
        ),
        None => e,
    }
}

/// An error of a bare config's generated workload as the user should see it: a message about
/// the config (`CONFIG: 'key' ...`) located at the key's line in the config, not at a position
/// in the generated workload, which the user never wrote.
fn config_error(e: Error) -> Error {
    let Error::Input { message, .. } = &e else {
        return e;
    };
    let Some((file, rest)) = message.split_once(": ") else {
        return e;
    };
    // (a folder's config is its config.json)
    let file = match Path::new(file) {
        d if d.is_dir() => d.join("config.json"),
        f => f.to_path_buf(),
    };
    let Ok(text) = crate::input::read(&file, crate::input::Kind::Text) else {
        return e;
    };
    let text = String::from_utf8_lossy(&text);
    // the key the message names first ('vocab_size'), found as a JSON key
    let key = rest.split('\'').nth(1).filter(|k| !k.is_empty());
    let line = key.and_then(|k| {
        let quoted = format!("\"{k}\"");
        text.lines().position(|l| l.contains(&quoted))
    });
    let location = match line {
        Some(l) => format!("line {}", l + 1),
        None => "config".to_string(),
    };
    Error::input(file, location, rest)
}

/// Whether `path` is a Hugging Face config rather than a snapshot, where both may be JSON
/// (`check`, `diff`): a folder holding a config.json, or a `.json` file of at most 4 MiB that
/// names a `model_type`.
pub fn is_config_not_snapshot(path: &Path) -> bool {
    if path.is_dir() {
        return path.join("config.json").is_file();
    }
    if path.extension().is_none_or(|e| e != "json") {
        return false;
    }
    let small = std::fs::metadata(path).is_ok_and(|m| m.is_file() && m.len() <= 4 << 20);
    small
        && crate::input::read_text(path, crate::input::Kind::Text)
            .is_ok_and(|t| t.contains("\"model_type\""))
}

/// Whether `path` names a Hugging Face config (a `.json` file, or a folder holding a
/// config.json) rather than a workload.
pub fn is_config(path: &Path) -> bool {
    path.extension().is_some_and(|e| e == "json") || path.join("config.json").is_file()
}

/// The workload of a bare Hugging Face config: the model it describes, trained with AdamW
/// for 3 iterations at batch 1 and 1 token (the caller sets `batch` and `seq` as parameters),
/// with the `[model]`, `[model.lora]` and `[train]` settings of the command's flags.
fn config_workload(path: &Path, o: &Overrides) -> Option<String> {
    if !is_config(path) {
        return None;
    }
    // the config named by its file; a generic `config.json` (as a model's folder holds it) by
    // its folder too, so two models' configs are two names (`check` keys its baseline by them)
    let file = path.file_name()?.to_string_lossy().into_owned();
    let quoted = toml::Value::String(file.clone()).to_string();
    let mut name = file;
    if name == "config.json" {
        let folder = std::fs::canonicalize(path)
            .ok()
            .and_then(|p| Some(p.parent()?.file_name()?.to_string_lossy().into_owned()));
        if let Some(folder) = folder {
            name = format!("{folder}/{name}");
        }
    }
    let lines = |kv: &[(String, String)]| -> String {
        kv.iter().map(|(k, v)| format!("{k} = {v}\n")).collect()
    };
    let lora = if o.hf_lora.is_empty() {
        String::new()
    } else {
        format!("\n[model.lora]\n{}", lines(&o.hf_lora))
    };
    let distributed = if o.hf_distributed.is_empty() {
        String::new()
    } else {
        format!("\n[distributed]\n{}", lines(&o.hf_distributed))
    };
    Some(format!(
        "[workload]\nname = {}\n\n[model]\nhf_config = {quoted}\n{}{lora}\n[train]\nbatch = 1\nseq = 1\n{}",
        toml::Value::String(format!("{name} (Hugging Face config)")),
        lines(&o.hf_model),
        lines(&o.hf_train)
    ) + &distributed)
}

/// Parses the text of a workload file; `path` is only used in error messages.
pub fn parse(text: &str, path: &Path) -> Result<Workload> {
    parse_with(text, path, &Overrides::default())
}

/// [`parse`] with `overrides` applied.
pub fn parse_with(text: &str, path: &Path, overrides: &Overrides) -> Result<Workload> {
    // files named in the workload are found beside it
    let base = path.parent().unwrap_or(Path::new(""));
    let mut w = file::parse_file(text, overrides, base).map_err(|e| e.into_error(path))?;
    for p in [&mut w.weights, &mut w.data].into_iter().flatten() {
        if p.is_relative() {
            *p = base.join(&*p);
        }
    }
    Ok(w)
}

/// Parses a file's bytes: they must be UTF-8, as TOML requires.
fn parse_bytes(bytes: &[u8], path: &Path, overrides: &Overrides) -> Result<Workload> {
    match std::str::from_utf8(bytes) {
        Ok(text) => parse_with(text, path, overrides),
        Err(e) => {
            let valid = e.valid_up_to();
            let prefix = std::str::from_utf8(bytes.get(..valid).unwrap_or(&[])).unwrap_or("");
            let at = source::LineIndex::new(prefix).span(valid);
            let byte = bytes.get(valid).copied().unwrap_or(0);
            Err(Error::input(
                path,
                at.location(),
                format!("the file is not valid UTF-8 (byte 0x{byte:02x}); TOML files are UTF-8"),
            ))
        }
    }
}
