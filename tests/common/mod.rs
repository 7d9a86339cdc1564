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
