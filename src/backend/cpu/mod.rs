//! The CPU device: real numbers in host memory, at the caching allocator's addresses.
//!
//! Segments and expandable-segment pages are host buffers keyed by the address the address
//! model ([`SimSource`]) gave them, so a tensor's bytes live exactly where the allocator put
//! them: a freed block's bytes are reused by the next tensor placed there, as on a GPU. Every
//! kernel is plain Rust that reads its inputs through their layouts (strides, offset, dtype)
//! into float64 working copies (recycled through [`scratch`]), computes in float64 on rayon's
//! threads (by rows, elements, heads or product blocks), and writes its outputs through their
//! layouts, rounding to the output's dtype (bfloat16 and float16 round to nearest even). They
//! are the reference the CUDA kernels are checked against.
//!
//! Kernel families: [`elementwise`] (factories, unary, binary, casts, in-place, dropout),
//! [`linalg`] (matmul, linear), [`nn`] (norms, softmax, losses, embedding, reductions,
//! gradient plumbing), [`attention`], [`optim`], [`routing`] (a mixture of experts: topk, sort,
//! row gathers, histc, grouped_mm); [`rng`] is the documented generator.

mod attention;
#[cfg(test)]
mod check;
mod elementwise;
mod linalg;
mod nn;
mod optim;
pub mod rng;
mod routing;
mod scratch;
mod vision;

pub(crate) use scratch::Scratch;

use std::collections::BTreeMap;

use super::sim::forward_segments;
use super::{Buffer, Device, Launch, Pass};
use crate::alloc::SimSource;
use crate::engine::dtype::DType;
use crate::engine::layout::Layout;
use crate::engine::op::{Op, Role};

/// Host memory by device address: one buffer per segment or mapped page.
#[derive(Debug, Default)]
struct Mem {
    chunks: BTreeMap<u64, Vec<u8>>,
}

impl Mem {
    fn chunk(&self, addr: u64) -> Result<(u64, &Vec<u8>), String> {
        match self.chunks.range(..=addr).next_back() {
            Some((&base, v)) if addr < base + v.len() as u64 => Ok((base, v)),
            _ => Err(format!("address {addr:#x} is not in device memory")),
        }
    }

    /// Copies `len` bytes at `addr` (which may span pages) into `out`.
    fn get(&self, addr: u64, out: &mut [u8]) -> Result<(), String> {
        let mut done = 0usize;
        while done < out.len() {
            let a = addr + done as u64;
            let (base, v) = self.chunk(a)?;
            let from = (a - base) as usize;
            let n = (v.len() - from).min(out.len() - done);
            out[done..done + n].copy_from_slice(&v[from..from + n]);
            done += n;
        }
        Ok(())
    }

    /// The `len` bytes at `addr` when one chunk holds them all (the common case: a tensor
    /// inside one segment), so kernels decode and encode in place without a staging copy.
    fn within(&self, addr: u64, len: usize) -> Option<&[u8]> {
        let (base, v) = self.chunk(addr).ok()?;
        let from = (addr - base) as usize;
        v.get(from..from.checked_add(len)?)
    }

    fn within_mut(&mut self, addr: u64, len: usize) -> Option<&mut [u8]> {
        let base = self.chunk(addr).ok()?.0;
        let v = self.chunks.get_mut(&base)?;
        let from = (addr - base) as usize;
        v.get_mut(from..from.checked_add(len)?)
    }

    fn put(&mut self, addr: u64, bytes: &[u8]) -> Result<(), String> {
        let mut done = 0usize;
        while done < bytes.len() {
            let a = addr + done as u64;
            let base = self.chunk(a)?.0;
            let v = self.chunks.get_mut(&base).expect("found");
            let from = (a - base) as usize;
            let n = (v.len() - from).min(bytes.len() - done);
            v[from..from + n].copy_from_slice(&bytes[done..done + n]);
            done += n;
        }
        Ok(())
    }
}

/// The CPU device.
#[derive(Debug)]
pub struct CpuDevice {
    src: SimSource,
    mem: Mem,
    /// Host bytes held, and the most it may hold: half the memory available when it was opened
    /// (the kernels' float64 working copies need the rest).
    held: u64,
    limit: u64,
    /// A segment the host could not hold (see [`Device::failure`]).
    failed: Option<u64>,
}

/// The host memory available now (Linux's `MemAvailable`), or no limit where it is unknown;
/// no more than the process's address-space limit (`ulimit -v`) where one is set.
fn host_available() -> u64 {
    let available = std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|m| {
            m.lines()
                .find(|l| l.starts_with("MemAvailable:"))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|kb| kb.parse::<u64>().ok())
        })
        .map_or(u64::MAX, |kb| kb.saturating_mul(1024));
    // "Max address space   4294967296   4294967296   bytes" (or "unlimited")
    let rlimit = std::fs::read_to_string("/proc/self/limits")
        .ok()
        .and_then(|m| {
            m.lines()
                .find(|l| l.starts_with("Max address space"))
                .and_then(|l| l.split_whitespace().nth(3))
                .and_then(|v| v.parse::<u64>().ok())
        })
        .unwrap_or(u64::MAX);
    available.min(rlimit)
}

impl CpuDevice {
    pub fn new(src: SimSource) -> Self {
        let limit = host_available() / 2;
        // the working copies may keep a quarter of what the tensors may hold
        scratch::set_budget(limit / 4);
        CpuDevice {
            src,
            mem: Mem::default(),
            held: 0,
            limit,
            failed: None,
        }
    }

    pub fn into_source(self) -> SimSource {
        self.src
    }

    /// A device that holds only the given host copies of device memory, by address (disjoint
    /// ranges): where the CUDA device runs an op without a kernel of its own through this
    /// device's ([`crate::backend::cuda`]'s host twin). `limit`: host bytes its working
    /// copies may take.
    pub(crate) fn mirror(chunks: Vec<(u64, Vec<u8>)>, limit: u64) -> Self {
        let held = chunks.iter().map(|(_, v)| v.len() as u64).sum();
        CpuDevice {
            src: SimSource::new(0, 0),
            mem: Mem {
                chunks: chunks.into_iter().collect(),
            },
            held,
            limit: limit.saturating_add(held),
            failed: None,
        }
    }

    /// The host copies a [`CpuDevice::mirror`] holds, as the kernels left them.
    pub(crate) fn into_chunks(self) -> Vec<(u64, Vec<u8>)> {
        self.mem.chunks.into_iter().collect()
    }

    /// Copies device bytes at `addr` (possibly across pages) into `out`.
    #[cfg(test)]
    pub(crate) fn get_bytes(&self, addr: u64, out: &mut [u8]) -> Result<(), String> {
        self.mem.get(addr, out)
    }

    /// Writes `bytes` at device address `addr`.
    #[cfg(test)]
    pub(crate) fn put_bytes(&mut self, addr: u64, bytes: &[u8]) -> Result<(), String> {
        self.mem.put(addr, bytes)
    }

    /// Half the host memory available now: what a data device lets itself hold.
    pub(crate) fn host_limit() -> u64 {
        host_available() / 2
    }

    /// Host memory for a segment or page the allocator took; false when the host has not
    /// got it (the allocator then sees the device refuse, and the run reports the failure).
    fn hold(&mut self, addr: u64, size: u64) -> bool {
        let mut v = Vec::new();
        if self.held.saturating_add(size) > self.limit
            || v.try_reserve_exact(size as usize).is_err()
        {
            self.failed.get_or_insert(size);
            return false;
        }
        v.resize(size as usize, 0u8);
        self.held += size;
        self.mem.chunks.insert(addr, v);
        true
    }

    fn drop_chunk(&mut self, addr: u64) {
        if let Some(v) = self.mem.chunks.remove(&addr) {
            self.held -= v.len() as u64;
        }
    }
}

forward_segments!(CpuDevice, src, CpuDevice::hold, CpuDevice::drop_chunk);

/// Calls `f` with the storage offset (in elements) of each element of `l`, in row-major order.
pub(crate) fn for_each_offset(l: &Layout, mut f: impl FnMut(usize)) {
    let n = l.numel();
    if n == 0 {
        return;
    }
    let nd = l.ndim();
    if nd == 0 {
        f(l.offset);
        return;
    }
    let mut idx = vec![0usize; nd];
    let mut off = l.offset;
    for _ in 0..n {
        f(off);
        // odometer
        let mut d = nd;
        while d > 0 {
            d -= 1;
            idx[d] += 1;
            off += l.strides[d];
            if idx[d] < l.shape[d] {
                break;
            }
            off -= l.strides[d] * l.shape[d];
            idx[d] = 0;
        }
    }
}

/// The elements of a strided layout, row-major, from the bytes it spans (which start at element
/// `first`): rows of the last dimension in parallel.
pub(crate) fn gather(l: &Layout, first: usize, dtype: DType, bytes: &[u8]) -> Scratch {
    use rayon::prelude::*;
    let n = l.numel();
    let es = dtype.size() as usize;
    let mut out = Scratch::zeros(n);
    if n == 0 {
        return out;
    }
    let nd = l.ndim();
    if nd == 0 {
        out[0] = decode(dtype, &bytes[(l.offset - first) * es..][..es]);
        return out;
    }
    let (inner, stride) = (l.shape[nd - 1], l.strides[nd - 1]);
    if inner == 0 {
        return out;
    }
    out.par_chunks_mut(inner)
        .with_min_len((1 << 12) / inner.max(1) + 1)
        .enumerate()
        .for_each(|(row, o)| {
            // the row's first element: the row index unravelled over the outer dimensions
            let (mut rem, mut off) = (row, l.offset);
            for d in (0..nd - 1).rev() {
                off += (rem % l.shape[d]) * l.strides[d];
                rem /= l.shape[d];
            }
            for (j, v) in o.iter_mut().enumerate() {
                let at = (off + j * stride - first) * es;
                *v = decode(dtype, &bytes[at..at + es]);
            }
        });
    out
}

/// The bytes a layout touches: (first element, elements spanned).
pub(crate) fn extent(l: &Layout) -> (usize, usize) {
    if l.numel() == 0 {
        return (l.offset, 0);
    }
    let last: usize = l
        .shape
        .iter()
        .zip(&l.strides)
        .map(|(&s, &st)| (s - 1) * st)
        .sum();
    (l.offset, last + 1)
}

/// One little-endian element of `dtype` as float64.
pub(crate) fn decode(dtype: DType, b: &[u8]) -> f64 {
    match dtype {
        DType::F32 => f32::from_le_bytes(b.try_into().expect("4 bytes")) as f64,
        DType::F64 => f64::from_le_bytes(b.try_into().expect("8 bytes")),
        DType::F16 => half::f16::from_le_bytes(b.try_into().expect("2 bytes")).to_f64(),
        DType::BF16 => half::bf16::from_le_bytes(b.try_into().expect("2 bytes")).to_f64(),
        DType::I64 => i64::from_le_bytes(b.try_into().expect("8 bytes")) as f64,
        DType::I32 => i32::from_le_bytes(b.try_into().expect("4 bytes")) as f64,
        DType::I8 => b[0] as i8 as f64,
        DType::U8 => b[0] as f64,
        DType::Bool => (b[0] != 0) as u8 as f64,
    }
}

/// `v` rounded to float32 toward zero, its last bit set when that was inexact ("round to
/// odd"): rounding that to nearest at 8 or 11 bits (bf16, float16) rounds `v` itself to
/// nearest, ties to even, once. (`half`'s own conversions from f64 drop the low 32 bits of the
/// mantissa first, which breaks a tie the dropped bits would have decided.)
pub(crate) fn round_to_odd_f32(v: f64) -> f32 {
    let f = v as f32;
    if !f.is_finite() || f as f64 == v {
        return f;
    }
    // the nearest float32 may lie above |v|: step back to the one below, then mark it inexact
    let below = if (f as f64).abs() > v.abs() {
        f32::from_bits(f.to_bits() - 1)
    } else {
        f
    };
    f32::from_bits(below.to_bits() | 1)
}

pub(crate) fn encode(dtype: DType, v: f64, out: &mut [u8]) {
    match dtype {
        DType::F32 => out.copy_from_slice(&(v as f32).to_le_bytes()),
        DType::F64 => out.copy_from_slice(&v.to_le_bytes()),
        DType::F16 => out.copy_from_slice(&half::f16::from_f32(round_to_odd_f32(v)).to_le_bytes()),
        DType::BF16 => {
            out.copy_from_slice(&half::bf16::from_f32(round_to_odd_f32(v)).to_le_bytes())
        }
        DType::I64 => out.copy_from_slice(&(v as i64).to_le_bytes()),
        DType::I32 => out.copy_from_slice(&(v as i32).to_le_bytes()),
        DType::I8 => out[0] = v as i8 as u8,
        DType::U8 => out[0] = v as u8,
        DType::Bool => out[0] = (v != 0.0) as u8,
    }
}

/// Decodes packed elements (in parallel for large tensors).
pub(crate) fn decode_all(dtype: DType, bytes: &[u8]) -> Scratch {
    use rayon::prelude::*;
    let es = dtype.size() as usize;
    let mut out = Scratch::with_capacity(bytes.len() / es);
    match dtype {
        DType::F32 => bytes
            .par_chunks_exact(4)
            .with_min_len(1 << 14)
            .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]) as f64)
            .collect_into_vec(&mut out),
        _ => bytes
            .par_chunks_exact(es)
            .with_min_len(1 << 14)
            .map(|b| decode(dtype, b))
            .collect_into_vec(&mut out),
    }
    out
}

/// Encodes elements packed into `out` (in parallel for large tensors).
pub(crate) fn encode_into(dtype: DType, vals: &[f64], out: &mut [u8]) {
    use rayon::prelude::*;
    let es = dtype.size() as usize;
    out.par_chunks_exact_mut(es)
        .with_min_len(1 << 14)
        .zip(vals.par_iter())
        .for_each(|(o, v)| encode(dtype, *v, o));
}

impl CpuDevice {
    /// A tensor's elements, row-major, as float64 (exact for every dtype gpumem has but the
    /// largest int64 values).
    pub(crate) fn load(&self, b: &Buffer) -> Result<Scratch, String> {
        // a view may show one element many times (`expand`): its working copy is sized by the
        // view, so it is checked against the host before it is made
        let copy = (b.layout.numel() as u64).saturating_mul(8);
        if copy > self.limit.saturating_sub(self.held) {
            return Err(format!(
                "the cpu device computes on float64 copies of its inputs, and a copy of this \
                 {}-element tensor needs {}, more than the host has left for gpumem ({} of {}): \
                 run this workload on the simulated device",
                crate::units::group_digits(b.layout.numel() as u64),
                crate::units::format_bytes(copy),
                crate::units::format_bytes(self.limit.saturating_sub(self.held)),
                crate::units::format_bytes(self.limit)
            ));
        }
        let es = b.dtype.size() as usize;
        let (first, span) = extent(b.layout);
        let start = b.addr + (first * es) as u64;
        // in place when one chunk holds it all, else staged (a tensor across mapped pages)
        let staged;
        let bytes = match self.mem.within(start, span * es) {
            Some(b) => b,
            None => {
                let mut b = vec![0u8; span * es];
                if span > 0 {
                    self.mem.get(start, &mut b)?;
                }
                staged = b;
                &staged
            }
        };
        if b.layout.is_contiguous() {
            return Ok(decode_all(b.dtype, bytes));
        }
        Ok(gather(b.layout, first, b.dtype, bytes))
    }

    /// Writes row-major values through the buffer's layout, rounding to its dtype.
    pub(crate) fn store(&mut self, b: &Buffer, vals: &[f64]) -> Result<(), String> {
        if vals.len() != b.layout.numel() {
            return Err(format!(
                "kernel wrote {} values into a tensor of {}",
                vals.len(),
                b.layout.numel()
            ));
        }
        let es = b.dtype.size() as usize;
        let (first, span) = extent(b.layout);
        if span == 0 {
            return Ok(());
        }
        let base = b.addr + (first * es) as u64;
        if b.layout.is_contiguous() {
            if let Some(out) = self.mem.within_mut(base, span * es) {
                encode_into(b.dtype, vals, out);
                return Ok(());
            }
            let mut bytes = vec![0u8; span * es];
            encode_into(b.dtype, vals, &mut bytes);
            return self.mem.put(base, &bytes);
        }
        let mut bytes = vec![0u8; span * es];
        // keep what the layout does not cover
        self.mem.get(base, &mut bytes)?;
        let mut i = 0;
        for_each_offset(b.layout, |o| {
            let at = (o - first) * es;
            encode(b.dtype, vals[i], &mut bytes[at..at + es]);
            i += 1;
        });
        self.mem.put(base, &bytes)
    }
}

/// The saved tensor of role `r`, for a backward kernel.
pub(crate) fn saved<'a>(l: &'a Launch, r: Role) -> Result<&'a Buffer<'a>, String> {
    l.saved
        .iter()
        .find(|(role, _)| *role == r)
        .map(|(_, b)| b)
        .ok_or_else(|| format!("{}'s backward: {r:?} was not saved", l.op.name()))
}

impl Device for CpuDevice {
    fn name(&self) -> &'static str {
        "cpu"
    }
    fn computes(&self) -> bool {
        true
    }
    fn launch(&mut self, l: &Launch) -> Result<(), String> {
        match (l.op, l.pass) {
            (
                Op::Fill { .. }
                | Op::Unary(_)
                | Op::Pow { .. }
                | Op::Where
                | Op::Compare { .. }
                | Op::Bitwise { .. }
                | Op::Cumsum { .. }
                | Op::Logical { .. }
                | Op::Cat { .. }
                | Op::Pad { .. }
                | Op::Binary(_)
                | Op::Scalar { .. }
                | Op::MaskedFill { .. }
                | Op::Cast
                | Op::Clone
                | Op::Copy
                | Op::Dropout { .. }
                | Op::InPlace(_)
                | Op::Accumulate,
                _,
            ) => elementwise::launch(self, l),
            (Op::Matmul | Op::Linear | Op::Addmm, _) => linalg::launch(self, l),
            (Op::Sdpa { .. }, _) => attention::launch(self, l),
            (Op::OptimStep(s), Pass::Forward) => optim::step(self, l, s),
            (
                Op::Conv2d(_) | Op::BatchNorm(_) | Op::MaxPool2d(_) | Op::AdaptiveAvgPool2d { .. },
                _,
            ) => vision::launch(self, l),
            (
                Op::Topk { .. }
                | Op::Sort { .. }
                | Op::Gather
                | Op::IndexPut
                | Op::Histc { .. }
                | Op::FloorDiv { .. }
                | Op::Clamp { .. }
                | Op::Bincount { .. }
                | Op::GroupedMm { .. },
                _,
            ) => routing::launch(self, l),
            _ => nn::launch(self, l),
        }
    }
    fn read(&self, b: &Buffer) -> Result<Option<Vec<f64>>, String> {
        self.load(b).map(|v| Some(v.into_vec()))
    }
    fn write(&mut self, b: &Buffer, values: &[f64]) -> Result<(), String> {
        self.store(b, values)
    }
    fn failure(&self) -> Option<String> {
        self.failed.map(|size| {
            format!(
                "the cpu device holds every segment in host memory, and the host could not hold \
                 {} more (it had {} for gpumem, {} held): run this workload on the simulated \
                 device, or with a smaller batch or model",
                crate::units::format_bytes(size),
                crate::units::format_bytes(self.limit),
                crate::units::format_bytes(self.held)
            )
        })
    }
}

#[cfg(test)]
mod rounding_tests {
    use super::*;

    fn bf16_of(v: f64) -> f64 {
        let mut b = [0u8; 2];
        encode(DType::BF16, v, &mut b);
        decode(DType::BF16, &b)
    }

    fn f16_of(v: f64) -> f64 {
        let mut b = [0u8; 2];
        encode(DType::F16, v, &mut b);
        decode(DType::F16, &b)
    }

    /// float64 results round once to bf16 and float16, to nearest with ties to even, even
    /// where only bits below float64's top 32 decide the tie (the GPU's kernels round the same
    /// way, so the two devices store the same bits).
    #[test]
    fn doubles_round_once_to_half_precision() {
        let ulp = 2f64.powi(-7); // bf16's at 1.0
        let tiny = 2f64.powi(-40);
        for sign in [1.0, -1.0] {
            assert_eq!(bf16_of(sign * (1.0 + ulp / 2.0 + tiny)), sign * (1.0 + ulp));
            assert_eq!(bf16_of(sign * (1.0 + ulp / 2.0)), sign);
            assert_eq!(bf16_of(sign * (1.0 + ulp / 2.0 - tiny)), sign);
            assert_eq!(bf16_of(sign * (1.0 + 1.5 * ulp)), sign * (1.0 + 2.0 * ulp));
            let h = 2f64.powi(-10); // float16's ulp at 1.0
            assert_eq!(f16_of(sign * (1.0 + h / 2.0 + tiny)), sign * (1.0 + h));
            assert_eq!(f16_of(sign * (1.0 + h / 2.0)), sign);
        }
        assert_eq!(bf16_of(3.0), 3.0);
        assert!(bf16_of(f64::NAN).is_nan());
        assert_eq!(bf16_of(f64::INFINITY), f64::INFINITY);
        assert_eq!(bf16_of(1e300), f64::INFINITY);
        assert_eq!(bf16_of(0.0), 0.0);
        // a value between float32's subnormals still rounds to bf16's nearest (zero here)
        assert_eq!(bf16_of(1e-45), 0.0);
    }
}
