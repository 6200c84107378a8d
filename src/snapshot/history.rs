//! A trace must be one the allocator could have written: a block is freed once, with the size
//! it was allocated with, an address is not handed out again while still allocated, and a
//! segment is not released while blocks in it are allocated. Frees of blocks allocated before
//! the trace began (a ring buffer's wrap) are fine: only what the trace itself shows is held
//! against it.

use rustc_hash::FxHashMap;

use crate::trace::{Event, EventKind};

#[derive(Clone, Copy, PartialEq)]
enum Block {
    /// Allocated at this trace index, with this size.
    Live(usize, u64),
    /// Its free asked for (other streams may still use it).
    Freeing(usize, u64),
    /// Freed at this trace index.
    Freed(usize),
}

/// `Err` names the first entry that contradicts the ones before it; `entry` turns an event's
/// index into its trace index (skipped entries count), and `device` the list it is in.
pub fn check(events: &[Event], entry: impl Fn(usize) -> u64, device: u32) -> Result<(), String> {
    let mut blocks: FxHashMap<u64, Block> = FxHashMap::default();
    // the addresses of blocks not yet freed, for a segment's range
    let mut busy: std::collections::BTreeSet<u64> = Default::default();
    let at = |i: usize| format!("device_traces[{device}][{}]", entry(i));
    for (i, e) in events.iter().enumerate() {
        let (addr, size) = (e.addr, e.size());
        match e.kind() {
            EventKind::Alloc => match blocks.get(&addr) {
                Some(Block::Live(k, _) | Block::Freeing(k, _)) => {
                    return Err(format!(
                        "{}: alloc at {addr:#x} while the block {} allocated there is not \
                         freed",
                        at(i),
                        at(*k)
                    ))
                }
                _ => {
                    blocks.insert(addr, Block::Live(i, size));
                    busy.insert(addr);
                }
            },
            EventKind::FreeRequested => match blocks.get(&addr) {
                Some(&Block::Live(k, s)) if s != size => {
                    return Err(format!(
                        "{}: free of {size} bytes at {addr:#x}, where {} allocated {s}",
                        at(i),
                        at(k)
                    ))
                }
                Some(&Block::Live(_, s)) => {
                    blocks.insert(addr, Block::Freeing(i, s));
                }
                Some(Block::Freeing(k, _) | Block::Freed(k)) => {
                    return Err(format!(
                        "{}: free at {addr:#x}, a block already freed at {}",
                        at(i),
                        at(*k)
                    ))
                }
                // allocated before the trace began
                None => {
                    blocks.insert(addr, Block::Freeing(i, size));
                    busy.insert(addr);
                }
            },
            EventKind::FreeCompleted => match blocks.get(&addr) {
                Some(Block::Freed(k)) => {
                    return Err(format!(
                        "{}: free_completed at {addr:#x}, a block already freed at {}",
                        at(i),
                        at(*k)
                    ))
                }
                _ => {
                    blocks.insert(addr, Block::Freed(i));
                    busy.remove(&addr);
                }
            },
            EventKind::SegmentFree | EventKind::SegmentUnmap => {
                let end = addr.saturating_add(size);
                if let Some(&b) = busy.range(addr..end).next() {
                    let k = match blocks.get(&b) {
                        Some(Block::Live(k, _) | Block::Freeing(k, _)) => *k,
                        _ => i,
                    };
                    return Err(format!(
                        "{}: the segment at {addr:#x} ({size} bytes) is released while the \
                         block at {b:#x} ({} allocated) is in use",
                        at(i),
                        at(k)
                    ));
                }
            }
            _ => {}
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::trace::StackId;

    fn ev(kind: EventKind, addr: u64, size: u64) -> Event {
        Event::new(kind, addr, size, StackId::ROOT, 0)
    }

    #[test]
    fn a_trace_the_allocator_could_write_passes_and_contradictions_are_named() {
        use EventKind::*;
        let ok = [
            ev(SegmentAlloc, 0, 1024),
            ev(Alloc, 0, 512),
            ev(FreeRequested, 0, 512),
            ev(FreeCompleted, 0, 512),
            ev(Alloc, 0, 512),
            ev(FreeRequested, 0x9900, 8), // allocated before the trace began
            ev(FreeRequested, 0, 512),
            ev(FreeCompleted, 0, 512),
            ev(SegmentFree, 0, 1024),
        ];
        assert_eq!(check(&ok, |i| i as u64, 0), Ok(()));
        let twice = [
            ev(Alloc, 0, 512),
            ev(FreeRequested, 0, 512),
            ev(FreeRequested, 0, 512),
        ];
        let e = check(&twice, |i| i as u64 + 1, 3).unwrap_err();
        assert!(
            e.starts_with(
                "device_traces[3][3]: free at 0x0, a block already freed at device_traces[3][2]"
            ),
            "{e}"
        );
        let size = [ev(Alloc, 0, 512), ev(FreeRequested, 0, 4096)];
        assert!(check(&size, |i| i as u64, 0)
            .unwrap_err()
            .contains("free of 4096 bytes"));
        let again = [ev(Alloc, 0, 512), ev(Alloc, 0, 512)];
        assert!(check(&again, |i| i as u64, 0)
            .unwrap_err()
            .contains("is not freed"));
        let busy = [
            ev(SegmentAlloc, 0, 1024),
            ev(Alloc, 512, 8),
            ev(SegmentFree, 0, 1024),
        ];
        assert!(check(&busy, |i| i as u64, 0)
            .unwrap_err()
            .contains("in use"));
    }
}
