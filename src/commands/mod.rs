//! One file per subcommand. Each takes its parsed arguments and a writer, and returns whether
//! it found something the user asked to fail on; `main.rs` turns that into the exit code.

pub mod bench;
pub mod check;
pub mod compare_torch;
pub mod completions;
pub mod devices;
pub mod diff;
pub mod export;
pub mod fit;
pub mod mcp;
pub mod plot;
pub mod replay;
pub mod run;
pub mod selftest;
pub mod summary;

use std::io::Write;

use crate::cli::Command;
use crate::error::Result;

/// What a command found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// All good: exit 0.
    Ok,
    /// A finding the user asked to fail on: exit 1.
    Finding,
}

/// Refuses an output file (given with `flag`) that is one of the command's inputs: writing
/// there would replace the snapshot, workload or baseline the user recorded or committed.
/// Checked before anything runs.
pub fn refuse_output_over_input(
    flag: &str,
    output: &std::path::Path,
    inputs: &[&std::path::Path],
) -> Result<()> {
    let Ok(out) = std::fs::canonicalize(output) else {
        // (not there yet: it is none of the inputs, which exist)
        return Ok(());
    };
    for input in inputs {
        if std::fs::canonicalize(input).is_ok_and(|i| i == out) {
            return Err(crate::error::Error::usage(
                flag,
                format!(
                    "{} is also an input of this command: writing there would replace it; \
                     give another file",
                    output.display()
                ),
            ));
        }
    }
    Ok(())
}

/// Refuses a plot file named as another format (`-o plot.png`): the plot is SVG, and a file
/// named `.png` that holds SVG opens nowhere.
pub fn refuse_non_svg(flag: &str, output: &std::path::Path) -> Result<()> {
    match output.extension().and_then(|e| e.to_str()) {
        Some(e) if !e.eq_ignore_ascii_case("svg") => Err(crate::error::Error::usage(
            flag,
            format!(
                "{}: the plot is SVG: name the file .svg (convert it with any SVG tool for \
                 another format)",
                output.display()
            ),
        )),
        _ => Ok(()),
    }
}

/// Writes `bytes` to `path` so that a reader never sees a half-written file and a failed write
/// never clobbers an existing one: `tempfile` makes a randomly named file beside it (opened
/// exclusively, so a planted link is not followed), which is synced and then renamed over it.
pub fn write_atomic(path: &std::path::Path, bytes: &[u8]) -> Result<()> {
    use std::io::Write as _;
    let err = |source| crate::error::Error::Write {
        path: path.to_path_buf(),
        source,
    };
    let dir = path
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(std::path::Path::new("."));
    if path.file_name().is_none() {
        return Err(err(std::io::Error::other("not a file name")));
    }
    let mut builder = tempfile::Builder::new();
    builder.prefix(".gpumem-");
    // an ordinary file's mode (0666 less the umask), not tempfile's private 0600
    #[cfg(unix)]
    builder.permissions(std::os::unix::fs::PermissionsExt::from_mode(0o666));
    // (tempfile's own message names its temporary file, which the user never asked for)
    let mut tmp = builder.tempfile_in(dir).map_err(|e| {
        err(if dir.is_dir() {
            std::io::Error::new(
                e.kind(),
                format!("cannot create a file in {}", dir.display()),
            )
        } else {
            std::io::Error::new(e.kind(), format!("no folder {}", dir.display()))
        })
    })?;
    let _known = crate::interrupt::TempFile::register(tmp.path());
    tmp.write_all(bytes).map_err(err)?;
    tmp.as_file().sync_all().map_err(err)?;
    // stopped while writing: the temporary file goes (dropped) and the target stays as it was
    crate::interrupt::check()?;
    tmp.persist(path).map_err(|e| err(e.error))?;
    tracing::debug!(path = %path.display(), bytes = bytes.len(), "wrote");
    Ok(())
}

/// `--iterations N`: at least 1, at most the bound a workload's `iterations` has.
pub fn check_iterations(n: Option<u32>) -> Result<()> {
    let Some(n) = n else { return Ok(()) };
    if n == 0 {
        return Err(crate::error::Error::usage(
            "--iterations",
            "must be at least 1",
        ));
    }
    match crate::workload::limits::exceeded("iterations", n.into()) {
        Some(why) => Err(crate::error::Error::usage(
            "--iterations",
            format!("must be at most {why}"),
        )),
        None => Ok(()),
    }
}

/// `--param NAME=VALUE` flags and `--alloc-conf` as workload overrides (checked here; the
/// names are checked against the workload by [`load_workload`]).
pub fn parse_overrides(
    params: &[String],
    alloc_conf: Option<&str>,
) -> Result<crate::workload::Overrides> {
    let mut o = crate::workload::Overrides::default();
    for p in params {
        let Some((k, v)) = p.split_once('=') else {
            return Err(crate::error::Error::usage(
                "--param",
                format!("'{p}' is not NAME=VALUE (e.g. --param batch=16)"),
            ));
        };
        let v: i64 = v.trim().replace('_', "").parse().map_err(|_| {
            crate::error::Error::usage("--param", format!("'{p}': the value must be an integer"))
        })?;
        if let Some(why) = u64::try_from(v)
            .ok()
            .and_then(|n| crate::workload::limits::exceeded(k.trim(), n))
        {
            return Err(crate::error::Error::usage(
                "--param",
                format!("'{p}': '{}' must be at most {why}", k.trim()),
            ));
        }
        o.params.push((k.trim().to_string(), v));
    }
    if let Some(c) = alloc_conf {
        crate::alloc::AllocConf::parse(c)
            .map_err(|e| crate::error::Error::usage("--alloc-conf", e.to_string()))?;
        o.alloc_conf = Some(c.to_string());
    }
    o.env_alloc_conf = env_alloc_conf(&|k| std::env::var(k).ok())?;
    Ok(o)
}

/// The allocator settings of the environment, as PyTorch reads them: `PYTORCH_ALLOC_CONF`
/// (PyTorch 2.9's name), else `PYTORCH_CUDA_ALLOC_CONF`; empty counts as unset. A value PyTorch
/// would refuse is a usage error naming the variable.
pub fn env_alloc_conf(env: &dyn Fn(&str) -> Option<String>) -> Result<Option<(String, String)>> {
    for var in ["PYTORCH_ALLOC_CONF", "PYTORCH_CUDA_ALLOC_CONF"] {
        if let Some(v) = env(var).filter(|v| !v.trim().is_empty()) {
            crate::alloc::AllocConf::parse(&v).map_err(|e| {
                crate::error::Error::usage(var, format!("'{v}' in the environment: {e}"))
            })?;
            tracing::debug!(var, value = %v, "allocator settings from the environment");
            return Ok(Some((var.to_string(), v)));
        }
    }
    Ok(None)
}

/// The overrides of a command's flags: `--param NAME=VALUE`, `--alloc-conf`, and the
/// [`ModelArgs`](crate::cli::ModelArgs) (`--batch`, `--seq`, `--new-tokens` as parameters; a bare
/// config's `--dtype`, `--lora-r`, ... as its tables' keys). A bare config must be given each
/// of `required` (`batch`, `seq`) that is not searched.
pub fn model_overrides(
    workload: &std::path::Path,
    m: &crate::cli::ModelArgs,
    extra_params: &[String],
    alloc_conf: Option<&str>,
    required: &[&str],
) -> Result<crate::workload::Overrides> {
    use crate::error::Error;
    let mut params = extra_params.to_vec();
    for (k, flag, v) in [
        ("batch", "--batch", m.batch),
        ("seq", "--seq", m.seq),
        ("new_tokens", "--new-tokens", m.new_tokens),
    ] {
        if let Some(v) = v {
            // checked here so that the message names the flag typed, not `--param`
            if v == 0 {
                return Err(Error::usage(flag, "must be at least 1"));
            }
            if let Some(why) = crate::workload::limits::exceeded(k, v) {
                return Err(Error::usage(flag, format!("must be at most {why}")));
            }
            if i64::try_from(v).is_err() {
                return Err(Error::usage(flag, format!("must be at most {}", i64::MAX)));
            }
            params.push(format!("{k}={v}"));
        }
    }
    if m.lora_r == Some(0) {
        return Err(Error::usage("--lora-r", "the LoRA rank must be at least 1"));
    }
    if let Some(p) = m.lora_dropout {
        if !(0.0..1.0).contains(&p) {
            return Err(Error::usage(
                "--lora-dropout",
                format!("must be at least 0 and below 1, found {p}"),
            ));
        }
    }
    if let Some(a) = m.lora_alpha {
        if !(a.is_finite() && a > 0.0) {
            return Err(Error::usage(
                "--lora-alpha",
                format!("must be positive, found {a}"),
            ));
        }
    }
    if crate::workload::is_config(workload) {
        let given = |k: &str| params.iter().any(|p| p.split('=').next() == Some(k));
        for k in required {
            if !given(k) {
                return Err(Error::usage(
                    format!("--{k}"),
                    format!(
                        "{} is a Hugging Face config: give the batch size and the tokens per \
                         sample, e.g. --batch 4 --seq 1024 (or write a workload with [model] \
                         hf_config = ... and [train])",
                        workload.display(),
                    ),
                ));
            }
        }
    }
    let mut overrides = parse_overrides(&params, alloc_conf)?;
    // on a bare config, tokens to generate mean a generation: --new-tokens implies
    // --mode generate (a workload file says its mode in [train])
    if let (true, Some(_), Some(mode)) = (
        crate::workload::is_config(workload),
        m.new_tokens,
        m.mode.as_deref().filter(|md| *md != "generate"),
    ) {
        return Err(Error::usage(
            "--new-tokens",
            format!(
                "--new-tokens is the length of a generation, and --mode {mode} generates \
                 nothing: drop one (--new-tokens alone implies --mode generate)"
            ),
        ));
    }
    let implied;
    let m = if crate::workload::is_config(workload) && m.new_tokens.is_some() && m.mode.is_none() {
        implied = crate::cli::ModelArgs {
            mode: Some("generate".into()),
            ..m.clone()
        };
        &implied
    } else {
        m
    };
    config_flags(workload, m, &mut overrides)?;
    Ok(overrides)
}

/// The flags that set a bare config's `[model]`, `[model.lora]` and `[train]` keys; with a
/// workload file they are a usage error (its tables hold them).
fn config_flags(
    workload: &std::path::Path,
    args: &crate::cli::ModelArgs,
    o: &mut crate::workload::Overrides,
) -> Result<()> {
    use crate::error::Error;
    let q = |s: &str| toml::Value::String(s.to_string()).to_string();
    let mut model = Vec::new();
    let mut train = Vec::new();
    let mut lora = Vec::new();
    let mut given: Vec<&str> = Vec::new();
    for (flag, key, v, to) in [
        ("--optimizer", "optimizer", &args.optimizer, 't'),
        ("--precision", "precision", &args.precision, 't'),
        ("--mode", "mode", &args.mode, 't'),
        ("--dtype", "dtype", &args.dtype, 'm'),
        ("--attention", "attention", &args.attention, 'm'),
    ] {
        if let Some(v) = v {
            given.push(flag);
            let line = (key.to_string(), q(v));
            if to == 't' {
                train.push(line);
            } else {
                model.push(line);
            }
        }
    }
    if args.gradient_checkpointing {
        given.push("--gradient-checkpointing");
        model.push(("gradient_checkpointing".into(), "true".into()));
    }
    if let Some(r) = args.lora_r {
        given.push("--lora-r");
        lora.push(("r".into(), r.to_string()));
        if let Some(a) = args.lora_alpha {
            lora.push(("alpha".into(), toml::Value::Float(a).to_string()));
        }
        if let Some(p) = args.lora_dropout {
            lora.push(("dropout".into(), toml::Value::Float(p).to_string()));
        }
        if let Some(t) = &args.lora_targets {
            // peft's "all-linear" and gpumem's "attention" name a set, not a module
            let value = if matches!(t.trim(), "all-linear" | "attention") {
                toml::Value::String(t.trim().to_string())
            } else {
                toml::Value::Array(
                    t.split(',')
                        .map(|n| toml::Value::String(n.trim().to_string()))
                        .collect(),
                )
            };
            lora.push(("target_modules".into(), value.to_string()));
        }
    }
    let mut distributed = Vec::new();
    if args.ddp {
        given.push("--ddp");
        distributed.push(("strategy".to_string(), q("ddp")));
        if let Some(mb) = args.bucket_cap_mb {
            distributed.push(("bucket_cap_mb".to_string(), mb.to_string()));
        }
    }
    if let Some(stage) = args.zero {
        given.push("--zero");
        distributed.push(("strategy".to_string(), q(&format!("zero{stage}"))));
        if let Some(n) = args.reduce_bucket_size {
            distributed.push(("reduce_bucket_size".to_string(), n.to_string()));
        }
        if args.cpu_offload {
            distributed.push(("cpu_offload".to_string(), "true".into()));
        }
    }
    if args.cpu_offload && !args.fsdp2 && args.zero.is_none() {
        return Err(Error::usage(
            "--cpu-offload",
            "--cpu-offload offloads a sharded run: add --fsdp2 (CPUOffloadPolicy) or --zero 1|2|3 \
             (offload_optimizer)",
        ));
    }
    if let Some(n) = args.world_size {
        if !args.ddp && !args.fsdp2 && args.zero.is_none() {
            return Err(Error::usage(
                "--world-size",
                "--world-size needs a strategy: add --ddp, --fsdp2 or --zero 1|2|3",
            ));
        }
        distributed.push(("world_size".to_string(), n.to_string()));
    }
    if args.fsdp2 {
        given.push("--fsdp2");
        distributed.push(("strategy".to_string(), q("fsdp2")));
        if let Some(d) = &args.param_dtype {
            distributed.push(("param_dtype".to_string(), q(d)));
        }
        if let Some(d) = &args.reduce_dtype {
            distributed.push(("reduce_dtype".to_string(), q(d)));
        }
        if args.no_reshard_after_forward {
            distributed.push(("reshard_after_forward".to_string(), "false".into()));
        }
        if args.cpu_offload {
            distributed.push(("cpu_offload".to_string(), "true".into()));
        }
    }
    if given.is_empty() {
        return Ok(());
    }
    if !crate::workload::is_config(workload) {
        return Err(Error::usage(
            given[0],
            format!(
                "{} sets a bare Hugging Face config's key; {} is a workload file: set it in its [model], [train] or [distributed] table",
                given[0],
                workload.display()
            ),
        ));
    }
    o.hf_model = model;
    o.hf_lora = lora;
    o.hf_train = train;
    o.hf_distributed = distributed;
    Ok(())
}

/// Loads a workload with overrides, first checking that every `--param` names one of its
/// integer parameters (a usage error otherwise, listing them).
pub fn load_workload(
    path: &std::path::Path,
    o: &crate::workload::Overrides,
) -> Result<crate::workload::Workload> {
    if o.params.is_empty() {
        return crate::workload::load_with(path, o);
    }
    // (a bare config's flags can make a parameter: --mode generate gives new_tokens)
    let plain = match crate::workload::load(path) {
        // (the config alone may be refused for what a flag changes: its bf16 `torch_dtype`
        // where `--dtype fp32` is given)
        Ok(_) | Err(_) if !(o.hf_train.is_empty() && o.hf_model.is_empty()) => {
            // the flags' workload without the parameters being checked: its error (a mode
            // the model has not, say) is the one to show
            let mut flags_only = o.clone();
            // (--new-tokens is a flag's parameter: generation needs it)
            flags_only.params.retain(|(k, _)| k == "new_tokens");
            crate::workload::load_with(path, &flags_only)?
        }
        r => r?,
    };
    let known = plain.integer_params();
    for (k, v) in &o.params {
        if !known.iter().any(|(n, _)| n == k) {
            let names: Vec<&str> = known.iter().map(|(n, _)| n.as_str()).collect();
            return Err(crate::error::Error::usage(
                "--param",
                format!(
                    "{} has no integer parameter '{k}' ({})",
                    path.display(),
                    if names.is_empty() {
                        "it has none: declare one in a [params] table, e.g. batch = 32".into()
                    } else {
                        format!("it has: {}", names.join(", "))
                    }
                ),
            ));
        }
        if *v < 1 && plain.preset.is_some() {
            return Err(crate::error::Error::usage(
                "--param",
                format!("{k}={v}: a preset's parameters are at least 1"),
            ));
        }
    }
    crate::workload::load_with(path, o)
}

pub fn run(cmd: &Command, out: &mut dyn Write) -> Result<Outcome> {
    match cmd {
        Command::Run(a) => run::run(a, out),
        Command::Summary(a) => summary::run(a, out),
        Command::Check(a) => check::run(a, out),
        Command::Export(a) => export::run(a, out),
        Command::Diff(a) => diff::run(a, out),
        Command::Fit(a) => fit::run(a, out),
        Command::Plot(a) => plot::run(a, out),
        Command::Replay(a) => replay::run(a, out),
        Command::Bench(a) => bench::run(a, out),
        Command::CompareTorch(a) => compare_torch::run_cmd(a, out),
        Command::Devices(a) => devices::run(a, out),
        Command::Selftest(a) => selftest::run(a, out),
        Command::Completions(a) => completions::run(a, out),
        Command::Mcp(a) => mcp::run(a, out),
    }
}
