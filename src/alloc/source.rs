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
pub const DEFAULT_CONTEXT_OVERHEAD: u64 = 518 * MIB;

/// A simulated device: a capacity, virtual addresses, refusal past the capacity. Deterministic.
///
/// Addresses are handed out by a bump pointer. A replay of a recorded PyTorch trace can instead
/// give the addresses the real driver returned ([`SimSource::with_address_hints`]), so that
/// best-fit ties between equal-size blocks (broken by address) fall the same way.
#[derive(Debug, Clone)]
pub struct SimSource {
    total: u64,
    overhead: u64,
    used: u64,
    next_addr: u64,
    malloc_hints: VecDeque<u64>,
    reserve_hints: VecDeque<u64>,
    /// Live segments and reservations by start address, to keep hinted addresses from overlapping.
    live: BTreeMap<u64, u64>,
}

const SIM_BASE: u64 = 0x1000_0000_0000;
const SIM_ALIGN: u64 = 2 * MIB;

impl SimSource {
    /// A device of `total` bytes of which `overhead` is held by the CUDA context.
    pub fn new(total: u64, overhead: u64) -> Self {
        SimSource {
            total,
            overhead: overhead.min(total),
            used: 0,
            next_addr: SIM_BASE,
            malloc_hints: VecDeque::new(),
            reserve_hints: VecDeque::new(),
            live: BTreeMap::new(),
        }
    }

    /// Addresses to use, in order, for the next `malloc`s and `reserve`s.
    pub fn with_address_hints(mut self, mallocs: Vec<u64>, reserves: Vec<u64>) -> Self {
        self.malloc_hints = mallocs.into();
        self.reserve_hints = reserves.into();
        self
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

    fn place(&mut self, size: u64, hint: Option<u64>) -> u64 {
        if let Some(h) = hint {
            if h != 0 && h % 512 == 0 && !self.overlaps(h, size) {
                self.live.insert(h, size);
                return h;
            }
        }
        loop {
            let a = self.next_addr;
            self.next_addr = (a + size).div_ceil(SIM_ALIGN) * SIM_ALIGN;
            if !self.overlaps(a, size) {
                self.live.insert(a, size);
                return a;
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
        self.used += size;
        let hint = self.malloc_hints.pop_front();
        Some(self.place(size, hint))
    }

    fn free(&mut self, addr: u64, size: u64) {
        self.used -= size;
        self.live.remove(&addr);
    }

    fn reserve(&mut self, size: u64) -> Option<u64> {
        let hint = self.reserve_hints.pop_front();
        Some(self.place(size, hint))
    }

    fn release(&mut self, base: u64, _size: u64) {
        self.live.remove(&base);
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
