//! Fragmentation of the allocator's segments: where reserved memory that no tensor uses sits.
//!
//! Reserved memory splits three ways: the bytes tensors asked for (`requested`), the slack of
//! allocated blocks (`internal`: rounding up to 512 bytes or a power-of-two division, and the
//! remainder of a block too small to split off), and free blocks inside segments (`external`:
//! gaps between allocated blocks that only a request of their size or less can use). The
//! ratio `1 - largest free block / free bytes` says how scattered the free bytes are: 0 when
//! they are one block, near 1 when they are many small ones.

use crate::alloc::{BlockState, SegmentInfo};

/// Cells in a segment's fill map.
pub const MAP_CELLS: usize = 64;

/// One segment (or mapped range of an expandable segment).
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct SegmentFill {
    pub address: u64,
    pub size: u64,
    pub pool: &'static str,
    pub stream: u32,
    pub is_expandable: bool,
    /// Bytes of allocated blocks (including pending frees).
    pub allocated: u64,
    pub requested: u64,
    /// `allocated - requested`.
    pub internal: u64,
    /// Bytes of free blocks.
    pub free: u64,
    pub largest_free: u64,
    pub blocks: usize,
    pub free_blocks: usize,
    /// One character per 1/64 of the segment: `#` requested bytes, `+` slack of allocated
    /// blocks, `.` free, whichever covers most of the cell.
    pub map: String,
}

/// Free memory of one pool on one stream: a request there can only use these blocks.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct PoolFree {
    pub pool: &'static str,
    pub stream: u32,
    pub segments: usize,
    pub reserved: u64,
    pub free: u64,
    pub largest_free: u64,
    pub free_blocks: usize,
}

#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct Fragmentation {
    pub reserved: u64,
    pub allocated: u64,
    pub requested: u64,
    /// Slack inside allocated blocks.
    pub internal: u64,
    /// Free blocks inside segments.
    pub external: u64,
    pub largest_free: u64,
    /// `1 - largest_free / external` (0 when nothing is free).
    pub ratio: f64,
    pub pools: Vec<PoolFree>,
    pub segments: Vec<SegmentFill>,
}

/// The fragmentation of a set of segments (as `CachingAllocator::snapshot` lists them).
pub fn analyze(segments: &[SegmentInfo]) -> Fragmentation {
    let mut f = Fragmentation {
        reserved: 0,
        allocated: 0,
        requested: 0,
        internal: 0,
        external: 0,
        largest_free: 0,
        ratio: 0.0,
        pools: Vec::new(),
        segments: Vec::with_capacity(segments.len()),
    };
    for s in segments {
        let fill = fill(s);
        f.reserved += fill.size;
        f.allocated += fill.allocated;
        f.requested += fill.requested;
        f.internal += fill.internal;
        f.external += fill.free;
        f.largest_free = f.largest_free.max(fill.largest_free);
        let pool = match f
            .pools
            .iter_mut()
            .find(|p| p.pool == fill.pool && p.stream == fill.stream)
        {
            Some(p) => p,
            None => {
                f.pools.push(PoolFree {
                    pool: fill.pool,
                    stream: fill.stream,
                    segments: 0,
                    reserved: 0,
                    free: 0,
                    largest_free: 0,
                    free_blocks: 0,
                });
                f.pools.last_mut().expect("just pushed")
            }
        };
        pool.segments += 1;
        pool.reserved += fill.size;
        pool.free += fill.free;
        pool.largest_free = pool.largest_free.max(fill.largest_free);
        pool.free_blocks += fill.free_blocks;
        f.segments.push(fill);
    }
    f.pools
        .sort_by_key(|p| (p.stream, std::cmp::Reverse(p.pool)));
    f.ratio = ratio(f.largest_free, f.external);
    f
}

fn ratio(largest: u64, free: u64) -> f64 {
    if free == 0 {
        0.0
    } else {
        1.0 - largest as f64 / free as f64
    }
}

fn fill(s: &SegmentInfo) -> SegmentFill {
    let mut out = SegmentFill {
        address: s.address,
        size: s.total_size,
        pool: s.pool.name(),
        stream: s.stream,
        is_expandable: s.is_expandable,
        allocated: 0,
        requested: 0,
        internal: 0,
        free: 0,
        largest_free: 0,
        blocks: s.blocks.len(),
        free_blocks: 0,
        map: String::new(),
    };
    // bytes per cell of each kind: [requested, slack, free]
    let mut cells = [[0u64; 3]; MAP_CELLS];
    let cell = s.total_size.div_ceil(MAP_CELLS as u64).max(1);
    let total = s.total_size;
    let mut paint = |from: u64, len: u64, kind: usize| {
        // a block recorded past its segment's end paints only what lies inside it
        let (mut at, end) = (from.min(total), from.saturating_add(len).min(total));
        while at < end {
            let c = ((at / cell) as usize).min(MAP_CELLS - 1);
            let cell_end = ((c as u64 + 1) * cell).min(end).max(at + 1);
            cells[c][kind] += cell_end - at;
            at = cell_end;
        }
    };
    for b in &s.blocks {
        let off = b.address.saturating_sub(s.address);
        if b.state == BlockState::Inactive {
            out.free = out.free.saturating_add(b.size);
            out.free_blocks += 1;
            out.largest_free = out.largest_free.max(b.size);
            paint(off, b.size, 2);
        } else if b.state == BlockState::ActiveAllocated {
            let req = b.requested_size.min(b.size);
            out.allocated = out.allocated.saturating_add(b.size);
            out.requested = out.requested.saturating_add(req);
            paint(off, req, 0);
            paint(off + req, b.size - req, 1);
        } else {
            // freed by the program but still in use by a stream (active_pending_free): not
            // allocated and not yet free
            paint(off, b.size, 0);
        }
    }
    out.internal = out.allocated - out.requested;
    let used_cells = s.total_size.div_ceil(cell).min(MAP_CELLS as u64) as usize;
    out.map = cells[..used_cells]
        .iter()
        .map(|c| {
            if c[0] >= c[1] && c[0] >= c[2] && c[0] > 0 {
                '#'
            } else if c[1] >= c[2] && c[1] > 0 {
                '+'
            } else {
                '.'
            }
        })
        .collect();
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::alloc::{AllocConf, SimAllocator, SimSource};
    use crate::units::{GIB, MIB};

    #[test]
    fn a_block_past_its_segment_paints_only_the_segment() {
        // the map's loop advanced a byte per pass past the last cell: 2^63 bytes never ended
        let mut a = SimAllocator::new(AllocConf::default(), SimSource::new(8 * GIB, 0));
        a.malloc(64 * MIB, 0).unwrap();
        let mut segs = a.snapshot();
        segs[0].blocks[0].size = i64::MAX as u64;
        segs[0].blocks[0].requested_size = 8;
        let f = fill(&segs[0]);
        assert_eq!(f.map.len(), MAP_CELLS);
        // 8 bytes requested, the rest of the segment slack
        assert_eq!(f.map, "+".repeat(MAP_CELLS));
    }

    #[test]
    fn splits_free_space_into_internal_and_external() {
        let mut a = SimAllocator::new(AllocConf::default(), SimSource::new(8 * GIB, 0));
        // 20 MiB requests come from one 20 MiB segment each; free every other one
        let blocks: Vec<u64> = (0..4).map(|_| a.malloc(20 * MIB, 0).unwrap()).collect();
        a.free(blocks[1]).unwrap();
        // a small allocation: 1000 bytes rounded to 1024 in a 2 MiB small segment
        a.malloc(1000, 0).unwrap();
        let f = analyze(&a.snapshot());
        assert_eq!(f.reserved, 4 * 20 * MIB + 2 * MIB);
        assert_eq!(f.allocated, 3 * 20 * MIB + 1024);
        assert_eq!(f.internal, 24);
        assert_eq!(f.external, 20 * MIB + 2 * MIB - 1024);
        assert_eq!(f.largest_free, 20 * MIB);
        let large = f.pools.iter().find(|p| p.pool == "large").unwrap();
        assert_eq!((large.free, large.largest_free), (20 * MIB, 20 * MIB));
        let small = f.pools.iter().find(|p| p.pool == "small").unwrap();
        assert_eq!(small.free, 2 * MIB - 1024);
        assert!((f.ratio - (1.0 - 20.0 * MIB as f64 / f.external as f64)).abs() < 1e-12);
        let freed = f.segments.iter().find(|s| s.address == blocks[1]).unwrap();
        assert_eq!(freed.map, ".".repeat(MAP_CELLS));
        let full = f.segments.iter().find(|s| s.address == blocks[0]).unwrap();
        assert_eq!(full.map, "#".repeat(MAP_CELLS));
        let small_seg = f.segments.iter().find(|s| s.pool == "small").unwrap();
        // 1 KiB of a 2 MiB segment covers no cell's majority
        assert_eq!(small_seg.map, ".".repeat(MAP_CELLS));
    }

    #[test]
    fn nothing_free_is_ratio_zero() {
        let f = analyze(&[]);
        assert_eq!((f.reserved, f.external, f.ratio), (0, 0, 0.0));
    }
}
