//! Feast's own Python SDK (the real `feast` package, in its own virtualenv because it pins
//! pandas 2) reading from `quiver serve` through `online_store: {type: remote}`: every
//! value, type and status checked against an independent pandas oracle. The work is in
//! `tests/it/feast/feast_client.py`; this test runs it with the `quiver` binary built here,
//! on the embedded store and on the real Redis that `./run test` starts.
//!
//! Needs `QUIVER_TEST_FEAST_PY` (the Feast venv's python, set by `./run test`); without it
//! the test is skipped with a message, unless `QUIVER_REQUIRE_FEAST=1` makes that a failure.

use std::path::Path;
use std::process::Command;

fn feast_python(test: &str) -> Option<String> {
    match std::env::var("QUIVER_TEST_FEAST_PY") {
        Ok(py) => Some(py),
        Err(_) => {
            assert!(std::env::var("QUIVER_REQUIRE_FEAST").is_err(), "QUIVER_REQUIRE_FEAST is set but QUIVER_TEST_FEAST_PY is not");
            eprintln!("SKIPPED {test}: no Feast venv (set QUIVER_TEST_FEAST_PY, or use ./run test)");
            None
        }
    }
}

fn run_client(python: &str, redis_url: Option<&str>) {
    let work = tempfile::tempdir().unwrap();
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/it/feast/feast_client.py");
    let mut cmd = Command::new(python);
    cmd.arg(&script).arg(env!("CARGO_BIN_EXE_quiver")).arg(work.path());
    if let Some(url) = redis_url {
        cmd.arg(url);
    }
    let out = cmd.output().expect("runs the Feast venv's python");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    println!("{stdout}");
    assert!(out.status.success(), "Feast's client disagrees with the oracle:\n{stdout}\n{stderr}");
    assert!(stdout.contains("feast client: all checks passed"), "{stdout}");
}

#[test]
fn feast_sdk_reads_quiver_serve_embedded() {
    if let Some(py) = feast_python("feast_sdk_reads_quiver_serve_embedded") {
        run_client(&py, None);
    }
}

#[test]
fn feast_sdk_reads_quiver_serve_redis() {
    let Some(py) = feast_python("feast_sdk_reads_quiver_serve_redis") else { return };
    let Ok(url) = std::env::var("QUIVER_TEST_REDIS_URL") else {
        assert!(std::env::var("QUIVER_REQUIRE_REDIS").is_err(), "QUIVER_REQUIRE_REDIS is set but QUIVER_TEST_REDIS_URL is not");
        eprintln!("SKIPPED feast_sdk_reads_quiver_serve_redis: no Redis (set QUIVER_TEST_REDIS_URL, or use ./run test)");
        return;
    };
    run_client(&py, Some(&url));
}
