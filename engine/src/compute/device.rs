//! Which device runs the model, and whether this machine can.
//!
//! The CPU backend is the reference and always available. The CUDA backend
//! ([`crate::compute::backend::cuda`]) needs the driver, NVRTC (its kernels are compiled at start-up)
//! and cuBLAS. [`check`] looks the libraries up by name, never by creating a context, so a
//! machine without CUDA gets a refusal naming the missing part rather than a panic; the
//! context itself is created by [`crate::compute::backend::cuda::CudaBackend::new`], whose errors are
//! reported the same way.

/// Where the model's ops run (`--device`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum Device {
    /// The CPU backend (the reference).
    #[default]
    Cpu,
    /// An NVIDIA GPU through CUDA.
    Cuda,
}

/// The backend a configuration runs its model on.
#[derive(Debug, Clone, Default)]
pub enum ComputeBackend {
    /// The CPU backend.
    #[default]
    Cpu,
    /// The CUDA backend on an opened GPU.
    Cuda {
        /// The backend.
        backend: crate::compute::backend::cuda::CudaBackend,
        /// Replay decode steps from CUDA graphs (`--cuda-graphs`).
        graphs: bool,
    },
}

impl ComputeBackend {
    /// Opens `device`: for CUDA, a context on GPU 0 (`graphs`: replay decode steps from
    /// CUDA graphs). An error says what failed and what would work.
    pub fn open(device: Device, graphs: bool) -> Result<ComputeBackend, String> {
        Ok(match device {
            Device::Cpu => ComputeBackend::Cpu,
            Device::Cuda => ComputeBackend::Cuda {
                backend: crate::compute::backend::cuda::CudaBackend::new(0)
                    .map_err(|e| format!("{e}; use --device cpu"))?,
                graphs,
            },
        })
    }
}

/// Whether this machine can serve on `device`: `Err` says why not and what would work.
pub fn check(device: Device) -> Result<(), String> {
    match device {
        Device::Cpu => Ok(()),
        Device::Cuda => {
            let (driver, cublas) = crate::compute::backend::cuda::libraries_present();
            cuda_verdict(driver, ballast_kernels::nvrtc_available(), cublas)
        }
    }
}

/// The answer for `--device cuda` given which CUDA libraries this machine has.
fn cuda_verdict(driver: bool, nvrtc: bool, cublas: bool) -> Result<(), String> {
    if !driver {
        return Err(
            "no CUDA driver library (libcuda.so.1) on this machine: CUDA needs an NVIDIA \
                    GPU and its driver; use --device cpu"
                .into(),
        );
    }
    if !nvrtc {
        return Err(
            "no NVRTC library (libnvrtc.so): the CUDA kernels are compiled at start-up; \
                    install NVRTC (kernels/install-nvrtc.sh on Debian) or use --device cpu"
                .into(),
        );
    }
    if !cublas {
        return Err(
            "no cuBLAS library (libcublas.so) on this machine: the CUDA backend's GEMMs use \
             it; install the CUDA runtime libraries or use --device cpu"
                .into(),
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_is_always_available() {
        assert_eq!(check(Device::Cpu), Ok(()));
    }

    #[test]
    fn cuda_is_refused_with_the_missing_part_named() {
        let no_driver = cuda_verdict(false, true, true).unwrap_err();
        assert!(no_driver.contains("libcuda"), "{no_driver}");
        let no_nvrtc = cuda_verdict(true, false, true).unwrap_err();
        assert!(no_nvrtc.contains("NVRTC"), "{no_nvrtc}");
        let no_cublas = cuda_verdict(true, true, false).unwrap_err();
        assert!(no_cublas.contains("cuBLAS"), "{no_cublas}");
        assert_eq!(cuda_verdict(true, true, true), Ok(()));
        // On this machine, whatever it has, the answer is an answer, not a panic.
        let _ = check(Device::Cuda);
    }
}
