//! Reading the user's files whole, but never without a bound: a text input (a workload, a
//! config, a baseline, a results file) is at most [`TEXT_LIMIT`], and anything read from a pipe
//! or a device is at most [`STREAM_LIMIT`], so `/dev/zero` given by mistake is refused instead
//! of filling memory. Regular data files (snapshots, traces) are read whole: their size is the
//! user's own.

use std::io::{self, Read};
use std::path::Path;

use crate::units::format_bytes;

/// The most gpumem reads of a text input: far beyond any real workload, config or baseline.
pub const TEXT_LIMIT: u64 = 256 << 20;
/// The most gpumem reads from a pipe or a device (a file's size is not known in advance).
pub const STREAM_LIMIT: u64 = 1 << 30;

/// What a file holds, for its bound.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// Workloads, configs, baselines, results: [`TEXT_LIMIT`].
    Text,
    /// Snapshots, traces, tensor files: whole when a regular file, else [`STREAM_LIMIT`].
    Data,
}

fn too_big(limit: u64) -> io::Error {
    io::Error::new(
        io::ErrorKind::InvalidData,
        format!(
            "more than {} (the most gpumem reads of such a file{})",
            format_bytes(limit),
            if limit == STREAM_LIMIT {
                " from a pipe or a device: save it to a file"
            } else {
                ""
            }
        ),
    )
}

/// The bound on reading `f` as `kind`, and its size where known.
fn limit_of(f: &std::fs::File, kind: Kind) -> io::Result<(u64, Option<u64>)> {
    let meta = f.metadata()?;
    let size = meta.is_file().then_some(meta.len());
    let limit = match (kind, size) {
        (Kind::Text, _) => TEXT_LIMIT,
        (Kind::Data, Some(_)) => u64::MAX,
        (Kind::Data, None) => STREAM_LIMIT,
    };
    Ok((limit, size))
}

/// Reads the rest of `f` onto `buf` (which may hold its first bytes already), within the
/// bound of `kind`.
pub fn read_rest(f: &mut std::fs::File, buf: &mut Vec<u8>, kind: Kind) -> io::Result<()> {
    let (limit, size) = limit_of(f, kind)?;
    if size.is_some_and(|s| s > limit) {
        return Err(too_big(limit));
    }
    if let Some(s) = size {
        buf.reserve(s.saturating_sub(buf.len() as u64) as usize);
    }
    let room = limit.saturating_sub(buf.len() as u64);
    f.take(room.saturating_add(1)).read_to_end(buf)?;
    if buf.len() as u64 > limit {
        return Err(too_big(limit));
    }
    Ok(())
}

/// The whole of the file at `path`, within the bound of `kind`.
pub fn read(path: &Path, kind: Kind) -> io::Result<Vec<u8>> {
    let mut f = std::fs::File::open(path)?;
    let mut buf = Vec::new();
    read_rest(&mut f, &mut buf, kind)?;
    Ok(buf)
}

/// [`read`] as UTF-8 text.
pub fn read_text(path: &Path, kind: Kind) -> io::Result<String> {
    String::from_utf8(read(path, kind)?).map_err(|_| {
        io::Error::new(
            io::ErrorKind::InvalidData,
            "stream did not contain valid UTF-8",
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_device_is_read_only_up_to_the_bound() {
        // /dev/zero never ends: the text bound stops it (256 MiB read, then refused)
        let e = read(Path::new("/dev/zero"), Kind::Text).unwrap_err();
        assert!(e.to_string().contains("256.00 MiB"), "{e}");
    }

    #[test]
    fn a_regular_file_is_read_whole() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("f");
        std::fs::write(&p, b"hello").unwrap();
        assert_eq!(read(&p, Kind::Text).unwrap(), b"hello");
        assert_eq!(read_text(&p, Kind::Data).unwrap(), "hello");
    }
}
