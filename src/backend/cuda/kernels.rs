//! The CUDA kernels of `kernels/*.cu`: their sources (built into the binary), the kernel names
//! they define, and compiling them with NVRTC for the GPU at hand, cached on disk.
//!
//! A kernel is named as the engine's ops name theirs (`Op::kernel`, `Op::backward_kernel`), so
//! a test without a GPU checks that every kernel defined here is one an op asks for. The PTX
//! of a source is cached under `$XDG_CACHE_HOME/gpumem/kernels/` (else `~/.cache/...`), keyed
//! by a hash of the source and the GPU architecture: NVRTC runs once per source and GPU model.

use std::path::PathBuf;
use std::sync::Arc;

use cudarc::driver::{CudaContext, CudaModule};
use cudarc::nvrtc::{CompileOptions, Ptx};

/// Every kernel source: (file name in `kernels/`, its text).
pub const SOURCES: &[(&str, &str)] = &[
    (
        "elementwise.cu",
        include_str!("../../../kernels/elementwise.cu"),
    ),
    ("softmax.cu", include_str!("../../../kernels/softmax.cu")),
    ("norm.cu", include_str!("../../../kernels/norm.cu")),
    ("nn.cu", include_str!("../../../kernels/nn.cu")),
    ("reduce.cu", include_str!("../../../kernels/reduce.cu")),
    ("optim.cu", include_str!("../../../kernels/optim.cu")),
    (
        "attention.cu",
        include_str!("../../../kernels/attention.cu"),
    ),
    ("vision.cu", include_str!("../../../kernels/vision.cu")),
];

/// What every source starts with when compiled (`kernels/common.cuh`: views of any dtype).
pub const COMMON: &str = include_str!("../../../kernels/common.cuh");

/// The names of the kernels a source defines (`extern "C" __global__ void NAME(`).
pub fn defined(src: &str) -> Vec<&str> {
    src.split("extern \"C\" __global__ void ")
        .skip(1)
        .map(|rest| {
            // past `__launch_bounds__(N) `, where a kernel has one
            rest.strip_prefix("__launch_bounds__")
                .and_then(|r| r.split_once(')'))
                .map_or(rest, |(_, r)| r)
        })
        .filter_map(|rest| rest.split('(').next())
        .map(str::trim)
        .collect()
}

/// FNV-1a, 64 bits: a hash that stays the same across builds (the cache key).
fn fnv1a(parts: &[&[u8]]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for p in parts {
        for &b in *p {
            h ^= b as u64;
            h = h.wrapping_mul(0x0100_0000_01b3);
        }
        h ^= 0xff;
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    h
}

fn cache_dir() -> Option<PathBuf> {
    let base = std::env::var_os("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))?;
    Some(base.join("gpumem").join("kernels"))
}

/// NVRTC's name for a compute capability's virtual architecture.
fn arch(cc: (i32, i32)) -> &'static str {
    match cc {
        (7, 0) => "compute_70",
        (7, 5) => "compute_75",
        (8, 0) => "compute_80",
        (8, 6) => "compute_86",
        (8, 7) => "compute_87",
        (8, 9) => "compute_89",
        (9, 0) => "compute_90",
        (10, 0) => "compute_100",
        (12, 0) => "compute_120",
        // a newer GPU runs the PTX of an older architecture (the driver compiles it)
        (m, _) if m >= 9 => "compute_90",
        _ => "compute_70",
    }
}

/// Where a compiled module came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Origin {
    Compiled,
    Cache,
}

/// Compiles (or reads from the cache) the source `file` of [`SOURCES`] for `ctx`'s GPU and
/// loads it.
pub fn load(ctx: &Arc<CudaContext>, file: &str) -> Result<(Arc<CudaModule>, Origin), String> {
    let src = SOURCES
        .iter()
        .find(|(f, _)| *f == file)
        .map(|(_, s)| *s)
        .ok_or_else(|| format!("no kernel source {file}"))?;
    let cc = ctx
        .compute_capability()
        .map_err(|e| format!("the GPU's compute capability: {e:?}"))?;
    let arch = arch(cc);
    let key = fnv1a(&[COMMON.as_bytes(), src.as_bytes(), arch.as_bytes()]);
    let path = cache_dir().map(|d| {
        d.join(format!(
            "{}-{arch}-{key:016x}.ptx",
            file.trim_end_matches(".cu")
        ))
    });
    let cached = path.as_ref().and_then(|p| std::fs::read_to_string(p).ok());
    let (ptx, origin) = match cached {
        Some(text) => (text, Origin::Cache),
        None => {
            // SAFETY: only tries to load the library by its usual names
            if !unsafe { cudarc::nvrtc::sys::is_culib_present() } {
                return Err(
                    "compiling gpumem's CUDA kernels needs NVRTC (libnvrtc.so, from the \
                            CUDA toolkit or the nvidia-cuda-nvrtc wheel) on the library path"
                        .into(),
                );
            }
            let opts = CompileOptions {
                arch: Some(arch),
                name: Some(file.to_string()),
                ..Default::default()
            };
            let whole = format!("{COMMON}\n{src}");
            let ptx = cudarc::nvrtc::compile_ptx_with_opts(whole, opts)
                .map_err(|e| format!("NVRTC could not compile kernels/{file}: {e:?}"))?;
            let text = ptx.to_src();
            if let Some(p) = &path {
                // a cache that cannot be written only costs a compile next time
                let _ = write_cache(p, &text);
            }
            (text, Origin::Compiled)
        }
    };
    let module = ctx
        .load_module(Ptx::from_src(ptx))
        .map_err(|e| format!("loading kernels/{file}: {e:?}"))?;
    Ok((module, origin))
}

fn write_cache(path: &std::path::Path, text: &str) -> std::io::Result<()> {
    let dir = path.parent().expect("a file in a folder");
    std::fs::create_dir_all(dir)?;
    let mut f = tempfile::NamedTempFile::new_in(dir)?;
    std::io::Write::write_all(&mut f, text.as_bytes())?;
    f.persist(path).map_err(|e| e.error)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::op::{Binary, Op, OptimKind, Unary};

    /// Every kernel of `kernels/` is one an op runs (forward or backward), by its name.
    #[test]
    fn every_kernel_is_an_ops_kernel() {
        let mut names: Vec<&str> = Vec::new();
        for u in Unary::ALL {
            names.extend(Op::Unary(u).kernel());
            names.extend(Op::Unary(u).backward_kernel());
        }
        names.extend(Op::Binary(Binary::Add).kernel());
        names.extend(
            Op::Scalar {
                op: Binary::Add,
                value: 1.0,
                reversed: false,
            }
            .kernel(),
        );
        names.extend(Op::Clone.kernel());
        let sm = Op::Softmax {
            dim: -1,
            log: false,
            safe: false,
        };
        names.extend(sm.kernel());
        names.extend(sm.backward_kernel());
        for n in crate::engine::op::norm::EXAMPLES {
            names.extend(Op::Norm(*n).kernel());
            names.extend(Op::Norm(*n).backward_kernel());
        }
        names.extend(
            Op::Fill {
                fill: crate::engine::op::Fill::Zeros,
                seed: 0,
            }
            .kernel(),
        );
        for op in [
            Op::Binary(crate::engine::op::Binary::Mul),
            Op::MaskedFill { value: 0.0 },
            Op::Embedding { strided: false },
            Op::NllLoss,
            Op::Dropout { p: 0.1, seed: 0 },
            Op::Cat { dim: 0 },
            Op::Where,
            Op::Compare {
                cmp: crate::engine::op::Cmp::Lt,
                scalar: None,
            },
            Op::Sdpa {
                cudnn: false,
                gqa: false,
                dropout: 0.0,
                seed: 0,
                causal: true,
            },
            Op::Reduce {
                mean: false,
                dims: crate::engine::op::reduce::DimList::from_dim(None),
                keepdim: false,
            },
            Op::Conv2d(crate::engine::op::vision::Conv {
                stride: 1,
                padding: 0,
                dilation: 1,
                groups: 1,
            }),
            Op::BatchNorm(crate::engine::op::vision::BatchNorm {
                training: true,
                momentum: 0.1,
                eps: 1e-5,
            }),
            Op::MaxPool2d(crate::engine::op::vision::Pool {
                kernel: 2,
                stride: 2,
                padding: 0,
            }),
            Op::AdaptiveAvgPool2d { out: [1, 1] },
            Op::Bitwise { or: false },
            Op::Cumsum {
                dim: 0,
                dtype: None,
            },
            Op::Isin,
        ] {
            names.extend(op.kernel());
            names.extend(op.backward_kernel());
        }
        for kind in [OptimKind::Sgd, OptimKind::AdamW] {
            names.push(kind.kernel());
        }
        let mut found = 0;
        for (file, src) in SOURCES {
            for k in defined(src) {
                // a variant of an op's kernel (a path or width) is named `<kernel>__<variant>`
                let op_kernel = k.split("__").next().unwrap_or(k);
                assert!(
                    names.contains(&op_kernel),
                    "kernels/{file}: {k} is no op's kernel"
                );
                found += 1;
            }
        }
        // fill, unary, unary_backward, binary, scalar, copy, masked_fill, softmax,
        // softmax_backward, layer_norm, layer_norm_backward, rms_norm, rms_norm_backward,
        // embedding, embedding_backward, nll_loss, nll_loss_backward, dropout,
        // dropout_backward, reduce, adam_step, sgd_step, cat, compare, where, where_backward,
        // binary_backward; attention and attention_backward, each __rows, __d64 and __d128;
        // conv2d, batch_norm, max_pool2d, adaptive_avg_pool2d and their backward kernels;
        // bitwise, cumsum, isin; reduce__select (argmax, any, all, max); attention__d64_mask
        // and __d128_mask
        assert_eq!(found, 47);
        // the shared prelude defines no kernel of its own
        assert!(defined(COMMON).is_empty());
    }

    #[test]
    fn the_cache_key_is_stable() {
        assert_eq!(fnv1a(&[b"a", b"b"]), fnv1a(&[b"a", b"b"]));
        assert_ne!(fnv1a(&[b"ab"]), fnv1a(&[b"a", b"b"]));
        assert_eq!(arch((9, 0)), "compute_90");
    }
}
