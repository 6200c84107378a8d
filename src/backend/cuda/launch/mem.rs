//! Device bytes to and from the host: a tensor read back (`.item()`, losses, `--save-grads`),
//! weights and batches written in, and the byte ranges a launch's buffers span (the host
//! twin's copies).

use cudarc::driver::result;

use crate::backend::cpu::{decode_all, encode, encode_into, extent, for_each_offset, gather};
use crate::backend::Buffer;

/// Copies `out.len()` bytes at device address `addr` to the host (waits for the launches
/// before it: a synchronous copy on the legacy default stream).
pub(crate) fn get(addr: u64, out: &mut [u8]) -> Result<(), String> {
    if out.is_empty() {
        return Ok(());
    }
    // SAFETY: `addr..addr + len` lies in device memory the caching allocator holds (a
    // tensor's span), and `out` is a host buffer of that length
    unsafe { result::memcpy_dtoh_sync(out, addr) }
        .map_err(|e| format!("copying {} bytes from the GPU: {e:?}", out.len()))
}

/// Copies `bytes` to device address `addr`.
pub(crate) fn put(addr: u64, bytes: &[u8]) -> Result<(), String> {
    if bytes.is_empty() {
        return Ok(());
    }
    // SAFETY: as in `get`, the other way round
    unsafe { result::memcpy_htod_sync(addr, bytes) }
        .map_err(|e| format!("copying {} bytes to the GPU: {e:?}", bytes.len()))
}

/// The device bytes a buffer's view touches: (first byte's address, length).
pub(crate) fn span(b: &Buffer) -> (u64, u64) {
    let es = b.dtype.size();
    let (first, n) = extent(b.layout);
    (b.addr + first as u64 * es, n as u64 * es)
}

/// A tensor's elements, row-major, as float64.
pub(crate) fn read(b: &Buffer) -> Result<Vec<f64>, String> {
    let (start, len) = span(b);
    let mut bytes = vec![0u8; len as usize];
    get(start, &mut bytes)?;
    let v = if b.layout.is_contiguous() {
        decode_all(b.dtype, &bytes)
    } else {
        gather(b.layout, extent(b.layout).0, b.dtype, &bytes)
    };
    Ok(v.into_vec())
}

/// Writes row-major values through the buffer's layout, rounding to its dtype; what the view
/// does not cover keeps its bytes.
pub(crate) fn write(b: &Buffer, vals: &[f64]) -> Result<(), String> {
    if vals.len() != b.layout.numel() {
        return Err(format!(
            "{} values for a tensor of {}",
            vals.len(),
            b.layout.numel()
        ));
    }
    let (start, len) = span(b);
    let mut bytes = vec![0u8; len as usize];
    if b.layout.is_contiguous() {
        encode_into(b.dtype, vals, &mut bytes);
    } else {
        get(start, &mut bytes)?;
        let es = b.dtype.size() as usize;
        let first = extent(b.layout).0;
        let mut i = 0;
        for_each_offset(b.layout, |o| {
            let at = (o - first) * es;
            encode(b.dtype, vals[i], &mut bytes[at..at + es]);
            i += 1;
        });
    }
    put(start, &bytes)
}

/// Byte ranges merged where they overlap: disjoint, by address. Ranges that only touch stay
/// apart: they may lie in two segments the driver placed end to end, and one copy may not
/// cross from one allocation into another.
pub(crate) fn merge(mut ranges: Vec<(u64, u64)>) -> Vec<(u64, u64)> {
    ranges.retain(|r| r.1 > 0);
    ranges.sort_unstable();
    let mut out: Vec<(u64, u64)> = Vec::with_capacity(ranges.len());
    for (a, n) in ranges {
        match out.last_mut() {
            Some((b, m)) if a < *b + *m => *m = (*m).max(a + n - *b),
            _ => out.push((a, n)),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::dtype::DType;
    use crate::engine::layout::Layout;

    #[test]
    fn overlapping_ranges_merge_and_touching_ones_stay_apart() {
        assert_eq!(
            merge(vec![
                (100, 10),
                (0, 8),
                (105, 20),
                (8, 4),
                (200, 0),
                (50, 1)
            ]),
            vec![(0, 8), (8, 4), (50, 1), (100, 25)]
        );
        // one range inside another
        assert_eq!(merge(vec![(0, 100), (10, 5)]), vec![(0, 100)]);
    }

    #[test]
    fn a_views_span_runs_from_its_first_to_its_last_element() {
        // a transposed [3, 4] float32 view at element offset 2: elements 2..=2+11
        let l = Layout::contiguous(&[3, 4]).t().unwrap();
        let mut l = l;
        l.offset = 2;
        let b = Buffer {
            addr: 0x1000,
            layout: &l,
            dtype: DType::F32,
        };
        assert_eq!(span(&b), (0x1000 + 8, 48));
        // a broadcast row spans one row
        let mut r = Layout::contiguous(&[1, 4]);
        r.shape = smallvec::smallvec![5, 4];
        r.strides = smallvec::smallvec![0, 1];
        let b = Buffer {
            addr: 0x2000,
            layout: &r,
            dtype: DType::BF16,
        };
        assert_eq!(span(&b), (0x2000, 8));
    }
}
