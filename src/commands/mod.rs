//! One file per subcommand. Each takes its parsed arguments and a writer, and returns whether
//! it found something the user asked to fail on; `main.rs` turns that into the exit code.

pub mod bench;
pub mod compare_torch;
pub mod replay;
pub mod run;

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
/// never clobbers an existing one: a temporary file beside it, synced, then renamed over it.
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
    let name = path
        .file_name()
        .ok_or_else(|| err(std::io::Error::other("not a file name")))?;
    let tmp = dir.join(format!(
        ".{}.tmp{}",
        name.to_string_lossy(),
        std::process::id()
    ));
    let result = (|| {
        let mut f = std::fs::File::create(&tmp)?;
        f.write_all(bytes)?;
        f.sync_all()?;
        std::fs::rename(&tmp, path)
    })();
    if result.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    result.map_err(err)
}

pub fn run(cmd: &Command, out: &mut dyn Write) -> Result<Outcome> {
    match cmd {
        Command::Run(a) => run::run(a, out),
        Command::Replay(a) => replay::run(a, out),
        Command::Bench(a) => bench::run(a, out),
        Command::CompareTorch(a) => compare_torch::run_cmd(a, out),
    }
}
