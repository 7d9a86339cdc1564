//! `quiver serve`: the HTTP feature server.

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
            let server = repo.serve(addr).start().await?;
            warn_exposure(&repo.config, &addr, "serve");
            println!("serving project `{}` on http://{} (Ctrl-C to stop)", repo.config.project, server.addr());
            if server.logs_answers() {
                println!("logging answers to {} (serving_log in quiver.yaml)", repo.config.serving_log.location);
            }
            quiver::online::listen::shutdown_signal().await;
            server.stop().await?;
            println!("stopped");
            anyhow::Ok(())
        })
    }
}
