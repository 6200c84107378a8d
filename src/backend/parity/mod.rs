//! One harness above the engine for the devices that compute: every op the workloads use,
//! forward and backward, run through [`Tensors`] on two devices from the same random non-zero
//! inputs, in float32 and bf16, with the largest relative difference of every output and
//! every input's gradient.
//!
//! `gpumem selftest --device cuda` runs it with the cuda device against the cpu device (the
//! reference its kernels are written after); the tests run it with the host twin against the
//! cpu device. Nothing here knows a kernel: a case is an op applied as a workload applies it
//! (`Tensors::apply`, the optimizers' `step`, ...), so a case checks whatever the device does
//! with the op's launches, and says how many of them ran on the GPU and how many on the host
//! twin.

use serde::Serialize;

use crate::alloc::{AllocConf, CachingAllocator};
use crate::backend::{AnyDevice, Device, Launches, Ran};
use crate::engine::op::{Binary, Fill, Op};
use crate::engine::optim::Optimizer;
use crate::engine::{Category, DType, TensorId, Tensors};

mod cases;
pub use cases::{cases, Case};
use cases::{Arg, Run};

/// One op on one case in one dtype, and how far the two devices were apart.
#[derive(Debug, Clone, Serialize)]
pub struct Check {
    /// The op (its PyTorch name).
    pub op: String,
    /// What was run: shapes, views, attributes.
    pub case: String,
    pub dtype: &'static str,
    /// The values compared ("output", "gradient of input 1", "parameter 0") and their
    /// elements in all.
    pub values: Vec<String>,
    pub elements: usize,
    /// The largest `|a - b| / max(|b|, 1)` over them, and which value it was in.
    pub max_rel_error: f64,
    pub worst: String,
    pub tolerance: f64,
    pub ok: bool,
    /// The device's launches for the case: on the GPU, on the host twin (with the kernels
    /// that went there).
    pub gpu_launches: u64,
    pub host_launches: u64,
    pub host_kernels: Vec<&'static str>,
}

/// Pseudo-random values in [lo, hi] (SplitMix64), never zero.
fn random(n: usize, seed: u64, lo: f64, hi: f64) -> Vec<f64> {
    let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ 0x1234_5678;
    (0..n)
        .map(|_| {
            s = s.wrapping_add(0x9E37_79B9_7F4A_7C15);
            let mut z = s;
            z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
            z ^= z >> 31;
            let u = (z >> 11) as f64 / (1u64 << 53) as f64;
            let v = lo + (hi - lo) * u;
            if v == 0.0 {
                1e-3
            } else {
                v
            }
        })
        .collect()
}

type Values = Vec<(String, Vec<f64>)>;

fn err(e: impl std::fmt::Display) -> String {
    e.to_string()
}

/// A fresh engine on a device (its capacity the device's: the harness's tensors take a few MiB).
pub fn engine(dev: AnyDevice) -> Tensors<AnyDevice> {
    Tensors::new(CachingAllocator::new(AllocConf::default(), dev))
}

/// Runs `c` in `dtype` on `d`: every output's values, then every input's gradient of
/// `sum(y * r)` for a random `r` (the backward kernels given a non-trivial incoming gradient).
/// What it made is released, so one engine runs every case.
fn run_case(
    d: &mut Tensors<AnyDevice>,
    c: &Case,
    dtype: DType,
    seed: u64,
) -> Result<Values, String> {
    let mut made: Vec<TensorId> = Vec::new();
    let r = run_case_in(d, c, dtype, seed, &mut made);
    for t in made.into_iter().rev() {
        d.clear_grad(t);
        d.release(t);
    }
    r
}

fn run_case_in(
    d: &mut Tensors<AnyDevice>,
    c: &Case,
    dtype: DType,
    seed: u64,
    made: &mut Vec<TensorId>,
) -> Result<Values, String> {
    let mut inputs = Vec::new();
    let mut leaves = Vec::new();
    for (i, a) in c.args.iter().enumerate() {
        let s = seed.wrapping_mul(31).wrapping_add(i as u64 + 1);
        let t = match a {
            Arg::F {
                shape,
                lo,
                hi,
                grad,
                t,
            } => {
                let mut made_shape = shape.clone();
                let n = made_shape.len();
                if *t {
                    made_shape.swap(n - 2, n - 1);
                }
                let x = d
                    .factory_fill(&made_shape, dtype, *grad, Category::Input, Fill::Empty)
                    .map_err(err)?;
                made.push(x);
                let vals = random(made_shape.iter().product(), s, *lo, *hi);
                d.write(x, &vals).map_err(err)?;
                let x = if *t {
                    let l = d.info(x).layout.transpose(-2, -1).map_err(|e| e.0)?;
                    let v = d.view_with(x, l);
                    made.push(v);
                    v
                } else {
                    x
                };
                if *grad {
                    leaves.push((i, x));
                }
                x
            }
            Arg::Idx { shape, hi } => {
                let x = d
                    .factory_fill(shape, DType::I64, false, Category::Input, Fill::Empty)
                    .map_err(err)?;
                made.push(x);
                let vals: Vec<f64> = random(shape.iter().product(), s, 0.0, *hi as f64)
                    .into_iter()
                    .map(|v| v.floor().min(*hi as f64 - 1.0))
                    .collect();
                d.write(x, &vals).map_err(err)?;
                x
            }
            Arg::Same(j) => inputs[*j],
            Arg::Mask { shape } => {
                let x = d
                    .factory_fill(shape, DType::Bool, false, Category::Input, Fill::Empty)
                    .map_err(err)?;
                made.push(x);
                let vals: Vec<f64> = random(shape.iter().product(), s, -1.0, 1.0)
                    .into_iter()
                    .map(|v| f64::from(u8::from(v > 0.0)))
                    .collect();
                d.write(x, &vals).map_err(err)?;
                x
            }
        };
        inputs.push(t);
    }
    let mut out = Values::new();
    if let Run::Optim(k) = c.run {
        // gradients of sum(p * r), then two steps: the parameters after them
        // (the optimizer gives back its own handles when released)
        let params: Vec<TensorId> = inputs.iter().map(|&p| d.retain(p)).collect();
        let mut opt = Optimizer::new(k, params, false);
        for step in 0..2u64 {
            for (j, &p) in inputs.iter().enumerate() {
                let shape = d.shape(p).to_vec();
                let g = d
                    .factory_fill(&shape, dtype, false, Category::Input, Fill::Empty)
                    .map_err(err)?;
                made.push(g);
                let gv = random(
                    shape.iter().product(),
                    seed + 97 * step + j as u64,
                    -1.0,
                    1.0,
                );
                d.write(g, &gv).map_err(err)?;
                let y = d.binary(Binary::Mul, p, g).map_err(err)?;
                made.push(y);
                let loss = d.reduce(false, y, None, false).map_err(err)?;
                made.push(loss);
                d.backward(loss, false).map_err(err)?;
            }
            opt.step(d).map_err(err)?;
            opt.zero_grad(d, true).map_err(err)?;
        }
        for (j, &p) in inputs.iter().enumerate() {
            out.push((format!("parameter {j}"), read(d, p)?));
        }
        opt.release(d);
        return Ok(out);
    }
    let y = match &c.run {
        Run::Apply(op) => d.apply(op, &inputs),
        Run::Fill(fill) => d.factory_fill(&[48, 129], dtype, false, Category::Input, *fill),
        Run::FillShape(fill, shape) => d.factory_fill(shape, dtype, false, Category::Input, *fill),
        Run::Cast(to) => d.cast_op(inputs[0], *to),
        Run::Contiguous => d.clone_op(inputs[0]),
        Run::Sum { mean, dim } => d.reduce(*mean, inputs[0], *dim, false),
        Run::CrossEntropy => d.cross_entropy(inputs[0], inputs[1]),
        Run::Sdpa { causal, gqa } => {
            d.sdpa_with(inputs[0], inputs[1], inputs[2], *gqa, 0.0, *causal)
        }
        Run::SdpaMask => d.sdpa_full(
            [inputs[0], inputs[1], inputs[2]],
            Some(inputs[3]),
            false,
            0.0,
            false,
        ),
        Run::Optim(_) => unreachable!("handled above"),
        Run::Slice { dim, start, end } => {
            let x = inputs[0];
            let l = d.info(x).layout.slice(*dim, Some(*start), Some(*end), 1);
            let rel = crate::engine::layout::Layout::contiguous(d.shape(x)).slice(
                *dim,
                Some(*start),
                Some(*end),
                1,
            );
            match (l, rel) {
                (Ok(l), Ok(rel)) => {
                    Ok(d.view_op(crate::engine::op::view::ViewKind::Index, x, l, rel))
                }
                (Err(e), _) | (_, Err(e)) => return Err(e.0),
            }
        }
        Run::Expand(sizes) => {
            let x = inputs[0];
            let l = d.info(x).layout.expand(sizes);
            let rel = crate::engine::layout::Layout::contiguous(d.shape(x)).expand(sizes);
            match (l, rel) {
                (Ok(l), Ok(rel)) => {
                    Ok(d.view_op(crate::engine::op::view::ViewKind::Expand, x, l, rel))
                }
                (Err(e), _) | (_, Err(e)) => return Err(e.0),
            }
        }
        Run::ChunkCat => {
            let x = inputs[0];
            let nd = d.shape(x).len();
            let parts = d.info(x).layout.chunk(3, -1).map_err(|e| e.0)?;
            let ps = d.split_op(true, nd - 1, x, parts);
            made.extend(ps.iter().copied());
            d.apply(&Op::Cat { dim: -1 }, &[ps[2], ps[0], ps[1]])
        }
        Run::InPlace(ip) => {
            let y = d.clone_op(inputs[0]).map_err(err)?;
            made.push(y);
            d.inplace(*ip, y, inputs.get(1).copied()).map_err(err)?;
            Ok(d.retain(y))
        }
    }
    .map_err(err)?;
    made.push(y);
    out.push(("output".into(), read(d, y)?));
    // the inputs the op writes in place (batch norm's running statistics)
    if let Run::Apply(op) = &c.run {
        for i in op.written_inputs() {
            if let Some(&x) = inputs.get(i) {
                out.push((format!("input {i} after"), read(d, x)?));
            }
        }
    }
    if leaves.is_empty() || !d.dtype(y).is_floating() || !d.info(y).requires_grad {
        return Ok(out);
    }
    let shape = d.shape(y).to_vec();
    let rt = d
        .factory_fill(&shape, d.dtype(y), false, Category::Input, Fill::Empty)
        .map_err(err)?;
    made.push(rt);
    d.write(
        rt,
        &random(shape.iter().product(), seed ^ 0x5eed, -1.0, 1.0),
    )
    .map_err(err)?;
    let p = d.binary(Binary::Mul, y, rt).map_err(err)?;
    made.push(p);
    let loss = d.reduce(false, p, None, false).map_err(err)?;
    made.push(loss);
    d.backward(loss, false).map_err(err)?;
    for (i, x) in leaves {
        let g = d
            .grad(x)
            .ok_or_else(|| format!("no gradient of input {i}"))?;
        out.push((format!("gradient of input {i}"), read(d, g)?));
    }
    Ok(out)
}

fn read(d: &Tensors<AnyDevice>, t: TensorId) -> Result<Vec<f64>, String> {
    d.read(t)
        .map_err(err)?
        .ok_or_else(|| format!("the {} device keeps no values", d.alloc.source().name()))
}

/// What a device has launched so far, per kernel and where.
fn launched(d: &Tensors<AnyDevice>) -> Vec<Launches> {
    d.alloc.source().launches()
}

/// The tolerance of a dtype: float32 kernels against float64 references are a few units in
/// float32's last place apart after a sum over the case's longest dimension (1,000 classes,
/// 129 columns); bf16 results are rounded once to 8 bits, so one unit there (2^-8), and twice
/// where a bf16 result feeds another op of the case (the gradient of a bf16 output).
pub fn tolerance(dtype: DType) -> f64 {
    match dtype {
        DType::BF16 => 2.0 * 2f64.powi(-8),
        DType::F16 => 2.0 * 2f64.powi(-11),
        _ => 2e-5,
    }
}

/// Runs every case on `a` (the device under test) and `b` (the reference), each in each of
/// its dtypes. A case that fails to run on either device is reported as off with the error as
/// its `worst` value, and the rest go on.
pub fn compare(
    a: &mut Tensors<AnyDevice>,
    b: &mut Tensors<AnyDevice>,
    cases: &[Case],
) -> Vec<Check> {
    let mut checks = Vec::new();
    for (k, c) in cases.iter().enumerate() {
        for &dtype in c.dtypes {
            let seed = 1 + k as u64;
            let before = launched(a);
            let got = run_case(a, c, dtype, seed);
            let after = launched(a);
            let want = run_case(b, c, dtype, seed);
            let (gpu, host, host_kernels) = delta(&before, &after);
            let tol = tolerance(dtype);
            let mut check = Check {
                op: c.op.clone(),
                case: c.case.clone(),
                dtype: dtype.name(),
                values: Vec::new(),
                elements: 0,
                max_rel_error: 0.0,
                worst: String::new(),
                tolerance: tol,
                ok: false,
                gpu_launches: gpu,
                host_launches: host,
                host_kernels,
            };
            match (got, want) {
                (Ok(got), Ok(want)) => {
                    let m = measure(&got, &want);
                    check.values = want.iter().map(|(n, _)| n.clone()).collect();
                    check.elements = m.elements;
                    check.max_rel_error = m.max_rel_error;
                    check.worst = m.worst;
                    check.ok = m.same_shape && m.max_rel_error <= tol;
                }
                (Err(e), _) => {
                    check.max_rel_error = f64::INFINITY;
                    check.worst = format!("failed on {}: {e}", a.alloc.source().name());
                }
                (_, Err(e)) => {
                    check.max_rel_error = f64::INFINITY;
                    check.worst = format!("failed on {}: {e}", b.alloc.source().name());
                }
            }
            checks.push(check);
        }
    }
    checks
}

/// How far one device's values are from the reference's.
struct Measured {
    elements: usize,
    max_rel_error: f64,
    worst: String,
    /// The same values in the same counts.
    same_shape: bool,
}

/// The largest `|a - b| / max(|b|, 1)` over every value (NaN on one side only counts as
/// infinitely far; NaN on both as equal).
fn measure(got: &Values, want: &Values) -> Measured {
    let mut m = Measured {
        elements: 0,
        max_rel_error: 0.0,
        worst: String::new(),
        same_shape: got.len() == want.len(),
    };
    for ((name, g), (_, w)) in got.iter().zip(want) {
        m.same_shape &= g.len() == w.len();
        m.elements += w.len();
        for (x, y) in g.iter().zip(w) {
            let e = if x.is_nan() || y.is_nan() {
                if x.is_nan() && y.is_nan() {
                    0.0
                } else {
                    f64::INFINITY
                }
            } else {
                (x - y).abs() / y.abs().max(1.0)
            };
            if e > m.max_rel_error || m.worst.is_empty() {
                m.max_rel_error = m.max_rel_error.max(e);
                m.worst = name.clone();
            }
        }
    }
    m
}

/// Launches between two tallies: on the GPU, on the host, and the kernels that went to the
/// host.
fn delta(before: &[Launches], after: &[Launches]) -> (u64, u64, Vec<&'static str>) {
    let (mut gpu, mut host, mut kernels) = (0, 0, Vec::new());
    for l in after {
        let was = before
            .iter()
            .find(|b| b.kernel == l.kernel && b.ran == l.ran)
            .map_or(0, |b| b.count);
        let n = l.count - was;
        if n == 0 {
            continue;
        }
        match l.ran {
            Ran::Gpu => gpu += n,
            Ran::Host => {
                host += n;
                if !kernels.contains(&l.kernel) {
                    kernels.push(l.kernel);
                }
            }
        }
    }
    (gpu, host, kernels)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::op::Unary;

    fn dev(name: &str) -> Tensors<AnyDevice> {
        engine(crate::backend::open(name, 8 << 30, 0, None).expect("a device"))
    }

    /// The harness itself: the host twin against the cpu device is the same arithmetic, so
    /// every case runs on both, in each of its dtypes, and agrees exactly; a device that
    /// computes something else is caught.
    #[test]
    fn every_case_runs_and_the_host_twin_equals_the_cpu_device() {
        let cases = cases();
        assert!(cases.len() >= 60, "{}", cases.len());
        let (mut a, mut b) = (dev("cpu-twin"), dev("cpu"));
        let checks = compare(&mut a, &mut b, &cases);
        let bad: Vec<_> = checks
            .iter()
            .filter(|c| !c.ok || c.max_rel_error != 0.0)
            .map(|c| {
                format!(
                    "{} {} {}: {} {}",
                    c.op, c.case, c.dtype, c.max_rel_error, c.worst
                )
            })
            .collect();
        assert!(bad.is_empty(), "{bad:#?}");
        assert!(checks.iter().any(|c| c.dtype == "bfloat16"));
        assert!(checks.iter().all(|c| c.elements > 0));
        // every case ran its op, not only made inputs
        let with_grads = checks
            .iter()
            .filter(|c| c.values.iter().any(|v| v.starts_with("gradient")))
            .count();
        assert!(with_grads > 80, "{with_grads} of {}", checks.len());
        assert!(checks
            .iter()
            .all(|c| c.values[0] == "output" || c.op.contains("sgd") || c.op.contains("adam")));
    }

    /// A difference is found and named, a NaN on one side only is off, and a case that does
    /// not run is reported as off rather than stopping the harness.
    #[test]
    fn differences_and_failures_are_reported() {
        let want: Values = vec![
            ("output".into(), vec![1.0, 2.0]),
            ("gradient of input 0".into(), vec![4.0, -8.0]),
        ];
        let mut got = want.clone();
        assert_eq!(measure(&got, &want).max_rel_error, 0.0);
        got[1].1[1] = -8.08;
        let m = measure(&got, &want);
        assert!(
            (m.max_rel_error - 0.01).abs() < 1e-12,
            "{}",
            m.max_rel_error
        );
        assert_eq!(m.worst, "gradient of input 0");
        got[0].1[0] = f64::NAN;
        assert!(measure(&got, &want).max_rel_error.is_infinite());
        got[0].1.pop();
        assert!(!measure(&got, &want).same_shape);
        // a case whose inputs are missing fails on both devices: off, and the next one runs
        let mut cs: Vec<Case> = cases()
            .into_iter()
            .filter(|c| matches!(c.run, Run::Apply(Op::Unary(Unary::Exp))))
            .collect();
        cs[0].args.clear();
        let (mut a, mut b) = (dev("cpu-twin"), dev("cpu"));
        let c = compare(&mut a, &mut b, &cs);
        assert!(c.len() >= 4, "{c:?}");
        // the first case's two dtypes are off, the second case's are not
        assert!(
            c.iter()
                .take(2)
                .all(|c| !c.ok && c.worst.contains("failed")),
            "{c:?}"
        );
        assert!(c.iter().skip(2).all(|c| c.ok), "{c:?}");
    }
}
