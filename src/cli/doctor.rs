//! `quiver doctor`: what this machine and repository offer, one line per check.

use std::path::Path;

use quiver::Repo;

use super::{Ctx, runtime};

/// Check config, registry, stores, Kafka and the GPU.
#[derive(Debug, clap::Args)]
pub struct Doctor {
    /// Also compile the CUDA kernels to PTX and report it.
    #[arg(long)]
    compile_kernels: bool,
}

impl Doctor {
    pub fn run(self, ctx: &Ctx) -> anyhow::Result<()> {
        cmd_doctor(&ctx.repo, self.compile_kernels)
    }
}

/// Exits 1 when a check that the repository needs fails (config, registry, online store, a kernel
/// that does not compile when asked for); a missing GPU or broker is reported only.
fn cmd_doctor(dir: &Path, compile_kernels: bool) -> anyhow::Result<()> {
    let mut failed = Vec::new();
    match Repo::open(dir) {
        Ok(repo) => check_repo(&repo, dir, &mut failed)?,
        Err(e) => {
            line(false, "config", e.to_string());
            failed.push("config");
        }
    }
    check_gpu(compile_kernels, &mut failed);
    if failed.is_empty() { Ok(()) } else { anyhow::bail!("doctor: {} failed", failed.join(", ")) }
}

/// A check's line: `ok  ` or `FAIL`.
fn line(ok: bool, what: &str, detail: String) {
    println!("{} {what}: {detail}", if ok { "ok  " } else { "FAIL" });
}

/// A line for what is reported only.
fn note(what: &str, detail: String) {
    println!("--   {what}: {detail}");
}

/// The repository's config, registry, online store, token and brokers.
fn check_repo(repo: &Repo, dir: &Path, failed: &mut Vec<&'static str>) -> anyhow::Result<()> {
    line(true, "config", format!("project `{}` in {}", repo.config.project, dir.display()));
    match repo.applied() {
        Ok(doc) => line(
            true,
            "registry",
            format!(
                "version {}, {} feature views, {} services",
                doc.version,
                doc.definitions.feature_views.len(),
                doc.definitions.feature_services.len()
            ),
        ),
        Err(e) => {
            line(false, "registry", e.to_string());
            failed.push("registry");
        }
    }
    let rt = runtime()?;
    match rt.block_on(async {
        let store = repo.open_store().await?;
        store.read(&["quiver:doctor:probe".to_string()]).await?;
        anyhow::Ok(store.name())
    }) {
        Ok(name) => line(true, "online store", format!("{name} answers")),
        Err(e) => {
            line(false, "online store", format!("{e:#}"));
            failed.push("online store");
        }
    }
    if repo.config.server.auth_token_in_file {
        note(
            "auth",
            format!(
                "{} holds server.auth_token; keep it out of version control or set QUIVER_SERVER_AUTH_TOKEN instead",
                dir.join(quiver::sdk::config::CONFIG_FILE).display()
            ),
        );
    }
    let brokers = &repo.config.kafka_brokers;
    let reachable: Vec<String> = brokers
        .split(',')
        .filter(|b| {
            use std::net::ToSocketAddrs;
            b.trim()
                .to_socket_addrs()
                .ok()
                .and_then(|mut a| a.next())
                .is_some_and(|a| std::net::TcpStream::connect_timeout(&a, std::time::Duration::from_secs(1)).is_ok())
        })
        .map(str::to_string)
        .collect();
    if reachable.is_empty() {
        note("kafka", format!("no broker of `{brokers}` accepts connections (needed only by `quiver stream`)"));
    } else {
        line(true, "kafka", format!("{} reachable", reachable.join(", ")));
    }
    Ok(())
}

/// The CUDA driver, devices and NVRTC; with `compile_kernels`, the kernels compiled.
fn check_gpu(compile_kernels: bool, failed: &mut Vec<&'static str>) {
    let probe = quiver::gpu_join::cuda::probe();
    if probe.devices.is_empty() {
        note("gpu", probe.driver_error.clone().unwrap_or_else(|| "no CUDA device".into()) + " (joins run on the CPU)");
    }
    for (i, (name, (major, minor), mem)) in probe.devices.iter().enumerate() {
        line(true, "gpu", format!("device {i}: {name}, compute capability {major}.{minor}, {:.1} GiB", *mem as f64 / (1u64 << 30) as f64));
    }
    match probe.nvrtc {
        Some((major, minor)) => line(true, "nvrtc", format!("version {major}.{minor}")),
        None => note("nvrtc", "libnvrtc not found (pip install nvidia-cuda-nvrtc-cu12 and put its lib folder on LD_LIBRARY_PATH)".into()),
    }
    if !compile_kernels {
        return;
    }
    let arch = probe.devices.first().map_or("compute_80".to_string(), |(_, (major, minor), _)| format!("compute_{major}{minor}"));
    let began = std::time::Instant::now();
    match quiver::gpu_join::cuda::compile_ptx(Some(&arch)) {
        Ok(ptx) => {
            for name in quiver::gpu_join::cuda::KERNEL_NAMES {
                let found = ptx.contains(&format!(".entry {name}("));
                line(found, "kernel", format!("{name} {}", if found { "compiled" } else { "missing from the PTX" }));
                if !found {
                    failed.push("kernels");
                }
            }
            line(true, "ptx", format!("{} bytes for {arch} in {:.0} ms", ptx.len(), began.elapsed().as_secs_f64() * 1000.0));
        }
        Err(e) => {
            line(false, "kernels", e.to_string());
            failed.push("kernels");
        }
    }
}
