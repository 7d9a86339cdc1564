//! Helpers shared by the root integration tests.

use std::path::Path;
use std::process::{Command, Output};

/// Runs the `quiver` binary in `dir` with `env`, without the test process's own
/// `QUIVER_` settings leaking into the repository under test.
pub fn quiver(dir: &Path, args: &[&str], env: &[(&str, &str)]) -> Output {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_quiver"));
    cmd.current_dir(dir).args(args);
    for (k, _) in std::env::vars() {
        if k.starts_with("QUIVER_") {
            cmd.env_remove(k);
        }
    }
    for (k, v) in env {
        cmd.env(k, v);
    }
    cmd.output().unwrap()
}

/// One HTTP/1.1 request on loopback over a plain socket; returns (status line, body).
pub fn http(port: u16, method: &str, path: &str, body: &str) -> (String, String) {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
    write!(s, "{method} {path} HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}", body.len()).unwrap();
    let mut text = String::new();
    s.read_to_string(&mut text).unwrap();
    let (head, body) = text.split_once("\r\n\r\n").unwrap();
    (head.lines().next().unwrap().to_string(), body.to_string())
}

/// `quiver serve` on a free port in `dir` (stdout piped), once it accepts connections;
/// the test's own `QUIVER_` settings do not leak in.
pub fn spawn_serve(dir: &Path) -> (std::process::Child, u16) {
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_quiver"));
    for (k, _) in std::env::vars().filter(|(k, _)| k.starts_with("QUIVER_")) {
        cmd.env_remove(k);
    }
    let child = cmd.current_dir(dir).args(["serve", "--port", &port.to_string()]).stdout(std::process::Stdio::piped()).spawn().unwrap();
    let started = std::time::Instant::now();
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(started.elapsed().as_secs() < 30, "server did not start");
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    (child, port)
}

/// Runs `quiver` in `dir`; it must succeed. Its stdout.
pub fn ok(dir: &Path, args: &[&str]) -> String {
    let out = quiver(dir, args, &[]);
    assert!(
        out.status.success(),
        "quiver {args:?} failed: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

/// Runs `quiver` in `dir`; it must exit 1 with a one-line `error: ...` containing every
/// one of `parts`. The error line.
pub fn fails(dir: &Path, args: &[&str], parts: &[&str]) -> String {
    fails_with(dir, args, 1, parts)
}

/// As [`fails`], with exit code `code`.
pub fn fails_with(dir: &Path, args: &[&str], code: i32, parts: &[&str]) -> String {
    let out = quiver(dir, args, &[]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(code), "quiver {args:?}: {}{err}", String::from_utf8_lossy(&out.stdout));
    let line = err.lines().find(|l| l.starts_with("error: ")).unwrap_or_else(|| panic!("no error line: {err}"));
    assert_eq!(err.lines().filter(|l| l.starts_with("error: ")).count(), 1, "{err}");
    for p in parts {
        assert!(line.contains(p), "error {line:?} lacks {p:?}");
        // Said once: an error chain printing a cause its message already holds says
        // it twice.
        assert!(p.len() < 12 || line.matches(p).count() == 1, "error {line:?} says {p:?} more than once");
    }
    line.to_string()
}

/// Runs `quiver` in `dir`; it must exit with `code` and print nothing on stderr but
/// one `error: ...` line containing every one of `parts`. That line.
pub fn fails_alone(dir: &Path, args: &[&str], code: i32, parts: &[&str]) -> String {
    let out = quiver(dir, args, &[]);
    let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert_eq!(out.status.code(), Some(code), "quiver {args:?}: {stdout}{stderr}");
    let err = stderr.trim_end();
    assert_eq!(err.lines().count(), 1, "one line expected: {err}");
    assert!(err.starts_with("error: "), "{err}");
    for p in parts {
        assert!(err.contains(p), "error {err:?} lacks {p:?}");
        assert!(p.len() < 12 || err.matches(p).count() == 1, "error {err:?} says {p:?} more than once");
    }
    err.to_string()
}

/// One HTTP/1.1 request with extra headers; returns (status code, body).
pub fn request(port: u16, method: &str, path: &str, headers: &[(&str, &str)], body: &str) -> (u16, String) {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
    s.set_read_timeout(Some(std::time::Duration::from_secs(30))).unwrap();
    let extra: String = headers.iter().map(|(k, v)| format!("{k}: {v}\r\n")).collect();
    write!(s, "{method} {path} HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n{extra}Content-Length: {}\r\nConnection: close\r\n\r\n{body}", body.len()).unwrap();
    let mut bytes = Vec::new();
    s.read_to_end(&mut bytes).unwrap();
    let text = String::from_utf8_lossy(&bytes).into_owned();
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    let code = head.split_whitespace().nth(1).and_then(|c| c.parse().ok()).unwrap_or(0);
    (code, body.to_string())
}

/// What a test does when the service it needs is absent: fails when `require` is set
/// (as `./run test` sets it), else says SKIPPED where the test output shows it.
fn absent<T>(test: &str, what: &str, require: &str, vars: &str) -> Option<T> {
    assert!(std::env::var(require).is_err(), "{require} is set but {vars} is not");
    eprintln!("SKIPPED {test}: no {what} (set {vars}, or use ./run test)");
    None
}

/// Redis for end-to-end tests (`QUIVER_TEST_REDIS_URL`); see [`absent`] when there is none.
pub fn redis_url(test: &str) -> Option<String> {
    match std::env::var("QUIVER_TEST_REDIS_URL") {
        Ok(url) => Some(url),
        Err(_) => absent(test, "Redis", "QUIVER_REQUIRE_REDIS", "QUIVER_TEST_REDIS_URL"),
    }
}

/// The S3-compatible server of the end-to-end tests and a quiver.yaml section for it.
pub struct S3 {
    /// `QUIVER_TEST_S3_ENDPOINT`.
    pub endpoint: String,
    /// `QUIVER_TEST_S3_BUCKET`.
    pub bucket: String,
    /// The `offline_store` section putting the tables under `s3://<bucket>/<prefix>`.
    pub section: String,
}

/// The S3-compatible server (`QUIVER_TEST_S3_ENDPOINT`, `QUIVER_TEST_S3_BUCKET`) with
/// the tables under `prefix`; see [`absent`] when there is none.
pub fn s3_offline_store(test: &str, prefix: &str) -> Option<S3> {
    match (std::env::var("QUIVER_TEST_S3_ENDPOINT"), std::env::var("QUIVER_TEST_S3_BUCKET")) {
        (Ok(endpoint), Ok(bucket)) => {
            let section = format!(
                "offline_store:\n  path: s3://{bucket}/{prefix}\n  storage_options:\n    AWS_ENDPOINT_URL: {endpoint}\n    \
                 AWS_ACCESS_KEY_ID: quiver\n    AWS_SECRET_ACCESS_KEY: quiver-secret\n    AWS_REGION: us-east-1\n    AWS_ALLOW_HTTP: \"true\"\n"
            );
            Some(S3 { endpoint, bucket, section })
        }
        _ => absent(test, "S3-compatible server", "QUIVER_REQUIRE_S3", "QUIVER_TEST_S3_ENDPOINT and QUIVER_TEST_S3_BUCKET"),
    }
}

/// A name no other test run uses (process id and clock).
pub fn unique(name: &str) -> String {
    let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos();
    format!("{name}-{}-{nanos}", std::process::id())
}

/// The test Redis Cluster (`QUIVER_TEST_REDIS_CLUSTER_URLS`, comma separated) and the
/// folder of its nodes' config files (`QUIVER_TEST_REDIS_CLUSTER_DIR`); see [`absent`]
/// when there is none.
pub fn redis_cluster(test: &str) -> Option<(Vec<String>, String)> {
    match (std::env::var("QUIVER_TEST_REDIS_CLUSTER_URLS"), std::env::var("QUIVER_TEST_REDIS_CLUSTER_DIR")) {
        (Ok(urls), Ok(dir)) => Some((urls.split(',').map(str::to_string).collect(), dir)),
        _ => absent(test, "Redis Cluster", "QUIVER_REQUIRE_REDIS", "QUIVER_TEST_REDIS_CLUSTER_URLS and _DIR"),
    }
}
