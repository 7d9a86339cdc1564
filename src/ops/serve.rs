//! `serve`: the repository's feature server — its online store, the registry, `/push`
//! offline through the streaming write path, the web UI's reports, and the serving log
//! when `quiver.yaml` turns it on — bound to an address (docs/online.md).
//!
//! `.await` serves until SIGINT or SIGTERM, then stops gracefully (what `quiver serve`
//! does); [`Serve::start`] returns a running [`Server`] to stop when the caller is done
//! (the examples and tests).

use std::net::SocketAddr;
use std::sync::Arc;

use quiver_online::OnlineStore;
use quiver_online::server::ServerState;
use quiver_sdk::FeatureView;

use crate::error::{Error, Result};
use crate::repo::Repo;
use crate::serving_log::{DeltaServingLog, Observer};

/// Builder of [`Repo::serve`].
#[must_use = "an operation does nothing until awaited"]
pub struct Serve<'a> {
    repo: &'a Repo,
    addr: SocketAddr,
    store: Option<Arc<dyn OnlineStore>>,
    serving_log: Option<bool>,
}

impl std::fmt::Debug for Serve<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Serve").field("addr", &self.addr).field("serving_log", &self.serving_log).finish_non_exhaustive()
    }
}

setters!(Serve { store });

impl Serve<'_> {
    /// Logs every answer (or not), whatever `serving_log.enabled` in `quiver.yaml` says.
    pub fn with_serving_log(mut self, on: bool) -> Self {
        self.serving_log = Some(on);
        self
    }

    /// What the server serves from, without listening: to mount Quiver's routes
    /// (`quiver::online::server::router(Arc::new(state))`) in a service of your own, or
    /// to answer requests in-process. Its answers are not logged: a serving log's last
    /// batch is written by [`Server::stop`].
    ///
    /// # Errors
    /// When the store cannot be opened or the registry read.
    pub async fn state(self) -> Result<ServerState> {
        let store = self.repo.store_or_open(self.store).await?;
        crate::server::server_state(&self.repo.config, store, None)
    }

    /// Binds the address and serves from a task of the current runtime.
    ///
    /// # Errors
    /// When the store cannot be opened, the registry read or the address bound.
    pub async fn start(self) -> Result<Server> {
        let store = self.repo.store_or_open(self.store).await?;
        let logging = self.serving_log.unwrap_or(self.repo.config.serving_log.enabled);
        let live = crate::monitor::live::Live::start(self.repo).await?.map(Arc::new);
        if live.is_some() && !logging {
            return Err(Error::Invalid(
                "quiver.yaml: monitoring.reference needs the serving log, which keeps the serving window's profiles (serving_log: {enabled: true})"
                    .into(),
            ));
        }
        let log = logging.then(|| DeltaServingLog::start(&self.repo.config.serving_log, live.map(|l| l as Arc<dyn Observer>)));
        // Rows of pushes a server killed before writing them online owed the store.
        if let Ok(applied) = self.repo.applied() {
            let (config, store) = (self.repo.config.clone(), store.clone());
            tokio::spawn(async move {
                let window = crate::materialize::OWED_WINDOW_US;
                match crate::materialize::write_owed(&config, &applied.definitions, store.as_ref(), window).await {
                    Ok(rows) => tracing::info!(rows, "rows owed to the online store by pushes written"),
                    Err(e) => eprintln!("warning: writing the rows pushes owed to the online store: {e}"),
                }
            });
        }
        let mut state = crate::server::server_state(&self.repo.config, store, log.clone())?;
        let listener =
            tokio::net::TcpListener::bind(self.addr).await.map_err(|e| Error::Serving(format!("serving on {}: {e}", self.addr)))?;
        let addr = listener.local_addr().map_err(|e| Error::Serving(format!("serving on {}: {e}", self.addr)))?;
        let lineage = PushLineage::wrap(self.repo, &mut state, addr);
        let state = Arc::new(state);
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let task = tokio::spawn(quiver_online::listen::serve_until(state.clone(), listener, async move {
            let _ = stopped.await;
        }));
        Ok(Server { addr, log, state, stop, task, lineage })
    }

    async fn run(self) -> Result<()> {
        let server = self.start().await?;
        quiver_online::listen::shutdown_signal().await;
        server.stop().await
    }
}

impl<'a> std::future::IntoFuture for Serve<'a> {
    type Output = Result<()>;
    type IntoFuture = super::OpFuture<'a, ()>;
    fn into_future(self) -> Self::IntoFuture {
        Box::pin(self.run())
    }
}

/// A running feature server ([`Serve::start`]).
pub struct Server {
    addr: SocketAddr,
    log: Option<Arc<DeltaServingLog>>,
    state: Arc<ServerState>,
    stop: tokio::sync::oneshot::Sender<()>,
    task: tokio::task::JoinHandle<std::io::Result<()>>,
    lineage: Option<crate::lineage::Ongoing>,
}

impl std::fmt::Debug for Server {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Server").field("addr", &self.addr).field("serving_log", &self.log.is_some()).finish_non_exhaustive()
    }
}

impl Server {
    /// The bound address (the port the system chose, for port 0).
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// What the server serves from (its store, registry cache, metrics).
    pub fn state(&self) -> &Arc<ServerState> {
        &self.state
    }

    /// Whether answers are logged.
    pub fn logs_answers(&self) -> bool {
        self.log.is_some()
    }

    /// Writes the answers logged so far (nothing without a serving log).
    ///
    /// # Errors
    /// When the log's table cannot be written; the rows stay queued.
    pub async fn flush_log(&self) -> Result<()> {
        match &self.log {
            Some(log) => log.flush().await.map_err(|e| Error::Serving(format!("serving log: {e}"))),
            None => Ok(()),
        }
    }

    /// Stops taking connections, finishes the requests in flight, then writes the
    /// serving log's last batch (a store that is briefly down gets five tries).
    ///
    /// # Errors
    /// When serving failed for good, or the log's last batch could not be written.
    pub async fn stop(mut self) -> Result<()> {
        let lineage = self.lineage.take();
        let result = self.finish().await;
        if let Some(run) = lineage {
            let ended = result.as_ref().map(|_| ()).map_err(ToString::to_string);
            tokio::task::spawn_blocking(move || run.end(&ended)).await.ok();
        }
        result
    }

    async fn finish(self) -> Result<()> {
        let _ = self.stop.send(());
        match self.task.await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => return Err(Error::Serving(format!("serving on {}: {e}", self.addr))),
            Err(e) => return Err(Error::Serving(format!("serving on {}: {e}", self.addr))),
        }
        if let Some(log) = &self.log {
            let mut tries = 0;
            while let Err(e) = log.flush().await {
                tries += 1;
                if tries == 5 {
                    return Err(Error::Serving(format!("serving log: the last batch was not written: {e}")));
                }
                tracing::warn!(error = %e, "serving log: the last batch failed; retrying");
                tokio::time::sleep(std::time::Duration::from_secs(1)).await;
            }
        }
        Ok(())
    }
}

impl Repo {
    /// The feature server of this repository on `addr` (`host:port`; port 0 picks one).
    pub fn serve(&self, addr: SocketAddr) -> Serve<'_> {
        Serve { repo: self, addr, store: None, serving_log: None }
    }
}

/// The server's pushes as a long-running lineage run `serve.push`
/// (docs/lineage.md#long-running-jobs): requests to `/push` into the tables and key
/// spaces they wrote, one RUNNING event per `lineage.interval` with pushes, never one
/// per request.
struct PushLineage {
    inner: Arc<dyn quiver_online::server::OfflineWriter>,
    config: quiver_sdk::Config,
    input: crate::lineage::Dataset,
    /// What pushes wrote since the last event, by dataset.
    wrote: Arc<std::sync::Mutex<std::collections::BTreeMap<(String, String), crate::lineage::Dataset>>>,
}

impl PushLineage {
    fn wrap(repo: &Repo, state: &mut ServerState, addr: SocketAddr) -> Option<crate::lineage::Ongoing> {
        let lineage = crate::lineage::Lineage::of(repo);
        let inner = state.offline.clone().filter(|_| lineage.enabled())?;
        let input = crate::lineage::Dataset { namespace: format!("http://{addr}"), name: "/push".into(), facets: Default::default() };
        let wrote = Arc::new(std::sync::Mutex::new(std::collections::BTreeMap::new()));
        let pending = wrote.clone();
        let poll: crate::lineage::Poll = Box::new(move || {
            let taken = std::mem::take(&mut *pending.lock().unwrap_or_else(std::sync::PoisonError::into_inner));
            (!taken.is_empty()).then(|| taken.into_values().collect())
        });
        let run = lineage.ongoing("serve.push", vec![input.clone()], &[], poll)?;
        state.offline = Some(Arc::new(PushLineage { inner, config: repo.config.clone(), input, wrote }));
        Some(run)
    }
}

#[async_trait::async_trait]
impl quiver_online::server::OfflineWriter for PushLineage {
    async fn append(
        &self,
        defs: &quiver_sdk::Definitions,
        view: &FeatureView,
        rows: &[quiver_runtime::rows::ViewRow],
        owes_online: bool,
    ) -> std::result::Result<u64, String> {
        self.inner.append(defs, view, rows, owes_online).await
    }

    async fn refresh_event_log(
        &self,
        defs: &quiver_sdk::Definitions,
        view: &FeatureView,
        entities: &[Vec<quiver_runtime::encoding::KeyValue>],
        store: &dyn OnlineStore,
    ) -> std::result::Result<usize, String> {
        self.inner.refresh_event_log(defs, view, entities, store).await
    }

    fn pushed(&self, defs: &quiver_sdk::Definitions, view: &FeatureView, online: bool, offline_version: Option<u64>) {
        let mut wrote = self.wrote.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let mut note = |d: crate::lineage::Dataset| {
            wrote.insert((d.namespace.clone(), d.name.clone()), d);
        };
        if let Some(version) = offline_version {
            note(crate::lineage::view_table(&self.config, defs, view, Some(&self.input)).version(Some(version)));
        }
        if online {
            note(crate::lineage::online_keys(&self.config, view));
        }
        self.inner.pushed(defs, view, online, offline_version);
    }
}
