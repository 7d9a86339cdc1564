//! `quiver serve`: the HTTP feature server.

use anyhow::Context;
use quiver::sdk::Config;

use super::{Ctx, runtime};

/// Run the HTTP feature server.
#[derive(Debug, clap::Args)]
pub struct Serve {
    #[arg(long)]
    host: Option<String>,
    #[arg(long)]
    port: Option<u16>,
}

/// Warnings for a listener reachable from other machines without a token, and for a
/// token written into `quiver.yaml` (a file that is easily committed).
pub fn warn_exposure(config: &Config, addr: &std::net::SocketAddr, what: &str) {
    if !addr.ip().is_loopback() && config.server.auth_token.is_none() {
        eprintln!(
            "warning: {what} listens on {addr}, reachable from other machines, with no server.auth_token: anyone who can connect can read{}",
            if what == "serve" { " and push features" } else { " the metrics" }
        );
    }
    if config.server.auth_token_in_file {
        eprintln!(
            "warning: {} holds server.auth_token; keep it out of version control (add it to .gitignore) or set QUIVER_SERVER_AUTH_TOKEN instead",
            config.repo.join(quiver::sdk::config::CONFIG_FILE).display()
        );
    }
}

/// `host:port` as a socket address (a name is resolved).
pub fn socket_addr(host: &str, port: u16) -> anyhow::Result<std::net::SocketAddr> {
    use std::net::ToSocketAddrs;
    format!("{host}:{port}")
        .parse()
        .or_else(|_| {
            format!("{host}:{port}").to_socket_addrs().map_err(anyhow::Error::from)?.next().ok_or_else(|| anyhow::anyhow!("no address"))
        })
        .map_err(|e| anyhow::anyhow!("server address `{host}:{port}`: {e}"))
}

impl Serve {
    pub fn run(self, ctx: &Ctx) -> anyhow::Result<()> {
        let repo = ctx.open()?;
        // Precedence: flag > environment > file > default (the config holds the last three).
        let host = self.host.unwrap_or_else(|| repo.config.server.host.clone());
        let port = self.port.unwrap_or(repo.config.server.port);
        let addr = socket_addr(&host, port)?;
        let rt = runtime()?;
        rt.block_on(async {
            let store = repo.open_store().await?;
            let log = repo.config.serving_log.enabled.then(|| quiver::serving_log::DeltaServingLog::start(&repo.config.serving_log));
            let state = std::sync::Arc::new(quiver::server::server_state(&repo.config, store, log.clone())?);
            warn_exposure(&repo.config, &addr, "serve");
            println!("serving project `{}` on http://{addr} (Ctrl-C to stop)", repo.config.project);
            if log.is_some() {
                println!("logging answers to {} (serving_log in quiver.yaml)", repo.config.serving_log.location);
            }
            quiver::online::server::serve(state, addr).await.with_context(|| format!("serving on {addr}"))?;
            if let Some(log) = &log {
                // The last batch; a store that is briefly down gets a few more tries.
                let mut tries = 0;
                while let Err(e) = log.flush().await {
                    tries += 1;
                    if tries == 5 {
                        anyhow::bail!("serving log: the last batch was not written: {e}");
                    }
                    eprintln!("serving log: {e}; retrying");
                    tokio::time::sleep(std::time::Duration::from_secs(1)).await;
                }
            }
            println!("stopped");
            anyhow::Ok(())
        })
    }
}
