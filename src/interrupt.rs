//! Ctrl-C and SIGTERM: the first asks gpumem to stop, and long work (the script runner, snapshot
//! reading) polls [`requested`] and unwinds through its normal error path, so temporary files
//! are removed and existing outputs are left as they were; `main.rs` exits 130. Work that does
//! not poll (a benchmark, a read blocked on a pipe) is ended after [`GRACE`] by the handler
//! itself, which first removes the temporary files being written ([`TempFile`]). A second signal
//! exits at once, the same way.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;
use std::time::Duration;

static REQUESTED: AtomicBool = AtomicBool::new(false);
/// Set by whoever says "interrupted" first (main's error path or the handler), so it is said once.
static SAID: AtomicBool = AtomicBool::new(false);
/// Temporary files being written now (see [`TempFile`]).
static TEMPS: Mutex<Vec<PathBuf>> = Mutex::new(Vec::new());

/// How long work that does not poll has after the first signal before the handler ends it.
pub const GRACE: Duration = Duration::from_millis(500);

/// Installs the handler (the executable calls this once; library users and tests never do,
/// so for them [`requested`] stays false).
pub fn install() {
    let installed = ctrlc::set_handler(|| {
        if REQUESTED.swap(true, Ordering::SeqCst) {
            // the second signal: the user insists
            stop_now();
        }
        // the handler's thread stays free for a second signal while the grace runs out
        std::thread::spawn(|| {
            std::thread::sleep(GRACE);
            stop_now();
        });
    });
    if let Err(e) = installed {
        tracing::debug!(error = %e, "no Ctrl-C handler; a signal ends gpumem at once");
    }
}

/// Removes the temporary files being written, says so once and exits 130.
fn stop_now() -> ! {
    let temps = TEMPS.lock().map(|t| t.clone()).unwrap_or_default();
    for t in temps {
        let _ = std::fs::remove_file(t);
    }
    say_interrupted();
    std::process::exit(130);
}

/// Prints `gpumem: interrupted` on stderr, the first time it is called.
pub fn say_interrupted() {
    if !SAID.swap(true, Ordering::SeqCst) {
        eprintln!("gpumem: interrupted");
    }
}

/// Whether a stop was asked for. A relaxed load: cheap enough to call per statement.
#[inline]
pub fn requested() -> bool {
    REQUESTED.load(Ordering::Relaxed)
}

/// `Err` once a stop was asked for.
pub fn check() -> crate::error::Result<()> {
    if requested() {
        Err(crate::error::Error::Interrupted)
    } else {
        Ok(())
    }
}

/// A temporary file being written, known to the handler while this lives: a stop that does not
/// wait for the writer removes it.
pub struct TempFile(PathBuf);

impl TempFile {
    pub fn register(path: &Path) -> TempFile {
        if let Ok(mut t) = TEMPS.lock() {
            t.push(path.to_path_buf());
        }
        TempFile(path.to_path_buf())
    }
}

impl Drop for TempFile {
    fn drop(&mut self) {
        if let Ok(mut t) = TEMPS.lock() {
            if let Some(i) = t.iter().position(|p| *p == self.0) {
                t.swap_remove(i);
            }
        }
    }
}
