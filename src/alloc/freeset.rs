//! The free blocks of one pool, ordered by (stream, size, address) like PyTorch's
//! `std::set<Block*, BlockComparatorSize>`, but faster for the one query that matters: the
//! first block of a stream not smaller than a request.
//!
//! Each stream has a size index: sizes fall into 4096 classes (the exponent and the next six
//! bits of the mantissa, so classes increase with size), each class a small vector sorted by
//! (size, address), and a two-level bitmap of non-empty classes. A lower bound is a binary
//! search in one class plus, on a miss, a bit scan for the next non-empty class. Every order
//! (ascending, descending, lower bound) is exactly the ordered set's.

/// A free block's position in the order.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct FreeKey {
    pub stream: u32,
    pub size: u64,
    pub addr: u64,
}

const SUB_BITS: u32 = 6;
const CLASSES: usize = 64 << SUB_BITS;
const WORDS: usize = CLASSES / 64;

#[inline]
fn class_of(size: u64) -> usize {
    let s = size.max(1 << SUB_BITS);
    let lg = 63 - s.leading_zeros();
    ((lg as usize) << SUB_BITS) | ((s >> (lg - SUB_BITS)) as usize & ((1 << SUB_BITS) - 1))
}

#[derive(Debug, Clone, Copy)]
struct Entry {
    size: u64,
    addr: u64,
    id: u32,
}

#[derive(Debug, Clone)]
struct SizeIndex {
    classes: Vec<Vec<Entry>>,
    words: [u64; WORDS],
    summary: u64,
    len: usize,
}

impl SizeIndex {
    fn new() -> Self {
        SizeIndex {
            classes: vec![Vec::new(); CLASSES],
            words: [0; WORDS],
            summary: 0,
            len: 0,
        }
    }

    #[inline]
    fn pos(v: &[Entry], size: u64, addr: u64) -> usize {
        v.partition_point(|e| (e.size, e.addr) < (size, addr))
    }

    fn insert(&mut self, size: u64, addr: u64, id: u32) -> bool {
        let c = class_of(size);
        let v = &mut self.classes[c];
        let i = Self::pos(v, size, addr);
        if i < v.len() && v[i].size == size && v[i].addr == addr {
            return false;
        }
        v.insert(i, Entry { size, addr, id });
        self.words[c / 64] |= 1 << (c % 64);
        self.summary |= 1 << (c / 64);
        self.len += 1;
        true
    }

    fn remove(&mut self, size: u64, addr: u64) -> Option<u32> {
        let c = class_of(size);
        let v = &mut self.classes[c];
        let i = Self::pos(v, size, addr);
        if i < v.len() && v[i].size == size && v[i].addr == addr {
            let id = v.remove(i).id;
            if v.is_empty() {
                self.words[c / 64] &= !(1 << (c % 64));
                if self.words[c / 64] == 0 {
                    self.summary &= !(1 << (c / 64));
                }
            }
            self.len -= 1;
            Some(id)
        } else {
            None
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
        let above = if w == 63 {
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

    /// The last non-empty class before `c`.
    #[inline]
    fn prev_class(&self, c: usize) -> Option<usize> {
        let w = c / 64;
        let bit = c % 64;
        let rest = self.words[w] & ((1u64 << bit) - 1);
        if rest != 0 {
            return Some(w * 64 + 63 - rest.leading_zeros() as usize);
        }
        let below = self.summary & ((1u64 << w) - 1);
        if below == 0 {
            return None;
        }
        let w2 = 63 - below.leading_zeros() as usize;
        Some(w2 * 64 + 63 - self.words[w2].leading_zeros() as usize)
    }

    /// Position of the first entry >= (size, 0), as (class, index).
    fn lower_bound(&self, size: u64) -> Option<(usize, usize)> {
        let c = class_of(size);
        let v = &self.classes[c];
        let i = Self::pos(v, size, 0);
        if i < v.len() {
            return Some((c, i));
        }
        self.next_class(c).map(|c2| (c2, 0))
    }
}

/// Ascending walk from a position.
pub struct Ascending<'a> {
    idx: &'a SizeIndex,
    stream: u32,
    at: Option<(usize, usize)>,
}

impl Iterator for Ascending<'_> {
    type Item = (FreeKey, u32);

    fn next(&mut self) -> Option<Self::Item> {
        let (c, i) = self.at?;
        let v = &self.idx.classes[c];
        let e = v[i];
        self.at = if i + 1 < v.len() {
            Some((c, i + 1))
        } else {
            self.idx.next_class(c).map(|c2| (c2, 0))
        };
        Some((
            FreeKey {
                stream: self.stream,
                size: e.size,
                addr: e.addr,
            },
            e.id,
        ))
    }
}

/// Descending walk from a position (inclusive).
pub struct Descending<'a> {
    idx: &'a SizeIndex,
    stream: u32,
    at: Option<(usize, usize)>,
}

impl Iterator for Descending<'_> {
    type Item = (FreeKey, u32);

    fn next(&mut self) -> Option<Self::Item> {
        let (c, i) = self.at?;
        let e = self.idx.classes[c][i];
        self.at = if i > 0 {
            Some((c, i - 1))
        } else {
            self.idx
                .prev_class(c)
                .map(|c2| (c2, self.idx.classes[c2].len() - 1))
        };
        Some((
            FreeKey {
                stream: self.stream,
                size: e.size,
                addr: e.addr,
            },
            e.id,
        ))
    }
}

/// Free blocks of one pool, all streams.
#[derive(Debug, Clone, Default)]
pub struct FreeSet {
    /// Sorted by stream.
    streams: Vec<(u32, SizeIndex)>,
}

impl FreeSet {
    #[inline]
    fn index(&self, stream: u32) -> Option<&SizeIndex> {
        self.streams
            .iter()
            .find(|(s, _)| *s == stream)
            .map(|(_, i)| i)
    }

    pub fn insert(&mut self, k: FreeKey, id: u32) -> bool {
        let pos = match self.streams.iter().position(|(s, _)| *s == k.stream) {
            Some(p) => p,
            None => {
                let at = self.streams.partition_point(|(s, _)| *s < k.stream);
                self.streams.insert(at, (k.stream, SizeIndex::new()));
                at
            }
        };
        self.streams[pos].1.insert(k.size, k.addr, id)
    }

    pub fn remove(&mut self, k: &FreeKey) -> Option<u32> {
        self.streams
            .iter_mut()
            .find(|(s, _)| *s == k.stream)?
            .1
            .remove(k.size, k.addr)
    }

    pub fn len(&self) -> usize {
        self.streams.iter().map(|(_, i)| i.len).sum()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Blocks of `stream` from the first one with size >= `size`, ascending.
    pub fn from_size(&self, stream: u32, size: u64) -> Ascending<'_> {
        match self.index(stream) {
            Some(idx) => Ascending {
                idx,
                stream,
                at: idx.lower_bound(size),
            },
            None => Ascending {
                idx: EMPTY.get_or_init(SizeIndex::new),
                stream,
                at: None,
            },
        }
    }

    /// Blocks of `stream` smaller than `size` (in (size, address) order), descending.
    pub fn below_size_rev(&self, stream: u32, size: u64) -> Descending<'_> {
        let Some(idx) = self.index(stream) else {
            return Descending {
                idx: EMPTY.get_or_init(SizeIndex::new),
                stream,
                at: None,
            };
        };
        let at = match idx.lower_bound(size) {
            Some((c, i)) if i > 0 => Some((c, i - 1)),
            Some((c, _)) => idx.prev_class(c).map(|c2| (c2, idx.classes[c2].len() - 1)),
            // everything is below: start at the largest
            None if idx.classes[CLASSES - 1].is_empty() => idx
                .prev_class(CLASSES - 1)
                .map(|c| (c, idx.classes[c].len() - 1)),
            None => Some((CLASSES - 1, idx.classes[CLASSES - 1].len() - 1)),
        };
        Descending { idx, stream, at }
    }

    /// Every free block in (stream, size, address) order.
    pub fn iter(&self) -> impl Iterator<Item = (FreeKey, u32)> + '_ {
        self.streams.iter().flat_map(|(s, idx)| {
            let first = if idx.len == 0 {
                None
            } else {
                idx.lower_bound(0)
            };
            Ascending {
                idx,
                stream: *s,
                at: first,
            }
        })
    }

    /// Ids of every free block, in order.
    pub fn ids(&self) -> Vec<u32> {
        self.iter().map(|(_, id)| id).collect()
    }
}

static EMPTY: std::sync::OnceLock<SizeIndex> = std::sync::OnceLock::new();

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
            assert!(c >= last, "{s}");
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
            for (i, (stream, units, addr, ins)) in ops.into_iter().enumerate() {
                let k = FreeKey { stream, size: units * 512, addr: addr * 4096 };
                if ins {
                    prop_assert_eq!(fs.insert(k, i as u32), !m.contains_key(&k));
                    m.entry(k).or_insert(i as u32);
                } else {
                    prop_assert_eq!(fs.remove(&k), m.remove(&k));
                }
            }
            prop_assert_eq!(fs.iter().collect::<Vec<_>>(), m.iter().map(|(k, v)| (*k, *v)).collect::<Vec<_>>());
            for (stream, size) in probes {
                let lo = FreeKey { stream, size, addr: 0 };
                let want: Vec<_> = m.range(lo..).take_while(|(k, _)| k.stream == stream).map(|(k, v)| (*k, *v)).collect();
                prop_assert_eq!(fs.from_size(stream, size).collect::<Vec<_>>(), want);
                let want: Vec<_> = m.range(..lo).rev().take_while(|(k, _)| k.stream == stream).map(|(k, v)| (*k, *v)).collect();
                prop_assert_eq!(fs.below_size_rev(stream, size).collect::<Vec<_>>(), want);
            }
        }
    }
}
