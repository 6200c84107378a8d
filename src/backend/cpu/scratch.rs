//! The kernels' float64 working copies, recycled.
//!
//! Every kernel reads its inputs into float64 vectors and builds its outputs in them. Fresh
//! vectors of tens of megabytes come from the operating system as new pages each time (glibc
//! maps every allocation above 32 MiB on its own and unmaps it on free), and faulting those
//! pages in cost a third of a GPT run's time. A [`Scratch`] goes back to a small pool when it is
//! dropped and the next kernel that needs as many elements takes it, pages already mapped.
//! The pool keeps at most [`KEEP`] vectors and at most the byte budget the CPU device sets
//! ([`set_budget`]); it never changes what a kernel computes.

use std::ops::{Deref, DerefMut};

use rayon::iter::ParallelIterator;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

/// The most vectors the pool keeps.
pub(super) const KEEP: usize = 12;

/// Vectors smaller than this (32 MiB) are left to the allocator, whose heap reuses them well;
/// glibc maps larger ones on their own and unmaps them on free.
const SMALL: usize = 1 << 22;

static POOL: Mutex<Vec<Vec<f64>>> = Mutex::new(Vec::new());
static BUDGET: AtomicU64 = AtomicU64::new(0);

/// The most bytes the pool may keep (0: keep nothing).
pub(super) fn set_budget(bytes: u64) {
    BUDGET.store(bytes, Ordering::Relaxed);
}

/// A float64 vector from the pool (or new), returned to it when dropped.
#[derive(Debug, Default)]
pub(crate) struct Scratch(Vec<f64>);

impl Scratch {
    /// An empty vector with room for at least `n` elements: the smallest pooled one that
    /// fits, or a new one.
    pub(crate) fn with_capacity(n: usize) -> Scratch {
        if n >= SMALL {
            let mut pool = POOL.lock().unwrap_or_else(|e| e.into_inner());
            let best = (0..pool.len())
                .filter(|&i| pool[i].capacity() >= n)
                .min_by_key(|&i| pool[i].capacity());
            if let Some(i) = best {
                let mut v = pool.swap_remove(i);
                v.clear();
                return Scratch(v);
            }
        }
        Scratch(Vec::with_capacity(n))
    }

    /// `n` zeros.
    pub(crate) fn zeros(n: usize) -> Scratch {
        Scratch::filled(n, 0.0)
    }

    /// `n` copies of `v`.
    pub(crate) fn filled(n: usize, v: f64) -> Scratch {
        let mut s = Scratch::with_capacity(n);
        s.0.resize(n, v);
        s
    }

    /// The values as a plain vector (leaving the pool).
    pub(crate) fn into_vec(mut self) -> Vec<f64> {
        std::mem::take(&mut self.0)
    }
}

impl From<Vec<f64>> for Scratch {
    fn from(v: Vec<f64>) -> Self {
        Scratch(v)
    }
}

impl FromIterator<f64> for Scratch {
    fn from_iter<I: IntoIterator<Item = f64>>(iter: I) -> Self {
        let iter = iter.into_iter();
        let mut s = Scratch::with_capacity(iter.size_hint().0);
        s.0.extend(iter);
        s
    }
}

impl rayon::iter::FromParallelIterator<f64> for Scratch {
    fn from_par_iter<I: rayon::iter::IntoParallelIterator<Item = f64>>(iter: I) -> Self {
        use rayon::iter::ParallelExtend;
        let iter = iter.into_par_iter();
        let mut s = Scratch::with_capacity(iter.opt_len().unwrap_or(0));
        s.0.par_extend(iter);
        s
    }
}

impl<'a> IntoIterator for &'a Scratch {
    type Item = &'a f64;
    type IntoIter = std::slice::Iter<'a, f64>;
    fn into_iter(self) -> Self::IntoIter {
        self.0.iter()
    }
}

impl Deref for Scratch {
    type Target = Vec<f64>;
    fn deref(&self) -> &Vec<f64> {
        &self.0
    }
}

impl DerefMut for Scratch {
    fn deref_mut(&mut self) -> &mut Vec<f64> {
        &mut self.0
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let v = std::mem::take(&mut self.0);
        if v.capacity() < SMALL {
            return;
        }
        let budget = BUDGET.load(Ordering::Relaxed);
        let bytes = |v: &Vec<f64>| v.capacity() as u64 * 8;
        if bytes(&v) > budget {
            return;
        }
        let mut pool = POOL.lock().unwrap_or_else(|e| e.into_inner());
        pool.push(v);
        // over the count or the budget: drop the smallest first (the large ones are the
        // expensive ones to fault in again)
        pool.sort_by_key(|v| std::cmp::Reverse(v.capacity()));
        while pool.len() > KEEP || pool.iter().map(bytes).sum::<u64>() > budget {
            pool.pop();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_dropped_vector_serves_the_next_request_that_fits() {
        set_budget(1 << 30);
        let n = SMALL * 3 + 17;
        let mut a = Scratch::zeros(n);
        a[5] = 1.0;
        let ptr = a.as_ptr();
        drop(a);
        // (other tests may use the pool at the same time: look for it among a few)
        let taken: Vec<Scratch> = (0..4).map(|_| Scratch::with_capacity(n)).collect();
        assert!(taken.iter().all(|b| b.is_empty()));
        assert!(
            taken.iter().any(|b| b.as_ptr() == ptr),
            "the pooled vector was not reused"
        );
        drop(taken);
        let z = Scratch::zeros(n);
        assert!(
            z.iter().all(|&x| x == 0.0),
            "zeros are zeros, reused or not"
        );
    }
}
