//! Reading: the internal error type and the buffered input.

use super::BUF;
use std::io::{self, Read};

/// Internal error: the input ended, a read failed, or `Msg` (completed with the opcode's name).
pub(super) enum Fail {
    Eof,
    Io(io::Error),
    Msg(String),
}
/// Boxed, so that `R<Value>` is 16 bytes and comes back in registers (this matters for speed).
pub(super) struct E(pub(super) Box<Fail>);
pub(super) type R<T> = Result<T, E>;

pub(super) fn msg<T>(m: impl Into<String>) -> R<T> {
    Err(E(Box::new(Fail::Msg(m.into()))))
}

fn eof<T>() -> R<T> {
    Err(E(Box::new(Fail::Eof)))
}

fn io_err(e: io::Error) -> E {
    E(Box::new(Fail::Io(e)))
}

/// A buffered reader that tracks the absolute offset and parses short arguments in place.
pub(super) struct Input<T> {
    pub(super) r: T,
    pub(super) buf: Vec<u8>,
    pub(super) pos: usize,
    pub(super) end: usize,
    /// Absolute offset of `buf[0]`.
    pub(super) base: u64,
    /// Strings longer than the buffer, read incrementally.
    pub(super) big: Vec<u8>,
}

impl<T: Read> Input<T> {
    /// Reads `r`, whose first byte is at offset `base` of the data.
    pub(super) fn new(r: T, base: u64) -> Self {
        Input {
            r,
            buf: vec![0; BUF],
            pos: 0,
            end: 0,
            base,
            big: Vec::new(),
        }
    }

    /// Moves to offset `off`, forgetting what was buffered (the reader must be positioned
    /// there too).
    pub(super) fn restart_at(&mut self, off: u64) {
        self.base = off;
        self.pos = 0;
        self.end = 0;
    }

    pub(super) fn offset(&self) -> u64 {
        self.base + self.pos as u64
    }

    /// Makes `need` (at most `BUF`) bytes available at `pos`, or fails with `Eof`.
    #[cold]
    pub(super) fn fill(&mut self, need: usize) -> R<()> {
        // once per buffer (1 MiB): Ctrl-C stops a long read within a few milliseconds
        if crate::interrupt::requested() {
            return Err(io_err(io::Error::new(
                io::ErrorKind::Interrupted,
                "interrupted",
            )));
        }
        if self.pos + need > self.buf.len() {
            self.buf.copy_within(self.pos..self.end, 0);
            self.base += self.pos as u64;
            self.end -= self.pos;
            self.pos = 0;
        }
        while self.end - self.pos < need {
            match self.r.read(&mut self.buf[self.end..]) {
                Ok(0) => return eof(),
                Ok(n) => self.end += n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(io_err(e)),
            }
        }
        Ok(())
    }

    #[inline(always)]
    pub(super) fn byte(&mut self) -> R<u8> {
        if self.pos == self.end {
            self.fill(1)?;
        }
        let b = self.buf[self.pos];
        self.pos += 1;
        Ok(b)
    }

    #[inline(always)]
    pub(super) fn array<const N: usize>(&mut self) -> R<[u8; N]> {
        if self.end - self.pos < N {
            self.fill(N)?;
        }
        let mut a = [0u8; N];
        a.copy_from_slice(&self.buf[self.pos..self.pos + N]);
        self.pos += N;
        Ok(a)
    }

    /// The next `n` bytes. Lengths come from the file, so nothing is allocated from `n`: a
    /// long string grows with the bytes actually read, and a lying length ends in `Eof`.
    pub(super) fn bytes(&mut self, n: u64) -> R<&[u8]> {
        if n <= BUF as u64 {
            let n = n as usize;
            if self.end - self.pos < n {
                self.fill(n)?;
            }
            self.pos += n;
            return Ok(&self.buf[self.pos - n..self.pos]);
        }
        self.big.clear();
        self.big.extend_from_slice(&self.buf[self.pos..self.end]);
        self.base += self.end as u64;
        (self.pos, self.end) = (0, 0);
        let want = n - self.big.len() as u64;
        let got = (&mut self.r).take(want).read_to_end(&mut self.big);
        let got = got.map_err(io_err)? as u64;
        self.base += got;
        if got < want {
            return eof();
        }
        Ok(&self.big)
    }
}
