//! Where segments come from. The caching policy asks a [`SegmentSource`] for device memory and
//! never talks to a driver itself, so the simulated device here and a CUDA driver source (which
//! calls `cuMemAlloc`/`cuMemFree` and the virtual-memory API) plug into the same policy.

use std::collections::{BTreeMap, VecDeque};

use crate::units::MIB;

/// Device memory as the CUDA driver gives it: whole segments (`cudaMalloc`) and, for expandable
/// segments, reserved address ranges with physical pages mapped into them.
pub trait SegmentSource {
    /// Total device memory (`cudaMemGetInfo`'s total, `totalGlobalMem`).
    fn device_total(&self) -> u64;
    /// Free device memory as `cudaMemGetInfo` reports it now.
    fn device_free(&self) -> u64;
    /// What NVML says this process uses on the device (the OOM message's "this process has"),
    /// or `None` where NVML is not available.
    fn process_used(&self) -> Option<u64>;
    /// `cudaMalloc(size)`: a segment's address, or `None` when the device is out of memory.
    fn malloc(&mut self, size: u64) -> Option<u64>;
    /// `cudaFree` of a segment this source handed out.
    fn free(&mut self, addr: u64, size: u64);
    /// `cuMemAddressReserve`: a virtual range of `size` bytes with nothing mapped.
    fn reserve(&mut self, size: u64) -> Option<u64>;
    /// `cuMemAddressFree` of a reserved range.
    fn release(&mut self, base: u64, size: u64);
    /// `cuMemCreate` + `cuMemMap` of one page at `addr`; false when out of physical memory.
    fn map(&mut self, addr: u64, size: u64) -> bool;
    /// `cuMemUnmap` + `cuMemRelease` of one page.
    fn unmap(&mut self, addr: u64, size: u64);
}

/// Memory the CUDA context and libraries hold outside PyTorch's allocator on an H200 with
/// PyTorch 2.11 (from the OOM message's "this process has ... in use" with nothing reserved).
/// It is the bare context of driver 580: NVML showed a `--device cuda` gpumem process (no
/// kernels loaded) using exactly reserved + 518 MiB at the end of 8 runs
/// (`scripts/gpu-cuda-driver-view.sh`, 2026-12-02).
pub const DEFAULT_CONTEXT_OVERHEAD: u64 = 518 * MIB;

/// A simulated device: a capacity, virtual addresses, refusal past the capacity. Deterministic.
///
/// Addresses follow a model of the CUDA driver's address space ([`VaSpace`]), because best-fit
/// ties between equal-size blocks are broken by address: with it, 39 of 40 recorded PyTorch
/// traces replay exactly without being told a single address. A replay can instead give the
/// addresses the real driver returned ([`SimSource::with_address_hints`]).
#[derive(Debug, Clone)]
pub struct SimSource {
    total: u64,
    overhead: u64,
    used: u64,
    malloc_hints: VecDeque<u64>,
    reserve_hints: VecDeque<u64>,
    /// Live segments and reservations by start address, to keep hinted addresses from overlapping.
    live: BTreeMap<u64, u64>,
    /// Addresses when no hint is given.
    vas: VaSpace,
}

impl SimSource {
    /// A device of `total` bytes of which `overhead` is held by the CUDA context.
    pub fn new(total: u64, overhead: u64) -> Self {
        SimSource {
            total,
            overhead: overhead.min(total),
            used: 0,
            malloc_hints: VecDeque::new(),
            reserve_hints: VecDeque::new(),
            live: BTreeMap::new(),
            vas: VaSpace::default(),
        }
    }

    /// Addresses to use, in order, for the next `malloc`s and `reserve`s.
    pub fn with_address_hints(mut self, mallocs: Vec<u64>, reserves: Vec<u64>) -> Self {
        self.malloc_hints = mallocs.into();
        self.reserve_hints = reserves.into();
        self
    }

    /// The address the next `malloc` (or, with `reserve`, the next `reserve`) is to return: a
    /// device whose driver chose the address keeps its record here.
    pub fn hint_next(&mut self, addr: u64, reserve: bool) {
        if reserve {
            self.reserve_hints.push_front(addr);
        } else {
            self.malloc_hints.push_front(addr);
        }
    }

    /// Bytes of device memory the allocator holds through this source.
    pub fn used(&self) -> u64 {
        self.used
    }

    /// Bytes the allocator may take before the device refuses.
    pub fn capacity(&self) -> u64 {
        self.total - self.overhead
    }

    fn overlaps(&self, addr: u64, size: u64) -> bool {
        let end = addr.saturating_add(size);
        if let Some((&a, &s)) = self.live.range(..end).next_back() {
            if a + s > addr {
                return true;
            }
        }
        false
    }

    /// An address for `size` bytes, or `None` when the simulated address space has no room
    /// (a capacity beyond what a device's address space holds).
    fn place(&mut self, size: u64, hint: Option<u64>) -> Option<u64> {
        if let Some(h) = hint {
            if h != 0 && h % 512 == 0 && h.checked_add(size).is_some() && !self.overlaps(h, size) {
                self.live.insert(h, size);
                return Some(h);
            }
        }
        loop {
            // a hinted segment may sit where the model would put one: skip past it
            let a = self.vas.place(size)?;
            if !self.overlaps(a, size) {
                self.live.insert(a, size);
                return Some(a);
            }
        }
    }
}

/// How the CUDA driver hands out device virtual addresses, as far as PyTorch traces on an H200
/// show it: each new allocation that fits no reserved range reserves a range of its size rounded
/// up to 32 MiB, top-down and 32 MiB aligned, and takes its bottom; later allocations fill the
/// free space of reserved ranges first (lowest range first, lowest address first). Only the
/// order of addresses matters to the allocator (best-fit ties go to the lower address).
#[derive(Debug, Clone, Default)]
struct VaSpace {
    /// Reserved ranges in the order they were made, so by falling base (each new range goes
    /// below the lowest): the lowest range is the last.
    ranges: Vec<VaRange>,
    /// Each range's largest free gap, by the same index: the search skips a range without
    /// room by one comparison (a model's weights make hundreds of ranges, nearly all full).
    gaps: Vec<u64>,
}

#[derive(Debug, Clone)]
struct VaRange {
    base: u64,
    size: u64,
    /// Used pieces (address, size), by address.
    used: Vec<(u64, u64)>,
}

impl VaRange {
    /// The lowest address with `size` free bytes, if any.
    fn first_fit(&self, size: u64) -> Option<u64> {
        let mut at = self.base;
        for &(a, s) in &self.used {
            if a >= at + size {
                break;
            }
            at = at.max(a + s);
        }
        (at + size <= self.base + self.size).then_some(at)
    }

    fn largest_gap(&self) -> u64 {
        let mut at = self.base;
        let mut gap = 0;
        for &(a, s) in &self.used {
            gap = gap.max(a.saturating_sub(at));
            at = at.max(a + s);
        }
        gap.max((self.base + self.size).saturating_sub(at))
    }

    fn insert(&mut self, at: u64, size: u64) {
        let i = self.used.partition_point(|&(a, _)| a < at);
        self.used.insert(i, (at, size));
    }
}

const VA_TOP: u64 = 0x7f00_0000_0000;
const VA_CHUNK: u64 = 32 << 20;

impl VaSpace {
    fn place(&mut self, size: u64) -> Option<u64> {
        // lowest range first (the last made) with a gap that holds it, lowest address first
        if let Some(j) = self.gaps.iter().rposition(|&g| g >= size) {
            let range = &mut self.ranges[j];
            let at = range.first_fit(size).expect("a gap that holds it");
            range.insert(at, size);
            self.gaps[j] = range.largest_gap();
            return Some(at);
        }
        let rsize = size.div_ceil(VA_CHUNK).checked_mul(VA_CHUNK)?;
        let below = self.ranges.last().map_or(VA_TOP, |r| r.base);
        // nothing at address 0: the lowest range starts at one chunk at least
        let base = below.checked_sub(rsize).filter(|&b| b >= VA_CHUNK)? / VA_CHUNK * VA_CHUNK;
        let range = VaRange {
            base,
            size: rsize,
            used: vec![(base, size)],
        };
        self.gaps.push(range.largest_gap());
        self.ranges.push(range);
        Some(base)
    }

    fn free(&mut self, addr: u64) {
        // the range with the highest base at or below the address
        let j = self.ranges.partition_point(|r| r.base > addr);
        if let Some(range) = self.ranges.get_mut(j) {
            if let Ok(i) = range.used.binary_search_by_key(&addr, |&(a, _)| a) {
                range.used.remove(i);
                self.gaps[j] = range.largest_gap();
            }
        }
    }
}

impl SegmentSource for SimSource {
    fn device_total(&self) -> u64 {
        self.total
    }

    fn device_free(&self) -> u64 {
        self.total - self.overhead - self.used
    }

    fn process_used(&self) -> Option<u64> {
        Some(self.overhead + self.used)
    }

    fn malloc(&mut self, size: u64) -> Option<u64> {
        if size > self.capacity() - self.used {
            return None;
        }
        let hint = self.malloc_hints.pop_front();
        let addr = self.place(size, hint)?;
        self.used += size;
        Some(addr)
    }

    fn free(&mut self, addr: u64, size: u64) {
        self.used -= size;
        self.live.remove(&addr);
        self.vas.free(addr);
    }

    fn reserve(&mut self, size: u64) -> Option<u64> {
        let hint = self.reserve_hints.pop_front();
        self.place(size, hint)
    }

    fn release(&mut self, base: u64, _size: u64) {
        self.live.remove(&base);
        self.vas.free(base);
    }

    fn map(&mut self, _addr: u64, size: u64) -> bool {
        if size > self.capacity() - self.used {
            return false;
        }
        self.used += size;
        true
    }

    fn unmap(&mut self, _addr: u64, size: u64) {
        self.used -= size;
    }
}
