// Quiver's point-in-time kernels (docs/offline.md: the point-in-time rule; the GPU join), compiled at run time with NVRTC.
//
// The feature rows of a chunk of entities arrive grouped by entity and sorted by
// (ts, created, seq) — the CPU engine's layout: run_offsets[e]..run_offsets[e + 1] are
// entity e's rows, run_ts/run_created their times, run_rows their row ids in the
// scanned table. Spine rows arrive with their entity (relative to the chunk) and time.
// Each thread answers one spine row exactly as CpuKernel::winner does, so the two
// engines return the same indices.

#define NO_ENTITY 0xffffffffu
#define NO_ROW 0xffffffffu

extern "C" __global__ void asof_search(
    const unsigned int* __restrict__ spine_entity,
    const long long* __restrict__ spine_ts,
    unsigned int n_spine,
    const unsigned int* __restrict__ run_offsets,
    const long long* __restrict__ run_ts,
    const long long* __restrict__ run_created,  // null when the view has no created time
    const unsigned int* __restrict__ run_rows,
    int created_cutoff,
    int has_ttl,
    long long ttl_us,
    unsigned int* __restrict__ out)
{
    unsigned int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n_spine) return;
    unsigned int e = spine_entity[i];
    if (e == NO_ENTITY) { out[i] = NO_ROW; return; }
    long long t = spine_ts[i];
    unsigned int lo = run_offsets[e], hi = run_offsets[e + 1];
    // The first row with ts > t (partition point of ts <= t).
    unsigned int a = lo, b = hi;
    while (a < b) {
        unsigned int mid = a + (b - a) / 2;
        if (run_ts[mid] <= t) a = mid + 1; else b = mid;
    }
    unsigned int j = a;
    for (;;) {
        if (j == lo) { out[i] = NO_ROW; return; }
        j -= 1;
        if (created_cutoff && run_created != 0 && run_created[j] > t) continue;
        break;
    }
    // t - ttl, saturating like the CPU's i64::saturating_sub.
    if (has_ttl) {
        const long long min_ll = -9223372036854775807LL - 1;
        long long floor = (ttl_us > 0 && t < min_ll + ttl_us) ? min_ll : t - ttl_us;
        if (run_ts[j] < floor) { out[i] = NO_ROW; return; }
    }
    out[i] = run_rows[j];
}

// The gather after the join: out[i] = values[index[i]] with a validity byte, for
// 8-byte and 4-byte columns (int64/float64/timestamps, int32/float32).
template <typename T>
__device__ void gather(const T* __restrict__ values, const unsigned char* __restrict__ valid_in,
                       const unsigned int* __restrict__ index, unsigned int n,
                       T* __restrict__ out, unsigned char* __restrict__ valid_out)
{
    unsigned int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    unsigned int r = index[i];
    if (r == NO_ROW) { out[i] = 0; valid_out[i] = 0; return; }
    out[i] = values[r];
    valid_out[i] = valid_in ? valid_in[r] : 1;  // null valid_in: all valid
}

extern "C" __global__ void gather_u64(const unsigned long long* values, const unsigned char* valid_in,
                                      const unsigned int* index, unsigned int n,
                                      unsigned long long* out, unsigned char* valid_out)
{
    gather(values, valid_in, index, n, out, valid_out);
}

extern "C" __global__ void gather_u32(const unsigned int* values, const unsigned char* valid_in,
                                      const unsigned int* index, unsigned int n,
                                      unsigned int* out, unsigned char* valid_out)
{
    gather(values, valid_in, index, n, out, valid_out);
}
