//! The point-in-time (as-of) kernel: for each spine row, the winning feature row of its
//! entity (docs/offline.md), as row indices with "no match" marked.
//!
//! The kernel works on dense entity ids and microsecond times, so that every engine —
//! the CPU kernel here, and the CUDA kernels through cudarc — sees the same plain arrays
//! and must return the same indices. [`AsOfKernel`] is the extension point;
//! [`CpuKernel`] is the reference and the fallback. Key encoding, scans and the gather
//! of feature columns live in the offline store, which calls a kernel.
//!
//! Invariant: every engine returns exactly the [`CpuKernel`]'s indices for the same
//! input.

mod cpu;
pub mod cuda;
mod kernel;

pub use cpu::{CpuKernel, EntityRuns};
pub use cuda::CudaKernel;
pub use kernel::{AsOfInput, AsOfKernel, FixedColumn, Gathered, KernelError, NO_ENTITY, NO_ROW, gather_on_host};
