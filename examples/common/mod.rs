//! What both examples share: a plain HTTP client and the timed report lines.

use std::io::{Read, Write};
use std::time::Instant;

/// POSTs `body` to `path` on a new connection and returns the JSON answer (200 only).
pub fn post(addr: std::net::SocketAddr, path: &str, body: &str) -> anyhow::Result<serde_json::Value> {
    let mut conn = std::net::TcpStream::connect(addr)?;
    write!(
        conn,
        "POST {path} HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )?;
    let mut text = String::new();
    conn.read_to_string(&mut text)?;
    let (head, body) = text.split_once("\r\n\r\n").ok_or_else(|| anyhow::anyhow!("no HTTP answer"))?;
    anyhow::ensure!(head.starts_with("HTTP/1.1 200"), "{path}: {head} {body}");
    Ok(serde_json::from_str(body)?)
}

/// One report line: the step, its seconds, what it did.
pub fn step(name: &str, t: Instant, what: String) {
    println!("  {name:<16} {:>6.2} s  {what}", t.elapsed().as_secs_f64());
}

/// Turns the serving log on in the repository's quiver.yaml.
pub fn enable_serving_log(dir: &std::path::Path) -> anyhow::Result<()> {
    let mut config = std::fs::read_to_string(dir.join("quiver.yaml"))?;
    config.push_str("serving_log:\n  enabled: true\n  batch_ms: 200\n");
    std::fs::write(dir.join("quiver.yaml"), config)?;
    Ok(())
}
