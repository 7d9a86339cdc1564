//! The GPU point-in-time join: CUDA kernels (through cudarc) for the as-of search and
//! the gather, with the identical CPU algorithm as reference and fallback (SPEC §8).
//!
//! Nothing is implemented here yet; `historical --engine gpu` refuses until it is.
