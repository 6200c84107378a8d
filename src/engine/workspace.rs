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
    /// The first matrix product of the process takes the cuBLAS workspace, right after
    /// allocating its output, and its first product with a bias (`addmm`, through cuBLASLt)
    /// the cuBLASLt one (as PyTorch 2.11 does on an H200: Llama's bias-free `mm` and `bmm`
    /// take no cuBLASLt workspace, an MLP's first `addmm` takes both at once). On the autograd
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
        }
        if with_bias && self.lt_workspace.is_none() {
            let lt = self.empty(
                &[CUBLASLT_WORKSPACE as usize],
                DType::U8,
                Category::Workspace,
            )?;
            self.lt_workspace = Some(lt);
        }
        Ok(())
    }

    /// The scratch PyTorch's reduction kernel takes to sum a contiguous `[rows, cols]` over its
    /// rows (a bias gradient), allocated and freed within the kernel
    /// ([`super::reduction`]).
    pub(crate) fn column_sum_scratch(
        &mut self,
        rows: usize,
        cols: usize,
    ) -> Result<(), EngineError> {
        self.reduce_scratch(&[rows, cols], &[0], DType::F32)
    }

    /// The reduction kernel's staging buffer and semaphores for a contiguous tensor of
    /// `shape` summed over `dims` (nothing when the kernel reduces within its blocks).
    pub(crate) fn reduce_scratch(
        &mut self,
        shape: &[usize],
        dims: &[usize],
        dtype: DType,
    ) -> Result<(), EngineError> {
        let Some((buffer, sem)) = super::reduction::sum_scratch(shape, dims, dtype.size() as usize)
        else {
            return Ok(());
        };
        let buf = self.empty(&[buffer as usize], DType::U8, Category::Temporary)?;
        let sem = match self.empty(&[sem as usize], DType::U8, Category::Temporary) {
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
