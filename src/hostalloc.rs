//! The executable's host-memory allocator: mimalloc for small objects, the C library's malloc
//! for large buffers.
//!
//! The two kinds of work gpumem does want different allocators. Simulating makes and drops
//! several small objects per allocator event (tensor metadata, shapes, argument lists), where
//! mimalloc is about a fifth faster than glibc's malloc (`gpumem bench --workload` on the
//! Llama-3-8B generation bench). Reading a snapshot grows a few column vectors to hundreds of
//! megabytes, where glibc's `realloc` moves the pages with `mremap` while mimalloc copies them
//! into fresh ones: with mimalloc alone, `summary` of a 1 GB snapshot took 5.8 s instead of
//! 3.7 s on one core, at 1.31 GB peak RSS instead of 1.00 GB. So every allocation of
//! [`LARGE`] bytes or more goes to the system allocator and the rest to mimalloc. The bound is
//! 1 MiB: the snapshot reader's workers reserve a few MiB of columns per chunk, which mimalloc
//! kept committed (a 187 MB snapshot read on one core peaked at 350 MB with a 16 MiB bound,
//! 250 MB with 1 MiB, at the same speed; 732 MB and 431 MB on 16 threads; on an H100 host's
//! 16 cores a 956 MB one peaked at 0.81 GB against 1.49 GB, but took 0.68-0.75 s against
//! 0.59-0.64 s: glibc maps and unmaps those buffers). A block's
//! size at `dealloc` and `realloc` is the size it was allocated with, so each block is always
//! returned to the allocator that made it.
//!
//! [`tune`] (run by the executable before its first allocation) makes mimalloc give freed
//! pages back to the system within 10 ms: by default it purges them after a second and, its arenas
//! committed eagerly on Linux, they stay in the process's resident memory until then. A
//! snapshot read on many threads leaves each worker's freed pages so: a 209 MB snapshot read
//! with 16 threads peaked at 436-448 MB resident with the defaults and at 229 MB tuned (one
//! thread: 233 and 212 MB), with no slower simulation (329 `madvise` calls in a Llama-3-8B
//! generation of 4.5 million allocator events). A user's own `MIMALLOC_ARENA_EAGER_COMMIT` or
//! `MIMALLOC_PURGE_DELAY` still wins.

use std::alloc::{GlobalAlloc, Layout, System};
use std::ffi::{c_int, c_long};

use mimalloc::MiMalloc;

/// Allocations of at least this many bytes go to the system allocator.
pub const LARGE: usize = 1 << 20;

/// mimalloc below [`LARGE`] bytes, the system allocator from it.
pub struct HostAlloc;

unsafe impl GlobalAlloc for HostAlloc {
    #[inline]
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: forwarded with the caller's layout, which GlobalAlloc's contract makes valid
        unsafe {
            if layout.size() >= LARGE {
                System.alloc(layout)
            } else {
                MiMalloc.alloc(layout)
            }
        }
    }

    #[inline]
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        // SAFETY: as in alloc
        unsafe {
            if layout.size() >= LARGE {
                System.alloc_zeroed(layout)
            } else {
                MiMalloc.alloc_zeroed(layout)
            }
        }
    }

    #[inline]
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: `layout` is the one `ptr` was allocated with, so its size picks the
        // allocator that made it
        unsafe {
            if layout.size() >= LARGE {
                System.dealloc(ptr, layout)
            } else {
                MiMalloc.dealloc(ptr, layout)
            }
        }
    }

    #[inline]
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        let (old_large, new_large) = (layout.size() >= LARGE, new_size >= LARGE);
        // SAFETY: `ptr` was made by the allocator its old size picks; a block that changes
        // sides is copied into a new block of the other and freed where it was made
        unsafe {
            match (old_large, new_large) {
                (true, true) => System.realloc(ptr, layout, new_size),
                (false, false) => MiMalloc.realloc(ptr, layout, new_size),
                _ => {
                    let new_layout = Layout::from_size_align_unchecked(new_size, layout.align());
                    let new = self.alloc(new_layout);
                    if !new.is_null() {
                        std::ptr::copy_nonoverlapping(ptr, new, layout.size().min(new_size));
                        self.dealloc(ptr, layout);
                    }
                    new
                }
            }
        }
    }
}

// mimalloc's C API (the library the `mimalloc` crate links), for its options
unsafe extern "C" {
    fn mi_option_get(option: c_int) -> c_long;
    fn mi_option_set(option: c_int, value: c_long);
}

/// mimalloc 3's option numbers (`mi_option_t` in its `mimalloc.h`) and their defaults, which
/// [`tune`] checks before it sets anything: another mimalloc (its numbering changed between
/// versions) is left as it is.
const ARENA_EAGER_COMMIT: (c_int, c_long) = (4, 2);
const PURGE_DELAY: (c_int, c_long) = (15, 1_000);

/// The purge delay [`tune`] sets, in milliseconds: freed pages leave within 10 ms, in
/// batches (immediate purging, 0, cost 64 snapshots of 100 MB read together 18% more time
/// on an H100 host's 16 cores for the same memory).
const TUNED_PURGE_DELAY_MS: c_long = 10;

/// Sets mimalloc to decommit freed pages soon (10 ms, arenas not committed eagerly), so
/// that memory a thread freed leaves the resident set. Unless the environment set these
/// options (`MIMALLOC_ARENA_EAGER_COMMIT`, `MIMALLOC_PURGE_DELAY`) or the linked mimalloc's
/// defaults are not the ones expected. Returns whether it set them.
pub fn tune() -> bool {
    let given = |name: &str| std::env::var_os(name).is_some();
    if given("MIMALLOC_ARENA_EAGER_COMMIT") || given("MIMALLOC_PURGE_DELAY") {
        return false;
    }
    // SAFETY: plain C calls on option numbers mimalloc defines (checked by their defaults)
    unsafe {
        if mi_option_get(ARENA_EAGER_COMMIT.0) != ARENA_EAGER_COMMIT.1
            || mi_option_get(PURGE_DELAY.0) != PURGE_DELAY.1
        {
            return false;
        }
        mi_option_set(ARENA_EAGER_COMMIT.0, 0);
        mi_option_set(PURGE_DELAY.0, TUNED_PURGE_DELAY_MS);
    }
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The option numbers name the options meant: mimalloc's defaults for them are read back
    /// (a renumbered mimalloc makes `tune` a no-op, and this test says so), and `tune` sets
    /// them.
    #[test]
    fn tune_finds_mimallocs_options_by_their_defaults() {
        if std::env::var_os("MIMALLOC_ARENA_EAGER_COMMIT").is_some()
            || std::env::var_os("MIMALLOC_PURGE_DELAY").is_some()
        {
            return;
        }
        assert!(tune(), "mimalloc's option numbers or defaults changed");
        // SAFETY: as in tune
        unsafe {
            assert_eq!(mi_option_get(ARENA_EAGER_COMMIT.0), 0);
            assert_eq!(mi_option_get(PURGE_DELAY.0), TUNED_PURGE_DELAY_MS);
        }
    }

    /// A block keeps its bytes when `realloc` moves it from one allocator to the other and
    /// back, and each side frees what it made (a mismatch aborts under either allocator).
    #[test]
    fn realloc_across_the_threshold_keeps_the_bytes() {
        let a = HostAlloc;
        let small = Layout::from_size_align(1000, 8).unwrap();
        unsafe {
            let p = a.alloc(small);
            assert!(!p.is_null());
            for i in 0..1000 {
                *p.add(i) = (i % 251) as u8;
            }
            // small -> large (mimalloc to the system allocator)
            let big = a.realloc(p, small, LARGE + 4096);
            assert!(!big.is_null());
            for i in 0..1000 {
                assert_eq!(*big.add(i), (i % 251) as u8);
            }
            *big.add(LARGE + 4095) = 7;
            // large -> larger (the system allocator's own realloc)
            let big_layout = Layout::from_size_align(LARGE + 4096, 8).unwrap();
            let bigger = a.realloc(big, big_layout, 3 * LARGE);
            assert_eq!(*bigger.add(999), (999 % 251) as u8);
            assert_eq!(*bigger.add(LARGE + 4095), 7);
            // large -> small (back to mimalloc)
            let bigger_layout = Layout::from_size_align(3 * LARGE, 8).unwrap();
            let back = a.realloc(bigger, bigger_layout, 500);
            for i in 0..500 {
                assert_eq!(*back.add(i), (i % 251) as u8);
            }
            a.dealloc(back, Layout::from_size_align(500, 8).unwrap());
            let z = a.alloc_zeroed(Layout::from_size_align(LARGE, 64).unwrap());
            assert_eq!(z as usize % 64, 0);
            assert!((0..LARGE).step_by(4096).all(|i| *z.add(i) == 0));
            a.dealloc(z, Layout::from_size_align(LARGE, 64).unwrap());
        }
    }
}
