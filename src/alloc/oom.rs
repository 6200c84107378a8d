//! The out-of-memory error, with the fields of PyTorch's `torch.OutOfMemoryError` message.

use crate::units::torch_format_size;

/// Where PyTorch 2.11 points users from the OOM message.
pub const OOM_DOC_URL: &str =
    "https://docs.pytorch.org/docs/stable/notes/cuda.html#optimizing-memory-usage-with-pytorch-cuda-alloc-conf";

/// An allocation the allocator could not satisfy, after every retry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OutOfMemory {
    pub device: u32,
    /// Bytes asked for.
    pub requested: u64,
    /// The request rounded as the allocator rounds it.
    pub rounded: u64,
    /// The segment size asked of the device ("Tried to allocate").
    pub alloc_size: u64,
    /// Device total and free memory, as `cudaMemGetInfo` reported at the failure.
    pub device_total: u64,
    pub device_free: u64,
    /// This process's device memory according to NVML, if known.
    pub process_used: Option<u64>,
    /// The memory-fraction limit, if one is set.
    pub allowed: Option<u64>,
    /// `allocated_bytes` and `reserved_bytes` (all pools) at the failure.
    pub allocated: u64,
    pub reserved: u64,
    /// A request of 1 EiB or more, refused before the allocator ran.
    pub over_one_exabyte: bool,
    /// The request's pool at the failure: its largest free (cached, mapped) block and how
    /// many free blocks it had.
    pub largest_free: u64,
    pub free_blocks: u64,
}

impl OutOfMemory {
    /// Reserved memory no allocation holds: fragmentation or cache the retry could not free.
    pub fn reserved_unallocated(&self) -> u64 {
        self.reserved - self.allocated
    }
}

impl std::fmt::Display for OutOfMemory {
    /// PyTorch's message, field for field.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.over_one_exabyte {
            return write!(
                f,
                "CUDA out of memory. Tried to allocate more than 1EB memory."
            );
        }
        write!(
            f,
            "CUDA out of memory. Tried to allocate {}. GPU {} has a total capacity of {} of which {} is free. ",
            torch_format_size(self.alloc_size),
            self.device,
            torch_format_size(self.device_total),
            torch_format_size(self.device_free)
        )?;
        if let Some(p) = self.process_used {
            write!(
                f,
                "Including non-PyTorch memory, this process has {} memory in use. ",
                torch_format_size(p)
            )?;
        }
        if let Some(a) = self.allowed {
            write!(f, "{} allowed; ", torch_format_size(a))?;
        }
        write!(
            f,
            "Of the allocated memory {} is allocated by PyTorch, and {} is reserved by PyTorch but unallocated. \
             If reserved but unallocated memory is large try setting PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True \
             to avoid fragmentation.  See documentation for Memory Management  ({})",
            torch_format_size(self.allocated),
            torch_format_size(self.reserved_unallocated()),
            OOM_DOC_URL
        )
    }
}

impl std::error::Error for OutOfMemory {}
