//! The workspace cuDNN's convolutions take from the caching allocator, as measured on an H200
//! with PyTorch 2.11 and cuDNN 9.19 (`torch.backends.cudnn.benchmark = False`, so cuDNN's
//! heuristics choose the engine).
//!
//! Which engine the heuristics choose has no compact rule: over 12,469 measured shapes the
//! best rule by kernel size and stride gets about half the sizes right (fixtures/vision/
//! conv_workspace.md). What does hold is that a workspace depends on the convolution's shape
//! and dtype alone (not on the allocator's state or the model around it), and that each
//! engine's size is a sum of the tensors' sizes plus a constant. So the engine reads the
//! measured sweep (`cudnn_conv_h200.tsv`, 29,541 shapes: every convolution of torchvision's
//! ResNets, wide ResNets and ResNeXts at 224 for every batch from 1 to 128 in float32 and
//! bf16, and a generic grid of 11,637 shapes), and for a batch size that was not measured
//! (above 128) it carries the nearest measured batch's size over: the
//! part that scales with the batch (the input, the output, a per-image weight buffer) scaled,
//! the rest kept. A shape that was never measured at any batch gets no workspace, and
//! [`measured`] says so.

use std::collections::HashMap;
use std::sync::OnceLock;

use super::vision::{Conv, ConvPass};
use crate::engine::dtype::DType;

/// Everything but the batch: `C H W K R S stride pad groups dtype`.
type Key = [u32; 10];

/// Per shape, its measured batches, ascending, each with (fwd, bwd_input, bwd_weight) bytes.
type Table = HashMap<Key, Vec<(u32, [u64; 3])>>;

const DATA: &str = include_str!("cudnn_conv_h200.tsv");

fn dtype_code(d: DType) -> Option<u32> {
    match d {
        DType::F32 => Some(0),
        DType::BF16 => Some(1),
        _ => None,
    }
}

fn table() -> &'static Table {
    static T: OnceLock<Table> = OnceLock::new();
    T.get_or_init(|| {
        let mut t: Table = HashMap::new();
        for line in DATA
            .lines()
            .filter(|l| !l.starts_with('#') && !l.is_empty())
        {
            let f: Vec<&str> = line.split(' ').collect();
            let n = |i: usize| f[i].parse::<u64>().expect("the table's numbers");
            let dt = match f[10] {
                "fp32" => 0,
                _ => 1,
            };
            let key: Key = [
                n(1) as u32,
                n(2) as u32,
                n(3) as u32,
                n(4) as u32,
                n(5) as u32,
                n(6) as u32,
                n(7) as u32,
                n(8) as u32,
                n(9) as u32,
                dt,
            ];
            t.entry(key)
                .or_default()
                .push((n(0) as u32, [n(11), n(12), n(13)]));
        }
        for v in t.values_mut() {
            v.sort_by_key(|e| e.0);
        }
        t
    })
}

fn key(c: &Conv, x: &[usize], w: &[usize], dtype: DType) -> Option<Key> {
    let d = dtype_code(dtype)?;
    let u = |v: usize| u32::try_from(v).ok();
    (c.dilation == 1).then_some(())?;
    Some([
        u(x[1])?,
        u(x[2])?,
        u(x[3])?,
        u(w[0])?,
        u(w[2])?,
        u(w[3])?,
        u(c.stride)?,
        u(c.padding)?,
        u(c.groups)?,
        d,
    ])
}

/// Whether the sweep measured this convolution (at some batch size).
pub fn measured(c: &Conv, x: &[usize], w: &[usize], dtype: DType) -> bool {
    key(c, x, w, dtype).is_some_and(|k| table().contains_key(&k))
}

/// The sizes at batch `n` that scale with it: the input, the output, and a float32
/// weight-sized buffer per image (some weight-gradient engines keep one).
fn per_image(c: &Conv, x: &[usize], w: &[usize], dtype: DType) -> [u64; 3] {
    let e = dtype.size();
    let out = c.out_shape(x, w).unwrap_or_default();
    let per = |s: &[usize]| s[1..].iter().product::<usize>() as u64;
    let i = per(x) * e;
    let o = if out.is_empty() { 0 } else { per(&out) * e };
    let wf = w.iter().product::<usize>() as u64 * 4;
    [i, o, wf]
}

/// Which of the scaling parts (input, output, per-image weight buffer) a measured size holds:
/// the combination that leaves the smallest non-negative rest, preferring fewer parts.
fn scaling_part(size: u64, n: u64, parts: [u64; 3]) -> u64 {
    let mut best = 0u64;
    let mut best_rest = size;
    for mask in 1u32..8 {
        let scaled: u64 = (0..3)
            .filter(|b| mask & (1 << b) != 0)
            .map(|b| parts[b] * n)
            .sum();
        if scaled <= size && size - scaled < best_rest {
            best_rest = size - scaled;
            best = scaled / n.max(1);
        }
    }
    best
}

/// Bytes of workspace for one computation (0: none).
pub fn workspace(pass: ConvPass, c: &Conv, x: &[usize], w: &[usize], dtype: DType) -> u64 {
    let Some(rows) = key(c, x, w, dtype).and_then(|k| table().get(&k)) else {
        return 0;
    };
    let p = match pass {
        ConvPass::Forward => 0,
        ConvPass::Data => 1,
        ConvPass::Filter => 2,
    };
    let n = x[0] as u64;
    if let Some(r) = rows.iter().find(|r| r.0 as u64 == n) {
        return r.1[p];
    }
    // the nearest measured batch (the larger one on a tie): its size, its scaling part moved
    // to this batch
    let near = rows
        .iter()
        .min_by_key(|r| {
            (
                (r.0 as i64 - n as i64).unsigned_abs(),
                std::cmp::Reverse(r.0),
            )
        })
        .expect("a measured shape has a batch");
    let (m, size) = (near.0 as u64, near.1[p]);
    if size == 0 {
        return 0;
    }
    let per = scaling_part(size, m, per_image(c, x, w, dtype));
    size - per * m + per * n
}

#[cfg(test)]
mod tests {
    use super::*;

    const C7: Conv = Conv {
        stride: 2,
        padding: 3,
        dilation: 1,
        groups: 1,
    };

    #[test]
    fn a_measured_shape_gives_its_measured_sizes() {
        // resnet's stem at batch 64: input + output + weight + 16 forward, no data gradient
        // measured in the model (the image needs none), a weight-gradient workspace
        let (x, w) = ([64, 3, 224, 224], [64, 3, 7, 7]);
        assert_eq!(
            workspace(ConvPass::Forward, &C7, &x, &w, DType::F32),
            244_093_712
        );
        assert_eq!(
            workspace(ConvPass::Filter, &C7, &x, &w, DType::F32),
            262_972_560
        );
        assert!(measured(&C7, &x, &w, DType::F32));
    }

    #[test]
    fn an_unmeasured_batch_scales_the_nearest_measured_one() {
        // measured at 64 as i + o + w + 16; at batch 48 the same engine's size
        let (x, w) = ([48, 3, 224, 224], [64, 3, 7, 7]);
        let i = 48 * 3 * 224 * 224 * 4u64;
        let o = 48 * 64 * 112 * 112 * 4u64;
        assert_eq!(
            workspace(ConvPass::Forward, &C7, &x, &w, DType::F32),
            i + o + 64 * 3 * 49 * 4 + 16
        );
    }

    #[test]
    fn an_unmeasured_shape_takes_none_and_says_so() {
        let (x, w) = ([2, 5, 9, 9], [3, 5, 3, 3]);
        let c = Conv {
            stride: 1,
            padding: 1,
            dilation: 1,
            groups: 1,
        };
        assert!(!measured(&c, &x, &w, DType::F32));
        assert_eq!(workspace(ConvPass::Forward, &c, &x, &w, DType::F32), 0);
    }
}
