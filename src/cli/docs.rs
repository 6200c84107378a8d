//! The documentation generated from the clap definitions: the man pages and the shell
//! completion scripts (`man/`, checked by a test against these).

use super::Cli;

/// The clap command, for man pages and completions.
pub fn command() -> clap::Command {
    <Cli as clap::CommandFactory>::command()
}

/// The shell completion scripts, as `man/completions/` holds them: (file name, script).
pub fn completion_scripts() -> Vec<(String, Vec<u8>)> {
    use clap_complete::Shell;
    [
        (Shell::Bash, "gpumem.bash"),
        (Shell::Zsh, "_gpumem"),
        (Shell::Fish, "gpumem.fish"),
    ]
    .into_iter()
    .map(|(shell, name)| {
        let mut cmd = command();
        let mut buf = Vec::new();
        clap_complete::generate(shell, &mut cmd, "gpumem", &mut buf);
        (name.to_string(), buf)
    })
    .collect()
}

/// Renders the man pages: `gpumem.1` and one per subcommand (`gpumem-replay.1`, ...).
pub fn man_pages() -> Vec<(String, Vec<u8>)> {
    let cmd = command();
    let mut pages = Vec::new();
    let mut buf = Vec::new();
    clap_mangen::Man::new(cmd.clone())
        .render(&mut buf)
        .expect("render to memory");
    pages.push(("gpumem.1".to_string(), buf));
    for sub in cmd.get_subcommands() {
        let name = format!("gpumem-{}", sub.get_name());
        let sub = sub
            .clone()
            .name(name.clone())
            .version(env!("CARGO_PKG_VERSION"));
        let mut buf = Vec::new();
        clap_mangen::Man::new(sub)
            .render(&mut buf)
            .expect("render to memory");
        pages.push((format!("{name}.1"), buf));
    }
    pages
}
