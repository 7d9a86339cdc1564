//! Helpers shared by the root integration tests.

use std::path::Path;
use std::process::{Command, Output};

/// Runs the `quiver` binary in `dir` with `env`, without the test process's own
/// `QUIVER_` settings leaking into the repository under test.
#[allow(dead_code)]
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
#[allow(dead_code)] // not every test binary makes requests
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
#[allow(dead_code)]
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
