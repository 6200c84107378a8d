//! The free blocks of one pool, ordered by (stream, size, address) like PyTorch's
//! `std::set<Block*, BlockComparatorSize>`, but faster for what the allocator does all the time:
//! find the first block of a stream not smaller than a request, and take a known block out
//! when it merges with a neighbour.
//!
//! Each stream has a size index: sizes fall into 1024 classes (the exponent and the next four
//! bits of the mantissa, so classes increase with size), each class a doubly linked list sorted
//! by (size, address), and a two-level bitmap of non-empty classes. The links live in the
//! blocks themselves ([`FreeLink`], reached through [`FreeArena`]), so removing a known block is
//! O(1) and touches only memory the allocator touches anyway; a lower bound walks one short
//! list, and on a miss a bit scan finds the next non-empty class. Every order (ascending,
//! descending, lower bound) is exactly the ordered set's.
//!
//! In front of the lists sits a one-block buffer: the block inserted last. The allocator's
//! commonest cycle is split (insert the remainder) then free (remove the remainder, insert the
//! merged block) then the next request takes that block again; with the buffer, that cycle
//! touches no list at all. Lookups compare the buffered block with the lists' best; every
//! other read first moves it into the lists. The set is always exactly lists + buffer.

/// A free block's position in the order.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct FreeKey {
    pub stream: u32,
    pub size: u64,
    pub addr: u64,
}

const SUB_BITS: u32 = 4;
const CLASSES: usize = 64 << SUB_BITS;
const WORDS: usize = CLASSES / 64;
const NIL: u32 = u32::MAX;

#[inline(always)]
fn class_of(size: u64) -> usize {
    let s = size.max(1 << SUB_BITS);
    let lg = 63 - s.leading_zeros();
    ((lg as usize) << SUB_BITS) | ((s >> (lg - SUB_BITS)) as usize & ((1 << SUB_BITS) - 1))
}

/// A block's links in its class list, kept in the block.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FreeLink {
    prev: u32,
    next: u32,
    /// Index into the set's streams + 1 while linked, 0 while not in the lists.
    owner: u16,
    class: u16,
}

impl Default for FreeLink {
    fn default() -> Self {
        FreeLink {
            prev: NIL,
            next: NIL,
            owner: 0,
            class: 0,
        }
    }
}

/// Where the set finds a block's size, address and links (the allocator's block arena).
pub trait FreeArena {
    fn size(&self, id: u32) -> u64;
    fn addr(&self, id: u32) -> u64;
    fn link(&self, id: u32) -> &FreeLink;
    fn link_mut(&mut self, id: u32) -> &mut FreeLink;
}

#[derive(Debug, Clone)]
struct Heads {
    stream: u32,
    head: Box<[u32; CLASSES]>,
    words: [u64; WORDS],
    summary: u64,
    len: usize,
}

impl Heads {
    fn new(stream: u32) -> Self {
        Heads {
            stream,
            head: Box::new([NIL; CLASSES]),
            words: [0; WORDS],
            summary: 0,
            len: 0,
        }
    }

    #[inline(always)]
    fn set(&mut self, c: usize) {
        self.words[c / 64] |= 1 << (c % 64);
        self.summary |= 1 << (c / 64);
    }

    #[inline(always)]
    fn clear(&mut self, c: usize) {
        self.words[c / 64] &= !(1 << (c % 64));
        if self.words[c / 64] == 0 {
            self.summary &= !(1 << (c / 64));
        }
    }

    /// The first non-empty class after `c`.
    #[inline]
    fn next_class(&self, c: usize) -> Option<usize> {
        let w = c / 64;
        let bit = c % 64;
        let rest = if bit == 63 {
            0
        } else {
            self.words[w] & (!0u64 << (bit + 1))
        };
        if rest != 0 {
            return Some(w * 64 + rest.trailing_zeros() as usize);
        }
        let above = if w == WORDS - 1 {
            0
        } else {
            self.summary & (!0u64 << (w + 1))
        };
        if above == 0 {
            return None;
        }
        let w2 = above.trailing_zeros() as usize;
        Some(w2 * 64 + self.words[w2].trailing_zeros() as usize)
    }

    fn first(&self) -> u32 {
        if self.len == 0 {
            return NIL;
        }
        let w = self.summary.trailing_zeros() as usize;
        self.head[w * 64 + self.words[w].trailing_zeros() as usize]
    }
}

/// Free blocks of one pool, all streams.
#[derive(Debug, Clone, Default)]
pub struct FreeSet {
    /// The block inserted last, not yet in the lists.
    pending: Option<(FreeKey, u32)>,
    /// Sorted by stream.
    streams: Vec<Heads>,
}

impl FreeSet {
    #[inline(always)]
    fn stream_index(&self, stream: u32) -> Option<usize> {
        // nearly always one stream: a scan is the fastest lookup
        self.streams.iter().position(|h| h.stream == stream)
    }

    /// Inserts block `id` at `k`. Each (stream, size, address) and each id may be present once.
    #[inline(always)]
    pub fn insert<A: FreeArena>(&mut self, a: &mut A, k: FreeKey, id: u32) {
        if let Some((pk, pid)) = self.pending.replace((k, id)) {
            debug_assert!(pk != k && pid != id, "free block inserted twice");
            self.link(a, pk, pid);
        }
    }

    /// Moves the buffered block into the lists.
    #[inline]
    pub fn flush<A: FreeArena>(&mut self, a: &mut A) {
        if let Some((k, id)) = self.pending.take() {
            self.link(a, k, id);
        }
    }

    #[inline(always)]
    fn link<A: FreeArena>(&mut self, a: &mut A, k: FreeKey, id: u32) {
        let s = match self.stream_index(k.stream) {
            Some(s) => s,
            None => self.add_stream(a, k.stream),
        };
        debug_assert_eq!(a.link(id).owner, 0, "block {id} linked twice");
        let c = class_of(k.size);
        let h = &mut self.streams[s];
        let mut prev = NIL;
        let mut cur = h.head[c];
        while cur != NIL {
            let (size, addr) = (a.size(cur), a.addr(cur));
            if size > k.size || (size == k.size && addr >= k.addr) {
                break;
            }
            prev = cur;
            cur = a.link(cur).next;
        }
        *a.link_mut(id) = FreeLink {
            prev,
            next: cur,
            owner: s as u16 + 1,
            class: c as u16,
        };
        if prev == NIL {
            h.head[c] = id;
            h.set(c);
        } else {
            a.link_mut(prev).next = id;
        }
        if cur != NIL {
            a.link_mut(cur).prev = id;
        }
        h.len += 1;
    }

    #[cold]
    fn add_stream<A: FreeArena>(&mut self, a: &mut A, stream: u32) -> usize {
        let at = self.streams.partition_point(|h| h.stream < stream);
        self.streams.insert(at, Heads::new(stream));
        // owners are stream positions: shift those of the streams after the new one
        for h in &self.streams[at + 1..] {
            let mut cur = h.first();
            while cur != NIL {
                a.link_mut(cur).owner += 1;
                cur = self_next(a, h, cur);
            }
        }
        at
    }

    /// Takes block `id` out if it is in the set at `k`; O(1).
    #[inline(always)]
    pub fn remove<A: FreeArena>(&mut self, a: &mut A, k: &FreeKey, id: u32) -> bool {
        if let Some((pk, pid)) = self.pending {
            if pid == id {
                if pk != *k {
                    return false;
                }
                self.pending = None;
                return true;
            }
        }
        let l = *a.link(id);
        if l.owner == 0
            || a.size(id) != k.size
            || a.addr(id) != k.addr
            || self.streams[l.owner as usize - 1].stream != k.stream
        {
            return false;
        }
        self.unlink(a, id, l);
        true
    }

    #[inline(always)]
    fn unlink<A: FreeArena>(&mut self, a: &mut A, id: u32, l: FreeLink) {
        let h = &mut self.streams[l.owner as usize - 1];
        if l.prev == NIL {
            let c = l.class as usize;
            h.head[c] = l.next;
            if l.next == NIL {
                h.clear(c);
            }
        } else {
            a.link_mut(l.prev).next = l.next;
        }
        if l.next != NIL {
            a.link_mut(l.next).prev = l.prev;
        }
        h.len -= 1;
        a.link_mut(id).owner = 0;
    }

    pub fn len(&self) -> usize {
        self.streams.iter().map(|h| h.len).sum::<usize>() + self.pending.is_some() as usize
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// PyTorch's `lower_bound`: the first block of `stream` with size >= `size`.
    #[inline]
    fn lower_bound<A: FreeArena>(&self, a: &A, s: usize, size: u64) -> u32 {
        let h = &self.streams[s];
        let c = class_of(size);
        let mut cur = h.head[c];
        while cur != NIL {
            if a.size(cur) >= size {
                return cur;
            }
            cur = a.link(cur).next;
        }
        match h.next_class(c) {
            Some(c2) => h.head[c2],
            None => NIL,
        }
    }

    /// The first block of `stream` with size >= `size`, if `accept` takes it, removed from the
    /// set. One search where a peek and a removal would be two.
    #[inline]
    pub fn take_first_at_least<A: FreeArena>(
        &mut self,
        a: &mut A,
        stream: u32,
        size: u64,
        accept: impl FnOnce(FreeKey, u32) -> bool,
    ) -> Option<u32> {
        // the lists' best...
        let listed = self.stream_index(stream).and_then(|s| {
            let id = self.lower_bound(a, s, size);
            (id != NIL).then(|| {
                (
                    FreeKey {
                        stream,
                        size: a.size(id),
                        addr: a.addr(id),
                    },
                    id,
                )
            })
        });
        // ...against the buffered block
        let buffered = self
            .pending
            .filter(|(k, _)| k.stream == stream && k.size >= size);
        let (k, id, from_buffer) = match (listed, buffered) {
            (Some(l), Some(b)) if b.0 < l.0 => (b.0, b.1, true),
            (Some(l), _) => (l.0, l.1, false),
            (None, Some(b)) => (b.0, b.1, true),
            (None, None) => return None,
        };
        if !accept(k, id) {
            return None;
        }
        if from_buffer {
            self.pending = None;
        } else {
            let l = *a.link(id);
            self.unlink(a, id, l);
        }
        Some(id)
    }

    /// Blocks of `stream` from the first one with size >= `size`, ascending. Call
    /// [`FreeSet::flush`] first.
    pub fn from_size<'s, A: FreeArena>(
        &'s self,
        a: &'s A,
        stream: u32,
        size: u64,
    ) -> Ascending<'s, A> {
        debug_assert!(self.pending.is_none(), "flush before iterating");
        match self.stream_index(stream) {
            Some(s) => Ascending {
                set: self,
                arena: a,
                s,
                at: self.lower_bound(a, s, size),
            },
            None => Ascending {
                set: self,
                arena: a,
                s: 0,
                at: NIL,
            },
        }
    }

    /// Blocks of `stream` smaller than `size` (in (size, address) order), descending. Used only
    /// on the out-of-memory path, so it collects. Call [`FreeSet::flush`] first.
    pub fn below_size_rev<A: FreeArena>(
        &self,
        a: &A,
        stream: u32,
        size: u64,
    ) -> Vec<(FreeKey, u32)> {
        debug_assert!(self.pending.is_none(), "flush before iterating");
        let mut v: Vec<(FreeKey, u32)> = match self.stream_index(stream) {
            Some(s) => Ascending {
                set: self,
                arena: a,
                s,
                at: self.streams[s].first(),
            }
            .take_while(|(k, _)| k.size < size)
            .collect(),
            None => Vec::new(),
        };
        v.reverse();
        v
    }

    /// Every free block in (stream, size, address) order (flushes the buffer first).
    pub fn ordered<A: FreeArena>(&mut self, a: &mut A) -> Vec<(FreeKey, u32)> {
        self.flush(a);
        let a = &*a;
        (0..self.streams.len())
            .flat_map(|s| Ascending {
                set: self,
                arena: a,
                s,
                at: self.streams[s].first(),
            })
            .collect()
    }

    /// Ids of every free block, in order (flushes the buffer first).
    pub fn ids<A: FreeArena>(&mut self, a: &mut A) -> Vec<u32> {
        self.ordered(a).into_iter().map(|(_, id)| id).collect()
    }
}

/// The block after `id` in its stream's order.
#[inline]
fn self_next<A: FreeArena>(a: &A, h: &Heads, id: u32) -> u32 {
    let l = a.link(id);
    if l.next != NIL {
        l.next
    } else {
        h.next_class(l.class as usize)
            .map(|c| h.head[c])
            .unwrap_or(NIL)
    }
}

/// Ascending walk of one stream from a block.
pub struct Ascending<'a, A> {
    set: &'a FreeSet,
    arena: &'a A,
    s: usize,
    at: u32,
}

impl<A: FreeArena> Iterator for Ascending<'_, A> {
    type Item = (FreeKey, u32);

    fn next(&mut self) -> Option<Self::Item> {
        if self.at == NIL {
            return None;
        }
        let id = self.at;
        let h = &self.set.streams[self.s];
        self.at = self_next(self.arena, h, id);
        Some((
            FreeKey {
                stream: h.stream,
                size: self.arena.size(id),
                addr: self.arena.addr(id),
            },
            id,
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::BTreeMap;

    /// A stand-in for the block arena.
    #[derive(Default, Clone)]
    struct Arena(Vec<(u64, u64, FreeLink)>);

    impl FreeArena for Arena {
        fn size(&self, id: u32) -> u64 {
            self.0[id as usize].0
        }
        fn addr(&self, id: u32) -> u64 {
            self.0[id as usize].1
        }
        fn link(&self, id: u32) -> &FreeLink {
            &self.0[id as usize].2
        }
        fn link_mut(&mut self, id: u32) -> &mut FreeLink {
            &mut self.0[id as usize].2
        }
    }

    #[test]
    fn classes_increase_with_size() {
        let mut last = 0;
        for s in (512u64..1 << 22)
            .step_by(512)
            .chain([1 << 40, (1 << 40) + 512, u64::MAX])
        {
            let c = class_of(s);
            assert!(c >= last && c < CLASSES, "{s}");
            last = c;
        }
    }

    proptest! {
        /// The free set orders and finds exactly as an ordered map keyed (stream, size, addr).
        #[test]
        fn agrees_with_an_ordered_map(ops in prop::collection::vec((0u32..3, 1u64..1<<16, 0u64..64, any::<bool>()), 1..300),
                                      probes in prop::collection::vec((0u32..3, 0u64..1<<17), 1..40)) {
            let mut fs = FreeSet::default();
            let mut arena = Arena::default();
            let mut m: BTreeMap<FreeKey, u32> = BTreeMap::new();
            for (stream, units, addr, ins) in ops {
                // streams out of order, so later streams shift earlier owners
                let k = FreeKey { stream: [5, 0, 9][stream as usize], size: units * 512, addr: addr * 4096 };
                if ins {
                    if let std::collections::btree_map::Entry::Vacant(e) = m.entry(k) {
                        let id = arena.0.len() as u32;
                        arena.0.push((k.size, k.addr, FreeLink::default()));
                        fs.insert(&mut arena, k, id);
                        e.insert(id);
                    }
                } else if let Some(&id) = m.get(&k) {
                    prop_assert!(fs.remove(&mut arena, &k, id));
                    prop_assert!(!fs.remove(&mut arena, &k, id), "a second removal finds nothing");
                    m.remove(&k);
                }
            }
            prop_assert_eq!(fs.len(), m.len());
            for (stream, size) in probes {
                let stream = [5, 0, 9][stream as usize % 3];
                let lo = FreeKey { stream, size, addr: 0 };
                let want: Vec<_> = m.range(lo..).take_while(|(k, _)| k.stream == stream).map(|(k, v)| (*k, *v)).collect();
                let (mut copy, mut copy_arena) = (fs.clone(), arena.clone());
                let taken = copy.take_first_at_least(&mut copy_arena, stream, size, |_, _| true);
                prop_assert_eq!(taken, want.first().map(|(_, id)| *id));
                fs.flush(&mut arena);
                prop_assert_eq!(fs.from_size(&arena, stream, size).collect::<Vec<_>>(), want);
                let want_rev: Vec<_> = m.range(..lo).rev().take_while(|(k, _)| k.stream == stream).map(|(k, v)| (*k, *v)).collect();
                prop_assert_eq!(fs.below_size_rev(&arena, stream, size), want_rev);
            }
            prop_assert_eq!(fs.ordered(&mut arena), m.iter().map(|(k, v)| (*k, *v)).collect::<Vec<_>>());
        }
    }
}
