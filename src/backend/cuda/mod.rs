//! The CUDA device: segments from the NVIDIA driver under the same caching policy.
//!
//! `cudaMalloc`/`cudaFree` of a segment are `cuMemAlloc`/`cuMemFree`; with
//! `expandable_segments:True` a segment is a virtual range (`cuMemAddressReserve`) into which
//! physical pages of the allocator's page size are mapped (`cuMemCreate`, `cuMemMap`,
//! `cuMemSetAccess`) and unmapped (`cuMemUnmap`, `cuMemRelease`), as PyTorch's allocator
//! does. So the device memory a run holds is real, the addresses are the driver's, and the
//! driver's own refusal is the out-of-memory.
//!
//! The engine launches every op here ([`launch`]): on the GPU where a kernel of `kernels/*.cu`
//! takes it, else on its host twin (the cpu device's kernel on a host copy of the op's
//! buffers), so a run computes what `--device cpu` computes, with the simulation's allocator
//! statistics and real device memory behind them. Fresh segments and pages are zeroed (as the
//! cpu device's are), and the launches are waited for before memory goes back to the driver.
//! The kernels are checked against their CPU twins by [`selftest`] (`gpumem selftest --device
//! cuda`).
//!
//! The driver library is loaded at run time (cudarc's dynamic loading): one binary serves
//! machines with and without a GPU. cudarc panics when the library is missing, so [`open`]
//! looks for it first and reports its absence as an error.

use std::collections::HashMap;
use std::fmt;

pub mod blas;
pub mod kernels;
pub(crate) mod launch;
pub mod nvml;
pub mod selftest;

use cudarc::driver::{result, sys};

use super::{Buffer, Device, Launch};
use crate::alloc::{SegmentSource, SimSource};

/// Why `--device cuda` cannot run here, when no driver library is found.
pub(crate) const NO_DRIVER: &str =
    "the cuda device needs the NVIDIA driver: its library (libcuda.so.1) was not \
found (install the driver, or put its folder on LD_LIBRARY_PATH); --device sim needs no GPU";

/// The NVIDIA driver's device 0 (the first of `CUDA_VISIBLE_DEVICES`).
pub struct CudaDevice {
    dev: sys::CUdevice,
    ctx: sys::CUcontext,
    name: String,
    uuid: String,
    /// `cuDeviceTotalMem`.
    total: u64,
    /// The most the allocator may hold (the device's memory, or a smaller `--capacity`).
    limit: u64,
    /// Bytes held in segments and mapped pages.
    used: u64,
    segments: HashMap<u64, u64>,
    reservations: HashMap<u64, u64>,
    /// Mapped pages of expandable segments by address: the physical allocation's handle and
    /// the page's size.
    pages: HashMap<u64, (sys::CUmemGenericAllocationHandle, u64)>,
    /// The same segments at the driver's addresses, as the record reports read after the run.
    addresses: SimSource,
    nvml: Option<nvml_wrapper::Nvml>,
    failure: Option<String>,
    /// The kernels' side, opened at the first launch.
    gpu: Option<launch::Gpu>,
    /// Whether ops run (`cuda`), or only segments come from the driver (`cuda-memory`).
    compute: bool,
}

// SAFETY: the context is the device's primary context, which the driver lets any thread make
// current; every call below makes it current first.
unsafe impl Send for CudaDevice {}

impl fmt::Debug for CudaDevice {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CudaDevice")
            .field("name", &self.name)
            .field("total", &self.total)
            .field("limit", &self.limit)
            .field("used", &self.used)
            .finish_non_exhaustive()
    }
}

/// Whether the driver library can be loaded (no panic, no GPU needed).
pub fn driver_present() -> bool {
    // SAFETY: only tries to load the library by its usual names
    unsafe { sys::is_culib_present() }
}

/// Opens device 0. `capacity`: at most this many bytes for the allocator (`--capacity`), else
/// the device's memory. An error, never a panic, where there is no driver or no device.
/// `compute`: ops run on the device (`cuda`); else it holds segments only (`cuda-memory`).
pub fn open(capacity: Option<u64>, compute: bool) -> Result<CudaDevice, String> {
    if !driver_present() {
        return Err(NO_DRIVER.into());
    }
    // cudarc panics on a symbol the library lacks (a driver older than its bindings)
    std::panic::catch_unwind(|| open_checked(capacity, compute)).unwrap_or_else(|_| {
        Err(
            "the NVIDIA driver library is too old for gpumem's CUDA bindings (CUDA 13.0, \
             driver 580 or later)"
                .into(),
        )
    })
}

fn driver_err(what: &str, e: result::DriverError) -> String {
    format!("{what} failed: {e:?}")
}

fn open_checked(capacity: Option<u64>, compute: bool) -> Result<CudaDevice, String> {
    result::init().map_err(|e| driver_err("cuInit", e))?;
    let n = result::device::get_count().map_err(|e| driver_err("cuDeviceGetCount", e))?;
    if n < 1 {
        return Err(
            "--device cuda: the NVIDIA driver sees no GPU (check CUDA_VISIBLE_DEVICES)".into(),
        );
    }
    let dev = result::device::get(0).map_err(|e| driver_err("cuDeviceGet", e))?;
    // SAFETY: `dev` came from cuDeviceGet
    let ctx = unsafe { result::primary_ctx::retain(dev) }
        .map_err(|e| driver_err("cuDevicePrimaryCtxRetain", e))?;
    let release = |e: String| {
        // SAFETY: the context retained above, given back on the way out
        let _ = unsafe { result::primary_ctx::release(dev) };
        e
    };
    // SAFETY: a context just retained
    unsafe { result::ctx::set_current(ctx) }
        .map_err(|e| release(driver_err("cuCtxSetCurrent", e)))?;
    // SAFETY: `dev` came from cuDeviceGet
    let total = unsafe { result::device::total_mem(dev) }
        .map_err(|e| release(driver_err("cuDeviceTotalMem", e)))? as u64;
    let name = result::device::get_name(dev).unwrap_or_else(|_| "an NVIDIA GPU".into());
    let uuid = result::device::get_uuid(dev)
        .map(|u| uuid_text(&u.bytes.map(|b| b as u8)))
        .unwrap_or_default();
    let limit = capacity.map_or(total, |c| c.min(total));
    tracing::debug!(%name, %uuid, total, limit, "cuda device opened");
    Ok(CudaDevice {
        dev,
        ctx,
        name,
        uuid,
        total,
        limit,
        used: 0,
        segments: HashMap::new(),
        reservations: HashMap::new(),
        pages: HashMap::new(),
        addresses: SimSource::new(total, 0),
        nvml: nvml_wrapper::Nvml::init().ok(),
        failure: None,
        gpu: None,
        compute,
    })
}

/// A device UUID as NVML and nvidia-smi write it: `GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx`.
pub fn uuid_text(b: &[u8; 16]) -> String {
    let h: Vec<String> = b.iter().map(|x| format!("{x:02x}")).collect();
    format!(
        "GPU-{}-{}-{}-{}-{}",
        h[0..4].concat(),
        h[4..6].concat(),
        h[6..8].concat(),
        h[8..10].concat(),
        h[10..16].concat()
    )
}

impl CudaDevice {
    /// The device's name as the driver gives it (`NVIDIA H200`).
    pub fn device_name(&self) -> &str {
        &self.name
    }

    fn current(&self) {
        // SAFETY: the device's primary context, retained until drop
        let _ = unsafe { result::ctx::set_current(self.ctx) };
    }

    /// The address record for reports after the run; the device memory is given back.
    pub fn into_addresses(mut self) -> SimSource {
        std::mem::replace(&mut self.addresses, SimSource::new(0, 0))
    }

    /// Waits for the launches so far (before memory goes back to the driver).
    fn wait(&mut self) {
        if let Some(Err(e)) = self.gpu.as_ref().map(launch::Gpu::synchronize) {
            tracing::warn!("{e}");
            self.failure.get_or_insert(e);
        }
    }

    /// Launches so far by kernel name and where they ran.
    pub fn launches(&self) -> Vec<super::Launches> {
        self.gpu.as_ref().map_or_else(Vec::new, |g| {
            g.counts
                .iter()
                .map(|(&(kernel, ran), &count)| super::Launches { kernel, ran, count })
                .collect()
        })
    }

    fn note(&mut self, what: &str, r: sys::CUresult) {
        if r != sys::CUresult::CUDA_SUCCESS && r != sys::CUresult::CUDA_ERROR_OUT_OF_MEMORY {
            let m = format!("{what} failed: {r:?}");
            tracing::warn!("{m}");
            self.failure.get_or_insert(m);
        }
    }
}

impl Drop for CudaDevice {
    fn drop(&mut self) {
        self.current();
        self.wait();
        // SAFETY: each address below was returned by the driver and is given back once
        unsafe {
            for (&a, &(h, s)) in &self.pages {
                let _ = sys::cuMemUnmap(a, s as usize);
                let _ = sys::cuMemRelease(h);
            }
            for &a in self.segments.keys() {
                let _ = result::free_sync(a);
            }
            for (&a, &s) in &self.reservations {
                let _ = sys::cuMemAddressFree(a, s as usize);
            }
            let _ = result::primary_ctx::release(self.dev);
        }
    }
}

impl SegmentSource for CudaDevice {
    fn device_total(&self) -> u64 {
        self.total
    }

    fn device_free(&self) -> u64 {
        self.current();
        let free = result::mem_get_info().map_or(0, |(f, _)| f as u64);
        free.min(self.limit.saturating_sub(self.used))
    }

    fn process_used(&self) -> Option<u64> {
        let nvml = self.nvml.as_ref()?;
        let n = nvml.device_count().ok()?;
        let me = std::process::id();
        (0..n).find_map(|i| {
            let d = nvml.device_by_index(i).ok()?;
            if d.uuid().ok()? != self.uuid {
                return None;
            }
            d.running_compute_processes()
                .ok()?
                .into_iter()
                .find(|p| p.pid == me)
                .and_then(|p| match p.used_gpu_memory {
                    nvml_wrapper::enums::device::UsedGpuMemory::Used(b) => Some(b),
                    nvml_wrapper::enums::device::UsedGpuMemory::Unavailable => None,
                })
        })
    }

    fn malloc(&mut self, size: u64) -> Option<u64> {
        if size > self.limit.saturating_sub(self.used) {
            return None;
        }
        self.current();
        // SAFETY: a plain device allocation, freed in `free` or at drop
        match unsafe { result::malloc_sync(size as usize) } {
            Ok(a) => {
                // fresh memory reads as zeros, as on the cpu device
                // SAFETY: the segment just allocated, `size` bytes
                if let Err(e) = unsafe { result::memset_d8_sync(a, 0, size as usize) } {
                    self.note("cuMemsetD8", e.0);
                }
                self.used += size;
                self.segments.insert(a, size);
                self.addresses.hint_next(a, false);
                self.addresses.malloc(size);
                Some(a)
            }
            Err(e) => {
                self.note("cuMemAlloc", e.0);
                None
            }
        }
    }

    fn free(&mut self, addr: u64, size: u64) {
        self.current();
        self.wait();
        if self.segments.remove(&addr).is_some() {
            // SAFETY: an address cuMemAlloc returned, freed once
            if let Err(e) = unsafe { result::free_sync(addr) } {
                self.note("cuMemFree", e.0);
            }
            self.used -= size;
            self.addresses.free(addr, size);
        }
    }

    fn reserve(&mut self, size: u64) -> Option<u64> {
        self.current();
        let mut p: sys::CUdeviceptr = 0;
        // SAFETY: reserves address space only; released in `release` or at drop
        let r = unsafe { sys::cuMemAddressReserve(&mut p, size as usize, 0, 0, 0) };
        if r != sys::CUresult::CUDA_SUCCESS {
            self.note("cuMemAddressReserve", r);
            return None;
        }
        self.reservations.insert(p, size);
        self.addresses.hint_next(p, true);
        self.addresses.reserve(size);
        Some(p)
    }

    fn release(&mut self, base: u64, size: u64) {
        self.current();
        if self.reservations.remove(&base).is_some() {
            // SAFETY: a range cuMemAddressReserve returned, with nothing mapped in it now
            let r = unsafe { sys::cuMemAddressFree(base, size as usize) };
            self.note("cuMemAddressFree", r);
            self.addresses.release(base, size);
        }
    }

    fn map(&mut self, addr: u64, size: u64) -> bool {
        if size > self.limit.saturating_sub(self.used) {
            return false;
        }
        self.current();
        // SAFETY: zeroed is a valid bit pattern for these plain C structs; the fields that
        // matter are set below
        let mut prop: sys::CUmemAllocationProp = unsafe { std::mem::zeroed() };
        prop.type_ = sys::CUmemAllocationType::CU_MEM_ALLOCATION_TYPE_PINNED;
        prop.location.type_ = sys::CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE;
        prop.location.id = 0;
        let mut h: sys::CUmemGenericAllocationHandle = 0;
        // SAFETY: `prop` describes device memory on device 0; the handle is released in
        // `unmap` or at drop
        let r = unsafe { sys::cuMemCreate(&mut h, size as usize, &prop, 0) };
        if r != sys::CUresult::CUDA_SUCCESS {
            self.note("cuMemCreate", r);
            return false;
        }
        // SAFETY: `addr..addr + size` lies in a range this device reserved, unmapped
        let mut r = unsafe { sys::cuMemMap(addr, size as usize, 0, h, 0) };
        if r == sys::CUresult::CUDA_SUCCESS {
            // SAFETY: as above
            let mut desc: sys::CUmemAccessDesc = unsafe { std::mem::zeroed() };
            desc.location = prop.location;
            desc.flags = sys::CUmemAccess_flags::CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
            // SAFETY: the range was just mapped
            r = unsafe { sys::cuMemSetAccess(addr, size as usize, &desc, 1) };
            if r != sys::CUresult::CUDA_SUCCESS {
                // SAFETY: the mapping made above
                let _ = unsafe { sys::cuMemUnmap(addr, size as usize) };
            }
        }
        if r != sys::CUresult::CUDA_SUCCESS {
            self.note("cuMemMap", r);
            // SAFETY: the handle made above, mapped nowhere
            let _ = unsafe { sys::cuMemRelease(h) };
            return false;
        }
        // SAFETY: the page just mapped, `size` bytes
        if let Err(e) = unsafe { result::memset_d8_sync(addr, 0, size as usize) } {
            self.note("cuMemsetD8", e.0);
        }
        self.pages.insert(addr, (h, size));
        self.used += size;
        self.addresses.map(addr, size);
        true
    }

    fn unmap(&mut self, addr: u64, size: u64) {
        self.current();
        self.wait();
        if let Some((h, _)) = self.pages.remove(&addr) {
            // SAFETY: a page mapped in `map`, unmapped and released once
            unsafe {
                let r = sys::cuMemUnmap(addr, size as usize);
                self.note("cuMemUnmap", r);
                let r = sys::cuMemRelease(h);
                self.note("cuMemRelease", r);
            }
            self.used -= size;
            self.addresses.unmap(addr, size);
        }
    }
}

/// A data device: every op runs, on the GPU where a kernel of `kernels/` takes it, else on
/// its host twin ([`launch`]). As `cuda-memory` it computes nothing and keeps no data (as the
/// simulated device), its segments still the driver's.
impl Device for CudaDevice {
    fn name(&self) -> &'static str {
        if self.compute {
            "cuda"
        } else {
            "cuda-memory"
        }
    }
    fn computes(&self) -> bool {
        self.compute
    }
    fn launch(&mut self, l: &Launch) -> Result<(), String> {
        if !self.compute {
            return Ok(());
        }
        self.current();
        if self.gpu.is_none() {
            self.gpu = Some(launch::Gpu::open()?);
        }
        let gpu = self.gpu.as_mut().expect("opened above");
        launch::launch(gpu, l).map(|_| ())
    }
    fn read(&self, b: &Buffer) -> Result<Option<Vec<f64>>, String> {
        if !self.compute {
            return Ok(None);
        }
        self.current();
        launch::mem::read(b).map(Some)
    }
    fn write(&mut self, b: &Buffer, values: &[f64]) -> Result<(), String> {
        if !self.compute {
            return Ok(());
        }
        self.current();
        launch::mem::write(b, values)
    }
    fn synchronize(&mut self) {
        self.current();
        self.wait();
    }
    fn failure(&self) -> Option<String> {
        self.failure.clone()
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn uuids_read_as_nvidia_smi_writes_them() {
        let b = [
            0x57, 0x75, 0xc9, 0xd1, 0x58, 0x79, 0xc5, 0x6d, 0xdc, 0xd2, 0x0d, 0x9e, 0x03, 0x96,
            0xf0, 0x0c,
        ];
        assert_eq!(
            super::uuid_text(&b),
            "GPU-5775c9d1-5879-c56d-dcd2-0d9e0396f00c"
        );
    }
}
