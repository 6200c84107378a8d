//! The engine's launches on the GPU: each op's kernel of `kernels/*.cu` (or cuBLAS) on the
//! buffers at the caching allocator's addresses, and the host twin for the rest.
//!
//! A launch runs on the GPU where a kernel of its own covers it: the op, the pass, the dtypes
//! (float32, bf16 and float16, computed in float32 or double and rounded once on store, as
//! the cpu device rounds; masks and integer copies bit for bit) and the layouts it takes
//! (every buffer a strided view: `kernels/common.cuh`'s `Strided`). Every other launch runs on
//! its host twin ([`host`]): the bytes its buffers span are copied to the host, the cpu
//! device's kernel (the reference the CUDA kernels are checked against) computes there, and
//! what it wrote is copied back. So a run on cuda computes every op the cpu device computes,
//! while the kernels that exist run on the GPU; [`Gpu::counts`] says which ran where, and the
//! run reports it, so nothing is silently slow. Families mirror `src/backend/cpu/`'s files:
//! [`elementwise`], [`integer`], [`nn`], [`linalg`] (cuBLAS), [`attention`], [`optim`],
//! [`vision`].
//! `src/backend/parity.rs` checks every op against the cpu device (`gpumem selftest`).
//!
//! Memory stays the caching allocator's: a kernel writes into the buffers the engine gave it
//! and allocates nothing; cuBLAS works in the workspace the engine took from the allocator, as
//! PyTorch's does. Kernels go
//! on the legacy default stream, and the driver's synchronous copies wait for them, so reads
//! see every launch before them; [`Gpu::synchronize`] waits before a segment goes back to the
//! driver.

mod attention;
mod elementwise;
pub(crate) mod host;
mod integer;
mod linalg;
pub(crate) mod mem;
mod nn;
mod optim;
mod vision;

use std::collections::BTreeMap;
use std::sync::Arc;

use cudarc::driver::{
    CudaContext, CudaFunction, CudaModule, CudaStream, DeviceRepr, LaunchArgs, LaunchConfig,
};

use super::kernels;
use crate::backend::Launch;
use crate::engine::layout::Layout;
use crate::engine::DType;

/// A view for a kernel: shape, strides (elements), offset, dtype, as `kernels/common.cuh`'s
/// `Strided`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub(crate) struct Strided {
    shape: [i64; 8],
    stride: [i64; 8],
    offset: i64,
    ndim: i32,
    dtype: i32,
    contiguous: i32,
    pad: i32,
}

// SAFETY: a plain C struct of integers, laid out as the kernel's
unsafe impl DeviceRepr for Strided {}

/// The kernels' code of a dtype (`kernels/common.cuh`), for those they read and write.
pub(crate) fn dtype_code(d: DType) -> Option<i32> {
    Some(match d {
        DType::F32 => 0,
        DType::BF16 => 1,
        DType::F16 => 2,
        DType::Bool | DType::U8 => 3,
        DType::I64 => 4,
        DType::I32 => 5,
        _ => return None,
    })
}

/// Whether the kernels compute in a dtype: float32, bf16 and float16, each computed in float32
/// and rounded on store, as PyTorch's CUDA kernels do.
pub(crate) fn floating(d: DType) -> bool {
    matches!(d, DType::F32 | DType::BF16 | DType::F16)
}

impl Strided {
    /// The view `l` of a buffer of `dtype`, or `None` past the kernels' 8 dimensions or for a
    /// dtype they do not read.
    pub(crate) fn of(l: &Layout, dtype: DType) -> Option<Strided> {
        if l.shape.len() > 8 {
            return None;
        }
        let mut s = Strided {
            shape: [1; 8],
            stride: [0; 8],
            offset: l.offset as i64,
            ndim: l.shape.len() as i32,
            dtype: dtype_code(dtype)?,
            contiguous: l.is_contiguous() as i32,
            pad: 0,
        };
        for (i, (&d, &st)) in l.shape.iter().zip(&l.strides).enumerate() {
            s.shape[i] = d as i64;
            s.stride[i] = st as i64;
        }
        Some(s)
    }
}

/// A floating buffer as a kernel's view: its address and view.
pub(crate) fn fview(b: &crate::backend::Buffer) -> Option<(u64, Strided)> {
    floating(b.dtype).then(|| Some((b.addr, Strided::of(b.layout, b.dtype)?)))?
}

/// A floating buffer seen through another layout of its storage (a broadcast).
pub(crate) fn fview_as(b: &crate::backend::Buffer, l: &Layout) -> Option<(u64, Strided)> {
    floating(b.dtype).then(|| Some((b.addr, Strided::of(l, b.dtype)?)))?
}

/// A bool (or uint8) mask as a kernel's view through `l`.
pub(crate) fn mask_as(b: &crate::backend::Buffer, l: &Layout) -> Option<(u64, Strided)> {
    matches!(b.dtype, DType::Bool | DType::U8).then(|| Some((b.addr, Strided::of(l, b.dtype)?)))?
}

/// A contiguous floating buffer: its first element's address and its dtype's code (the row
/// kernels of softmax.cu, norm.cu, reduce.cu and nn.cu).
pub(crate) fn contiguous(b: &crate::backend::Buffer) -> Option<(u64, i32)> {
    (floating(b.dtype) && b.layout.is_contiguous()).then(|| {
        Some((
            b.addr + b.dtype.size() * b.layout.offset as u64,
            dtype_code(b.dtype)?,
        ))
    })?
}

pub(crate) use crate::backend::Ran;

/// The GPU side of the cuda device: the context's default stream, the kernels' modules (each
/// source compiled at its first use) and what ran where.
pub(crate) struct Gpu {
    ctx: Arc<CudaContext>,
    stream: Arc<CudaStream>,
    modules: BTreeMap<&'static str, Arc<CudaModule>>,
    functions: BTreeMap<&'static str, CudaFunction>,
    blas: Option<cudarc::cublas::CudaBlas>,
    /// The workspace cuBLAS was last given: address and bytes.
    workspace: Option<(u64, u64)>,
    /// Launches by kernel name and where they ran.
    pub counts: BTreeMap<(&'static str, Ran), u64>,
    /// Host bytes the host twin's working copies may take.
    pub host_limit: u64,
    /// Kernels sent to the host twin even where a GPU kernel takes them
    /// (`GPUMEM_CUDA_HOST_KERNELS=gemm,softmax`: to tell which kernel a difference comes from).
    on_host: Vec<String>,
    /// Seconds per kernel, pass and place, each launch waited for (`GPUMEM_CUDA_PROFILE=1`,
    /// printed to stderr at the end: where a run's time goes).
    profile: Option<Profile>,
}

impl std::fmt::Debug for Gpu {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Gpu")
            .field("counts", &self.counts)
            .finish_non_exhaustive()
    }
}

/// Launches and seconds by kernel, pass (backward or not), place and the buffers' shapes.
type Profile = BTreeMap<(&'static str, bool, Ran, String), (u64, f64)>;

/// A kernel of `kernels/`, loaded, with its name for errors.
pub(crate) struct Kernel {
    f: CudaFunction,
    name: &'static str,
}

/// Which source of `kernels/` defines a kernel.
fn source_of(kernel: &str) -> &'static str {
    if kernel.starts_with("conv2d")
        || kernel.starts_with("batch_norm")
        || kernel.starts_with("max_pool2d")
        || kernel.starts_with("adaptive_avg_pool2d")
    {
        "vision.cu"
    } else if kernel.starts_with("softmax") {
        "softmax.cu"
    } else if kernel.contains("_norm") {
        "norm.cu"
    } else if kernel.starts_with("embedding")
        || kernel.starts_with("nll_loss")
        || kernel.starts_with("dropout")
    {
        "nn.cu"
    } else if kernel == "reduce" || kernel.starts_with("reduce__") {
        "reduce.cu"
    } else if kernel.ends_with("_step") {
        "optim.cu"
    } else if kernel.starts_with("attention") {
        "attention.cu"
    } else {
        "elementwise.cu"
    }
}

impl Gpu {
    /// The GPU of the device's primary context (device 0).
    pub(crate) fn open() -> Result<Gpu, String> {
        let ctx = CudaContext::new(0).map_err(|e| format!("opening GPU 0: {e:?}"))?;
        let stream = ctx.default_stream();
        Ok(Gpu {
            ctx,
            stream,
            modules: BTreeMap::new(),
            functions: BTreeMap::new(),
            blas: None,
            workspace: None,
            counts: BTreeMap::new(),
            host_limit: crate::backend::cpu::CpuDevice::host_limit(),
            on_host: std::env::var("GPUMEM_CUDA_HOST_KERNELS")
                .map(|v| v.split(',').map(|k| k.trim().to_string()).collect())
                .unwrap_or_default(),
            profile: std::env::var_os("GPUMEM_CUDA_PROFILE")
                .is_some_and(|v| v != "0")
                .then(BTreeMap::new),
        })
    }

    /// A kernel, its source compiled (or read from the cache) and loaded at its first use, and
    /// the function looked up once per run (not at every launch).
    fn function(&mut self, kernel: &'static str) -> Result<Kernel, String> {
        if let Some(f) = self.functions.get(kernel) {
            return Ok(Kernel {
                f: f.clone(),
                name: kernel,
            });
        }
        let file = source_of(kernel);
        if !self.modules.contains_key(file) {
            let (m, _) = kernels::load(&self.ctx, file)?;
            self.modules.insert(file, m);
        }
        let f = self.modules[file]
            .load_function(kernel)
            .map_err(|e| format!("kernel {kernel}: {e:?}"))?;
        self.functions.insert(kernel, f.clone());
        Ok(Kernel { f, name: kernel })
    }

    /// Launches `k` on the stream with `cfg` and the arguments `push` gives it, in the order
    /// of the kernel's parameters. Every launch of the families goes through here.
    fn run<'a>(
        &'a self,
        k: &'a Kernel,
        cfg: LaunchConfig,
        push: impl FnOnce(&mut LaunchArgs<'a>),
    ) -> Result<(), String> {
        let mut b = self.stream.launch_builder(&k.f);
        push(&mut b);
        // SAFETY: the families push, in the kernel's parameter order, device addresses of the
        // launch's buffers at the caching allocator's addresses with the views (shape,
        // strides, offset, dtype) the engine gave them, or scalars; each family checks first
        // that what the kernel reads and writes through them lies within those buffers (its
        // comment at the call says what it checked)
        unsafe { b.launch(cfg) }
            .map(|_| ())
            .map_err(|e| format!("{}: {e:?}", k.name))
    }

    /// cuBLAS's handle on the stream (made at the first product).
    fn blas(&mut self) -> Result<cudarc::cublas::sys::cublasHandle_t, String> {
        if self.blas.is_none() {
            self.blas = Some(super::blas::handle(self.stream.clone())?);
        }
        Ok(*self.blas.as_ref().expect("made above").handle())
    }

    /// Gives cuBLAS the engine's workspace for the next products (the caching allocator's
    /// memory; none: cuBLAS works without one), when it changed since the last.
    fn workspace(&mut self, ws: Option<&crate::backend::Buffer>) -> Result<(), String> {
        let want = ws.map(mem::span).unwrap_or((0, 0));
        if self.workspace == Some(want) {
            return Ok(());
        }
        let h = self.blas()?;
        // SAFETY: the span is a live tensor of the caching allocator (the engine keeps its
        // workspaces for the process, and every product names the current one, so cuBLAS never
        // works in memory given back); kernels run in stream order, so a later owner of the
        // memory waits for the products before it
        let r = unsafe {
            cudarc::cublas::sys::cublasSetWorkspace_v2(
                h,
                want.0 as *mut std::ffi::c_void,
                want.1 as usize,
            )
        };
        if r != cudarc::cublas::sys::cublasStatus_t::CUBLAS_STATUS_SUCCESS {
            return Err(format!("cublasSetWorkspace: {r:?}"));
        }
        self.workspace = Some(want);
        Ok(())
    }

    /// Waits for every launch so far.
    pub(crate) fn synchronize(&self) -> Result<(), String> {
        self.ctx
            .synchronize()
            .map_err(|e| format!("cuCtxSynchronize: {e:?}"))
    }

    /// A grid-stride launch over `n` elements.
    fn elems(n: usize) -> LaunchConfig {
        LaunchConfig::for_num_elems(n.clamp(1, 1 << 30) as u32)
    }

    /// One block of 256 threads per row (softmax.cu's and norm.cu's row kernels).
    fn rows(rows: usize) -> LaunchConfig {
        LaunchConfig {
            grid_dim: (rows.clamp(1, 65_535) as u32, 1, 1),
            block_dim: (256, 1, 1),
            shared_mem_bytes: 0,
        }
    }
}

/// Runs one launch: on the GPU where a kernel covers it, else on its host twin.
pub(crate) fn launch(gpu: &mut Gpu, l: &Launch) -> Result<Ran, String> {
    let name = l.op.kernel().unwrap_or("none");
    let kernel = match l.pass {
        crate::backend::Pass::Forward => name,
        crate::backend::Pass::Grad { .. } => l.op.backward_kernel().unwrap_or(name),
    };
    let forced = !gpu.on_host.is_empty() && gpu.on_host.iter().any(|k| k == kernel);
    let start = if gpu.profile.is_some() {
        gpu.synchronize()?;
        Some(std::time::Instant::now())
    } else {
        None
    };
    let ran = if !forced
        && (elementwise::launch(gpu, l)?
            || nn::launch(gpu, l)?
            || linalg::launch(gpu, l)?
            || attention::launch(gpu, l)?
            || optim::launch(gpu, l)?
            || vision::launch(gpu, l)?
            || integer::launch(gpu, l)?)
    {
        Ran::Gpu
    } else {
        host::run(gpu.host_limit, l)?;
        Ran::Host
    };
    *gpu.counts.entry((kernel, ran)).or_default() += 1;
    if let Some(start) = start {
        gpu.synchronize()?;
        let grad = matches!(l.pass, crate::backend::Pass::Grad { .. });
        let shapes: Vec<String> = l
            .inputs
            .iter()
            .chain(l.outputs.iter())
            .map(|b| format!("{:?}", b.layout.shape))
            .collect();
        let key = (kernel, grad, ran, shapes.join(" "));
        let e = gpu.profile.as_mut().expect("profiling").entry(key);
        let e = e.or_default();
        e.0 += 1;
        e.1 += start.elapsed().as_secs_f64();
    }
    Ok(ran)
}

impl Drop for Gpu {
    /// Prints the profile, the slowest first, when one was asked for: per kernel, then the 30
    /// slowest kernel and shape pairs (the inputs' shapes, then the outputs').
    fn drop(&mut self) {
        let Some(p) = &self.profile else { return };
        let mut per: BTreeMap<(&str, bool, Ran), (u64, f64)> = BTreeMap::new();
        for ((k, g, r, _), (n, t)) in p {
            let e = per.entry((k, *g, *r)).or_default();
            e.0 += n;
            e.1 += t;
        }
        let total: f64 = per.values().map(|v| v.1).sum();
        let pass = |g: bool| if g { "backward" } else { "forward" };
        eprintln!("GPUMEM_CUDA_PROFILE: {total:.3} s in launches, each waited for");
        let mut rows: Vec<_> = per.iter().collect();
        rows.sort_by(|a, b| b.1 .1.total_cmp(&a.1 .1));
        for ((kernel, grad, ran), (n, secs)) in rows {
            eprintln!(
                "  {secs:>8.3} s {:>5.1}% {n:>7} x {kernel:<28} {:<8} {ran:?}",
                100.0 * secs / total.max(1e-12),
                pass(*grad),
            );
        }
        eprintln!("  the slowest shapes:");
        let mut rows: Vec<_> = p.iter().collect();
        rows.sort_by(|a, b| b.1 .1.total_cmp(&a.1 .1));
        for ((kernel, grad, ran, shapes), (n, secs)) in rows.into_iter().take(30) {
            eprintln!(
                "  {secs:>8.3} s {n:>5} x {kernel} {} {ran:?} {shapes}",
                pass(*grad)
            );
        }
    }
}

/// The address of element 0 of a contiguous float32 buffer, if it is one.
fn contiguous_f32(b: &crate::backend::Buffer) -> Option<u64> {
    (b.dtype == crate::engine::DType::F32 && b.layout.is_contiguous())
        .then(|| b.addr + 4 * b.layout.offset as u64)
}
