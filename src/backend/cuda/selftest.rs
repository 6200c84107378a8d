//! `gpumem selftest --device cuda`: every CUDA kernel, and cuBLAS's matrix products, against
//! its CPU twin on fresh random inputs (never zeros), forward and backward, with the largest
//! relative error of each.
//!
//! The CPU side runs through the engine on the cpu device, as a workload would run the op
//! (so the twin is exactly what `--device cpu` computes); the GPU side launches the kernel of
//! `kernels/` on the same float32 inputs. Inputs include a transposed view and a broadcast
//! operand, so the kernels' strided indexing is checked too.

use std::sync::Arc;

use cudarc::driver::{CudaContext, CudaModule, CudaSlice, CudaStream, LaunchConfig, PushKernelArg};
use serde::Serialize;

use super::kernels::{self, Origin};

mod attention;
mod gemm;
mod nn;
use crate::alloc::{AllocConf, CachingAllocator, SimSource};
use crate::backend::cpu::CpuDevice;
use crate::engine::layout::Layout;
use crate::engine::op::norm::Norm;
use crate::engine::op::{Binary, Fill, Unary};
use crate::engine::{Category, DType, TensorId, Tensors};

/// One check: a kernel on one case, and how far it was from the CPU twin.
#[derive(Debug, Clone, Serialize)]
pub struct Check {
    pub kernel: &'static str,
    pub case: String,
    pub elements: usize,
    /// max |gpu - cpu| / max(|cpu|, 1).
    pub max_rel_error: f64,
    pub tolerance: f64,
    pub ok: bool,
}

/// What the self-test found.
#[derive(Debug, Clone, Serialize)]
pub struct Report {
    pub gpu: String,
    /// Whether the kernels were compiled now or read from the cache.
    pub compiled: bool,
    pub checks: Vec<Check>,
}

/// float32 kernels against float64 references: a few units in the last place of float32,
/// after the transcendental functions' own error.
const TOL: f64 = 2e-6;

/// A view for a kernel ([`super::launch::Strided`]); the self-test's views have at most 8
/// dimensions.
struct Strided;

impl Strided {
    fn of(l: &Layout) -> super::launch::Strided {
        super::launch::Strided::of(l).expect("a view of at most 8 dimensions")
    }
}

type Cpu = Tensors<CpuDevice>;

fn cpu() -> Cpu {
    Tensors::new(CachingAllocator::new(
        AllocConf::default(),
        CpuDevice::new(SimSource::new(1 << 32, 0)),
    ))
}

/// Fresh pseudo-random float32 values in [lo, hi] (SplitMix64), never zero.
fn random(n: usize, seed: u64, lo: f32, hi: f32) -> Vec<f32> {
    let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ 0x1234_5678;
    (0..n)
        .map(|_| {
            s = s.wrapping_add(0x9E37_79B9_7F4A_7C15);
            let mut z = s;
            z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
            z ^= z >> 31;
            let u = (z >> 40) as f32 / (1u64 << 24) as f32;
            let v = lo + (hi - lo) * u;
            if v == 0.0 {
                1e-3
            } else {
                v
            }
        })
        .collect()
}

fn tensor(d: &mut Cpu, shape: &[usize], v: &[f32], rg: bool) -> Result<TensorId, String> {
    let t = d
        .factory_fill(shape, DType::F32, rg, Category::Input, Fill::Empty)
        .map_err(|e| e.to_string())?;
    let vals: Vec<f64> = v.iter().map(|&x| x as f64).collect();
    d.write(t, &vals).map_err(|e| e.to_string())?;
    Ok(t)
}

/// Backward of `sum(y * r)` on the cpu device: every input's gradient is then its
/// `r`-weighted one, the CPU twin of a backward kernel given the incoming gradient `r`.
fn backprop(d: &mut Cpu, y: TensorId, r: &[f32]) -> Result<(), String> {
    let shape = d.shape(y).to_vec();
    let r = tensor(d, &shape, r, false)?;
    let p = d.binary(Binary::Mul, y, r).map_err(|e| e.to_string())?;
    let loss = d.reduce(false, p, None, false).map_err(|e| e.to_string())?;
    d.backward(loss, false).map_err(|e| e.to_string())
}

fn read(d: &Cpu, t: TensorId) -> Result<Vec<f64>, String> {
    d.read(t)
        .map_err(|e| e.to_string())?
        .ok_or_else(|| "the cpu device kept no values".to_string())
}

fn rel_error(gpu: &[f32], cpu: &[f64]) -> f64 {
    gpu.iter()
        .zip(cpu)
        .map(|(&g, &c)| (g as f64 - c).abs() / c.abs().max(1.0))
        .fold(0.0, f64::max)
}

struct Gpu {
    stream: Arc<CudaStream>,
    module: Arc<CudaModule>,
    softmax: Arc<CudaModule>,
    norm: Arc<CudaModule>,
    nn: Arc<CudaModule>,
    reduce: Arc<CudaModule>,
    optim: Arc<CudaModule>,
    attention: Arc<CudaModule>,
}

impl Gpu {
    fn up(&self, v: &[f32]) -> Result<CudaSlice<f32>, String> {
        self.stream.clone_htod(v).map_err(|e| format!("{e:?}"))
    }

    fn down(&self, s: &CudaSlice<f32>) -> Result<Vec<f32>, String> {
        self.stream.clone_dtoh(s).map_err(|e| format!("{e:?}"))
    }

    fn out(&self, n: usize) -> Result<CudaSlice<f32>, String> {
        self.stream
            .alloc_zeros::<f32>(n)
            .map_err(|e| format!("{e:?}"))
    }

    fn cfg(n: usize) -> LaunchConfig {
        LaunchConfig::for_num_elems(n.min(1 << 30) as u32)
    }

    fn function(&self, name: &str) -> Result<cudarc::driver::CudaFunction, String> {
        let m = if name.starts_with("softmax") {
            &self.softmax
        } else if name.contains("_norm") {
            &self.norm
        } else if name.starts_with("embedding")
            || name.starts_with("nll_loss")
            || name.starts_with("dropout")
        {
            &self.nn
        } else if name == "reduce" {
            &self.reduce
        } else if name.ends_with("_step") {
            &self.optim
        } else if name.starts_with("attention") {
            &self.attention
        } else {
            &self.module
        };
        m.load_function(name)
            .map_err(|e| format!("kernel {name}: {e:?}"))
    }

    /// One block of 256 threads per row (softmax.cu's kernels).
    fn rows_cfg(rows: usize) -> LaunchConfig {
        LaunchConfig {
            grid_dim: (rows.clamp(1, 65_535) as u32, 1, 1),
            block_dim: (256, 1, 1),
            shared_mem_bytes: 0,
        }
    }
}

fn check(kernel: &'static str, case: String, gpu: &[f32], cpu: &[f64]) -> Check {
    check_tol(kernel, case, gpu, cpu, TOL)
}

/// float32's rounding unit: a sum of k terms in float32 may be off by about k of them.
const F32_UNIT: f64 = 5.96e-8;

fn check_tol(kernel: &'static str, case: String, gpu: &[f32], cpu: &[f64], tol: f64) -> Check {
    let e = rel_error(gpu, cpu);
    Check {
        kernel,
        case,
        elements: cpu.len(),
        max_rel_error: e,
        tolerance: tol,
        ok: e <= tol && gpu.len() == cpu.len(),
    }
}

/// Runs every check on device 0.
pub fn run() -> Result<Report, String> {
    if !super::driver_present() {
        return Err(super::NO_DRIVER.into());
    }
    std::panic::catch_unwind(run_checked).unwrap_or_else(|_| {
        Err("the CUDA libraries are older than gpumem's bindings (CUDA 13.0)".into())
    })
}

fn run_checked() -> Result<Report, String> {
    let ctx = CudaContext::new(0).map_err(|e| format!("opening GPU 0: {e:?}"))?;
    let name = cudarc::driver::result::device::get_name(ctx.cu_device()).unwrap_or_default();
    let (module, origin) = kernels::load(&ctx, "elementwise.cu")?;
    let (softmax, _) = kernels::load(&ctx, "softmax.cu")?;
    let (norm, _) = kernels::load(&ctx, "norm.cu")?;
    let (nn, _) = kernels::load(&ctx, "nn.cu")?;
    let (reduce, _) = kernels::load(&ctx, "reduce.cu")?;
    let (optim, _) = kernels::load(&ctx, "optim.cu")?;
    let (attention, _) = kernels::load(&ctx, "attention.cu")?;
    let g = Gpu {
        stream: ctx.default_stream(),
        module,
        softmax,
        norm,
        nn,
        reduce,
        optim,
        attention,
    };
    let mut checks = Vec::new();
    let (rows, cols) = (96usize, 257usize);
    let n = rows * cols;

    // fill
    {
        let mut d = cpu();
        let t = d
            .factory_fill(
                &[rows, cols],
                DType::F32,
                false,
                Category::Input,
                Fill::Full(-2.75),
            )
            .map_err(|e| e.to_string())?;
        let want = read(&d, t)?;
        let mut out = g.out(n)?;
        let f = g.function("fill")?;
        let (nn, v) = (n as i64, -2.75f32);
        // SAFETY: `out` holds n floats; the kernel writes n
        unsafe {
            g.stream
                .launch_builder(&f)
                .arg(&mut out)
                .arg(&nn)
                .arg(&v)
                .launch(Gpu::cfg(n))
        }
        .map_err(|e| format!("{e:?}"))?;
        checks.push(check("fill", "full(-2.75)".into(), &g.down(&out)?, &want));
    }

    // unary forward (contiguous and a transposed view) and backward
    for (code, u) in Unary::ALL.iter().enumerate() {
        if matches!(u, Unary::Tril | Unary::BitwiseNot) {
            continue;
        }
        let (lo, hi) = match u {
            Unary::Rsqrt | Unary::Sqrt => (0.05, 4.0),
            Unary::Exp => (-4.0, 4.0),
            _ => (-3.0, 3.0),
        };
        let xv = random(n, code as u64 + 1, lo, hi);
        let rv = random(n, code as u64 + 101, -1.0, 1.0);
        for transposed in [false, true] {
            let mut d = cpu();
            let x = tensor(&mut d, &[rows, cols], &xv, !transposed)?;
            let xin = if transposed {
                let l = d.info(x).layout.t().map_err(|e| e.0)?;
                d.view_with(x, l)
            } else {
                d.retain(x)
            };
            let y = d.unary(*u, xin).map_err(|e| e.to_string())?;
            let want = read(&d, y)?;
            let layout = d.info(xin).layout.clone();
            let m = want.len();
            let xs = g.up(&xv)?;
            let mut out = g.out(m)?;
            let f = g.function("unary")?;
            let (c, st, mm) = (code as i32, Strided::of(&layout), m as i64);
            // SAFETY: `xs` holds the view's storage, `out` m floats
            unsafe {
                g.stream
                    .launch_builder(&f)
                    .arg(&c)
                    .arg(&xs)
                    .arg(&st)
                    .arg(&mut out)
                    .arg(&mm)
                    .launch(Gpu::cfg(m))
            }
            .map_err(|e| format!("{e:?}"))?;
            let got = g.down(&out)?;
            let case = format!(
                "{} {}",
                u.name(),
                if transposed {
                    "of a transposed view"
                } else {
                    "contiguous"
                }
            );
            checks.push(check("unary", case, &got, &want));
            if transposed {
                continue;
            }
            // backward: d(sum(y * r))/dx = r * f'(x), the CPU twin through autograd
            backprop(&mut d, y, &rv)?;
            let gx = d.grad(x).ok_or("no gradient on the cpu device")?;
            let want = read(&d, gx)?;
            let (rs, ys) = (g.up(&rv)?, g.up(&got)?);
            let mut out = g.out(n)?;
            let f = g.function("unary_backward")?;
            let nn = n as i64;
            // SAFETY: every buffer holds n floats
            unsafe {
                g.stream
                    .launch_builder(&f)
                    .arg(&c)
                    .arg(&rs)
                    .arg(&xs)
                    .arg(&ys)
                    .arg(&mut out)
                    .arg(&nn)
                    .launch(Gpu::cfg(n))
            }
            .map_err(|e| format!("{e:?}"))?;
            checks.push(check(
                "unary_backward",
                u.name().to_string(),
                &g.down(&out)?,
                &want,
            ));
        }
    }

    // binary with a broadcast row operand
    for (code, b) in [Binary::Add, Binary::Sub, Binary::Mul, Binary::Div]
        .into_iter()
        .enumerate()
    {
        let av = random(n, 201 + code as u64, -3.0, 3.0);
        let bv: Vec<f32> = random(cols, 301 + code as u64, 0.5, 2.0);
        let mut d = cpu();
        let a = tensor(&mut d, &[rows, cols], &av, false)?;
        let bt = tensor(&mut d, &[1, cols], &bv, false)?;
        let y = d.binary(b, a, bt).map_err(|e| e.to_string())?;
        let want = read(&d, y)?;
        let al = Layout::contiguous(&[rows, cols]);
        let mut bl = Layout::contiguous(&[1, cols]);
        bl.shape = smallvec::smallvec![rows, cols];
        bl.strides = smallvec::smallvec![0, 1];
        let (asl, bsl) = (g.up(&av)?, g.up(&bv)?);
        let mut out = g.out(n)?;
        let f = g.function("binary")?;
        let (c, sa, sb, nn) = (code as i32, Strided::of(&al), Strided::of(&bl), n as i64);
        // SAFETY: `asl` holds n floats, `bsl` cols (read through stride-0 rows), `out` n
        unsafe {
            g.stream
                .launch_builder(&f)
                .arg(&c)
                .arg(&asl)
                .arg(&sa)
                .arg(&bsl)
                .arg(&sb)
                .arg(&mut out)
                .arg(&nn)
                .launch(Gpu::cfg(n))
        }
        .map_err(|e| format!("{e:?}"))?;
        checks.push(check(
            "binary",
            format!("{} with a broadcast row", b.name()),
            &g.down(&out)?,
            &want,
        ));
    }
    // a tensor with a scalar, both ways round
    for (code, b) in [Binary::Add, Binary::Sub, Binary::Mul, Binary::Div]
        .into_iter()
        .enumerate()
    {
        for reversed in [false, true] {
            let xv = random(n, 401 + code as u64, 0.25, 3.0);
            let mut d = cpu();
            let x = tensor(&mut d, &[rows, cols], &xv, false)?;
            let y = d.scalar(b, x, 0.75, reversed).map_err(|e| e.to_string())?;
            let want = read(&d, y)?;
            let xs = g.up(&xv)?;
            let mut out = g.out(n)?;
            let f = g.function("scalar")?;
            let (c, rv, v, st, nn) = (
                code as i32,
                reversed as i32,
                0.75f32,
                Strided::of(&Layout::contiguous(&[rows, cols])),
                n as i64,
            );
            // SAFETY: `xs` and `out` hold n floats
            unsafe {
                g.stream
                    .launch_builder(&f)
                    .arg(&c)
                    .arg(&rv)
                    .arg(&v)
                    .arg(&xs)
                    .arg(&st)
                    .arg(&mut out)
                    .arg(&nn)
                    .launch(Gpu::cfg(n))
            }
            .map_err(|e| format!("{e:?}"))?;
            let case = if reversed {
                format!("0.75 {} x", b.name())
            } else {
                format!("x {} 0.75", b.name())
            };
            checks.push(check("scalar", case, &g.down(&out)?, &want));
        }
    }

    // a transposed view copied contiguous (clone)
    {
        let xv = random(n, 501, -5.0, 5.0);
        let mut d = cpu();
        let x = tensor(&mut d, &[rows, cols], &xv, false)?;
        let l = d.info(x).layout.t().map_err(|e| e.0)?;
        let v = d.view_with(x, l.clone());
        let y = d.clone_op(v).map_err(|e| e.to_string())?;
        let want = read(&d, y)?;
        let xs = g.up(&xv)?;
        let mut out = g.out(n)?;
        let f = g.function("copy")?;
        let (st, nn) = (Strided::of(&l), n as i64);
        // SAFETY: `xs` holds the view's storage, `out` n floats
        unsafe {
            g.stream
                .launch_builder(&f)
                .arg(&xs)
                .arg(&st)
                .arg(&mut out)
                .arg(&nn)
                .launch(Gpu::cfg(n))
        }
        .map_err(|e| format!("{e:?}"))?;
        checks.push(check(
            "copy",
            "a transposed view".into(),
            &g.down(&out)?,
            &want,
        ));
    }

    // softmax and log_softmax over the last dimension, forward and backward
    for log in [false, true] {
        let xv = random(n, 601 + log as u64, -6.0, 6.0);
        let rv = random(n, 701 + log as u64, -1.0, 1.0);
        let mut d = cpu();
        let x = tensor(&mut d, &[rows, cols], &xv, true)?;
        let y = d.softmax(log, x, -1).map_err(|e| e.to_string())?;
        let want = read(&d, y)?;
        let xs = g.up(&xv)?;
        let mut ys = g.out(n)?;
        let f = g.function("softmax")?;
        let (lg, rr, cc) = (log as i32, rows as i64, cols as i64);
        // SAFETY: `xs` and `ys` hold rows x cols floats
        unsafe {
            g.stream
                .launch_builder(&f)
                .arg(&lg)
                .arg(&xs)
                .arg(&mut ys)
                .arg(&rr)
                .arg(&cc)
                .launch(Gpu::rows_cfg(rows))
        }
        .map_err(|e| format!("{e:?}"))?;
        let name = if log { "log_softmax" } else { "softmax" };
        checks.push(check(
            "softmax",
            format!("{name} over {cols}"),
            &g.down(&ys)?,
            &want,
        ));
        backprop(&mut d, y, &rv)?;
        let gx = d.grad(x).ok_or("no gradient on the cpu device")?;
        let want = read(&d, gx)?;
        let rs = g.up(&rv)?;
        let mut out = g.out(n)?;
        let f = g.function("softmax_backward")?;
        // SAFETY: every buffer holds rows x cols floats
        unsafe {
            g.stream
                .launch_builder(&f)
                .arg(&lg)
                .arg(&rs)
                .arg(&ys)
                .arg(&mut out)
                .arg(&rr)
                .arg(&cc)
                .launch(Gpu::rows_cfg(rows))
        }
        .map_err(|e| format!("{e:?}"))?;
        checks.push(check(
            "softmax_backward",
            name.to_string(),
            &g.down(&out)?,
            &want,
        ));
    }
    // layer_norm and rms_norm with a weight (and layer_norm's bias), forward and every
    // input's gradient
    for layer in [true, false] {
        let eps = if layer { 1e-5 } else { 1e-6 };
        let xv = random(n, 801 + layer as u64, -2.0, 2.0);
        let wv = random(cols, 811 + layer as u64, 0.5, 1.5);
        let bv = random(cols, 821 + layer as u64, -0.5, 0.5);
        let rv = random(n, 831 + layer as u64, -1.0, 1.0);
        let mut d = cpu();
        let x = tensor(&mut d, &[rows, cols], &xv, true)?;
        let w = tensor(&mut d, &[cols], &wv, true)?;
        let b = tensor(&mut d, &[cols], &bv, true)?;
        let (op, ins): (Norm, Vec<TensorId>) = if layer {
            (Norm::Layer { eps }, vec![x, w, b])
        } else {
            (Norm::Rms { eps }, vec![x, w])
        };
        let y = d
            .simple(crate::engine::op::Op::Norm(op), &ins)
            .map_err(|e| e.to_string())?;
        let want = read(&d, y)?;
        let (xs, ws, bs) = (g.up(&xv)?, g.up(&wv)?, g.up(&bv)?);
        let mut ys = g.out(n)?;
        let mut mean = g.out(rows)?;
        let mut rstd = g.out(rows)?;
        let (rr, cc, e, one) = (rows as i64, cols as i64, eps as f32, 1i32);
        let kname = op.name();
        let f = g.function(kname)?;
        // SAFETY: x and y hold rows x cols floats, w and b cols, mean and rstd rows
        unsafe {
            let mut lb = g.stream.launch_builder(&f);
            lb.arg(&xs).arg(&ws);
            if layer {
                lb.arg(&bs).arg(&one).arg(&one).arg(&mut ys).arg(&mut mean);
            } else {
                lb.arg(&one).arg(&mut ys);
            }
            lb.arg(&mut rstd).arg(&rr).arg(&cc).arg(&e);
            lb.launch(Gpu::rows_cfg(rows))
        }
        .map_err(|e| format!("{e:?}"))?;
        let kernel: &'static str = if layer { "layer_norm" } else { "rms_norm" };
        let back: &'static str = if layer {
            "layer_norm_backward"
        } else {
            "rms_norm_backward"
        };
        checks.push(check(
            kernel,
            format!("{kname} over {cols}"),
            &g.down(&ys)?,
            &want,
        ));
        backprop(&mut d, y, &rv)?;
        let rs = g.up(&rv)?;
        let f = g.function(back)?;
        for (input, t) in ins.iter().enumerate() {
            let gt = d.grad(*t).ok_or("no gradient on the cpu device")?;
            let want = read(&d, gt)?;
            let len = if input == 0 { n } else { cols };
            let mut out = g.out(len)?;
            let inp = input as i32;
            let cfg = if input == 0 {
                Gpu::rows_cfg(rows)
            } else {
                Gpu::cfg(cols)
            };
            // SAFETY: as in the forward; `out` holds the input's elements
            unsafe {
                let mut lb = g.stream.launch_builder(&f);
                lb.arg(&inp).arg(&rs).arg(&xs).arg(&ws).arg(&one);
                if layer {
                    lb.arg(&mean);
                }
                lb.arg(&rstd).arg(&mut out).arg(&rr).arg(&cc);
                lb.launch(cfg)
            }
            .map_err(|e| format!("{e:?}"))?;
            let what = ["input", "weight", "bias"][input];
            // a weight's or bias's gradient sums a column over every row, one by one
            let tol = if input == 0 {
                TOL
            } else {
                (rows as f64 * F32_UNIT).max(TOL)
            };
            checks.push(check_tol(
                back,
                format!("{kname}, the {what}'s gradient"),
                &g.down(&out)?,
                &want,
                tol,
            ));
        }
    }
    nn::checks(&g, &mut checks)?;
    gemm::checks(&g, &mut checks)?;
    attention::checks(&g, &mut checks)?;
    Ok(Report {
        gpu: name,
        compiled: origin == Origin::Compiled,
        checks,
    })
}
