//! What NVML (the driver's management library, `libnvidia-ml.so.1`, loaded at run time) says
//! of the machine's GPUs: `gpumem devices`, and the memory a process uses as nvidia-smi shows
//! it. Plain data; `report::devices` formats it.

use serde::Serialize;

/// One GPU as NVML sees it.
#[derive(Debug, Clone, Serialize)]
pub struct GpuInfo {
    /// NVML's index (nvidia-smi's).
    pub index: u32,
    pub name: String,
    pub uuid: String,
    pub memory_total: u64,
    pub memory_used: u64,
    pub memory_free: u64,
    /// Processes holding memory on it: (pid, bytes), bytes absent where NVML cannot say.
    pub processes: Vec<GpuProcess>,
}

#[derive(Debug, Clone, Serialize)]
pub struct GpuProcess {
    pub pid: u32,
    pub used_memory: Option<u64>,
}

/// The machine's GPUs and driver.
#[derive(Debug, Clone, Serialize)]
pub struct Machine {
    pub driver_version: String,
    /// The CUDA version the driver supports (`13.0`).
    pub cuda_version: String,
    pub gpus: Vec<GpuInfo>,
}

/// Why NVML is not there, in the words `gpumem devices` prints.
const NO_NVML: &str = "NVML, the NVIDIA driver's management library (libnvidia-ml.so.1), could \
not be loaded: gpumem devices lists NVIDIA GPUs through it (install the NVIDIA driver, or put \
its folder on LD_LIBRARY_PATH)";

/// Every GPU NVML sees, or why it cannot say.
pub fn machine() -> Result<Machine, String> {
    use nvml_wrapper::enums::device::UsedGpuMemory;
    let nvml = nvml_wrapper::Nvml::init().map_err(|e| match e {
        nvml_wrapper::error::NvmlError::LibloadingError(_) => NO_NVML.to_string(),
        nvml_wrapper::error::NvmlError::DriverNotLoaded => {
            "the NVIDIA driver is installed but not loaded (no kernel module): no GPU to list"
                .to_string()
        }
        other => format!("NVML could not start: {other}"),
    })?;
    let err = |what: &str, e: nvml_wrapper::error::NvmlError| format!("NVML {what}: {e}");
    let driver_version = nvml
        .sys_driver_version()
        .map_err(|e| err("driver version", e))?;
    let cuda = nvml
        .sys_cuda_driver_version()
        .map_err(|e| err("CUDA version", e))?;
    let cuda_version = format!(
        "{}.{}",
        nvml_wrapper::cuda_driver_version_major(cuda),
        nvml_wrapper::cuda_driver_version_minor(cuda)
    );
    let n = nvml.device_count().map_err(|e| err("device count", e))?;
    let mut gpus = Vec::new();
    for index in 0..n {
        let d = nvml
            .device_by_index(index)
            .map_err(|e| err(&format!("device {index}"), e))?;
        let mem = d
            .memory_info()
            .map_err(|e| err(&format!("device {index}'s memory"), e))?;
        let processes = d
            .running_compute_processes()
            .unwrap_or_default()
            .into_iter()
            .map(|p| GpuProcess {
                pid: p.pid,
                used_memory: match p.used_gpu_memory {
                    UsedGpuMemory::Used(b) => Some(b),
                    UsedGpuMemory::Unavailable => None,
                },
            })
            .collect();
        gpus.push(GpuInfo {
            index,
            name: d.name().unwrap_or_else(|_| "an NVIDIA GPU".into()),
            uuid: d.uuid().unwrap_or_default(),
            memory_total: mem.total,
            memory_used: mem.used,
            memory_free: mem.free,
            processes,
        });
    }
    Ok(Machine {
        driver_version,
        cuda_version,
        gpus,
    })
}
