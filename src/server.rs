//! The feature server wired to a repository: its online store, the registry, `/push`
//! offline through the streaming crate's Delta writer, the web UI's reports of the
//! offline side, and the serving log when one is given. `quiver serve` and the
//! examples build their server state here.

use std::sync::Arc;

use quiver_online::OnlineStore;
use quiver_online::server::{Limits, Metrics, RegistryCache, ServerState, system_clock};
use quiver_sdk::Config;

use crate::error::Result;
use crate::serving_log::DeltaServingLog;

/// The state `quiver_online::server::router` serves, for `config`'s repository.
///
/// # Errors
/// When the registry cannot be read.
pub fn server_state(config: &Config, store: Arc<dyn OnlineStore>, log: Option<Arc<DeltaServingLog>>) -> Result<ServerState> {
    Ok(ServerState {
        store,
        registry: RegistryCache::new(config.registry_path.clone(), &config.project)?,
        project: config.project.clone(),
        auth_token: config.server.auth_token.clone(),
        metrics: Metrics::default(),
        clock: system_clock(),
        offline: Some(Arc::new(quiver_streaming::write::DeltaWriter::new(config.clone()))),
        serving_log: log.map(|l| l as Arc<dyn quiver_online::serving_log::ServingLog>),
        limits: Limits::of(&config.server, config.max_future_skew),
        insights: Some(Arc::new(crate::insights::RepoInsights::new(config.clone()))),
        pending: Default::default(),
    })
}
