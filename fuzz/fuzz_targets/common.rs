//! What the targets share: an input written to a file (the readers take paths), and a
//! command run the way the executable runs it.

use std::io::Write;

/// `data` in a temporary file named `name` (its extension picks the reader).
pub fn file(name: &str, data: &[u8]) -> (tempfile::TempDir, std::path::PathBuf) {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let path = dir.path().join(name);
    let mut f = std::fs::File::create(&path).expect("a temporary file");
    f.write_all(data).expect("written");
    (dir, path)
}

/// Runs `gpumem ARGS` in-process; any result is fine, a panic is the finding.
pub fn gpumem(args: &[&str]) {
    use clap::Parser as _;
    let cli = match gpumem::cli::Cli::try_parse_from(std::iter::once("gpumem").chain(args.iter().copied())) {
        Ok(c) => c,
        Err(_) => return,
    };
    let mut sink = Vec::new();
    let _ = gpumem::commands::run(&cli.command, &mut sink);
}
