//! The free blocks of one pool, ordered by (stream, size, address) like PyTorch's
//! `std::set<Block*, BlockComparatorSize>`, but faster for what the allocator does all the time:
//! find the first block of a stream not smaller than a request, and take a known block out
//! when it merges with a neighbour.
//!
//! Each stream has a size index: sizes fall into 4096 classes (the exponent and the next six
//! bits of the mantissa, so classes increase with size), each class a doubly linked list sorted
//! by (size, address), and a two-level bitmap of non-empty classes. Links live in `nodes`,
//! indexed by block id, so removing a known block is O(1) with no search; a lower bound walks
//! one short list, and on a miss a bit scan finds the next non-empty class. Every order
//! (ascending, descending, lower bound) is exactly the ordered set's.
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

#[derive(Debug, Clone, Copy)]
struct Node {
    size: u64,
    addr: u64,
    prev: u32,
    next: u32,
    /// Index into `streams` + 1 while linked, 0 while not in the set.
    owner: u32,
}

const UNLINKED: Node = Node {
    size: 0,
    addr: 0,
    prev: NIL,
    next: NIL,
    owner: 0,
};

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

    fn first_class(&self) -> Option<usize> {
        if self.len == 0 {
            return None;
        }
        let w = self.summary.trailing_zeros() as usize;
        Some(w * 64 + self.words[w].trailing_zeros() as usize)
    }
}

/// Free blocks of one pool, all streams.
#[derive(Debug, Clone, Default)]
pub struct FreeSet {
    /// The block inserted last, not yet in the lists.
    pending: Option<(FreeKey, u32)>,
    nodes: Vec<Node>,
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
    pub fn insert(&mut self, k: FreeKey, id: u32) {
        if let Some((pk, pid)) = self.pending.replace((k, id)) {
            debug_assert!(pk != k && pid != id, "free block inserted twice");
            self.link(pk, pid);
        }
    }

    /// Moves the buffered block into the lists.
    #[inline]
    pub fn flush(&mut self) {
        if let Some((k, id)) = self.pending.take() {
            self.link(k, id);
        }
    }

    #[inline(always)]
    fn link(&mut self, k: FreeKey, id: u32) -> bool {
        let s = match self.stream_index(k.stream) {
            Some(s) => s,
            None => self.add_stream(k.stream),
        };
        if self.nodes.len() <= id as usize {
            self.nodes.resize(id as usize + 1, UNLINKED);
        }
        debug_assert_eq!(
            self.nodes[id as usize].owner, 0,
            "block {id} inserted twice"
        );
        let c = class_of(k.size);
        let h = &mut self.streams[s];
        let mut prev = NIL;
        let mut cur = h.head[c];
        while cur != NIL {
            let n = &self.nodes[cur as usize];
            if n.size > k.size || (n.size == k.size && n.addr >= k.addr) {
                if n.size == k.size && n.addr == k.addr {
                    return false;
                }
                break;
            }
            prev = cur;
            cur = n.next;
        }
        self.nodes[id as usize] = Node {
            size: k.size,
            addr: k.addr,
            prev,
            next: cur,
            owner: s as u32 + 1,
        };
        if prev == NIL {
            h.head[c] = id;
            h.set(c);
        } else {
            self.nodes[prev as usize].next = id;
        }
        if cur != NIL {
            self.nodes[cur as usize].prev = id;
        }
        h.len += 1;
        true
    }

    #[cold]
    fn add_stream(&mut self, stream: u32) -> usize {
        let at = self.streams.partition_point(|h| h.stream < stream);
        self.streams.insert(at, Heads::new(stream));
        // owners are stream positions: shift those after the new one
        for n in &mut self.nodes {
            if n.owner > at as u32 {
                n.owner += 1;
            }
        }
        at
    }

    /// Takes block `id` out if it is in the set at `k`; O(1).
    #[inline(always)]
    pub fn remove(&mut self, k: &FreeKey, id: u32) -> bool {
        if let Some((pk, pid)) = self.pending {
            if pid == id {
                if pk != *k {
                    return false;
                }
                self.pending = None;
                return true;
            }
        }
        let Some(n) = self.nodes.get(id as usize).copied() else {
            return false;
        };
        if n.owner == 0
            || n.size != k.size
            || n.addr != k.addr
            || self.streams[n.owner as usize - 1].stream != k.stream
        {
            return false;
        }
        self.unlink(id, n);
        true
    }

    #[inline(always)]
    fn unlink(&mut self, id: u32, n: Node) {
        let h = &mut self.streams[n.owner as usize - 1];
        if n.prev == NIL {
            let c = class_of(n.size);
            h.head[c] = n.next;
            if n.next == NIL {
                h.clear(c);
            }
        } else {
            self.nodes[n.prev as usize].next = n.next;
        }
        if n.next != NIL {
            self.nodes[n.next as usize].prev = n.prev;
        }
        h.len -= 1;
        self.nodes[id as usize].owner = 0;
    }

    pub fn len(&self) -> usize {
        self.streams.iter().map(|h| h.len).sum::<usize>() + self.pending.is_some() as usize
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// PyTorch's `lower_bound`: the first block of `stream` with size >= `size`.
    #[inline]
    fn lower_bound(&self, s: usize, size: u64) -> u32 {
        let h = &self.streams[s];
        let c = class_of(size);
        let mut cur = h.head[c];
        while cur != NIL {
            let n = &self.nodes[cur as usize];
            if n.size >= size {
                return cur;
            }
            cur = n.next;
        }
        match h.next_class(c) {
            Some(c2) => h.head[c2],
            None => NIL,
        }
    }

    #[inline]
    fn key_of(&self, s: usize, id: u32) -> FreeKey {
        let n = &self.nodes[id as usize];
        FreeKey {
            stream: self.streams[s].stream,
            size: n.size,
            addr: n.addr,
        }
    }

    /// The first block of `stream` with size >= `size`, if `accept` takes it, removed from the
    /// set. One search where a peek and a removal would be two.
    #[inline]
    pub fn take_first_at_least(
        &mut self,
        stream: u32,
        size: u64,
        accept: impl FnOnce(FreeKey, u32) -> bool,
    ) -> Option<u32> {
        // the lists' best...
        let listed = match self.stream_index(stream) {
            Some(s) => {
                let id = self.lower_bound(s, size);
                (id != NIL).then(|| (self.key_of(s, id), id))
            }
            None => None,
        };
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
            let n = self.nodes[id as usize];
            self.unlink(id, n);
        }
        Some(id)
    }

    /// Blocks of `stream` from the first one with size >= `size`, ascending.
    pub fn from_size(&mut self, stream: u32, size: u64) -> Ascending<'_> {
        self.flush();
        match self.stream_index(stream) {
            Some(s) => Ascending {
                set: self,
                s,
                at: self.lower_bound(s, size),
            },
            None => Ascending {
                set: self,
                s: 0,
                at: NIL,
            },
        }
    }

    /// Blocks of `stream` smaller than `size` (in (size, address) order), descending. Used only
    /// on the out-of-memory path, so it collects.
    pub fn below_size_rev(
        &mut self,
        stream: u32,
        size: u64,
    ) -> impl Iterator<Item = (FreeKey, u32)> {
        self.flush();
        let mut v: Vec<(FreeKey, u32)> = match self.stream_index(stream) {
            Some(s) => {
                let h = &self.streams[s];
                let first = h.first_class().map(|c| h.head[c]).unwrap_or(NIL);
                Ascending {
                    set: self,
                    s,
                    at: first,
                }
                .take_while(|(k, _)| k.size < size)
                .collect()
            }
            None => Vec::new(),
        };
        v.reverse();
        v.into_iter()
    }

    /// Every free block in (stream, size, address) order.
    pub fn iter(&mut self) -> impl Iterator<Item = (FreeKey, u32)> + '_ {
        self.flush();
        let this = &*self;
        (0..this.streams.len()).flat_map(move |s| {
            let h = &this.streams[s];
            let first = h.first_class().map(|c| h.head[c]).unwrap_or(NIL);
            Ascending {
                set: this,
                s,
                at: first,
            }
        })
    }

    /// Ids of every free block, in order.
    pub fn ids(&mut self) -> Vec<u32> {
        self.iter().map(|(_, id)| id).collect()
    }
}

/// Ascending walk of one stream from a block.
pub struct Ascending<'a> {
    set: &'a FreeSet,
    s: usize,
    at: u32,
}

impl Iterator for Ascending<'_> {
    type Item = (FreeKey, u32);

    fn next(&mut self) -> Option<Self::Item> {
        if self.at == NIL {
            return None;
        }
        let id = self.at;
        let n = &self.set.nodes[id as usize];
        self.at = if n.next != NIL {
            n.next
        } else {
            let h = &self.set.streams[self.s];
            h.next_class(class_of(n.size))
                .map(|c| h.head[c])
                .unwrap_or(NIL)
        };
        Some((self.set.key_of(self.s, id), id))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::BTreeMap;

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
            let mut m: BTreeMap<FreeKey, u32> = BTreeMap::new();
            let mut by_id: Vec<FreeKey> = Vec::new();
            for (stream, units, addr, ins) in ops {
                let k = FreeKey { stream: [5, 0, 9][stream as usize], size: units * 512, addr: addr * 4096 };
                if ins {
                    let id = by_id.len() as u32;
                    if let std::collections::btree_map::Entry::Vacant(e) = m.entry(k) {
                        fs.insert(k, id);
                        e.insert(id);
                        by_id.push(k);
                    }
                } else if let Some(&id) = m.get(&k) {
                    prop_assert!(fs.remove(&k, id));
                    prop_assert!(!fs.remove(&k, id), "a second removal finds nothing");
                    m.remove(&k);
                }
            }
            prop_assert_eq!(fs.iter().collect::<Vec<_>>(), m.iter().map(|(k, v)| (*k, *v)).collect::<Vec<_>>());
            prop_assert_eq!(fs.len(), m.len());
            for (stream, size) in probes {
                let stream = [5, 0, 9][stream as usize % 3];
                let lo = FreeKey { stream, size, addr: 0 };
                let want: Vec<_> = m.range(lo..).take_while(|(k, _)| k.stream == stream).map(|(k, v)| (*k, *v)).collect();
                prop_assert_eq!(fs.from_size(stream, size).collect::<Vec<_>>(), want.clone());
                let want_rev: Vec<_> = m.range(..lo).rev().take_while(|(k, _)| k.stream == stream).map(|(k, v)| (*k, *v)).collect();
                prop_assert_eq!(fs.below_size_rev(stream, size).collect::<Vec<_>>(), want_rev);
                let mut copy = fs.clone();
                let taken = copy.take_first_at_least(stream, size, |_, _| true);
                prop_assert_eq!(taken, want.first().map(|(_, id)| *id));
            }
        }
    }
}
