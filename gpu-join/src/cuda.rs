//! The CUDA engine: the as-of search of [`asof.cu`](KERNEL_SOURCE) compiled with NVRTC
//! at run time and launched through cudarc, on the CPU engine's entity runs.
//!
//! Steps: the feature rows are grouped by entity and sorted exactly as [`CpuKernel`]
//! does (so both engines break ties alike); the spine rows are grouped by entity too.
//! The entities are then cut into chunks whose rows fit the device's free memory, and
//! each chunk goes to the device in one pinned transfer per array, is searched by one
//! thread per spine row, and comes back as row indices that are scattered into spine
//! order. A table larger than GPU memory therefore still works, one chunk at a time.
//!
//! Nothing here touches the CUDA driver until [`CudaKernel::new`]: cudarc 0.19 panics
//! when `libcuda` is missing, so [`probe`] looks for the libraries first and every
//! entry point returns an error instead.
//!
//! [`CpuKernel`]: crate::CpuKernel

use std::ops::Range;
use std::sync::Arc;

use crate::cpu::EntityRuns;
use crate::kernel::{AsOfInput, AsOfKernel, FixedColumn, Gathered, KernelError, NO_ENTITY, NO_ROW, gather_on_host};

/// The CUDA C source of every kernel.
pub const KERNEL_SOURCE: &str = include_str!("asof.cu");

/// The kernels `KERNEL_SOURCE` must define.
pub const KERNEL_NAMES: [&str; 3] = ["asof_search", "gather_u64", "gather_u32"];

/// A CUDA device: its name, compute capability (major, minor) and memory in bytes.
pub type Device = (String, (i32, i32), usize);

/// What the machine offers for CUDA.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Probe {
    /// `libcuda` can be loaded.
    pub driver: bool,
    /// The devices the driver reports: name, compute capability, memory in bytes.
    pub devices: Vec<Device>,
    /// Why the driver could not be used, if it could not.
    pub driver_error: Option<String>,
    /// NVRTC's version, when `libnvrtc` can be loaded.
    pub nvrtc: Option<(i32, i32)>,
}

/// Looks for the CUDA driver, its devices and NVRTC without ever panicking.
pub fn probe() -> Probe {
    // SAFETY: only tries to dlopen the library names; no symbol is called.
    let mut p = Probe { driver: unsafe { cudarc::driver::sys::is_culib_present() }, ..Probe::default() };
    if p.driver {
        match devices() {
            Ok(d) => p.devices = d,
            Err(e) => p.driver_error = Some(e),
        }
    } else {
        p.driver_error = Some("no CUDA driver library (libcuda.so) found".into());
    }
    // SAFETY: as above.
    if unsafe { cudarc::nvrtc::sys::is_culib_present() } {
        let (mut major, mut minor) = (0, 0);
        // SAFETY: the library is present (checked above); the call writes two ints.
        let r = unsafe { cudarc::nvrtc::sys::nvrtcVersion(&mut major, &mut minor) };
        if r == cudarc::nvrtc::sys::nvrtcResult::NVRTC_SUCCESS {
            p.nvrtc = Some((major, minor));
        }
    }
    p
}

fn devices() -> Result<Vec<Device>, String> {
    use cudarc::driver::CudaContext;
    let n = CudaContext::device_count().map_err(|e| format!("CUDA driver: {e}"))?;
    let mut out = Vec::new();
    for i in 0..n.max(0) as usize {
        let ctx = CudaContext::new(i).map_err(|e| format!("device {i}: {e}"))?;
        let name = ctx.name().map_err(|e| e.to_string())?;
        let cc = ctx.compute_capability().map_err(|e| e.to_string())?;
        let mem = ctx.total_mem().map_err(|e| e.to_string())?;
        out.push((name, cc, mem));
    }
    Ok(out)
}

/// Compiles every kernel to PTX with NVRTC (no GPU needed); returns the PTX text.
///
/// # Errors
/// [`KernelError::Engine`] when NVRTC is missing or the source does not compile.
pub fn compile_ptx(arch: Option<&str>) -> Result<String, KernelError> {
    // SAFETY: only tries to dlopen the library names.
    if !unsafe { cudarc::nvrtc::sys::is_culib_present() } {
        return Err(engine(
            "NVRTC (libnvrtc.so) not found: install the nvidia-cuda-nvrtc-cu12 wheel and put its nvidia/cuda_nvrtc/lib on LD_LIBRARY_PATH",
        ));
    }
    // The architecture as an option of its own: cudarc's `arch` field wants a `'static`.
    let options = arch.map(|a| vec![format!("--gpu-architecture={a}")]).unwrap_or_default();
    let opts = cudarc::nvrtc::CompileOptions { options, name: Some("asof.cu".into()), ..Default::default() };
    let ptx = cudarc::nvrtc::compile_ptx_with_opts(KERNEL_SOURCE, opts).map_err(|e| engine(format!("NVRTC: {e:?}")))?;
    Ok(ptx.to_src())
}

fn engine(message: impl Into<String>) -> KernelError {
    KernelError::Engine { engine: "cuda", message: message.into() }
}

/// The inputs of one view's join, laid out for chunked device work: the feature runs
/// (the CPU engine's), created times in run order, and the spine grouped by entity.
pub(crate) struct Prepared {
    pub(crate) runs: EntityRuns,
    pub(crate) run_created: Option<Vec<i64>>,
    /// Spine row ids grouped by entity; `spine_offsets[e]..spine_offsets[e + 1]`.
    pub(crate) spine_rows: Vec<u32>,
    pub(crate) spine_offsets: Vec<u32>,
}

impl Prepared {
    pub(crate) fn new(input: &AsOfInput<'_>, threads: usize) -> Prepared {
        let runs = EntityRuns::build(input, threads);
        let run_created =
            input.feature_created.filter(|_| input.created_cutoff).map(|c| runs.rows.iter().map(|&r| c[r as usize]).collect());
        let n_ent = input.n_entities as usize;
        let mut spine_offsets = vec![0u32; n_ent + 1];
        for &e in input.spine_entity {
            if e != NO_ENTITY {
                spine_offsets[e as usize + 1] += 1;
            }
        }
        for e in 0..n_ent {
            spine_offsets[e + 1] += spine_offsets[e];
        }
        let mut cursor = spine_offsets.clone();
        let mut spine_rows = vec![0u32; spine_offsets[n_ent] as usize];
        for (i, &e) in input.spine_entity.iter().enumerate() {
            if e != NO_ENTITY {
                spine_rows[cursor[e as usize] as usize] = i as u32;
                cursor[e as usize] += 1;
            }
        }
        Prepared { runs, run_created, spine_rows, spine_offsets }
    }

    /// Cuts the entities into chunks of at most `max_rows` feature rows plus spine rows.
    ///
    /// # Errors
    /// When one entity alone has more rows than fit.
    pub(crate) fn chunks(&self, max_rows: usize) -> Result<Vec<Range<usize>>, KernelError> {
        let n_ent = self.spine_offsets.len() - 1;
        let rows_of = |e: usize| {
            (self.runs.offsets[e + 1] - self.runs.offsets[e]) as usize + (self.spine_offsets[e + 1] - self.spine_offsets[e]) as usize
        };
        let mut out = Vec::new();
        let mut start = 0;
        let mut size = 0;
        for e in 0..n_ent {
            let r = rows_of(e);
            if r > max_rows {
                return Err(engine(format!("entity {e} has {r} rows, more than one device chunk holds ({max_rows})")));
            }
            if size + r > max_rows {
                out.push(start..e);
                start = e;
                size = 0;
            }
            size += r;
        }
        if start < n_ent {
            out.push(start..n_ent);
        }
        Ok(out)
    }

    /// One chunk's arrays as the device gets them: spine entity ids relative to the
    /// chunk, spine times, run offsets relative to the chunk, and the chunk's runs.
    pub(crate) fn chunk_arrays(&self, input: &AsOfInput<'_>, entities: &Range<usize>) -> ChunkArrays<'_> {
        let f = self.runs.offsets[entities.start] as usize..self.runs.offsets[entities.end] as usize;
        let s = self.spine_offsets[entities.start] as usize..self.spine_offsets[entities.end] as usize;
        let base = self.runs.offsets[entities.start];
        let run_offsets: Vec<u32> = self.runs.offsets[entities.start..=entities.end].iter().map(|o| o - base).collect();
        let mut spine_entity = Vec::with_capacity(s.len());
        for e in entities.clone() {
            let n = self.spine_offsets[e + 1] - self.spine_offsets[e];
            spine_entity.extend(std::iter::repeat_n((e - entities.start) as u32, n as usize));
        }
        let spine_rows = &self.spine_rows[s.clone()];
        debug_assert_eq!(spine_rows.len(), spine_entity.len());
        ChunkArrays {
            spine_rows: spine_rows.to_vec(),
            spine_entity,
            spine_ts: spine_rows.iter().map(|&i| input.spine_ts[i as usize]).collect(),
            run_offsets,
            run_ts: &self.runs.ts[f.clone()],
            run_created: self.run_created.as_ref().map(|c| &c[f.clone()]),
            run_rows: &self.runs.rows[f],
        }
    }
}

/// The arrays of one device chunk; the runs are borrowed from [`Prepared`].
pub(crate) struct ChunkArrays<'a> {
    /// Where each answer goes in the spine.
    pub(crate) spine_rows: Vec<u32>,
    pub(crate) spine_entity: Vec<u32>,
    pub(crate) spine_ts: Vec<i64>,
    pub(crate) run_offsets: Vec<u32>,
    pub(crate) run_ts: &'a [i64],
    pub(crate) run_created: Option<&'a [i64]>,
    pub(crate) run_rows: &'a [u32],
}

/// `asof_search` of `asof.cu`, line for line, on the host: the reference the device
/// code is checked against where there is no device, and by the chunked host join.
pub(crate) fn search_host(c: &ChunkArrays<'_>, i: usize, created_cutoff: bool, ttl_us: Option<i64>) -> u32 {
    let e = c.spine_entity[i];
    if e == NO_ENTITY {
        return NO_ROW;
    }
    let t = c.spine_ts[i];
    let (lo, hi) = (c.run_offsets[e as usize], c.run_offsets[e as usize + 1]);
    let (mut a, mut b) = (lo, hi);
    while a < b {
        let mid = a + (b - a) / 2;
        if c.run_ts[mid as usize] <= t {
            a = mid + 1;
        } else {
            b = mid;
        }
    }
    let mut j = a;
    loop {
        if j == lo {
            return NO_ROW;
        }
        j -= 1;
        if created_cutoff && c.run_created.is_some_and(|rc| rc[j as usize] > t) {
            continue;
        }
        break;
    }
    if let Some(ttl) = ttl_us {
        let floor = if ttl > 0 && t < i64::MIN + ttl { i64::MIN } else { t - ttl };
        if c.run_ts[j as usize] < floor {
            return NO_ROW;
        }
    }
    c.run_rows[j as usize]
}

/// The CUDA engine's whole flow — runs, chunks of at most `max_rows`, the search, the
/// scatter — with the search done on the host by [`search_host`]. Tests run it against
/// the naive oracle with tiny chunks, so the chunking is checked without a device.
#[doc(hidden)]
pub fn join_chunked_on_host(input: &AsOfInput<'_>, max_rows: usize) -> Result<Vec<u32>, KernelError> {
    input.validate()?;
    let prep = Prepared::new(input, 1);
    let mut out = vec![NO_ROW; input.spine_entity.len()];
    for entities in prep.chunks(max_rows)? {
        let c = prep.chunk_arrays(input, &entities);
        for i in 0..c.spine_rows.len() {
            out[c.spine_rows[i] as usize] = search_host(&c, i, input.created_cutoff, input.ttl_us);
        }
    }
    Ok(out)
}

/// An engine that joins with `inner` and gathers through [`AsOfKernel::gather`] with
/// the device gather's logic on the host: it exercises the caller's device-gather path
/// (column flattening, validity, rebuilding Arrow arrays) where there is no device.
#[doc(hidden)]
#[derive(Debug)]
pub struct HostGather<K>(pub K);

impl<K: AsOfKernel> AsOfKernel for HostGather<K> {
    fn name(&self) -> &'static str {
        "host-gather"
    }

    fn join(&self, input: &AsOfInput<'_>) -> Result<Vec<u32>, KernelError> {
        self.0.join(input)
    }

    fn gather(&self, columns: &[FixedColumn<'_>], index: &[u32]) -> Option<Result<Vec<Gathered>, KernelError>> {
        Some(Ok(columns.iter().map(|c| gather_on_host(c, index)).collect()))
    }
}

/// The GPU engine (device 0).
pub struct CudaKernel {
    ctx: Arc<cudarc::driver::CudaContext>,
    search: cudarc::driver::CudaFunction,
    gather_u64: cudarc::driver::CudaFunction,
    gather_u32: cudarc::driver::CudaFunction,
    device: String,
    /// Rows per chunk; `None`: as many as free device memory allows.
    chunk_rows: Option<usize>,
}

impl std::fmt::Debug for CudaKernel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CudaKernel").field("device", &self.device).finish_non_exhaustive()
    }
}

impl CudaKernel {
    /// Opens device 0 and compiles the kernels for it.
    ///
    /// # Errors
    /// [`KernelError::Engine`] when there is no driver, no device or no NVRTC — never a
    /// panic.
    pub fn new() -> Result<CudaKernel, KernelError> {
        use cudarc::driver::CudaContext;
        // SAFETY: only tries to dlopen the library names.
        if !unsafe { cudarc::driver::sys::is_culib_present() } {
            return Err(engine("no CUDA driver library (libcuda.so) found"));
        }
        let n = CudaContext::device_count().map_err(|e| engine(format!("CUDA driver: {e}")))?;
        if n < 1 {
            return Err(engine("the CUDA driver reports no device"));
        }
        let ctx = CudaContext::new(0).map_err(|e| engine(format!("device 0: {e}")))?;
        let device = ctx.name().unwrap_or_else(|_| "device 0".into());
        let arch = ctx.compute_capability().ok().map(|(major, minor)| format!("compute_{major}{minor}"));
        let ptx = compile_ptx(arch.as_deref())?;
        let module = ctx.load_module(cudarc::nvrtc::Ptx::from_src(ptx)).map_err(|e| engine(format!("loading the kernels: {e}")))?;
        let function = |name: &str| module.load_function(name).map_err(|e| engine(format!("{name}: {e}")));
        let (search, gather_u64, gather_u32) = (function("asof_search")?, function("gather_u64")?, function("gather_u32")?);
        let chunk_rows = std::env::var("QUIVER_GPU_CHUNK_ROWS").ok().and_then(|v| v.parse().ok());
        Ok(CudaKernel { ctx, search, gather_u64, gather_u32, device, chunk_rows })
    }

    /// Cuts every join into chunks of at most `rows` rows (feature plus spine rows of
    /// whole entities), as a table larger than device memory would be.
    #[must_use]
    pub fn with_chunk_rows(mut self, rows: usize) -> CudaKernel {
        self.chunk_rows = Some(rows.max(1));
        self
    }

    /// The device's name.
    pub fn device(&self) -> &str {
        &self.device
    }

    /// Copies `v` to the device through a pinned staging buffer: one large DMA transfer.
    fn upload<T: cudarc::driver::DeviceRepr + cudarc::driver::ValidAsZeroBits + Copy>(
        &self,
        stream: &Arc<cudarc::driver::CudaStream>,
        v: &[T],
    ) -> Result<cudarc::driver::CudaSlice<T>, cudarc::driver::DriverError> {
        // SAFETY: the pinned buffer is fully written before it is read.
        let mut pinned = unsafe { self.ctx.alloc_pinned::<T>(v.len().max(1))? };
        pinned.as_mut_slice()?[..v.len()].copy_from_slice(v);
        let mut dev = stream.alloc_zeros::<T>(v.len().max(1))?;
        stream.memcpy_htod(&pinned, &mut dev)?;
        Ok(dev)
    }

    /// One chunk on the device; also returns the time spent uploading, in the kernel and
    /// downloading (each phase synchronised, so they do not overlap).
    fn run_chunk(
        &self,
        c: &ChunkArrays<'_>,
        input: &AsOfInput<'_>,
    ) -> Result<(Vec<u32>, [std::time::Duration; 3]), cudarc::driver::DriverError> {
        use cudarc::driver::{LaunchConfig, PushKernelArg};
        let stream = self.ctx.default_stream();
        let began = std::time::Instant::now();
        let n = c.spine_rows.len();
        let spine_entity = self.upload(&stream, &c.spine_entity)?;
        let spine_ts = self.upload(&stream, &c.spine_ts)?;
        let run_offsets = self.upload(&stream, &c.run_offsets)?;
        let run_ts = self.upload(&stream, c.run_ts)?;
        let run_created = match c.run_created {
            Some(rc) => Some(self.upload(&stream, rc)?),
            None => None,
        };
        let run_rows = self.upload(&stream, c.run_rows)?;
        let mut out = stream.alloc_zeros::<u32>(n.max(1))?;
        stream.synchronize()?;
        let uploaded = began.elapsed();
        let n32 = n as u32;
        let cutoff = i32::from(input.created_cutoff && run_created.is_some());
        let has_ttl = i32::from(input.ttl_us.is_some());
        let ttl = input.ttl_us.unwrap_or(0);
        let null: u64 = 0;
        let mut launch = stream.launch_builder(&self.search);
        launch.arg(&spine_entity).arg(&spine_ts).arg(&n32).arg(&run_offsets).arg(&run_ts);
        match &run_created {
            Some(rc) => launch.arg(rc),
            None => launch.arg(&null),
        };
        launch.arg(&run_rows).arg(&cutoff).arg(&has_ttl).arg(&ttl).arg(&mut out);
        // SAFETY: the arguments match asof_search's parameters in order and type, and
        // every buffer holds at least the rows the kernel indexes.
        unsafe { launch.launch(LaunchConfig::for_num_elems(n32.max(1)))? };
        stream.synchronize()?;
        let searched = began.elapsed();
        let mut host = stream.clone_dtoh(&out)?;
        host.truncate(n);
        let done = began.elapsed();
        Ok((host, [uploaded, searched - uploaded, done - searched]))
    }
}

impl CudaKernel {
    fn gather_one(&self, column: &FixedColumn<'_>, index: &[u32]) -> Result<Gathered, cudarc::driver::DriverError> {
        use cudarc::driver::{LaunchConfig, PushKernelArg};
        let empty = match column {
            FixedColumn::U64 { values, .. } => values.is_empty(),
            FixedColumn::U32 { values, .. } => values.is_empty(),
        };
        if empty || index.is_empty() {
            // Nothing to read on the device: every row is NO_ROW or there are none.
            return Ok(gather_on_host(column, index));
        }
        let stream = self.ctx.default_stream();
        let n = index.len();
        let n32 = n as u32;
        let dev_index = stream.clone_htod(index)?;
        let mut valid_out = stream.alloc_zeros::<u8>(n.max(1))?;
        let null: u64 = 0;
        let config = LaunchConfig::for_num_elems(n32.max(1));
        macro_rules! run {
            ($values:expr, $valid:expr, $func:expr, $t:ty, $variant:ident) => {{
                let values = stream.clone_htod($values)?;
                let valid = match $valid {
                    Some(v) => Some(stream.clone_htod(v)?),
                    None => None,
                };
                let mut out = stream.alloc_zeros::<$t>(n.max(1))?;
                let mut launch = stream.launch_builder(&$func);
                launch.arg(&values);
                match &valid {
                    Some(v) => launch.arg(v),
                    None => launch.arg(&null),
                };
                launch.arg(&dev_index).arg(&n32).arg(&mut out).arg(&mut valid_out);
                // SAFETY: the arguments match the gather kernel's parameters; `index`
                // holds row numbers below the values' length or NO_ROW.
                unsafe { launch.launch(config)? };
                let mut values_out = stream.clone_dtoh(&out)?;
                let mut ok = stream.clone_dtoh(&valid_out)?;
                values_out.truncate(n);
                ok.truncate(n);
                Gathered::$variant(values_out, ok)
            }};
        }
        Ok(match column {
            FixedColumn::U64 { values, valid } => run!(*values, *valid, self.gather_u64, u64, U64),
            FixedColumn::U32 { values, valid } => run!(*values, *valid, self.gather_u32, u32, U32),
        })
    }
}

impl AsOfKernel for CudaKernel {
    fn name(&self) -> &'static str {
        "cuda"
    }

    fn gather(&self, columns: &[FixedColumn<'_>], index: &[u32]) -> Option<Result<Vec<Gathered>, KernelError>> {
        Some(columns.iter().map(|c| self.gather_one(c, index).map_err(|e| engine(format!("{} gather: {e}", self.device)))).collect())
    }

    fn join(&self, input: &AsOfInput<'_>) -> Result<Vec<u32>, KernelError> {
        input.validate()?;
        let began = std::time::Instant::now();
        let threads = std::thread::available_parallelism().map_or(1, std::num::NonZeroUsize::get);
        let prep = Prepared::new(input, threads);
        // About 40 bytes per row on the device (times, ids, offsets, the answer); use
        // half of the free memory.
        let max_rows = match self.chunk_rows {
            Some(n) => n,
            None => {
                let (free, _) = self.ctx.mem_get_info().map_err(|e| engine(format!("device memory: {e}")))?;
                (free / 2 / 40).max(1 << 16)
            }
        };
        let prepared = began.elapsed();
        let mut out = vec![NO_ROW; input.spine_entity.len()];
        let mut phases = [std::time::Duration::ZERO; 3];
        let chunks = prep.chunks(max_rows)?;
        for entities in &chunks {
            let c = prep.chunk_arrays(input, entities);
            if c.spine_rows.is_empty() {
                continue;
            }
            let (found, took) = self.run_chunk(&c, input).map_err(|e| engine(format!("{}: {e}", self.device)))?;
            for (k, &i) in c.spine_rows.iter().enumerate() {
                out[i as usize] = found[k];
            }
            for (p, t) in phases.iter_mut().zip(took) {
                *p += t;
            }
        }
        let ms = |d: std::time::Duration| d.as_secs_f64() * 1000.0;
        tracing::info!(
            device = %self.device,
            chunks = chunks.len(),
            spine_rows = input.spine_entity.len(),
            feature_rows = input.feature_entity.len(),
            prepare_ms = ms(prepared),
            upload_ms = ms(phases[0]),
            kernel_ms = ms(phases[1]),
            download_ms = ms(phases[2]),
            total_ms = ms(began.elapsed()),
            "cuda join"
        );
        Ok(out)
    }
}
