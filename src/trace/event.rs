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
    /// gpumem's own: the live block at `addr` changed memory category (a temporary saved for
    /// backward becomes an activation). The event's stack ends in the new `category:` tag;
    /// size 0. PyTorch has no such event; exports leave it out.
    Retag,
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
            EventKind::Retag => "retag",
        }
    }

    /// The kind numbered `i` (`kind as u8`).
    pub fn from_index(i: u8) -> Option<EventKind> {
        KINDS.get(usize::from(i)).copied()
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
            "retag" => EventKind::Retag,
            _ => return None,
        })
    }
}

/// 24 bytes: address, size and kind packed in one word, tag stack, stream. Every alloc and
/// free writes three of these, so their size is the recording's cost: sizes are below 2^60
/// (larger requests are refused before anything is recorded), which leaves the top 4 bits
/// for the kind.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct Event {
    pub addr: u64,
    size_kind: u64,
    pub stack: StackId,
    pub stream: u32,
}

const KIND_SHIFT: u32 = 60;
const SIZE_MASK: u64 = (1 << KIND_SHIFT) - 1;
const KINDS: [EventKind; 10] = [
    EventKind::Alloc,
    EventKind::FreeRequested,
    EventKind::FreeCompleted,
    EventKind::SegmentAlloc,
    EventKind::SegmentFree,
    EventKind::SegmentMap,
    EventKind::SegmentUnmap,
    EventKind::Oom,
    EventKind::EmptyCache,
    EventKind::Retag,
];

impl Event {
    #[inline(always)]
    pub fn new(kind: EventKind, addr: u64, size: u64, stack: StackId, stream: u32) -> Event {
        debug_assert!(size <= SIZE_MASK, "event sizes are below 2^60");
        Event {
            addr,
            size_kind: (size & SIZE_MASK) | ((kind as u64) << KIND_SHIFT),
            stack,
            stream,
        }
    }

    #[inline]
    pub fn kind(&self) -> EventKind {
        KINDS[(self.size_kind >> KIND_SHIFT) as usize]
    }

    #[inline]
    pub fn size(&self) -> u64 {
        self.size_kind & SIZE_MASK
    }
}

impl std::fmt::Debug for Event {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Event")
            .field("kind", &self.kind())
            .field("addr", &format_args!("{:#x}", self.addr))
            .field("size", &self.size())
            .field("stack", &self.stack)
            .field("stream", &self.stream)
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn packs_kind_and_size() {
        assert_eq!(std::mem::size_of::<Event>(), 24);
        for (i, k) in KINDS.iter().enumerate() {
            assert_eq!(*k as usize, i);
            let e = Event::new(*k, 0x7f00_0000_0200, (1 << 60) - 1, StackId(3), 2);
            assert_eq!(
                (e.kind(), e.size(), e.addr, e.stream),
                (*k, (1 << 60) - 1, 0x7f00_0000_0200, 2)
            );
        }
    }
}
