//! Block sizes from a trace. A trace records requests, not blocks; the block an allocation got
//! follows from where it was carved. Inside a segment the trace saw created, the blocks are
//! tracked as the allocator keeps them (split when the remainder is large enough, merged with
//! free neighbours on free), so each allocation's block size is exact; elsewhere (segments from
//! before the trace, expandable segments) the request is rounded as the allocator rounds it,
//! which can miss an unsplit remainder of up to 1 MiB.

use std::collections::BTreeMap;

use rustc_hash::FxHashMap;

use crate::alloc::{AllocConf, SimAllocator, SimSource};
use crate::trace::{Event, EventKind};

const SMALL_SEGMENT: u64 = 2 << 20;
const SMALL_SIZE: u64 = 1 << 20;
const MIN_BLOCK: u64 = 512;

struct Segment {
    size: u64,
    small: bool,
    /// Block start → the block. Blocks tile the segment; each knows the start of the one
    /// before it, so that splits and merges are a few hash lookups.
    blocks: FxHashMap<u64, Blk>,
}

#[derive(Clone, Copy)]
struct Blk {
    size: u64,
    free: bool,
    /// Start of the block before this one in the segment (`NO_PREV` for the first).
    prev: u64,
}

const NO_PREV: u64 = u64::MAX;

impl Segment {
    /// Sets the `prev` of the block starting at `at`, if there is one.
    fn link(&mut self, at: u64, prev: u64) {
        if let Some(b) = self.blocks.get_mut(&at) {
            b.prev = prev;
        }
    }
}

pub struct Sizer {
    rounder: SimAllocator,
    max_split: u64,
    expandable: bool,
    segments: BTreeMap<u64, Segment>,
    /// Sizes handed out, by address (for frees).
    given: FxHashMap<u64, u64>,
    /// Allocations at an address the trace had allocated and not freed since (a trace that
    /// is not a consistent history, or lost events).
    pub reused: u64,
}

impl Sizer {
    pub fn new(conf: &AllocConf) -> Sizer {
        Sizer {
            rounder: SimAllocator::new(conf.clone(), SimSource::new(1 << 40, 0)),
            max_split: conf.max_split_size,
            expandable: conf.expandable_segments,
            segments: BTreeMap::new(),
            given: FxHashMap::default(),
            reused: 0,
        }
    }

    pub fn round(&self, n: u64) -> u64 {
        self.rounder.round_size(n)
    }

    fn segment_of(&mut self, addr: u64) -> Option<&mut Segment> {
        let (start, seg) = self.segments.range_mut(..=addr).next_back()?;
        (addr < start + seg.size).then_some(seg)
    }

    /// Applies one event. For an allocation, returns its block's size; for a free, the size
    /// that is freed.
    pub fn step(&mut self, e: &Event) -> Option<u64> {
        match e.kind() {
            EventKind::SegmentAlloc if !self.expandable => {
                let mut blocks = FxHashMap::default();
                blocks.insert(
                    e.addr,
                    Blk {
                        size: e.size(),
                        free: true,
                        prev: NO_PREV,
                    },
                );
                self.segments.insert(
                    e.addr,
                    Segment {
                        size: e.size(),
                        small: e.size() == SMALL_SEGMENT,
                        blocks,
                    },
                );
                None
            }
            EventKind::SegmentFree => {
                self.segments.remove(&e.addr);
                None
            }
            EventKind::Alloc => {
                let r = self.round(e.size());
                let (max_split, addr) = (self.max_split, e.addr);
                let size = match self.segment_of(addr) {
                    Some(seg) => match seg.blocks.get(&addr).copied() {
                        Some(b) if b.free && b.size >= r => {
                            let f = b.size;
                            let remaining = f - r;
                            let split = if seg.small {
                                remaining >= MIN_BLOCK
                            } else {
                                r < max_split && remaining > SMALL_SIZE
                            };
                            if split {
                                seg.blocks.insert(
                                    addr,
                                    Blk {
                                        size: r,
                                        free: false,
                                        prev: b.prev,
                                    },
                                );
                                seg.blocks.insert(
                                    addr + r,
                                    Blk {
                                        size: remaining,
                                        free: true,
                                        prev: addr,
                                    },
                                );
                                seg.link(addr + f, addr + r);
                                r
                            } else {
                                seg.blocks.insert(addr, Blk { free: false, ..b });
                                f
                            }
                        }
                        _ => r,
                    },
                    None => r,
                };
                if self.given.insert(addr, size).is_some() {
                    self.reused += 1;
                }
                Some(size)
            }
            EventKind::FreeRequested => {
                let size = self
                    .given
                    .remove(&e.addr)
                    .unwrap_or_else(|| self.round(e.size()));
                let addr = e.addr;
                if let Some(seg) = self.segment_of(addr) {
                    if let Some(b) = seg.blocks.get(&addr).copied() {
                        let (mut start, mut len, mut prev) = (addr, b.size, b.prev);
                        // merge with a free block after and before
                        if let Some(n) = seg.blocks.get(&(start + len)).copied() {
                            if n.free {
                                seg.blocks.remove(&(start + len));
                                len += n.size;
                            }
                        }
                        if let Some(p) = seg.blocks.get(&prev).copied() {
                            if p.free && prev + p.size == start {
                                seg.blocks.remove(&start);
                                start = prev;
                                len += p.size;
                                prev = p.prev;
                            }
                        }
                        seg.blocks.insert(
                            start,
                            Blk {
                                size: len,
                                free: true,
                                prev,
                            },
                        );
                        seg.link(start + len, start);
                    }
                }
                Some(size)
            }
            _ => None,
        }
    }
}
