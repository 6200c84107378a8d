//! `memory_stats()`: the allocator's counters, as plain data, with PyTorch's 122 key names.
//!
//! Each [`Stat`] keeps `current`, `peak`, `allocated` (sum of increases) and `freed` (sum of
//! decreases), exactly as PyTorch's `Stat` does. Array stats have one `Stat` for the aggregate
//! and one per pool.

use std::collections::BTreeMap;

/// One counter, PyTorch's `Stat`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Stat {
    pub current: i64,
    pub peak: i64,
    pub allocated: i64,
    pub freed: i64,
}

impl Stat {
    #[inline]
    pub fn increase(&mut self, amount: u64) {
        let a = amount as i64;
        self.current += a;
        self.peak = self.peak.max(self.current);
        self.allocated += a;
    }

    #[inline]
    pub fn decrease(&mut self, amount: u64) {
        let a = amount as i64;
        self.current -= a;
        self.freed += a;
    }

    pub fn reset_peak(&mut self) {
        self.peak = self.current;
    }

    pub fn reset_accumulated(&mut self) {
        self.allocated = 0;
        self.freed = 0;
    }
}

/// Which pool a block or segment belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum PoolKind {
    Small = 0,
    Large = 1,
}

impl PoolKind {
    pub fn name(self) -> &'static str {
        match self {
            PoolKind::Small => "small",
            PoolKind::Large => "large",
        }
    }
}

/// An array stat: `all`, `small_pool`, `large_pool`.
///
/// PyTorch updates the aggregate and the block's pool together, so the aggregate's current,
/// allocated and freed are always the sums of the pools'. Only its peak carries information of
/// its own; the rest is summed on read, which halves the work of every update on the hot path.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct StatArray {
    pools: [Stat; 2],
    all_peak: i64,
}

impl StatArray {
    /// Builds an array from its three stats (the aggregate must be the pools' sum, as PyTorch's is).
    pub fn from_parts(all: Stat, small_pool: Stat, large_pool: Stat) -> Self {
        StatArray {
            pools: [small_pool, large_pool],
            all_peak: all.peak,
        }
    }

    #[inline(always)]
    pub fn increase(&mut self, pool: PoolKind, amount: u64) {
        self.pools[pool as usize].increase(amount);
        let all = self.pools[0].current + self.pools[1].current;
        self.all_peak = self.all_peak.max(all);
    }

    #[inline(always)]
    pub fn decrease(&mut self, pool: PoolKind, amount: u64) {
        self.pools[pool as usize].decrease(amount);
    }

    /// The aggregate over both pools (`<name>.all.*`).
    #[inline]
    pub fn all(&self) -> Stat {
        let (a, b) = (&self.pools[0], &self.pools[1]);
        Stat {
            current: a.current + b.current,
            peak: self.all_peak,
            allocated: a.allocated + b.allocated,
            freed: a.freed + b.freed,
        }
    }

    /// Sets the aggregate's peak (at least the current total).
    pub(crate) fn set_all_peak(&mut self, peak: i64) {
        self.all_peak = peak.max(self.pools[0].current + self.pools[1].current);
    }

    pub fn small_pool(&self) -> Stat {
        self.pools[0]
    }

    pub fn large_pool(&self) -> Stat {
        self.pools[1]
    }

    pub fn pool(&self, pool: PoolKind) -> Stat {
        self.pools[pool as usize]
    }

    fn reset_peak(&mut self) {
        for s in &mut self.pools {
            s.reset_peak();
        }
        self.all_peak = self.all().current;
    }

    fn reset_accumulated(&mut self) {
        for s in &mut self.pools {
            s.reset_accumulated();
        }
    }
}

/// All of `DeviceStats`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DeviceStats {
    /// Blocks handed out and not yet freed (COUNT).
    pub allocation: StatArray,
    /// Segments from the device (COUNT; not changed by expandable mappings).
    pub segment: StatArray,
    /// Blocks allocated or waiting for other streams before their free completes (COUNT).
    pub active: StatArray,
    /// Free blocks inside segments that hold other blocks too (COUNT).
    pub inactive_split: StatArray,
    /// Bytes of allocated blocks (rounded, whole unsplit blocks) (SUM).
    pub allocated_bytes: StatArray,
    /// Bytes reserved from the device (SUM).
    pub reserved_bytes: StatArray,
    pub active_bytes: StatArray,
    pub inactive_split_bytes: StatArray,
    /// Bytes the callers asked for, unrounded (SUM).
    pub requested_bytes: StatArray,
    pub oversize_allocations: Stat,
    pub oversize_segments: Stat,
    pub num_alloc_retries: i64,
    pub num_ooms: i64,
    pub num_sync_all_streams: i64,
    pub num_device_alloc: i64,
    pub num_device_free: i64,
    /// `max_split_size` in bytes, -1 when unlimited.
    pub max_split_size: i64,
}

/// The array stats by PyTorch name, in one place so flattening and tables agree.
pub const ARRAY_STATS: [&str; 9] = [
    "active",
    "active_bytes",
    "allocated_bytes",
    "allocation",
    "inactive_split",
    "inactive_split_bytes",
    "requested_bytes",
    "reserved_bytes",
    "segment",
];

impl DeviceStats {
    pub fn array(&self, name: &str) -> Option<&StatArray> {
        Some(match name {
            "allocation" => &self.allocation,
            "segment" => &self.segment,
            "active" => &self.active,
            "inactive_split" => &self.inactive_split,
            "allocated_bytes" => &self.allocated_bytes,
            "reserved_bytes" => &self.reserved_bytes,
            "active_bytes" => &self.active_bytes,
            "inactive_split_bytes" => &self.inactive_split_bytes,
            "requested_bytes" => &self.requested_bytes,
            _ => return None,
        })
    }

    fn arrays_mut(&mut self) -> [&mut StatArray; 9] {
        [
            &mut self.allocation,
            &mut self.segment,
            &mut self.active,
            &mut self.inactive_split,
            &mut self.allocated_bytes,
            &mut self.reserved_bytes,
            &mut self.active_bytes,
            &mut self.inactive_split_bytes,
            &mut self.requested_bytes,
        ]
    }

    /// `torch.cuda.reset_peak_memory_stats()`.
    pub fn reset_peak(&mut self) {
        for a in self.arrays_mut() {
            a.reset_peak();
        }
        self.oversize_allocations.reset_peak();
        self.oversize_segments.reset_peak();
    }

    /// `torch.cuda.reset_accumulated_memory_stats()`.
    pub fn reset_accumulated(&mut self) {
        for a in self.arrays_mut() {
            a.reset_accumulated();
        }
        self.oversize_allocations.reset_accumulated();
        self.oversize_segments.reset_accumulated();
        self.num_alloc_retries = 0;
        self.num_ooms = 0;
        self.num_sync_all_streams = 0;
        self.num_device_alloc = 0;
        self.num_device_free = 0;
    }

    /// The flat, key-sorted dict `torch.cuda.memory_stats()` returns (122 keys).
    pub fn to_flat(&self) -> BTreeMap<String, i64> {
        let mut m = BTreeMap::new();
        let mut put_stat = |prefix: String, s: &Stat| {
            m.insert(format!("{prefix}.current"), s.current);
            m.insert(format!("{prefix}.peak"), s.peak);
            m.insert(format!("{prefix}.allocated"), s.allocated);
            m.insert(format!("{prefix}.freed"), s.freed);
        };
        for name in ARRAY_STATS {
            let a = self.array(name).expect("listed array stat");
            put_stat(format!("{name}.all"), &a.all());
            put_stat(format!("{name}.large_pool"), &a.large_pool());
            put_stat(format!("{name}.small_pool"), &a.small_pool());
        }
        put_stat("oversize_allocations".into(), &self.oversize_allocations);
        put_stat("oversize_segments".into(), &self.oversize_segments);
        m.insert("num_alloc_retries".into(), self.num_alloc_retries);
        m.insert("num_ooms".into(), self.num_ooms);
        m.insert("num_sync_all_streams".into(), self.num_sync_all_streams);
        m.insert("num_device_alloc".into(), self.num_device_alloc);
        m.insert("num_device_free".into(), self.num_device_free);
        m.insert("max_split_size".into(), self.max_split_size);
        m
    }

    /// Rebuilds stats from a flat dict (missing keys read as 0), e.g. PyTorch's `stats_end`.
    pub fn from_flat(flat: &BTreeMap<String, i64>) -> DeviceStats {
        let get = |k: String| flat.get(&k).copied().unwrap_or(0);
        let stat = |prefix: &str| Stat {
            current: get(format!("{prefix}.current")),
            peak: get(format!("{prefix}.peak")),
            allocated: get(format!("{prefix}.allocated")),
            freed: get(format!("{prefix}.freed")),
        };
        let arr = |name: &str| {
            StatArray::from_parts(
                stat(&format!("{name}.all")),
                stat(&format!("{name}.small_pool")),
                stat(&format!("{name}.large_pool")),
            )
        };
        DeviceStats {
            allocation: arr("allocation"),
            segment: arr("segment"),
            active: arr("active"),
            inactive_split: arr("inactive_split"),
            allocated_bytes: arr("allocated_bytes"),
            reserved_bytes: arr("reserved_bytes"),
            active_bytes: arr("active_bytes"),
            inactive_split_bytes: arr("inactive_split_bytes"),
            requested_bytes: arr("requested_bytes"),
            oversize_allocations: stat("oversize_allocations"),
            oversize_segments: stat("oversize_segments"),
            num_alloc_retries: get("num_alloc_retries".into()),
            num_ooms: get("num_ooms".into()),
            num_sync_all_streams: get("num_sync_all_streams".into()),
            num_device_alloc: get("num_device_alloc".into()),
            num_device_free: get("num_device_free".into()),
            max_split_size: get("max_split_size".into()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flat_has_122_sorted_keys_and_round_trips() {
        let mut s = DeviceStats::default();
        s.allocated_bytes.increase(PoolKind::Large, 7);
        s.num_ooms = 3;
        let flat = s.to_flat();
        assert_eq!(flat.len(), 122);
        assert_eq!(flat["allocated_bytes.large_pool.peak"], 7);
        assert_eq!(DeviceStats::from_flat(&flat), s);
    }

    #[test]
    fn peak_and_accumulated_resets() {
        let mut st = Stat::default();
        st.increase(10);
        st.decrease(4);
        assert_eq!(
            (st.current, st.peak, st.allocated, st.freed),
            (6, 10, 10, 4)
        );
        st.reset_peak();
        assert_eq!(st.peak, 6);
        st.reset_accumulated();
        assert_eq!((st.allocated, st.freed), (0, 0));
    }
}
