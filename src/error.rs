//! gpumem's one error type. Every message names the file, line, op or flag to fix; an I/O
//! error's cause is its `source()`, which `main.rs` prints after it (through anyhow's chain),
//! and `main.rs` maps every variant to exit code 2 (usage, input or I/O error).

use std::path::PathBuf;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    // ---- input files ----
    /// A file that could not be read at all.
    #[error("cannot read {}", path.display())]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    /// A file that was read but is not what it should be; `location` says where in it.
    #[error("{}: {location}: {message}", path.display())]
    Input {
        path: PathBuf,
        location: String,
        message: String,
    },

    // ---- outputs ----
    #[error("cannot write {}", path.display())]
    Write {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("cannot write output")]
    Output(#[from] std::io::Error),

    // ---- command line ----
    /// A bad flag value: which flag, and what is wrong.
    #[error("{flag}: {message}")]
    Usage { flag: String, message: String },

    // ---- signals ----
    /// Ctrl-C or SIGTERM stopped the work (exit 130).
    #[error("interrupted")]
    Interrupted,
}

impl Error {
    pub fn input(
        path: impl Into<PathBuf>,
        location: impl Into<String>,
        message: impl Into<String>,
    ) -> Self {
        Error::Input {
            path: path.into(),
            location: location.into(),
            message: message.into(),
        }
    }

    pub fn usage(flag: impl Into<String>, message: impl Into<String>) -> Self {
        Error::Usage {
            flag: flag.into(),
            message: message.into(),
        }
    }
}

pub type Result<T> = std::result::Result<T, Error>;
