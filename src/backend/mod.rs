//! Devices: where segments come from and where kernels run.
//!
//! A [`Device`] is a segment source (the caching allocator asks it for segments and pages, as
//! PyTorch's asks the CUDA driver) and a kernel runner together: the engine hands it every op
//! ([`Launch`]: the op with its typed attributes, its input, output and extra buffers at the
//! allocator's addresses, and in backward the tensors the op saved) and can read a tensor back
//! and synchronize. The engine decides what is allocated, saved and freed; a device only holds
//! and computes data, so every device gives the same allocator statistics.
//!
//! - [`sim`]: the simulated device. Addresses and sizes only; computes nothing.
//! - [`cpu`]: real numbers in host memory held at the allocator's addresses; its kernels are the
//!   reference the CUDA kernels will be checked against.
//! - [`cuda`]: segments and pages from the NVIDIA driver at its addresses; ops run on the GPU
//!   where a kernel of `kernels/` takes them, else on their host twin (the cpu device's kernel
//!   on a host copy of the op's buffers).
//!
//! Nothing outside this module knows which device runs: the runner opens one by name with
//! [`open`] and gets an [`AnyDevice`].

pub mod cpu;
pub mod cuda;
pub mod parity;
pub mod sim;

use std::fmt::Debug;

use crate::alloc::{SegmentSource, SimSource};
use crate::engine::dtype::DType;
use crate::engine::layout::Layout;
use crate::engine::op::{Op, Role};

/// One tensor argument of a kernel: where its storage is and how it is laid out.
#[derive(Debug, Clone, Copy)]
pub struct Buffer<'a> {
    /// Device address of the storage (0 for an empty one).
    pub addr: u64,
    pub layout: &'a Layout,
    pub dtype: DType,
}

/// Which computation of an op a launch asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pass {
    Forward,
    /// The gradient of input `input`: `inputs[0]` is the incoming gradient, `outputs[0]` the
    /// gradient to write (in the input's shape), `saved` what the op kept.
    Grad {
        input: usize,
    },
}

/// One kernel launch.
#[derive(Debug, Clone, Copy)]
pub struct Launch<'a> {
    pub op: &'a Op,
    pub pass: Pass,
    pub inputs: &'a [Buffer<'a>],
    /// The outputs, then the op's extra outputs (layer_norm's mean and rstd, dropout's mask...).
    pub outputs: &'a [Buffer<'a>],
    /// In backward: the tensors the op's node saved, each with what it is.
    pub saved: &'a [(Role, Buffer<'a>)],
    /// The cuBLAS workspace the engine took from the caching allocator for the thread the
    /// launch runs on (the forward's, or the autograd thread's), which a device gives its
    /// matrix products as PyTorch gives cuBLAS (`None` before the first product took one).
    pub workspace: Option<Buffer<'a>>,
}

/// Where a data device ran a kernel.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Ran {
    /// On the GPU: a kernel of `kernels/` (or cuBLAS).
    Gpu,
    /// The cpu device's kernel on a host copy of the op's buffers (the cuda device's host
    /// twin, for an op or a case no GPU kernel takes yet).
    Host,
}

/// How many launches of one kernel ran where (a run on the cuda device reports them).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Launches {
    pub kernel: &'static str,
    pub ran: Ran,
    pub count: u64,
}

/// A device: segments and kernels.
pub trait Device: SegmentSource + Debug {
    /// `sim`, `cpu` or `cuda`.
    fn name(&self) -> &'static str;
    /// Whether kernels compute anything (the engine builds no launches for a device that
    /// does not).
    fn computes(&self) -> bool;
    /// Runs one kernel.
    fn launch(&mut self, l: &Launch) -> Result<(), String>;
    /// A tensor's values, in row-major order of its shape (None on a device without data).
    fn read(&self, b: &Buffer) -> Result<Option<Vec<f64>>, String>;
    /// Writes values (row-major over the shape) into a tensor: weights and batches from files.
    fn write(&mut self, b: &Buffer, values: &[f64]) -> Result<(), String>;
    /// Waits for queued kernels (a no-op where kernels run synchronously).
    fn synchronize(&mut self) {}
    /// Why the device could not hold what the allocator asked of it (the host memory of a
    /// data device ran out): the run's results are not the workload's, and the runner says so.
    fn failure(&self) -> Option<String> {
        None
    }
}

/// The devices this build has, behind one type.
#[derive(Debug)]
pub enum AnyDevice {
    /// The simulated device is the address model itself.
    Sim(SimSource),
    Cpu(cpu::CpuDevice),
    Cuda(Box<cuda::CudaDevice>),
    /// (tests) The cpu device with every launch through the cuda device's host twin.
    #[cfg(test)]
    Twin(cuda::launch::host::twin::TwinDevice),
}

/// The device names `--device` and `device = "..."` accept, and whether this build has each.
pub const DEVICES: &[(&str, bool)] = &[
    ("sim", true),
    ("cpu", true),
    ("cuda", true),
    ("cuda-memory", true),
];

/// Opens device `name` with `total` bytes of memory, `overhead` of which the CUDA context holds.
/// The CUDA device has its own memory: `given` is the capacity the user asked for, if any (at
/// most that much is taken there).
pub fn open(
    name: &str,
    total: u64,
    overhead: u64,
    given: Option<u64>,
) -> Result<AnyDevice, String> {
    let src = SimSource::new(total, overhead);
    match name {
        "sim" => Ok(AnyDevice::Sim(src)),
        "cpu" => Ok(AnyDevice::Cpu(cpu::CpuDevice::new(src))),
        // the allocator may take what the context leaves of a capacity given, as simulated
        "cuda" | "cuda-memory" => {
            cuda::open(given.map(|g| g.saturating_sub(overhead)), name == "cuda")
                .map(|d| AnyDevice::Cuda(Box::new(d)))
        }
        #[cfg(test)]
        "cpu-twin" => Ok(AnyDevice::Twin(cuda::launch::host::twin::TwinDevice::new(
            src,
        ))),
        other => Err(format!(
            "unknown device '{other}': expected sim, cpu, cuda or cuda-memory"
        )),
    }
}

impl AnyDevice {
    /// The address record of the device's segments, for reports after the run (plain data:
    /// no device memory).
    pub fn into_addresses(self) -> SimSource {
        match self {
            AnyDevice::Sim(d) => d,
            AnyDevice::Cpu(d) => d.into_source(),
            AnyDevice::Cuda(d) => (*d).into_addresses(),
            #[cfg(test)]
            AnyDevice::Twin(d) => d.into_source(),
        }
    }

    /// The kernels a cuda device launched, by name and where they ran (empty elsewhere).
    pub fn launches(&self) -> Vec<Launches> {
        match self {
            AnyDevice::Cuda(d) => d.launches(),
            _ => Vec::new(),
        }
    }

    fn inner(&self) -> &dyn Device {
        match self {
            AnyDevice::Sim(d) => d,
            AnyDevice::Cpu(d) => d,
            AnyDevice::Cuda(d) => &**d,
            #[cfg(test)]
            AnyDevice::Twin(d) => d,
        }
    }

    fn inner_mut(&mut self) -> &mut dyn Device {
        match self {
            AnyDevice::Sim(d) => d,
            AnyDevice::Cpu(d) => d,
            AnyDevice::Cuda(d) => &mut **d,
            #[cfg(test)]
            AnyDevice::Twin(d) => d,
        }
    }
}

impl SegmentSource for AnyDevice {
    fn device_total(&self) -> u64 {
        self.inner().device_total()
    }
    fn device_free(&self) -> u64 {
        self.inner().device_free()
    }
    fn process_used(&self) -> Option<u64> {
        self.inner().process_used()
    }
    fn malloc(&mut self, size: u64) -> Option<u64> {
        self.inner_mut().malloc(size)
    }
    fn free(&mut self, addr: u64, size: u64) {
        self.inner_mut().free(addr, size)
    }
    fn reserve(&mut self, size: u64) -> Option<u64> {
        self.inner_mut().reserve(size)
    }
    fn release(&mut self, base: u64, size: u64) {
        self.inner_mut().release(base, size)
    }
    fn map(&mut self, addr: u64, size: u64) -> bool {
        self.inner_mut().map(addr, size)
    }
    fn unmap(&mut self, addr: u64, size: u64) {
        self.inner_mut().unmap(addr, size)
    }
}

impl Device for AnyDevice {
    fn name(&self) -> &'static str {
        self.inner().name()
    }
    fn computes(&self) -> bool {
        self.inner().computes()
    }
    fn launch(&mut self, l: &Launch) -> Result<(), String> {
        self.inner_mut().launch(l)
    }
    fn read(&self, b: &Buffer) -> Result<Option<Vec<f64>>, String> {
        self.inner().read(b)
    }
    fn write(&mut self, b: &Buffer, values: &[f64]) -> Result<(), String> {
        self.inner_mut().write(b, values)
    }
    fn synchronize(&mut self) {
        self.inner_mut().synchronize()
    }
    fn failure(&self) -> Option<String> {
        self.inner().failure()
    }
}
