//! Allocated blocks by address: a small open-addressing table for `u64` keys.
//!
//! Every `malloc` inserts and every `free` removes one entry, so this table sits on the hot
//! path. A general-purpose hash map (hashbrown with FxHash) spent about 140 instructions per
//! insert and per remove here (measured with callgrind on `gpumem bench`); linear probing with
//! backward-shift deletion needs a multiply, a mask and usually one probe. Addresses are never
//! 0 (0 is the null pointer), so 0 marks an empty slot.

#[derive(Debug, Clone)]
pub struct AddrMap {
    /// (address, value) side by side: one cache line per probe.
    slots: Vec<(u64, u32)>,
    len: usize,
    mask: usize,
}

impl Default for AddrMap {
    fn default() -> Self {
        Self::with_capacity(16)
    }
}

#[inline]
fn slot(key: u64, mask: usize) -> usize {
    // Fibonacci hashing of the address without its always-zero low bits
    ((key >> 9).wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 32) as usize & mask
}

impl AddrMap {
    /// A table for about `n` entries before it grows.
    pub fn with_capacity(n: usize) -> Self {
        let cap = (n.max(8) * 2).next_power_of_two();
        AddrMap {
            slots: vec![(0, 0); cap],
            len: 0,
            mask: cap - 1,
        }
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Inserts `key` (non-zero); returns false (and changes nothing) if it is already there.
    #[inline]
    pub fn insert(&mut self, key: u64, val: u32) -> bool {
        assert!(key != 0, "address 0 is the null pointer");
        if (self.len + 1) * 2 > self.slots.len() {
            self.grow();
        }
        let mut i = slot(key, self.mask);
        loop {
            let k = self.slots[i].0;
            if k == 0 {
                self.slots[i] = (key, val);
                self.len += 1;
                return true;
            }
            if k == key {
                return false;
            }
            i = (i + 1) & self.mask;
        }
    }

    #[inline]
    pub fn get(&self, key: u64) -> Option<u32> {
        if key == 0 {
            return None;
        }
        let mut i = slot(key, self.mask);
        loop {
            let (k, v) = self.slots[i];
            if k == key {
                return Some(v);
            }
            if k == 0 {
                return None;
            }
            i = (i + 1) & self.mask;
        }
    }

    #[inline]
    pub fn remove(&mut self, key: u64) -> Option<u32> {
        if key == 0 {
            return None;
        }
        let mut i = slot(key, self.mask);
        loop {
            let k = self.slots[i].0;
            if k == 0 {
                return None;
            }
            if k == key {
                break;
            }
            i = (i + 1) & self.mask;
        }
        let val = self.slots[i].1;
        // backward-shift deletion: pull later entries of the run into the hole when their home
        // slot is not between the hole and them
        let mut hole = i;
        let mut j = (i + 1) & self.mask;
        loop {
            let k = self.slots[j].0;
            if k == 0 {
                break;
            }
            let home = slot(k, self.mask);
            let dist_hole = hole.wrapping_sub(home) & self.mask;
            let dist_j = j.wrapping_sub(home) & self.mask;
            if dist_hole < dist_j {
                self.slots[hole] = self.slots[j];
                hole = j;
            }
            j = (j + 1) & self.mask;
        }
        self.slots[hole].0 = 0;
        self.len -= 1;
        Some(val)
    }

    fn grow(&mut self) {
        let old = std::mem::take(&mut self.slots);
        let cap = old.len() * 2;
        self.slots = vec![(0, 0); cap];
        self.mask = cap - 1;
        self.len = 0;
        for (k, v) in old {
            if k != 0 {
                self.insert(k, v);
            }
        }
    }

    /// Every (address, value), in no particular order.
    pub fn iter(&self) -> impl Iterator<Item = (u64, u32)> + '_ {
        self.slots.iter().filter(|(k, _)| *k != 0).copied()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::HashMap;

    proptest! {
        /// Behaves as a HashMap under any mix of inserts, removes and lookups, through growth.
        #[test]
        fn agrees_with_a_hash_map(ops in prop::collection::vec((0u8..3, 1u64..200, any::<u32>()), 1..2000)) {
            let mut a = AddrMap::with_capacity(4);
            let mut m = HashMap::new();
            for (op, k, v) in ops {
                let key = k * 512 + (k % 3) * (1 << 40);
                match op {
                    0 => {
                        let fresh = !m.contains_key(&key);
                        prop_assert_eq!(a.insert(key, v), fresh);
                        m.entry(key).or_insert(v);
                    }
                    1 => prop_assert_eq!(a.remove(key), m.remove(&key)),
                    _ => prop_assert_eq!(a.get(key), m.get(&key).copied()),
                }
                prop_assert_eq!(a.len(), m.len());
            }
            let mut got: Vec<_> = a.iter().collect();
            got.sort();
            let mut want: Vec<_> = m.into_iter().collect();
            want.sort();
            prop_assert_eq!(got, want);
        }
    }
}
