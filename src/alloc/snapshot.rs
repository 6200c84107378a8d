//! The allocator's state as segments and blocks, in the shape of `torch.cuda.memory._snapshot()`
//! (`segments`): one entry per segment, or per contiguous mapped range of an expandable segment.

use super::caching::{Block, CachingAllocator, StreamId, NONE, NO_STACK};
use super::source::SegmentSource;
use super::stats::PoolKind;
use crate::trace::StackId;

#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum BlockState {
    ActiveAllocated,
    ActivePendingFree,
    Inactive,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BlockInfo {
    pub address: u64,
    pub size: u64,
    /// Unrounded size of the last allocation that used the block (stale once free).
    pub requested_size: u64,
    pub state: BlockState,
    /// Tag stack of the allocation (meaningful while allocated).
    pub stack: StackId,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SegmentInfo {
    pub device: u32,
    pub address: u64,
    pub total_size: u64,
    pub allocated_size: u64,
    pub active_size: u64,
    pub requested_size: u64,
    pub stream: StreamId,
    pub pool: PoolKind,
    pub is_expandable: bool,
    /// Tag stack when the segment was allocated (None when its first block came from a split).
    pub stack: Option<StackId>,
    pub blocks: Vec<BlockInfo>,
}

impl<S: SegmentSource> CachingAllocator<S> {
    /// Every segment, sorted by address, blocks in address order.
    pub fn snapshot(&self) -> Vec<SegmentInfo> {
        let mut segs = Vec::new();
        let heads = self
            .blocks
            .iter()
            .enumerate()
            .filter(|(_, b)| b.live && b.prev == NONE)
            .map(|(i, _)| i as u32);
        for head in heads {
            let b0 = &self.blocks[head as usize];
            if b0.expandable == NONE {
                let mut seg = self.new_segment(b0, false);
                let mut id = head;
                while id != NONE {
                    let b = &self.blocks[id as usize];
                    push_block(&mut seg, b);
                    id = b.next;
                }
                segs.push(seg);
            } else {
                // one segment per contiguous run of mapped blocks
                let mut id = head;
                let mut cur: Option<SegmentInfo> = None;
                while id != NONE {
                    let b = &self.blocks[id as usize];
                    if b.mapped {
                        let seg = cur.get_or_insert_with(|| self.new_segment(b, true));
                        push_block(seg, b);
                    } else if let Some(s) = cur.take() {
                        segs.push(s);
                    }
                    id = b.next;
                }
                if let Some(s) = cur {
                    segs.push(s);
                }
            }
        }
        segs.sort_by_key(|s| s.address);
        segs
    }

    fn new_segment(&self, b: &Block, expandable: bool) -> SegmentInfo {
        SegmentInfo {
            device: self.device(),
            address: b.addr,
            total_size: 0,
            allocated_size: 0,
            active_size: 0,
            requested_size: 0,
            stream: b.stream,
            pool: b.pool,
            is_expandable: expandable,
            stack: (b.seg_stack != NO_STACK).then_some(b.seg_stack),
            blocks: Vec::new(),
        }
    }
}

fn push_block(seg: &mut SegmentInfo, b: &Block) {
    let state = if b.allocated {
        BlockState::ActiveAllocated
    } else if b.event_count > 0 {
        BlockState::ActivePendingFree
    } else {
        BlockState::Inactive
    };
    seg.total_size += b.size;
    if b.allocated {
        seg.allocated_size += b.size;
    }
    if state != BlockState::Inactive {
        seg.active_size += b.size;
        seg.requested_size += b.requested;
    }
    seg.blocks.push(BlockInfo {
        address: b.addr,
        size: b.size,
        requested_size: b.requested,
        state,
        stack: b.stack,
    });
}
