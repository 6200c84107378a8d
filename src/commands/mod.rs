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
    let mut tmp = builder.tempfile_in(dir).map_err(err)?;
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
        Ok(_) if !(o.hf_train.is_empty() && o.hf_model.is_empty()) => {
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
    }
}
