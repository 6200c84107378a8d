//! The TOML layer of a workload file: the `[workload]` keys, their checks, and the hand-off of
//! `setup` and `body` to the line-language parser with their positions in the file.

use std::path::Path;

use serde::Deserialize;
use toml::{Spanned, Value};

use super::ast::{Device, Span, Stmt, Workload};
use super::error::{PResult, SyntaxError};
use super::parser::parse_stmts;
use super::preset::{self, Table};
use super::source::{locate, LineIndex, Text};
use super::transform::{self, Overrides};
use crate::alloc::AllocConf;
use crate::units::parse_size;

/// The keys of `[workload]`, in the order the format's documentation lists them.
pub const KNOWN_KEYS: &[&str] = &[
    "name",
    "iterations",
    "capacity",
    "alloc_conf",
    "device",
    "description",
    "setup",
    "body",
];

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawFile {
    workload: Option<Spanned<RawWorkload>>,
    model: Option<Spanned<Table>>,
    train: Option<Spanned<Table>>,
    generate: Option<Spanned<Table>>,
    distributed: Option<Spanned<Table>>,
    params: Option<Spanned<Table>>,
    check: Option<Spanned<Table>>,
    data: Option<Spanned<Table>>,
}

/// Every value is read as any TOML value so that a wrong type gets a message naming the key.
#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct RawWorkload {
    name: Option<Spanned<Value>>,
    iterations: Option<Spanned<Value>>,
    capacity: Option<Spanned<Value>>,
    alloc_conf: Option<Spanned<Value>>,
    device: Option<Spanned<Value>>,
    description: Option<Spanned<Value>>,
    setup: Option<Spanned<Value>>,
    body: Option<Spanned<Value>>,
}

fn type_name(v: &Value) -> &'static str {
    match v {
        Value::String(_) => "a string",
        Value::Integer(_) => "an integer",
        Value::Float(_) => "a float",
        Value::Boolean(_) => "a boolean",
        Value::Datetime(_) => "a date-time",
        Value::Array(_) => "an array",
        Value::Table(_) => "a table",
    }
}

/// Turns `toml`'s error into one at its position, with gpumem's wording for unknown keys.
fn toml_error(index: &LineIndex<'_>, e: &toml::de::Error) -> SyntaxError {
    let span = e.span().map_or(Span::new(1, 1), |r| index.span(r.start));
    let msg = e.message().trim();
    let unknown = msg.strip_prefix("unknown field `").and_then(|rest| {
        let end = rest
            .find("`, expected")
            .or_else(|| rest.find("`, there are no fields"))?;
        Some((rest.get(..end)?, rest.get(end..)?))
    });
    let message = match unknown {
        Some((key, rest)) if rest.contains("`workload`") => format!(
            "unknown table or key '{key}' at the top level: a workload file has [workload] \
             (setup and body, with integer [params]), or [model] and [train] (a preset), \
             an optional [distributed] (data-parallel training of a Hugging Face config) and \
             an optional [check] (tolerances and budgets for gpumem check); every key goes \
             in one of them"
        ),
        Some((key, _)) => format!(
            "unknown key '{key}' in [workload] (known: {})",
            KNOWN_KEYS.join(", ")
        ),
        None if msg.contains("expected struct RawWorkload") => format!(
            "'workload' must be a table: write [workload] on a line of its own and its keys \
             below it ({})",
            msg.replace("struct RawWorkload", "a table")
        ),
        None => format!("invalid TOML: {msg}"),
    };
    SyntaxError::new(span, message)
}

/// A preset's tables with the overrides applied, as if the user had written them.
fn override_preset(model: &mut Table, train: &mut Table, o: &Overrides, kind: &str) {
    let set = |t: &mut Table, key: &str, v: Value| {
        let range = t.get(key).map_or(0..0, |old| old.span());
        t.insert(key.to_string(), Spanned::new(range, v));
    };
    for (k, v) in &o.params {
        if preset::TRAIN_INTS.contains(&k.as_str())
            || (kind == "torchvision" && super::vision::TRAIN_KEYS.contains(&k.as_str()))
        {
            set(train, k, Value::Integer(*v));
        } else {
            set(model, k, Value::Integer(*v));
        }
    }
    let get = |t: &Table, key: &str| match t.get(key).map(|v| v.get_ref()) {
        Some(Value::String(s)) => Some(s.clone()),
        _ => None,
    };
    if o.bf16_autocast {
        set(train, "precision", Value::String("bf16-autocast".into()));
    }
    if o.checkpointing && kind == "gpt" {
        set(train, "checkpointing", Value::Boolean(true));
    }
    if o.sgd || o.optim8bit {
        let opt = get(train, "optimizer").unwrap_or_else(|| "adamw".into());
        if opt == "adam" || opt == "adamw" {
            let to = if o.sgd {
                "sgd".into()
            } else {
                format!("{opt}8bit")
            };
            set(train, "optimizer", Value::String(to));
        }
    }
    if o.no_grad_eval && get(train, "mode").as_deref() == Some("eval-with-graph") {
        set(train, "mode", Value::String("inference".into()));
    }
    if o.keep_item {
        set(train, "keep_loss", Value::String("item".into()));
    }
}

/// Parses and checks the whole file, with `overrides` applied.
pub(crate) fn parse_file(text: &str, overrides: &Overrides, base: &Path) -> PResult<Workload> {
    let index = LineIndex::new(text);
    let raw: RawFile = toml::from_str(text).map_err(|e| toml_error(&index, &e))?;
    let span_of = |offset: usize| index.span(offset);
    let preset = match &raw.model {
        Some(model) => {
            let model_at = index.span(model.span().start);
            let train_at = raw
                .train
                .as_ref()
                .map_or(model_at, |t| index.span(t.span().start));
            let (mut model_t, mut train_t) = (
                model.get_ref().clone(),
                raw.train.as_ref().map(|t| t.get_ref().clone()),
            );
            let mut generate_t = raw
                .generate
                .as_ref()
                .map(|t| (t.get_ref().clone(), index.span(t.span().start)));
            if !overrides.is_empty() && super::hf::is_hf(&model_t) {
                let t = train_t.get_or_insert_with(Table::new);
                let set = |t: &mut Table, k: &str, v: Value| {
                    let range = t.get(k).map_or(0..0, |old| old.span());
                    t.insert(k.to_string(), Spanned::new(range, v));
                };
                for (k, v) in &overrides.params {
                    if k == "new_tokens" {
                        // the generation's length lives in [generate]
                        let g = generate_t.get_or_insert_with(|| (Table::new(), model_at));
                        set(&mut g.0, k, Value::Integer(*v));
                    } else {
                        set(t, k, Value::Integer(*v));
                    }
                }
                // the remedies a config's loop takes
                if overrides.bf16_autocast {
                    set(t, "precision", Value::String("bf16-autocast".into()));
                }
                if overrides.checkpointing {
                    set(&mut model_t, "gradient_checkpointing", Value::Boolean(true));
                }
                if overrides.bf16_weights {
                    set(&mut model_t, "dtype", Value::String("bf16".into()));
                }
                if overrides.lora_attention && !model_t.contains_key("lora") {
                    set(&mut model_t, "lora", super::hf::attention_lora());
                }
                let opt = match t.get("optimizer").map(|v| v.get_ref()) {
                    Some(Value::String(o)) => o.clone(),
                    _ => "adamw".into(),
                };
                if overrides.sgd && (opt == "adam" || opt == "adamw") {
                    set(t, "optimizer", Value::String("sgd".into()));
                } else if overrides.optim8bit && (opt == "adam" || opt == "adamw") {
                    set(t, "optimizer", Value::String(format!("{opt}8bit")));
                }
            } else if !overrides.is_empty() {
                let kind = match model_t.get("kind").map(|v| v.get_ref()) {
                    Some(Value::String(k)) => k.clone(),
                    _ if super::vision::is_vision(&model_t) => "torchvision".into(),
                    _ => String::new(),
                };
                let t = train_t.get_or_insert_with(Table::new);
                override_preset(&mut model_t, t, overrides, &kind);
            }
            let mut distributed_t = raw
                .distributed
                .as_ref()
                .map(|t| (t.get_ref().clone(), index.span(t.span().start)));
            // the sharding remedies: keys of [distributed] set over the workload's
            if let Some((t, _)) = &mut distributed_t {
                for (k, v) in &overrides.distributed_set {
                    if v.is_empty() {
                        // (an empty value removes the key)
                        t.remove(k.as_str());
                        continue;
                    }
                    if let Ok(mut one) = format!("v = {v}").parse::<toml::Table>() {
                        if let Some(val) = one.remove("v") {
                            let range = t.get(k.as_str()).map_or(0..0, |old| old.span());
                            t.insert(k.clone(), Spanned::new(range, val));
                        }
                    }
                }
            }
            if let (Some((_, at)), false) = (&distributed_t, super::hf::is_hf(&model_t)) {
                return Err(SyntaxError::new(
                    *at,
                    "[distributed] is modelled for a Hugging Face config (hf_config in [model]) \
                     only, for now: remove it, or measure the model from its config.json",
                ));
            }
            if let (Some((_, at)), false) = (&generate_t, super::hf::is_hf(&model_t)) {
                return Err(SyntaxError::new(
                    *at,
                    "[generate] describes model.generate for a Hugging Face config: add \
                     hf_config to [model], or remove [generate]",
                ));
            }
            let expanded = if super::hf::is_hf(&model_t) {
                super::hf::expand(
                    &model_t,
                    model_at,
                    train_t.as_ref(),
                    train_at,
                    generate_t.as_ref().map(|(t, at)| (t, *at)),
                    distributed_t.as_ref().map(|(t, at)| (t, *at)),
                    base,
                    &span_of,
                )?
            } else if super::vision::is_vision(&model_t) {
                super::vision::expand(&model_t, model_at, train_t.as_ref(), train_at, &span_of)?
            } else {
                preset::expand(&model_t, model_at, train_t.as_ref(), train_at, &span_of)?
            };
            tracing::trace!(
                setup = %expanded.setup,
                body = %expanded.body,
                "the script gpumem wrote for the [model] table"
            );
            Some((model_at, expanded))
        }
        None => {
            if let Some(t) = &raw.distributed {
                return Err(SyntaxError::new(
                    index.span(t.span().start),
                    "[distributed] wraps a model: add a [model] table with hf_config = \
                     \"config.json\", or remove [distributed]",
                ));
            }
            if let Some(t) = &raw.generate {
                return Err(SyntaxError::new(
                    index.span(t.span().start),
                    "[generate] describes model.generate for a Hugging Face config: add a \
                     [model] table with hf_config = \"config.json\", or remove [generate]",
                ));
            }
            if let Some(t) = &raw.train {
                return Err(SyntaxError::new(
                    index.span(t.span().start),
                    "[train] describes the loop of a model preset: add a [model] table \
                     (kind = \"mlp\" or \"gpt\") or remove [train]",
                ));
            }
            None
        }
    };
    let (header, w) = match (raw.workload, &preset) {
        (Some(table), _) => (index.span(table.span().start), table.into_inner()),
        (None, Some((at, _))) => (*at, RawWorkload::default()),
        (None, None) => {
            return Err(SyntaxError::new(
                Span::new(1, 1),
                "missing the [workload] table: a workload file starts with [workload], then \
                 name = \"...\" and a body = \"\"\"...\"\"\" (or describes a standard model \
                 with [model] and [train])",
            ))
        }
    };
    if let Some((_, p)) = &preset {
        for (key, v, instead) in [
            ("setup", &w.setup, "the preset builds the model"),
            ("body", &w.body, "the preset runs the loop"),
            ("iterations", &w.iterations, "give it in [train]"),
        ] {
            if let Some(v) = v {
                return Err(SyntaxError::new(
                    index.span(v.span().start),
                    format!(
                        "'{key}' in [workload] can't be combined with a [model] preset \
                         ({instead}; kind = \"{}\")",
                        p.kind
                    ),
                ));
            }
        }
    }
    let at = |v: &Spanned<Value>| index.span(v.span().start);
    let string = |v: &Spanned<Value>, key: &str| -> PResult<String> {
        match v.get_ref() {
            Value::String(s) => Ok(s.clone()),
            other => Err(SyntaxError::new(
                at(v),
                format!("'{key}' must be a string, found {}", type_name(other)),
            )),
        }
    };

    let name =
        match &w.name {
            None if preset.is_some() => preset
                .as_ref()
                .map(|(_, p)| format!("{} preset", p.kind))
                .unwrap_or_default(),
            None => return Err(SyntaxError::new(
                header,
                "missing required key 'name' in [workload] (name = \"what this workload shows\")",
            )),
            Some(v) => {
                let s = string(v, "name")?;
                if s.trim().is_empty() {
                    return Err(SyntaxError::new(at(v), "'name' must not be empty"));
                }
                s
            }
        };

    let iterations = match &w.iterations {
        None => preset.as_ref().map_or(1, |(_, p)| p.iterations),
        Some(v) => match v.get_ref() {
            Value::Integer(i) => match u32::try_from(*i) {
                Ok(n) if n >= 1 => match super::limits::exceeded("iterations", n.into()) {
                    None => n,
                    Some(why) => {
                        return Err(SyntaxError::new(
                            at(v),
                            format!("'iterations' must be at most {why}"),
                        ))
                    }
                },
                _ if *i < 1 => {
                    return Err(SyntaxError::new(
                        at(v),
                        format!("'iterations' must be at least 1, found {i}"),
                    ))
                }
                _ => {
                    return Err(SyntaxError::new(
                        at(v),
                        format!("'iterations' must be at most {}, found {i}", u32::MAX),
                    ))
                }
            },
            other => {
                return Err(SyntaxError::new(
                    at(v),
                    format!(
                        "'iterations' must be an integer of at least 1, found {}",
                        type_name(other)
                    ),
                ))
            }
        },
    };

    let capacity = match &w.capacity {
        None => None,
        Some(v) => {
            let bytes = match v.get_ref() {
                Value::String(s) => parse_size(s)
                    .map_err(|m| SyntaxError::new(at(v), format!("'capacity': {m}")))?,
                Value::Integer(i) => u64::try_from(*i).unwrap_or(0),
                other => {
                    return Err(SyntaxError::new(
                        at(v),
                        format!(
                            "'capacity' must be a size: a string such as \"24GiB\" or an \
                             integer number of bytes, found {}",
                            type_name(other)
                        ),
                    ))
                }
            };
            crate::units::check_capacity(bytes)
                .map_err(|m| SyntaxError::new(at(v), format!("'capacity' {m}")))?;
            Some(bytes)
        }
    };

    let (alloc_conf, alloc_conf_from) = match (&overrides.alloc_conf, &w.alloc_conf) {
        (Some(conf), _) => (
            AllocConf::parse(conf).map_err(|e| {
                SyntaxError::new(header, format!("bad allocator settings '{conf}': {e}"))
            })?,
            "--alloc-conf".to_string(),
        ),
        (None, Some(v)) => (
            AllocConf::parse(&string(v, "alloc_conf")?)
                .map_err(|e| SyntaxError::new(at(v), format!("bad 'alloc_conf': {e}")))?,
            "alloc_conf".to_string(),
        ),
        (None, None) => match &overrides.env_alloc_conf {
            Some((var, conf)) => (
                AllocConf::parse(conf).map_err(|e| {
                    SyntaxError::new(
                        header,
                        format!("bad {var}='{conf}' in the environment: {e}"),
                    )
                })?,
                var.clone(),
            ),
            None => (AllocConf::default(), "default".to_string()),
        },
    };

    let device = match &w.device {
        None => Device::default(),
        Some(v) => match string(v, "device")?.as_str() {
            "sim" => Device::Sim,
            "cpu" => Device::Cpu,
            "cuda" => Device::Cuda,
            other => {
                return Err(SyntaxError::new(
                    at(v),
                    format!("unknown device '{other}': expected \"sim\", \"cpu\" or \"cuda\""),
                ))
            }
        },
    };

    let description = w
        .description
        .as_ref()
        .map(|v| string(v, "description"))
        .transpose()?;

    let statements = |v: &Option<Spanned<Value>>, key: &str| -> PResult<Vec<Stmt>> {
        let Some(v) = v else {
            return Ok(Vec::new());
        };
        let value = string(v, key)?;
        let range = v.span();
        let raw = text.get(range.clone()).unwrap_or("");
        let located = locate(&index, raw, range.start, &value);
        parse_stmts(&located, key)
    };
    let mut params: Vec<(String, i64)> = Vec::new();
    if let Some(t) = &raw.params {
        if preset.is_some() {
            return Err(SyntaxError::new(
                index.span(t.span().start),
                "[params] is for workloads with setup and body scripts; a preset's parameters \
                 are the integer keys of [model] and [train]",
            ));
        }
        for (k, v) in t.get_ref() {
            match v.get_ref() {
                Value::Integer(i) => params.push((k.clone(), *i)),
                other => {
                    return Err(SyntaxError::new(
                        at(v),
                        format!(
                            "parameter '{k}' in [params] must be an integer, found {}",
                            type_name(other)
                        ),
                    ))
                }
            }
            if !super::lexer::is_identifier(k) {
                return Err(SyntaxError::new(
                    at(v),
                    format!("parameter '{k}' in [params] must be a name (letters, digits, _)"),
                ));
            }
        }
    }
    if preset.is_none() {
        for (k, v) in &overrides.params {
            match params.iter_mut().find(|(n, _)| n == k) {
                Some(p) => p.1 = *v,
                None => {
                    return Err(SyntaxError::new(
                        header,
                        format!("the workload has no parameter '{k}' in [params]"),
                    ))
                }
            }
        }
    }
    let (mut setup, mut body) = match &preset {
        Some((at, p)) => {
            // Generated text: every position is the [model] table's.
            let text = |src: &str| Text {
                chars: src.chars().map(|c| (c, *at)).collect(),
                end: *at,
            };
            (
                parse_stmts(&text(&p.setup), "setup")?,
                parse_stmts(&text(&p.body), "body")?,
            )
        }
        None => (statements(&w.setup, "setup")?, statements(&w.body, "body")?),
    };
    if setup.is_empty() && body.is_empty() {
        return Err(SyntaxError::new(
            header,
            "the workload has no statements: give 'setup' or 'body' (or both) at least one \
             statement",
        ));
    }

    if preset.is_none() {
        apply_to_script(&mut setup, &mut body, overrides);
    }

    let mut check = super::check::CheckTable::default();
    if let Some(t) = &raw.check {
        use super::check::SettingValue;
        for (k, v) in t.get_ref() {
            let value = match v.get_ref() {
                Value::String(s) => SettingValue::Str(s),
                Value::Integer(i) => SettingValue::Int(*i),
                other => SettingValue::Other(type_name(other)),
            };
            check
                .set(k, value)
                .map_err(|m| SyntaxError::new(at(v), format!("[check]: {m}")))?;
        }
    }

    let data = match &raw.data {
        None => None,
        Some(t) => {
            let mut file = None;
            for (k, v) in t.get_ref() {
                match (k.as_str(), v.get_ref()) {
                    ("file", Value::String(p)) if !p.is_empty() => file = Some(p.into()),
                    ("file", other) => {
                        return Err(SyntaxError::new(
                            at(v),
                            format!(
                                "'file' in [data] must be the path of a safetensors file of \
                                 batches, found {}",
                                type_name(other)
                            ),
                        ))
                    }
                    (other, _) => {
                        return Err(SyntaxError::new(
                            at(v),
                            format!("unknown key '{other}' in [data] (known: file)"),
                        ))
                    }
                }
            }
            if file.is_none() {
                return Err(SyntaxError::new(
                    index.span(t.span().start),
                    "[data] needs file = \"batch.safetensors\"",
                ));
            }
            file
        }
    };
    let weights = preset
        .as_ref()
        .and_then(|(_, p)| p.weights.as_ref().map(|(w, _)| w.into()));
    Ok(Workload {
        name,
        iterations,
        weights,
        data,
        capacity,
        alloc_conf,
        alloc_conf_from,
        device,
        description,
        setup,
        body,
        params,
        preset: preset.map(|(_, p)| p.info),
        check,
    })
}

/// The script-level remedies (see [`transform`]).
fn apply_to_script(setup: &mut [Stmt], body: &mut Vec<Stmt>, o: &Overrides) {
    use super::ast::BlockKind;
    if o.sgd {
        transform::adam_to_sgd(setup);
        transform::adam_to_sgd(body);
    } else if o.optim8bit {
        transform::adam_to_8bit(setup);
        transform::adam_to_8bit(body);
    }
    if o.keep_item {
        transform::keep_to_item(body);
    }
    if o.no_grad_eval && !transform::calls_method(body, "backward") {
        *body = transform::wrap(std::mem::take(body), BlockKind::NoGrad);
    }
    if o.bf16_autocast {
        *body = transform::wrap(
            std::mem::take(body),
            BlockKind::Autocast {
                dtype: Some("bf16".into()),
            },
        );
    }
}
