//! A bounded ring buffer: grows up to its capacity, then overwrites the oldest entry, like
//! PyTorch's history with `max_entries`. Iteration is oldest first.

#[derive(Debug, Clone)]
pub struct Ring<T> {
    buf: Vec<T>,
    cap: usize,
    /// Index of the oldest entry once the buffer has wrapped.
    head: usize,
    /// Entries ever pushed (so dropped = total - len).
    total: u64,
}

impl<T: Copy> Ring<T> {
    /// Default capacity: 4 Mi entries (96 MiB of events at most).
    pub const DEFAULT_CAPACITY: usize = 4 << 20;

    /// A ring of at most `cap` entries (at least 1).
    pub fn new(cap: usize) -> Self {
        Ring {
            buf: Vec::new(),
            cap: cap.max(1),
            head: 0,
            total: 0,
        }
    }

    #[inline]
    pub fn push(&mut self, v: T) {
        self.total += 1;
        if self.buf.len() < self.cap {
            if self.buf.len() == self.buf.capacity() {
                // the whole capacity at once, as address space: pages are touched as events
                // come, and no growth copies what was recorded (a doubling vector copied
                // about as many bytes as it kept, and faulted in each new copy)
                self.buf.reserve_exact(self.cap - self.buf.len());
            }
            self.buf.push(v);
        } else {
            self.buf[self.head] = v;
            self.head += 1;
            if self.head == self.cap {
                self.head = 0;
            }
        }
    }

    pub fn len(&self) -> usize {
        self.buf.len()
    }

    pub fn is_empty(&self) -> bool {
        self.buf.is_empty()
    }

    pub fn capacity(&self) -> usize {
        self.cap
    }

    /// Entries pushed since creation, kept or not.
    pub fn total(&self) -> u64 {
        self.total
    }

    /// Entries lost to wrapping.
    pub fn dropped(&self) -> u64 {
        self.total - self.buf.len() as u64
    }

    pub fn clear(&mut self) {
        self.buf.clear();
        self.head = 0;
    }

    /// Oldest first.
    pub fn iter(&self) -> impl Iterator<Item = &T> + '_ {
        let (a, b) = self.buf.split_at(self.head);
        b.iter().chain(a.iter())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wraps_oldest_first() {
        let mut r = Ring::new(3);
        for i in 0..5 {
            r.push(i);
        }
        assert_eq!(r.iter().copied().collect::<Vec<_>>(), vec![2, 3, 4]);
        assert_eq!(r.dropped(), 2);
        assert_eq!(r.total(), 5);
        let mut r = Ring::new(0);
        r.push(1);
        r.push(2);
        assert_eq!(r.iter().copied().collect::<Vec<_>>(), vec![2]);
    }
}
