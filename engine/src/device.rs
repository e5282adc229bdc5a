//! Which device runs the model, and whether this machine can.
//!
//! The CPU backend is the reference and always available. The CUDA backend's kernels live in
//! `kernels/` (compiled at start-up by NVRTC); the engine does not run a model on the GPU yet,
//! so `--device cuda` is refused with the reason: first a missing driver or NVRTC library
//! (looked up by name, never by creating a context, so nothing can panic on a machine without
//! CUDA), then the missing backend itself.

/// Where the model's ops run (`--device`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum Device {
    /// The CPU backend (the reference).
    #[default]
    Cpu,
    /// An NVIDIA GPU through CUDA.
    Cuda,
}

/// Whether this machine can serve on `device`: `Err` says why not and what would work.
pub fn check(device: Device) -> Result<(), String> {
    match device {
        Device::Cpu => Ok(()),
        Device::Cuda => {
            // SAFETY: both only try to open the libraries by their usual names.
            let (driver, nvrtc) = unsafe {
                (
                    cudarc::driver::sys::is_culib_present(),
                    cudarc::nvrtc::sys::is_culib_present(),
                )
            };
            cuda_verdict(driver, nvrtc)
        }
    }
}

/// The answer for `--device cuda` given which CUDA libraries this machine has.
fn cuda_verdict(driver: bool, nvrtc: bool) -> Result<(), String> {
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
    Err(
        "this build cannot run a model on the GPU yet: the CUDA kernels (kernels/) compile, \
         but the CUDA backend is unfinished (issue 11); use --device cpu"
            .into(),
    )
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
        let no_driver = cuda_verdict(false, true).unwrap_err();
        assert!(no_driver.contains("libcuda"), "{no_driver}");
        let no_nvrtc = cuda_verdict(true, false).unwrap_err();
        assert!(no_nvrtc.contains("NVRTC"), "{no_nvrtc}");
        let no_backend = cuda_verdict(true, true).unwrap_err();
        assert!(no_backend.contains("unfinished"), "{no_backend}");
        // On this machine, whatever it has, the answer is a refusal, not a panic.
        assert!(check(Device::Cuda).is_err());
    }
}
