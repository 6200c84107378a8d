//! What [`crate::alloc::fastforward`] needs of the allocator: a log of one step's mallocs and
//! frees, a malloc that stops short of the out-of-memory path's release of every cached
//! segment, and a fingerprint of the small pool.

use std::hash::{Hash, Hasher};

use super::*;

/// One allocator call of a logged step.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StepEvent {
    /// `malloc(n, stream)` returned `addr`, asked for under the tags `stack`.
    Malloc {
        n: u64,
        stream: StreamId,
        addr: u64,
        stack: StackId,
    },
    /// `free(addr)`.
    Free { addr: u64 },
}

/// The calls since the log was last taken, and whether anything else changed the allocator
/// (`record_stream`, `empty_cache`, a memory fraction): a step with such a call cannot be
/// replayed from its mallocs and frees alone.
#[derive(Debug, Clone, Default)]
pub(crate) struct StepLog {
    pub events: Vec<StepEvent>,
    pub other: bool,
}

/// [`CachingAllocator::malloc_guarded`] stopped: no cached block fits and no new segment
/// can be had without first releasing every whole free segment of both pools. Nothing of
/// the small pool changed (the large pool may have released oversize segments, as the
/// unguarded call would have too).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Guarded;

impl<S: SegmentSource> CachingAllocator<S> {
    /// Logs every malloc and free from now on ([`CachingAllocator::take_step_log`]).
    pub fn start_step_log(&mut self) {
        self.steplog = Some(StepLog::default());
    }

    /// The calls logged since the last take, and whether another kind of call changed the
    /// allocator meanwhile (`None` while not logging). Logging goes on.
    pub fn take_step_log(&mut self) -> Option<(Vec<StepEvent>, bool)> {
        let log = self.steplog.as_mut()?;
        let events = std::mem::take(&mut log.events);
        let other = std::mem::replace(&mut log.other, false);
        Some((events, other))
    }

    /// Stops logging.
    pub fn stop_step_log(&mut self) {
        self.steplog = None;
    }

    #[inline]
    pub(super) fn log_other(&mut self) {
        if let Some(log) = self.steplog.as_mut() {
            log.other = true;
        }
    }

    /// [`CachingAllocator::malloc`], except that where it would release every whole free
    /// segment (its last resort before out-of-memory) it returns [`Guarded`] instead.
    pub fn malloc_guarded(&mut self, n: u64, stream: StreamId) -> Result<u64, Guarded> {
        self.guard_release = true;
        let r = self.malloc(n, stream);
        self.guard_release = false;
        r.map_err(|_| Guarded)
    }

    /// The size of the allocated block at `addr`.
    pub fn block_size_at(&self, addr: u64) -> Option<u64> {
        let id = self.allocated.get(addr)?;
        Some(self.blocks[id as usize].size)
    }

    /// The pool a request of this rounded size comes from.
    pub fn pool_for_rounded(&self, rounded: u64) -> PoolKind {
        Self::pool_of(rounded)
    }

    /// Sets the peak of allocated bytes over both pools (a fast-forward's true peak).
    pub(crate) fn set_allocated_peak(&mut self, peak: i64) {
        self.stats.allocated_bytes.set_all_peak(peak);
    }

    /// Whether garbage collection of cached blocks is on (a memory fraction with
    /// `garbage_collection_threshold`): it frees blocks of either pool on a miss.
    pub fn collects_garbage(&self) -> bool {
        self.gc_on()
    }

    /// A hash of the small pool's state: every block's address, size, whether it is
    /// allocated and mapped, and its stream. Two equal fingerprints mean the pool answers
    /// the same requests with the same blocks.
    pub fn small_pool_fingerprint(&self) -> u64 {
        // (a sum of each block's mixed hash: the blocks' order in `blocks` is not the pool's,
        // and a sum needs neither a sort nor an allocation; it runs at each layer of a
        // fast-forwarded step)
        let mut sum = 0u64;
        for b in self
            .blocks
            .iter()
            .filter(|b| b.live && b.pool == PoolKind::Small)
        {
            let mut h = rustc_hash::FxHasher::default();
            (b.addr, b.size, b.allocated, b.mapped, b.stream).hash(&mut h);
            sum = sum.wrapping_add(mix(h.finish()));
        }
        let mut h = rustc_hash::FxHasher::default();
        (sum, self.stats.segment.pool(PoolKind::Small).allocated).hash(&mut h);
        h.finish()
    }
}

/// splitmix64's finalizer: spreads FxHash's bits before they are summed.
fn mix(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}
