//! What the CUDA libraries take from the caching allocator besides the ops' own tensors, as
//! PyTorch 2.11 on an H200 shows it: the cuBLAS and cuBLASLt workspaces of each thread's
//! handles (Note [cuBLAS workspaces]), and the scratch of the split column sum
//! (Note [reduction scratch]).

use super::dtype::DType;
use super::graph::TapeEvent;
use super::tensor::{Category, EngineError, Tensors};
use crate::backend::Device;

/// The cuBLAS workspace PyTorch takes from the caching allocator at the first matrix product
/// on a stream (`CUBLAS_WORKSPACE_CONFIG` default `:4096:8` on Hopper), kept for the process.
pub const CUBLAS_WORKSPACE: u64 = 8 * 4096 * 1024;

/// The cuBLASLt workspace taken right after the cuBLAS one (1 MiB; seen in PyTorch's traces).
pub const CUBLASLT_WORKSPACE: u64 = 1 << 20;

impl<S: Device> Tensors<S> {
    // Note [cuBLAS workspaces]
    /// The first matrix product of the process takes the cuBLAS workspace and then the cuBLASLt
    /// one, right after allocating its output (as PyTorch 2.11 does on an H200). On the autograd
    /// thread (in backward, a checkpoint's recomputation included) the handles are that
    /// thread's: its first product takes a cuBLAS workspace, and its first product with a bias
    /// (`addmm`, which goes through cuBLASLt) a cuBLASLt one.
    pub(crate) fn ensure_cublas_workspace(&mut self, with_bias: bool) -> Result<(), EngineError> {
        if self.on_autograd_thread {
            if self.backward_workspace.is_none() {
                let w = self.empty(&[CUBLAS_WORKSPACE as usize], DType::U8, Category::Workspace)?;
                self.backward_workspace = Some(w);
            }
            if with_bias && self.backward_lt_workspace.is_none() {
                let lt = self.empty(
                    &[CUBLASLT_WORKSPACE as usize],
                    DType::U8,
                    Category::Workspace,
                )?;
                self.backward_lt_workspace = Some(lt);
            }
            return Ok(());
        }
        if let Some(r) = self.checkpoint.current {
            let ev = TapeEvent::Product { with_bias };
            self.checkpoint.regions[r as usize].tape.push(ev);
        }
        if self.workspace.is_none() {
            let w = self.empty(&[CUBLAS_WORKSPACE as usize], DType::U8, Category::Workspace)?;
            self.workspace = Some(w);
            let lt = self.empty(
                &[CUBLASLT_WORKSPACE as usize],
                DType::U8,
                Category::Workspace,
            )?;
            self.lt_workspace = Some(lt);
        }
        Ok(())
    }

    // Note [reduction scratch]
    /// The scratch PyTorch's reduction kernel takes to sum a contiguous `[rows, cols]` over its
    /// rows when the sum is split across thread blocks (float accumulators: per output, block
    /// and lane of a block row; an int semaphore per block column), allocated and freed within the kernel.
    /// The split follows the kernel's launch configuration on an H200 (132 SMs, 2,048 threads
    /// each): outputs vectorized by 4 into 32-wide, 4-high blocks; each thread sums at least
    /// 256 rows before the rows are spread over blocks, to fill the device, at least 16 rows
    /// a thread.
    pub(crate) fn column_sum_scratch(
        &mut self,
        rows: usize,
        cols: usize,
    ) -> Result<(), EngineError> {
        const SMS: usize = 132;
        const THREADS_PER_SM: usize = 2048;
        let vec = match cols {
            c if c % 4 == 0 => 4,
            c if c % 2 == 0 => 2,
            _ => 1,
        };
        let max_threads = 512 / vec;
        let pow2_below = |n: usize| {
            if n == 0 {
                1
            } else {
                1usize << (usize::BITS - 1 - n.leading_zeros())
            }
        };
        let dim0 = cols.div_ceil(vec);
        let dim0_pow2 = if dim0 < max_threads {
            pow2_below(dim0)
        } else {
            max_threads
        };
        let dim1_pow2 = if rows < max_threads {
            pow2_below(rows)
        } else {
            max_threads
        };
        let width = dim0_pow2.min(32);
        let height = dim1_pow2.min(max_threads / width);
        let width = dim0_pow2.min(max_threads / height);
        let grid = dim0.div_ceil(width);
        let per_thread = rows.div_ceil(height);
        let target = SMS * (THREADS_PER_SM / (width * height));
        if per_thread < 256 || grid > target {
            return Ok(());
        }
        let ctas = target
            .div_ceil(grid)
            .min(per_thread.div_ceil(16))
            .max(per_thread.div_ceil(256));
        if ctas <= 1 {
            return Ok(());
        }
        let buf = self.empty(
            &[cols * ctas * width * vec],
            DType::F32,
            Category::Temporary,
        )?;
        let sem = match self.empty(&[grid], DType::I32, Category::Temporary) {
            Ok(t) => t,
            Err(e) => {
                self.release(buf);
                return Err(e);
            }
        };
        self.release(sem);
        self.release(buf);
        Ok(())
    }
}
