//! Ctrl-C and SIGTERM: the first asks gpumem to stop, and long work (the script runner, snapshot
//! reading, replay, bench) polls [`requested`] and unwinds through its normal error path, so
//! temporary files are removed and existing outputs are left as they were; `main.rs` exits 130.
//! A second signal exits at once.

use std::sync::atomic::{AtomicBool, Ordering};

static REQUESTED: AtomicBool = AtomicBool::new(false);

/// Installs the handler (the executable calls this once; library users and tests never do,
/// so for them [`requested`] stays false).
pub fn install() {
    let installed = ctrlc::set_handler(|| {
        if REQUESTED.swap(true, Ordering::SeqCst) {
            // the second signal: the user insists
            std::process::exit(130);
        }
    });
    if let Err(e) = installed {
        tracing::debug!(error = %e, "no Ctrl-C handler; a signal ends gpumem at once");
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
