//! The CPU kernel against a naive row-by-row oracle written here, on random inputs with
//! duplicate times, equal created times, boundary rows, unknown entities and several
//! thread counts.

use quiver_gpu_join::{AsOfInput, AsOfKernel, CpuKernel, NO_ENTITY, NO_ROW};
use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};

/// For each spine row: the max (ts, created, seq) feature row of its entity among the
/// candidates of docs/offline.md, by looking at every feature row.
fn oracle(input: &AsOfInput<'_>) -> Vec<u32> {
    (0..input.spine_entity.len())
        .map(|i| {
            let (e, t) = (input.spine_entity[i], input.spine_ts[i]);
            let mut best: Option<(i64, i64, i64, u32)> = None;
            if e == NO_ENTITY {
                return NO_ROW;
            }
            for r in 0..input.feature_entity.len() {
                let ts = input.feature_ts[r];
                let created = input.feature_created.map_or(0, |c| c[r]);
                let ok = input.feature_entity[r] == e
                    && ts <= t
                    && input.ttl_us.is_none_or(|ttl| ts >= t - ttl)
                    && (!input.created_cutoff || input.feature_created.is_none() || created <= t);
                let cand = (ts, created, input.feature_seq[r], r as u32);
                if ok && best.is_none_or(|b| (cand.0, cand.1, cand.2) > (b.0, b.1, b.2)) {
                    best = Some(cand);
                }
            }
            best.map_or(NO_ROW, |b| b.3)
        })
        .collect()
}

struct Case {
    spine_entity: Vec<u32>,
    spine_ts: Vec<i64>,
    feature_entity: Vec<u32>,
    feature_ts: Vec<i64>,
    feature_created: Vec<i64>,
    feature_seq: Vec<i64>,
    n_entities: u32,
}

fn random_case(rng: &mut StdRng, n_spine: usize, n_feat: usize, n_ent: u32) -> Case {
    // Coarse times so that equal event times and equal created times are common.
    let time = |rng: &mut StdRng| rng.random_range(0..50i64) * 10;
    let mut feature_entity: Vec<u32> =
        (0..n_feat).map(|_| if rng.random_bool(0.05) { NO_ENTITY } else { rng.random_range(0..n_ent) }).collect();
    feature_entity.shuffle(rng);
    let feature_ts: Vec<i64> = (0..n_feat).map(|_| time(rng)).collect();
    let feature_created: Vec<i64> = feature_ts.iter().map(|t| t + rng.random_range(0..3) * 10).collect();
    let mut feature_seq: Vec<i64> = (0..n_feat as i64).collect();
    feature_seq.shuffle(rng);
    let mut spine_entity = Vec::new();
    let mut spine_ts = Vec::new();
    for _ in 0..n_spine {
        let e = if rng.random_bool(0.05) { NO_ENTITY } else { rng.random_range(0..n_ent) };
        // Often exactly at a feature time, or exactly a TTL after one.
        let t = match rng.random_range(0..4) {
            0 if n_feat > 0 => feature_ts[rng.random_range(0..n_feat)],
            1 if n_feat > 0 => feature_ts[rng.random_range(0..n_feat)] + 30,
            _ => time(rng) + rng.random_range(-5..5),
        };
        spine_entity.push(e);
        spine_ts.push(t);
    }
    Case { spine_entity, spine_ts, feature_entity, feature_ts, feature_created, feature_seq, n_entities: n_ent }
}

/// The kernel input of `case` with the given ttl and created-time settings.
fn input_of(case: &Case, ttl: Option<i64>, with_created: bool, cutoff: bool) -> AsOfInput<'_> {
    AsOfInput {
        spine_entity: &case.spine_entity,
        spine_ts: &case.spine_ts,
        feature_entity: &case.feature_entity,
        feature_ts: &case.feature_ts,
        feature_created: with_created.then_some(case.feature_created.as_slice()),
        feature_seq: &case.feature_seq,
        n_entities: case.n_entities,
        ttl_us: ttl,
        created_cutoff: cutoff,
    }
}

#[test]
fn cpu_kernel_matches_the_oracle() {
    let mut rng = StdRng::seed_from_u64(7);
    let mut checked = 0;
    for round in 0..200 {
        let n_ent = rng.random_range(1..20);
        let (n_spine, n_feat) = (rng.random_range(0..300), rng.random_range(0..600));
        let case = random_case(&mut rng, n_spine, n_feat, n_ent);
        for ttl in [None, Some(0), Some(30), Some(100)] {
            for (with_created, cutoff) in [(true, false), (true, true), (false, false)] {
                let input = input_of(&case, ttl, with_created, cutoff);
                let expected = oracle(&input);
                for threads in [1, 2, 3] {
                    let got = CpuKernel::new().with_threads(threads).join(&input).unwrap();
                    assert_eq!(got, expected, "round {round}, ttl {ttl:?}, created {with_created}, cutoff {cutoff}, threads {threads}");
                }
                checked += expected.iter().filter(|&&w| w != NO_ROW).count();
            }
        }
    }
    assert!(checked > 10_000, "too few matches exercised: {checked}");
}

#[test]
fn ties_go_to_created_then_ingestion_order() {
    // Entity 0: three rows at ts 10; created 5, 7, 7; seq 3, 1, 2.
    let input = AsOfInput {
        spine_entity: &[0, 0, 0],
        spine_ts: &[10, 9, 6],
        feature_entity: &[0, 0, 0],
        feature_ts: &[10, 10, 10],
        feature_created: Some(&[5, 7, 7]),
        feature_seq: &[3, 1, 2],
        n_entities: 1,
        ttl_us: None,
        created_cutoff: false,
    };
    assert_eq!(CpuKernel::new().join(&input).unwrap(), [2, NO_ROW, NO_ROW]);
}

#[test]
fn the_created_cutoff_skips_rows_created_after_the_spine_time() {
    // Row 1 is the latest event by t=10 but was only created at 12 (a backfill).
    let input = AsOfInput {
        spine_entity: &[0, 0],
        spine_ts: &[10, 12],
        feature_entity: &[0, 0],
        feature_ts: &[8, 10],
        feature_created: Some(&[9, 12]),
        feature_seq: &[0, 1],
        n_entities: 1,
        ttl_us: None,
        created_cutoff: false,
    };
    assert_eq!(CpuKernel::new().join(&input).unwrap(), [1, 1]);
    let cutoff = AsOfInput { created_cutoff: true, ..input };
    assert_eq!(CpuKernel::new().join(&cutoff).unwrap(), [0, 1]);
}

#[test]
fn ttl_bounds_are_inclusive() {
    let input = AsOfInput {
        spine_entity: &[0, 0, 0],
        spine_ts: &[100, 130, 131],
        feature_entity: &[0],
        feature_ts: &[100],
        feature_created: None,
        feature_seq: &[0],
        n_entities: 1,
        ttl_us: Some(30),
        created_cutoff: false,
    };
    assert_eq!(CpuKernel::new().join(&input).unwrap(), [0, 0, NO_ROW]);
}

#[test]
fn bad_input_is_refused() {
    let input = AsOfInput {
        spine_entity: &[5],
        spine_ts: &[1],
        feature_entity: &[],
        feature_ts: &[],
        feature_created: None,
        feature_seq: &[],
        n_entities: 1,
        ttl_us: None,
        created_cutoff: false,
    };
    let err = CpuKernel::new().join(&input).unwrap_err().to_string();
    assert!(err.contains("entity id out of range"), "{err}");
}

#[test]
fn large_inputs_split_over_threads_match_the_oracle() {
    // Enough rows for several scatter chunks (of 65,536 rows) per thread count.
    let mut rng = StdRng::seed_from_u64(99);
    let case = random_case(&mut rng, 300, 200_000, 500);
    let input = AsOfInput {
        spine_entity: &case.spine_entity,
        spine_ts: &case.spine_ts,
        feature_entity: &case.feature_entity,
        feature_ts: &case.feature_ts,
        feature_created: Some(&case.feature_created),
        feature_seq: &case.feature_seq,
        n_entities: case.n_entities,
        ttl_us: Some(100),
        created_cutoff: false,
    };
    let expected = oracle(&input);
    assert!(expected.iter().filter(|&&w| w != NO_ROW).count() > 200);
    for threads in [1, 2, 4, 7] {
        assert_eq!(CpuKernel::new().with_threads(threads).join(&input).unwrap(), expected, "threads {threads}");
    }
}

/// The CUDA engine's flow (runs, entity chunks, the `asof_search` logic, the scatter)
/// run on the host, with chunks from one entity's worth of rows up to everything.
#[test]
fn the_gpu_flow_on_the_host_matches_the_oracle() {
    let mut rng = StdRng::seed_from_u64(11);
    for round in 0..120 {
        let n_ent = rng.random_range(1..30);
        let (n_spine, n_feat) = (rng.random_range(0..200), rng.random_range(0..400));
        let case = random_case(&mut rng, n_spine, n_feat, n_ent);
        // The largest entity (feature + spine rows) bounds the smallest chunk.
        let mut per_entity = vec![0usize; n_ent as usize];
        for &e in case.feature_entity.iter().chain(&case.spine_entity) {
            if e != NO_ENTITY {
                per_entity[e as usize] += 1;
            }
        }
        let biggest = per_entity.iter().copied().max().unwrap_or(0).max(1);
        for ttl in [None, Some(0), Some(30)] {
            for (with_created, cutoff) in [(true, false), (true, true), (false, false)] {
                let input = input_of(&case, ttl, with_created, cutoff);
                let expected = oracle(&input);
                for chunk in [biggest, biggest + 1, 2 * biggest + 3, usize::MAX / 2] {
                    let got = quiver_gpu_join::cuda::join_chunked_on_host(&input, chunk).unwrap();
                    assert_eq!(got, expected, "round {round}, ttl {ttl:?}, created {with_created}, cutoff {cutoff}, chunk {chunk}");
                }
                if biggest > 1 {
                    assert!(
                        quiver_gpu_join::cuda::join_chunked_on_host(&input, biggest - 1).is_err(),
                        "an entity larger than a chunk is refused"
                    );
                }
            }
        }
    }
}

/// The kernels compile to PTX with NVRTC, which needs no GPU (`./run test` installs the
/// nvidia-cuda-nvrtc-cu12 wheel and sets QUIVER_REQUIRE_NVRTC=1).
#[test]
fn kernels_compile_to_ptx_with_nvrtc() {
    // SAFETY: only tries to dlopen the library.
    if !unsafe { cudarc::nvrtc::sys::is_culib_present() } {
        assert!(std::env::var("QUIVER_REQUIRE_NVRTC").is_err(), "QUIVER_REQUIRE_NVRTC is set but libnvrtc is not on LD_LIBRARY_PATH");
        eprintln!(
            "SKIPPED kernels_compile_to_ptx_with_nvrtc: no libnvrtc (pip install nvidia-cuda-nvrtc-cu12; put nvidia/cuda_nvrtc/lib on LD_LIBRARY_PATH, or use ./run test)"
        );
        return;
    }
    for arch in ["compute_80", "compute_90"] {
        let ptx = quiver_gpu_join::cuda::compile_ptx(Some(arch)).unwrap();
        for name in quiver_gpu_join::cuda::KERNEL_NAMES {
            assert!(ptx.contains(&format!(".entry {name}(")), "{arch}: no {name} in the PTX");
        }
        assert!(ptx.contains(&format!(".target sm_{}", &arch[8..])), "{arch}");
    }
    assert!(quiver_gpu_join::cuda::probe().nvrtc.is_some_and(|(major, _)| major >= 11));
}

/// Without a driver every entry point answers with an error, never a panic.
#[test]
fn no_gpu_means_errors_not_panics() {
    let probe = quiver_gpu_join::cuda::probe();
    if !probe.driver {
        assert!(probe.devices.is_empty());
        assert!(probe.driver_error.as_deref().is_some_and(|e| e.contains("libcuda")), "{probe:?}");
        let err = quiver_gpu_join::CudaKernel::new().unwrap_err().to_string();
        assert!(err.starts_with("cuda engine: no CUDA driver"), "{err}");
    } else {
        eprintln!("no_gpu_means_errors_not_panics: a CUDA driver is present ({} devices)", probe.devices.len());
    }
}

/// GPU against CPU, byte for byte, at several sizes and chunk boundaries. Needs a
/// device: skipped with a message without one, failing when QUIVER_REQUIRE_GPU=1.
#[test]
fn gpu_engine_matches_the_cpu_engine() {
    let kernel = match quiver_gpu_join::CudaKernel::new() {
        Ok(k) => k,
        Err(e) => {
            assert!(std::env::var("QUIVER_REQUIRE_GPU").is_err(), "QUIVER_REQUIRE_GPU is set but: {e}");
            eprintln!("SKIPPED gpu_engine_matches_the_cpu_engine: {e}");
            return;
        }
    };
    eprintln!("GPU test on {}", kernel.device());
    let mut rng = StdRng::seed_from_u64(5);
    // The device gather against its host meaning, with invalid rows and NO_ROW picks.
    for n in [0usize, 1, 1000, 1 << 20] {
        let values: Vec<u64> = (0..n).map(|_| rng.random()).collect();
        let narrow: Vec<u32> = (0..n).map(|_| rng.random()).collect();
        let valid: Vec<u8> = (0..n).map(|_| u8::from(rng.random_bool(0.9))).collect();
        let index: Vec<u32> =
            (0..n + 7).map(|_| if n == 0 || rng.random_bool(0.1) { NO_ROW } else { rng.random_range(0..n as u32) }).collect();
        let columns = [
            quiver_gpu_join::FixedColumn::U64 { values: &values, valid: Some(&valid) },
            quiver_gpu_join::FixedColumn::U64 { values: &values, valid: None },
            quiver_gpu_join::FixedColumn::U32 { values: &narrow, valid: Some(&valid) },
        ];
        let got = kernel.gather(&columns, &index).expect("the CUDA engine gathers").unwrap();
        let want: Vec<_> = columns.iter().map(|c| quiver_gpu_join::gather_on_host(c, &index)).collect();
        assert_eq!(got, want, "gather of {n} rows");
    }
    let mut sizes = vec![(0, 0, 1), (1, 1, 1), (300, 600, 20), (5_000, 50_000, 700)];
    sizes.push((1_000_000, 3_000_000, 100_000));
    for (n_spine, n_feat, n_ent) in sizes {
        let case = random_case(&mut rng, n_spine, n_feat, n_ent);
        for ttl in [None, Some(0), Some(30)] {
            for (with_created, cutoff) in [(true, false), (true, true), (false, false)] {
                let input = input_of(&case, ttl, with_created, cutoff);
                let cpu = CpuKernel::new().join(&input).unwrap();
                let gpu = quiver_gpu_join::CudaKernel::new().unwrap();
                assert_eq!(gpu.join(&input).unwrap(), cpu, "{n_spine}x{n_feat}, ttl {ttl:?}, created {with_created}, cutoff {cutoff}");
                // Small chunks: many transfers, entity boundaries at chunk edges.
                let chunked = quiver_gpu_join::CudaKernel::new().unwrap().with_chunk_rows(4 * (n_spine + n_feat) / n_ent as usize + 64);
                assert_eq!(chunked.join(&input).unwrap(), cpu, "chunked {n_spine}x{n_feat}");
            }
        }
    }
}
