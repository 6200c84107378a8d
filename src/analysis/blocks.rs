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
    /// Block start → (size, free).
    blocks: BTreeMap<u64, (u64, bool)>,
}

pub struct Sizer {
    rounder: SimAllocator,
    max_split: u64,
    expandable: bool,
    segments: BTreeMap<u64, Segment>,
    /// Sizes handed out, by address (for frees).
    given: FxHashMap<u64, u64>,
}

impl Sizer {
    pub fn new(conf: &AllocConf) -> Sizer {
        Sizer {
            rounder: SimAllocator::new(conf.clone(), SimSource::new(1 << 40, 0)),
            max_split: conf.max_split_size,
            expandable: conf.expandable_segments,
            segments: BTreeMap::new(),
            given: FxHashMap::default(),
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
                let mut blocks = BTreeMap::new();
                blocks.insert(e.addr, (e.size(), true));
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
                        Some((f, true)) if f >= r => {
                            let remaining = f - r;
                            let split = if seg.small {
                                remaining >= MIN_BLOCK
                            } else {
                                r < max_split && remaining > SMALL_SIZE
                            };
                            if split {
                                seg.blocks.insert(addr, (r, false));
                                seg.blocks.insert(addr + r, (remaining, true));
                                r
                            } else {
                                seg.blocks.insert(addr, (f, false));
                                f
                            }
                        }
                        _ => r,
                    },
                    None => r,
                };
                self.given.insert(addr, size);
                Some(size)
            }
            EventKind::FreeRequested => {
                let size = self
                    .given
                    .remove(&e.addr)
                    .unwrap_or_else(|| self.round(e.size()));
                let addr = e.addr;
                if let Some(seg) = self.segment_of(addr) {
                    if let Some((s, _)) = seg.blocks.get(&addr).copied() {
                        let (mut start, mut len) = (addr, s);
                        // merge with a free block after and before
                        if let Some((n, true)) = seg.blocks.get(&(start + len)).copied() {
                            seg.blocks.remove(&(start + len));
                            len += n;
                        }
                        if let Some((&p, &(ps, true))) = seg.blocks.range(..start).next_back() {
                            if p + ps == start {
                                seg.blocks.remove(&start);
                                start = p;
                                len += ps;
                            }
                        }
                        seg.blocks.insert(start, (len, true));
                    }
                }
                Some(size)
            }
            _ => None,
        }
    }
}
