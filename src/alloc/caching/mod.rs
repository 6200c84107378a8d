//! PyTorch 2.11's CUDA caching allocator policy (`DeviceCachingAllocator`), over any
//! [`SegmentSource`].
//!
//! Rule by rule this follows ../shared/docs/allocator-spec.md; the notes below name the rules
//! whose consequences are easy to get wrong. This file has the block arena, malloc and free;
//! `release.rs` gives memory back (empty_cache, the OOM path, GC) and `expandable.rs` maps and
//! unmaps expandable-segment pages.
//!
//! Note [Best fit]: free blocks sit in one ordered set per pool keyed by (stream, size, address).
//! A request looks at the *first* block of its stream not smaller than it, and only that one:
//! if the oversize rules reject it, the request misses (no second candidate is tried).
//!
//! Note [Split]: the front of a block is handed out, the tail stays free. Small pool (or any pool
//! with expandable segments): split when the tail is >= 512 B. Large pool: split only when the
//! request is below `max_split_size` and the tail is strictly more than 1 MiB; otherwise the
//! whole block is handed out and counted as allocated.
//!
//! Note [Inactive split]: `inactive_split*` count free blocks inside segments that also hold
//! other blocks. They change by net amounts: a free that merges with two neighbours removes two
//! and (if the result is still split) adds one. Expandable blocks are left out.
//!
//! Note [Retry]: a miss tries, in order, a new segment; (with `max_split_size`) releasing
//! oversize cached segments; then releasing every whole free segment (an `empty_cache`, counted
//! in `num_sync_all_streams`) and one more try, counted in `num_alloc_retries` whether or not it
//! succeeds. Only then is out-of-memory raised.

use std::collections::BTreeMap;

use rustc_hash::FxHashMap;

use super::addrmap::AddrMap;
use super::config::{
    AllocConf, MIN_BLOCK_SIZE, MIN_LARGE_ALLOC, ROUND_LARGE, SMALL_BUFFER, SMALL_SIZE,
};
use super::freeset::{FreeArena, FreeKey, FreeLink, FreeSet};
use super::oom::OutOfMemory;
use super::source::SegmentSource;
use super::stats::{DeviceStats, PoolKind};
use crate::trace::{EventKind, Recorder, StackId};

/// A CUDA stream, by number (0 = the default stream). Pools never share blocks across streams.
pub type StreamId = u32;

mod expandable;
mod release;
mod steps;

pub use steps::{Guarded, StepEvent};

pub(crate) const NONE: u32 = u32::MAX;
/// Requests this big are refused outright, as PyTorch's allocator does ("more than 1EB").
pub const ONE_EXABYTE: u64 = 1 << 60;
pub(crate) const NO_STACK: StackId = StackId(u32::MAX);

/// A block: a contiguous piece of a segment, allocated or free.
#[derive(Debug, Clone)]
pub(crate) struct Block {
    pub addr: u64,
    pub size: u64,
    /// The unrounded size of the last allocation that used this block (stale once freed).
    pub requested: u64,
    pub prev: u32,
    pub next: u32,
    pub stream: StreamId,
    pub pool: PoolKind,
    pub allocated: bool,
    /// Backed by physical memory (always true outside expandable segments).
    pub mapped: bool,
    /// Index of the expandable reservation this block lies in, or NONE.
    pub expandable: u32,
    /// How many other streams used the block (`record_stream`); the streams are in
    /// `CachingAllocator::stream_uses`, off the hot path.
    pub n_uses: u16,
    /// Frees that wait for other streams' work before they complete.
    pub event_count: u16,
    /// `get_free_block` calls of its pool when it last entered the free set (GC age).
    pub gc_base: u64,
    /// Tag stack when the block was last handed out.
    pub stack: StackId,
    /// Tag stack when its segment was allocated (kept by the segment's first block only).
    /// (`NO_STACK` for a segment whose first block came from a split.)
    pub seg_stack: StackId,
    pub live: bool,
    /// Links in the pool's free lists while the block is free.
    pub free: FreeLink,
}

impl FreeArena for Vec<Block> {
    #[inline(always)]
    fn size(&self, id: u32) -> u64 {
        self[id as usize].size
    }
    #[inline(always)]
    fn addr(&self, id: u32) -> u64 {
        self[id as usize].addr
    }
    #[inline(always)]
    fn link(&self, id: u32) -> &FreeLink {
        &self[id as usize].free
    }
    #[inline(always)]
    fn link_mut(&mut self, id: u32) -> &mut FreeLink {
        &mut self[id as usize].free
    }
}

// Small blocks: the arena is walked at random on every alloc and free.
const _: () = assert!(std::mem::size_of::<Block>() <= 80);

impl Block {
    #[inline]
    fn is_split(&self) -> bool {
        self.prev != NONE || self.next != NONE
    }
}

#[derive(Debug, Default, Clone)]
struct Pool {
    /// Free (mapped) blocks, ordered (stream, size, address) as PyTorch's `BlockComparatorSize`.
    blocks: FreeSet,
    /// Unmapped parts of expandable reservations, by (stream, address).
    unmapped: BTreeMap<(StreamId, u64), u32>,
    /// `get_free_blocks_call_count`, counted only while garbage collection is on.
    free_calls: u64,
}

/// An expandable segment: a reserved virtual range with pages mapped on demand.
#[derive(Debug, Clone)]
pub(crate) struct Reservation {
    pub base: u64,
    pub size: u64,
    pub page: u64,
    pub mapped: Vec<bool>,
    pub live: bool,
}

/// Errors of `free` and `record_stream`: the pointer is not a live allocation.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PointerError {
    #[error(
        "invalid device pointer {0:#x}: not a live allocation (never allocated, or already freed)"
    )]
    NotAllocated(u64),
}

/// The caching allocator of one device.
#[derive(Debug, Clone)]
pub struct CachingAllocator<S: SegmentSource> {
    conf: AllocConf,
    source: S,
    device: u32,
    pub(crate) blocks: Vec<Block>,
    free_ids: Vec<u32>,
    pools: [Pool; 2],
    /// Allocated blocks by address (PyTorch's `allocated_blocks`).
    allocated: AddrMap,
    /// Frees waiting on other streams.
    pending: Vec<u32>,
    /// Streams other than its own that used an allocated block, by block id.
    stream_uses: FxHashMap<u32, Vec<StreamId>>,
    pub(crate) reservations: Vec<Reservation>,
    stats: DeviceStats,
    /// Bytes reserved from the device (`total_allocated_memory`).
    total_reserved: u64,
    /// Set by a memory fraction below 1: (fraction, allowed bytes).
    fraction: Option<(f64, u64)>,
    recorder: Recorder,
    /// While on: every malloc and free, for [`crate::alloc::fastforward`] (`steps.rs`).
    steplog: Option<steps::StepLog>,
    /// Set by [`CachingAllocator::malloc_guarded`]: stop before releasing every cached
    /// segment (the out-of-memory path's last resort), which touches both pools.
    guard_release: bool,
}

impl<S: SegmentSource> CachingAllocator<S> {
    pub fn new(conf: AllocConf, source: S) -> Self {
        let mut a = CachingAllocator {
            stats: DeviceStats {
                max_split_size: conf.max_split_size_stat(),
                ..Default::default()
            },
            conf,
            source,
            device: 0,
            blocks: Vec::new(),
            free_ids: Vec::new(),
            pools: [Pool::default(), Pool::default()],
            allocated: AddrMap::default(),
            pending: Vec::new(),
            stream_uses: FxHashMap::default(),
            reservations: Vec::new(),
            total_reserved: 0,
            fraction: None,
            recorder: Recorder::default(),
            steplog: None,
            guard_release: false,
        };
        if let Some(f) = a.conf.per_process_memory_fraction {
            a.set_memory_fraction(f);
        }
        a
    }

    pub fn conf(&self) -> &AllocConf {
        &self.conf
    }

    pub fn source(&self) -> &S {
        &self.source
    }

    /// The segment source, to run kernels on a device that is one.
    pub fn source_mut(&mut self) -> &mut S {
        &mut self.source
    }

    /// The same allocator state over another source (a run's device swapped for the plain
    /// address record it kept, once the run is over).
    pub fn map_source<T: SegmentSource>(self, f: impl FnOnce(S) -> T) -> CachingAllocator<T> {
        CachingAllocator {
            conf: self.conf,
            source: f(self.source),
            device: self.device,
            blocks: self.blocks,
            free_ids: self.free_ids,
            pools: self.pools,
            allocated: self.allocated,
            pending: self.pending,
            stream_uses: self.stream_uses,
            reservations: self.reservations,
            stats: self.stats,
            total_reserved: self.total_reserved,
            fraction: self.fraction,
            recorder: self.recorder,
            steplog: self.steplog,
            guard_release: self.guard_release,
        }
    }

    pub fn device(&self) -> u32 {
        self.device
    }

    pub fn stats(&self) -> &DeviceStats {
        &self.stats
    }

    pub fn recorder(&self) -> &Recorder {
        &self.recorder
    }

    pub fn recorder_mut(&mut self) -> &mut Recorder {
        &mut self.recorder
    }

    /// Replaces the recorder (e.g. to set the ring's capacity or turn recording off).
    pub fn set_recorder(&mut self, r: Recorder) {
        self.recorder = r;
    }

    /// Bytes reserved from the device now.
    pub fn reserved(&self) -> u64 {
        self.total_reserved
    }

    /// `torch.cuda.set_per_process_memory_fraction(f)`: reserve at most f x total memory.
    /// A fraction of 1 (or more) lifts the limit, as in PyTorch 2.11.
    pub fn set_memory_fraction(&mut self, fraction: f64) {
        self.log_other();
        let f = fraction.clamp(0.0, 1.0);
        self.fraction = if f < 1.0 {
            Some((f, (f * self.source.device_total() as f64) as u64))
        } else {
            None
        };
    }

    /// The limit a memory fraction sets, if any.
    pub fn allowed_max(&self) -> Option<u64> {
        self.fraction.map(|(_, a)| a)
    }

    pub fn reset_peak_stats(&mut self) {
        self.stats.reset_peak();
    }

    pub fn reset_accumulated_stats(&mut self) {
        self.stats.reset_accumulated();
    }

    /// `round_size`: at least 512, a multiple of 512, or the next power-of-two division.
    pub fn round_size(&self, n: u64) -> u64 {
        if n < MIN_BLOCK_SIZE {
            return MIN_BLOCK_SIZE;
        }
        let d = self.conf.divisions_for(n);
        if d > 1 && n > MIN_BLOCK_SIZE * d {
            roundup_power2_next_division(n, d)
        } else {
            n.div_ceil(MIN_BLOCK_SIZE) * MIN_BLOCK_SIZE
        }
    }

    /// `get_allocation_size`: the segment size a miss of this rounded size asks for.
    pub fn allocation_size(&self, size: u64) -> u64 {
        if size <= SMALL_SIZE {
            SMALL_BUFFER
        } else if size < MIN_LARGE_ALLOC {
            self.conf.large_segment_size
        } else {
            size.div_ceil(ROUND_LARGE) * ROUND_LARGE
        }
    }

    fn pool_of(size: u64) -> PoolKind {
        if size <= SMALL_SIZE {
            PoolKind::Small
        } else {
            PoolKind::Large
        }
    }

    #[inline]
    fn gc_on(&self) -> bool {
        self.fraction.is_some() && self.conf.garbage_collection_threshold > 0.0
    }

    #[inline(always)]
    fn key(&self, id: u32) -> FreeKey {
        let b = &self.blocks[id as usize];
        FreeKey {
            stream: b.stream,
            size: b.size,
            addr: b.addr,
        }
    }

    #[inline(always)]
    fn new_block(&mut self, b: Block) -> u32 {
        if let Some(id) = self.free_ids.pop() {
            self.blocks[id as usize] = b;
            id
        } else {
            self.blocks.push(b);
            (self.blocks.len() - 1) as u32
        }
    }

    #[inline(always)]
    fn delete_block(&mut self, id: u32) {
        let b = &mut self.blocks[id as usize];
        b.live = false;
        self.free_ids.push(id);
    }

    #[inline(always)]
    fn blank(&self, addr: u64, size: u64, stream: StreamId, pool: PoolKind) -> Block {
        Block {
            addr,
            size,
            requested: 0,
            prev: NONE,
            next: NONE,
            stream,
            pool,
            allocated: false,
            mapped: true,
            expandable: NONE,
            n_uses: 0,
            event_count: 0,
            gc_base: 0,
            stack: StackId::ROOT,
            seg_stack: NO_STACK,
            live: true,
            free: FreeLink::default(),
        }
    }

    /// Links the new block `nb` into the segment's list right before `id`.
    #[inline(always)]
    fn splice_before(&mut self, id: u32, nb: u32) {
        let prev = self.blocks[id as usize].prev;
        let b = &mut self.blocks[nb as usize];
        b.prev = prev;
        b.next = id;
        if prev != NONE {
            self.blocks[prev as usize].next = nb;
        }
        self.blocks[id as usize].prev = nb;
    }

    /// Links the new block `nb` into the segment's list right after `id`.
    #[inline(always)]
    fn splice_after(&mut self, id: u32, nb: u32) {
        let next = self.blocks[id as usize].next;
        let b = &mut self.blocks[nb as usize];
        b.prev = id;
        b.next = next;
        if next != NONE {
            self.blocks[next as usize].prev = nb;
        }
        self.blocks[id as usize].next = nb;
    }

    #[inline(always)]
    fn insert_into_blocks(&mut self, id: u32) {
        let pool = self.blocks[id as usize].pool as usize;
        let gc = self.pools[pool].free_calls;
        self.blocks[id as usize].gc_base = gc;
        let k = self.key(id);
        self.pools[pool].blocks.insert(&mut self.blocks, k, id);
    }

    #[inline(always)]
    fn remove_from_blocks(&mut self, id: u32) {
        let pool = self.blocks[id as usize].pool as usize;
        let k = self.key(id);
        self.pools[pool].blocks.remove(&mut self.blocks, &k, id);
    }

    /// Allocates `n` bytes on `stream`, as `caching_allocator_alloc` does. Returns the block's
    /// address (0 for a zero-byte request, which changes nothing), or PyTorch's OOM error.
    pub fn malloc(&mut self, n: u64, stream: StreamId) -> Result<u64, OutOfMemory> {
        if n == 0 {
            return Ok(0);
        }
        if n >= ONE_EXABYTE {
            // PyTorch refuses these before the allocator runs (no stats, no trace entry)
            return Err(self.oom_error(n, n, n, true));
        }
        self.process_events();
        let size = self.round_size(n);
        let pool = Self::pool_of(size);
        let id = match self.get_free_block(pool, stream, size) {
            Some(id) => id,
            None => self.malloc_miss(n, size, pool, stream)?,
        };
        let split = self.should_split(id, size);
        let addr = self.alloc_found_block(id, size, n, split);
        if let Some(log) = self.steplog.as_mut() {
            let stack = self.recorder.current();
            log.events.push(StepEvent::Malloc {
                n,
                stream,
                addr,
                stack,
            });
        }
        Ok(addr)
    }

    /// Note [Retry]: no cached block fits. Kept out of line: the hit path stays small.
    #[cold]
    #[inline(never)]
    fn malloc_miss(
        &mut self,
        n: u64,
        size: u64,
        pool: PoolKind,
        stream: StreamId,
    ) -> Result<u32, OutOfMemory> {
        let alloc_size = self.allocation_size(size);
        if self.gc_on() {
            self.garbage_collect_cached_blocks();
        }
        let mut found = self.alloc_block(pool, stream, size, alloc_size, false);
        if found.is_none() && self.release_available_cached_blocks(pool, stream, size) {
            found = self.alloc_block(pool, stream, size, alloc_size, false);
        }
        if found.is_none() && self.guard_release {
            // (malloc_guarded: the caller stops here, before either pool changes)
            return Err(self.oom_error(n, size, alloc_size, false));
        }
        if found.is_none() {
            self.release_cached_blocks();
            found = self.alloc_block(pool, stream, size, alloc_size, true);
        }
        match found {
            Some(id) => Ok(id),
            None => {
                let device_free = self.source.device_free();
                tracing::debug!(
                    requested = n,
                    alloc_size,
                    device_free,
                    allocated = self.stats.allocated_bytes.all().current,
                    reserved = self.stats.reserved_bytes.all().current,
                    "out of memory after freeing cached blocks and retrying"
                );
                self.recorder
                    .record(EventKind::Oom, device_free, size, stream);
                self.stats.num_ooms += 1;
                Err(self.oom_error(n, size, alloc_size, false))
            }
        }
    }

    #[cold]
    fn oom_error(&self, n: u64, size: u64, alloc_size: u64, over_one_exabyte: bool) -> OutOfMemory {
        // the request's pool as the failure leaves it (what a report made later, after the
        // run's tensors were dropped, would no longer see)
        let pool = Self::pool_of(size);
        let (mut largest_free, mut free_blocks) = (0, 0);
        for b in self
            .blocks
            .iter()
            .filter(|b| b.live && !b.allocated && b.mapped && b.pool == pool)
        {
            largest_free = largest_free.max(b.size);
            free_blocks += 1;
        }
        OutOfMemory {
            largest_free,
            free_blocks,
            device: self.device,
            requested: n,
            rounded: size,
            alloc_size,
            device_total: self.source.device_total(),
            device_free: self.source.device_free(),
            process_used: self.source.process_used(),
            allowed: self.allowed_max(),
            allocated: self.stats.allocated_bytes.all().current as u64,
            reserved: self.stats.reserved_bytes.all().current as u64,
            over_one_exabyte,
        }
    }

    /// Note [Best fit].
    #[inline(always)]
    fn get_free_block(&mut self, pool: PoolKind, stream: StreamId, size: u64) -> Option<u32> {
        let gc = self.gc_on();
        let p = &mut self.pools[pool as usize];
        if gc {
            p.free_calls += 1;
        }
        let mss = self.conf.max_split_size;
        let nsr = self.conf.max_non_split_rounding;
        // Note [Oversize]: a normal request may not take a block that is never split; an
        // oversize request may take one at most max_non_split_rounding bigger.
        let fits = move |bsize: u64| {
            if size < mss {
                bsize < mss
            } else {
                bsize < size.saturating_add(nsr)
            }
        };
        if self.reservations.is_empty() {
            // no expandable blocks anywhere: the first candidate is the only one (fast path)
            return p
                .blocks
                .take_first_at_least(&mut self.blocks, stream, size, |k, _| fits(k.size));
        }
        p.blocks.flush(&mut self.blocks);
        let mut it = p.blocks.from_size(&self.blocks, stream, size);
        let (k0, id0) = it.next()?;
        if k0.stream != stream {
            return None;
        }
        let mut chosen = id0;
        let blocks = &self.blocks;
        if blocks[chosen as usize].expandable != NONE {
            if self.conf.expandable_segments {
                // An expandable block counts as big as it can grow: its size plus the unmapped
                // space right after it.
                let grow = |id: u32| {
                    let b = &blocks[id as usize];
                    if b.next == NONE || blocks[b.next as usize].mapped {
                        b.size
                    } else {
                        b.size + blocks[b.next as usize].size
                    }
                };
                while blocks[chosen as usize].expandable != NONE {
                    match it.next() {
                        Some((k, id)) if k.stream == stream && grow(id) < grow(chosen) => {
                            chosen = id
                        }
                        _ => break,
                    }
                }
            } else {
                // Expandable segments were turned off after some were made: skip their blocks.
                loop {
                    let (k, id) = it.next()?;
                    if k.stream != stream {
                        return None;
                    }
                    if blocks[id as usize].expandable == NONE {
                        chosen = id;
                        break;
                    }
                }
            }
        }
        if !fits(blocks[chosen as usize].size) {
            return None;
        }
        self.remove_from_blocks(chosen);
        Some(chosen)
    }

    #[inline(always)]
    fn should_split(&self, id: u32, size: u64) -> bool {
        let b = &self.blocks[id as usize];
        let remaining = b.size - size;
        if b.pool == PoolKind::Small || self.conf.expandable_segments {
            remaining >= MIN_BLOCK_SIZE
        } else {
            size < self.conf.max_split_size && remaining > SMALL_SIZE
        }
    }

    /// A new segment (or, with expandable segments, newly mapped pages).
    fn alloc_block(
        &mut self,
        pool: PoolKind,
        stream: StreamId,
        size: u64,
        alloc_size: u64,
        is_retry: bool,
    ) -> Option<u32> {
        if is_retry {
            self.stats.num_alloc_retries += 1;
        }
        if let Some((_, allowed)) = self.fraction {
            if self.total_reserved + alloc_size > allowed {
                return None;
            }
        }
        if self.conf.expandable_segments {
            return self.try_allocate_expandable_block(pool, stream, size);
        }
        let addr = self.source.malloc(alloc_size)?;
        self.total_reserved += alloc_size;
        let mut b = self.blank(addr, alloc_size, stream, pool);
        b.seg_stack = self.recorder.current();
        let id = self.new_block(b);
        self.stats.segment.increase(pool, 1);
        self.stats.reserved_bytes.increase(pool, alloc_size);
        if alloc_size >= self.conf.max_split_size {
            self.stats.oversize_segments.increase(1);
        }
        self.stats.num_device_alloc += 1;
        tracing::debug!(addr = %format_args!("{addr:#x}"), size = alloc_size, ?pool, "segment allocated (cudaMalloc)");
        self.recorder
            .record(EventKind::SegmentAlloc, addr, alloc_size, stream);
        Some(id)
    }

    /// Note [Split] and Note [Inactive split].
    #[inline(always)]
    fn alloc_found_block(&mut self, id: u32, size: u64, n: u64, split: bool) -> u64 {
        let (pool, stream, already_split, expandable) = {
            let b = &self.blocks[id as usize];
            (b.pool, b.stream, b.is_split(), b.expandable != NONE)
        };
        let mut block = id;
        if split {
            let remaining = id;
            let raddr = self.blocks[remaining as usize].addr;
            let mut nb = self.blank(raddr, size, stream, pool);
            nb.expandable = self.blocks[remaining as usize].expandable;
            let new = self.new_block(nb);
            self.splice_before(remaining, new);
            {
                let r = &mut self.blocks[remaining as usize];
                r.addr += size;
                r.size -= size;
            }
            self.insert_into_blocks(remaining);
            if !expandable {
                if already_split {
                    self.stats.inactive_split_bytes.decrease(pool, size);
                } else {
                    let rsize = self.blocks[remaining as usize].size;
                    self.stats.inactive_split_bytes.increase(pool, rsize);
                    self.stats.inactive_split.increase(pool, 1);
                }
            }
            block = new;
        } else if already_split && !expandable {
            let bsize = self.blocks[id as usize].size;
            self.stats.inactive_split_bytes.decrease(pool, bsize);
            self.stats.inactive_split.decrease(pool, 1);
        }
        let stack = self.recorder.current();
        let (addr, bsize) = {
            let b = &mut self.blocks[block as usize];
            b.allocated = true;
            b.requested = n;
            b.stack = stack;
            (b.addr, b.size)
        };
        self.recorder.record(EventKind::Alloc, addr, n, stream);
        self.allocated.insert(addr, block);
        let s = &mut self.stats;
        s.allocation.increase(pool, 1);
        s.allocated_bytes.increase(pool, bsize);
        s.active.increase(pool, 1);
        s.active_bytes.increase(pool, bsize);
        s.requested_bytes.increase(pool, n);
        if bsize >= self.conf.max_split_size {
            s.oversize_allocations.increase(1);
        }
        addr
    }

    /// Frees the allocation at `addr` (0 is a no-op, like freeing a null pointer). The block
    /// returns to its pool at once unless other streams used it (`record_stream`).
    pub fn free(&mut self, addr: u64) -> Result<(), PointerError> {
        if addr == 0 {
            return Ok(());
        }
        let id = self
            .allocated
            .remove(addr)
            .ok_or(PointerError::NotAllocated(addr))?;
        if let Some(log) = self.steplog.as_mut() {
            log.events.push(StepEvent::Free { addr });
        }
        let (pool, size, requested, stream) = {
            let b = &mut self.blocks[id as usize];
            b.allocated = false;
            (b.pool, b.size, b.requested, b.stream)
        };
        self.stats.allocation.decrease(pool, 1);
        self.stats.allocated_bytes.decrease(pool, size);
        self.recorder
            .record(EventKind::FreeRequested, addr, requested, stream);
        if size >= self.conf.max_split_size {
            self.stats.oversize_allocations.decrease(1);
        }
        if self.blocks[id as usize].n_uses > 0 {
            self.defer_free(id);
        } else {
            self.free_block(id);
        }
        Ok(())
    }

    /// The block was used on other streams: its free completes once their work is done.
    #[cold]
    #[inline(never)]
    fn defer_free(&mut self, id: u32) {
        let b = &mut self.blocks[id as usize];
        b.event_count = b.n_uses;
        b.n_uses = 0;
        self.stream_uses.remove(&id);
        self.pending.push(id);
    }

    /// `Tensor.record_stream(s)`: the block was used on `stream` too, so its free waits for
    /// that stream's work.
    pub fn record_stream(&mut self, addr: u64, stream: StreamId) -> Result<(), PointerError> {
        self.log_other();
        let id = self
            .allocated
            .get(addr)
            .ok_or(PointerError::NotAllocated(addr))?;
        let b = &mut self.blocks[id as usize];
        let uses = self.stream_uses.entry(id).or_default();
        if stream != b.stream && !uses.contains(&stream) {
            uses.push(stream);
            b.n_uses = uses.len().min(u16::MAX as usize) as u16;
        }
        Ok(())
    }

    /// Frees that are waiting on other streams (blocks in state `active_pending_free`).
    pub fn pending_frees(&self) -> usize {
        self.pending.len()
    }

    /// The simulated device finishes work at once, so pending frees complete at the next
    /// allocation or cache flush (where PyTorch queries or synchronizes its events).
    #[inline(always)]
    fn process_events(&mut self) {
        if !self.pending.is_empty() {
            self.complete_pending_frees();
        }
    }

    #[cold]
    fn complete_pending_frees(&mut self) {
        let pending = std::mem::take(&mut self.pending);
        for id in pending {
            self.blocks[id as usize].event_count = 0;
            self.free_block(id);
        }
    }

    #[inline(always)]
    fn free_block(&mut self, id: u32) {
        let (addr, orig_size, requested, stream, pool, prev, next, expandable) = {
            let b = &self.blocks[id as usize];
            (
                b.addr,
                b.size,
                b.requested,
                b.stream,
                b.pool,
                b.prev,
                b.next,
                b.expandable != NONE,
            )
        };
        self.recorder
            .record(EventKind::FreeCompleted, addr, requested, stream);
        let mut net_blocks: i64 = 0;
        let mut net_bytes: i64 = 0;
        for cand in [prev, next] {
            let sub = self.try_merge_blocks(id, cand);
            if sub > 0 {
                net_blocks -= 1;
                net_bytes -= sub as i64;
            }
        }
        self.insert_into_blocks(id);
        let b = &self.blocks[id as usize];
        if b.is_split() {
            net_blocks += 1;
            net_bytes += b.size as i64;
        }
        let s = &mut self.stats;
        if !expandable {
            match net_blocks.cmp(&0) {
                std::cmp::Ordering::Greater => s.inactive_split.increase(pool, net_blocks as u64),
                std::cmp::Ordering::Less => s.inactive_split.decrease(pool, (-net_blocks) as u64),
                _ => {}
            }
            match net_bytes.cmp(&0) {
                std::cmp::Ordering::Greater => {
                    s.inactive_split_bytes.increase(pool, net_bytes as u64)
                }
                std::cmp::Ordering::Less => {
                    s.inactive_split_bytes.decrease(pool, (-net_bytes) as u64)
                }
                _ => {}
            }
        }
        s.active.decrease(pool, 1);
        s.active_bytes.decrease(pool, orig_size);
        s.requested_bytes.decrease(pool, requested);
    }

    /// Merges `src` into `dst` if `src` is a free neighbour in the same mapped state; returns
    /// the bytes absorbed.
    #[inline(always)]
    fn try_merge_blocks(&mut self, dst: u32, src: u32) -> u64 {
        if src == NONE {
            return 0;
        }
        {
            let s = &self.blocks[src as usize];
            let d = &self.blocks[dst as usize];
            if s.allocated || s.event_count > 0 || s.n_uses > 0 || s.mapped != d.mapped {
                return 0;
            }
        }
        // leave the pool's set while the key is still intact
        let (s_addr, s_size, s_prev, s_next, s_mapped, s_stream, s_pool, s_seg) = {
            let s = &self.blocks[src as usize];
            (
                s.addr,
                s.size,
                s.prev,
                s.next,
                s.mapped,
                s.stream,
                s.pool,
                s.seg_stack,
            )
        };
        if s_mapped {
            self.pools[s_pool as usize].blocks.remove(
                &mut self.blocks,
                &FreeKey {
                    stream: s_stream,
                    size: s_size,
                    addr: s_addr,
                },
                src,
            );
        } else {
            self.pools[s_pool as usize]
                .unmapped
                .remove(&(s_stream, s_addr));
        }
        if self.blocks[dst as usize].prev == src {
            let d = &mut self.blocks[dst as usize];
            d.addr = s_addr;
            d.prev = s_prev;
            d.seg_stack = s_seg;
            if s_prev != NONE {
                self.blocks[s_prev as usize].next = dst;
            }
        } else {
            self.blocks[dst as usize].next = s_next;
            if s_next != NONE {
                self.blocks[s_next as usize].prev = dst;
            }
        }
        self.blocks[dst as usize].size += s_size;
        self.delete_block(src);
        s_size
    }
}

/// `roundup_power2_next_division`: round up to the next of `divisions` equal steps between two
/// powers of two.
pub fn roundup_power2_next_division(size: u64, divisions: u64) -> u64 {
    if size.is_power_of_two() {
        return size;
    }
    let floor = 1u64 << (63 - size.leading_zeros());
    let step = floor >> (63 - divisions.leading_zeros());
    if step == 0 {
        return floor << 1;
    }
    let rounded_floor = size & !(step - 1);
    if rounded_floor == size {
        size
    } else {
        rounded_floor + step
    }
}
