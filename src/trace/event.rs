//! One allocator event. The kinds and their `addr`/`size` follow PyTorch's trace entries
//! (`torch.cuda.memory._snapshot()["device_traces"]`), plus `EmptyCache`, which PyTorch does not
//! record but a reader of a gpumem trace wants to see.

use super::tags::StackId;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum EventKind {
    /// A block handed out: block address, unrounded request.
    Alloc,
    /// A free asked for: block address, the block's requested size.
    FreeRequested,
    /// The free done (after other streams finished with it): address before merging, requested size.
    FreeCompleted,
    /// A segment from the device: segment address, size.
    SegmentAlloc,
    /// A segment returned to the device.
    SegmentFree,
    /// Expandable segment pages mapped: address, bytes.
    SegmentMap,
    /// Expandable segment pages unmapped: address, bytes.
    SegmentUnmap,
    /// An allocation that raised out-of-memory: device free bytes, rounded request.
    Oom,
    /// `empty_cache()` called (addr 0, size 0).
    EmptyCache,
}

impl EventKind {
    /// PyTorch's action name (`empty_cache` is gpumem's own).
    pub fn action(self) -> &'static str {
        match self {
            EventKind::Alloc => "alloc",
            EventKind::FreeRequested => "free_requested",
            EventKind::FreeCompleted => "free_completed",
            EventKind::SegmentAlloc => "segment_alloc",
            EventKind::SegmentFree => "segment_free",
            EventKind::SegmentMap => "segment_map",
            EventKind::SegmentUnmap => "segment_unmap",
            EventKind::Oom => "oom",
            EventKind::EmptyCache => "empty_cache",
        }
    }

    pub fn from_action(s: &str) -> Option<EventKind> {
        Some(match s {
            "alloc" => EventKind::Alloc,
            "free_requested" => EventKind::FreeRequested,
            "free_completed" => EventKind::FreeCompleted,
            "segment_alloc" => EventKind::SegmentAlloc,
            "segment_free" => EventKind::SegmentFree,
            "segment_map" => EventKind::SegmentMap,
            "segment_unmap" => EventKind::SegmentUnmap,
            "oom" => EventKind::Oom,
            "empty_cache" => EventKind::EmptyCache,
            _ => return None,
        })
    }
}

/// 32 bytes: address, size, tag stack, stream, kind.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Event {
    pub addr: u64,
    pub size: u64,
    pub stack: StackId,
    pub stream: u32,
    pub kind: EventKind,
}
