//! The listener behind `quiver serve`: accepts connections, bounds them, and stops
//! gracefully (docs/limits.md).
//!
//! - A connection must send complete request headers within `request_timeout` of
//!   opening or of its last answer (hyper's header read timeout, which also covers an
//!   idle keep-alive connection); the body then has `request_timeout` more (the
//!   router's body guard answers 408). Either way the connection is closed.
//! - At most `max_connections` connections are served at once. A connection beyond
//!   them gets one short answer — `/health` still answers 200, everything else 503 —
//!   within a one-second header timeout, and is closed; beyond twice the cap a
//!   connection is closed at once. Load balancers keep seeing a healthy server while
//!   someone holds many slow connections open.
//! - SIGINT/SIGTERM stop accepting, let open requests finish for up to
//!   `request_timeout`, then close what is left: half-sent requests never hold a
//!   shutdown.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use axum::body::Body;
use axum::http::{Request, Response, StatusCode, header};
use hyper::server::conn::http1;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::graceful::GracefulShutdown;

use crate::server::{Limit, ServerState, router};

/// How long a connection beyond the cap has to send its request.
const OVERFLOW_TIMEOUT: Duration = Duration::from_secs(1);

/// Serves [`router`] on `listener` until `shutdown` completes, then finishes open
/// requests for up to the configured `request_timeout` and closes the rest.
///
/// # Errors
/// Only when accepting fails for good (an error of the listening socket itself).
pub async fn serve_until(
    state: Arc<ServerState>,
    listener: tokio::net::TcpListener,
    shutdown: impl std::future::Future<Output = ()>,
) -> std::io::Result<()> {
    let app = router(state.clone());
    let limits = state.limits.clone();
    let graceful = GracefulShutdown::new();
    let open = Arc::new(AtomicUsize::new(0));
    let mut builder = http1::Builder::new();
    builder.timer(TokioTimer::new()).header_read_timeout(limits.request_timeout);
    tokio::pin!(shutdown);
    loop {
        let (stream, _peer) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(a) => a,
                Err(e) if is_transient(&e) => {
                    // Out of file descriptors and the like: wait, never spin.
                    tracing::warn!(error = %e, "accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
                Err(e) => return Err(e),
            },
            () = &mut shutdown => break,
        };
        let _ = stream.set_nodelay(true);
        let io = TokioIo::new(stream);
        let n = open.fetch_add(1, Ordering::AcqRel) + 1;
        let guard = OpenGuard(open.clone());
        state.metrics.connections_open(open.load(Ordering::Relaxed));
        if n > limits.max_connections {
            state.metrics.refused(Limit::MaxConnections);
            if n > limits.max_connections.saturating_mul(2) {
                drop(io);
                drop(guard);
                continue;
            }
            let mut overflow = http1::Builder::new();
            overflow.timer(TokioTimer::new()).header_read_timeout(OVERFLOW_TIMEOUT).keep_alive(false);
            let max = limits.max_connections;
            let service = hyper::service::service_fn(move |req: Request<hyper::body::Incoming>| async move {
                Ok::<_, Infallible>(overflow_answer(req.uri().path(), max))
            });
            tokio::spawn(async move {
                let _guard = guard;
                let _ = tokio::time::timeout(OVERFLOW_TIMEOUT * 2, overflow.serve_connection(io, service)).await;
            });
            continue;
        }
        let connection = builder.serve_connection(io, Routes { app: app.clone(), state: state.clone() });
        let watched = graceful.watch(connection);
        let state = state.clone();
        tokio::spawn(async move {
            let _guard = guard;
            if let Err(e) = watched.await {
                if e.is_timeout() {
                    state.metrics.refused(Limit::RequestTimeout);
                }
                tracing::debug!(error = %e, "connection ended with an error");
            }
        });
    }
    drop(listener);
    // Open requests get `request_timeout` to finish; idle and half-sent connections are
    // closed by the shutdown itself or by that deadline.
    if tokio::time::timeout(limits.request_timeout, graceful.shutdown()).await.is_err() {
        tracing::warn!("shutdown: closing connections still open after {:?}", limits.request_timeout);
    }
    Ok(())
}

/// The server's routes as hyper calls them: `POST /get-online-features` straight to its
/// guarded handler ([`crate::server::features_route`]), everything else through
/// the router. Both answer the same (`online/tests/server/listener.rs`).
struct Routes {
    app: axum::Router,
    state: Arc<ServerState>,
}

impl hyper::service::Service<Request<hyper::body::Incoming>> for Routes {
    type Response = Response<Body>;
    type Error = Infallible;
    type Future = std::pin::Pin<Box<dyn std::future::Future<Output = Result<Response<Body>, Infallible>> + Send>>;

    fn call(&self, request: Request<hyper::body::Incoming>) -> Self::Future {
        use tower::ServiceExt;
        let request = request.map(Body::new);
        if request.method() == axum::http::Method::POST && request.uri().path() == "/get-online-features" {
            let state = self.state.clone();
            return Box::pin(async move { Ok(crate::server::features_route(state, request).await) });
        }
        let app = self.app.clone();
        Box::pin(async move { app.oneshot(request).await })
    }
}

/// Counts an open connection down when its task ends.
struct OpenGuard(Arc<AtomicUsize>);

impl Drop for OpenGuard {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

fn overflow_answer(path: &str, max: usize) -> Response<Body> {
    let (status, body) = if path == "/health" {
        (StatusCode::OK, r#"{"status":"ok"}"#.to_string())
    } else {
        (
            StatusCode::SERVICE_UNAVAILABLE,
            format!(r#"{{"error":"too many connections: the server serves {max} at once (server.max_connections); retry"}}"#),
        )
    };
    Response::builder()
        .status(status)
        .header(header::CONTENT_TYPE, "application/json")
        .header(header::CONNECTION, "close")
        .body(Body::from(body))
        .expect("a valid response")
}

fn is_transient(e: &std::io::Error) -> bool {
    use std::io::ErrorKind::*;
    matches!(e.kind(), ConnectionAborted | ConnectionReset | Interrupted | WouldBlock) || matches!(e.raw_os_error(), Some(23 | 24)) // ENFILE, EMFILE
}

/// Completes on SIGINT or SIGTERM.
///
/// # Panics
/// When the SIGTERM handler cannot be installed (no signal support at all).
pub async fn shutdown_signal() {
    let ctrl_c = tokio::signal::ctrl_c();
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()).expect("SIGTERM handler");
    tokio::select! {
        _ = ctrl_c => {},
        _ = term.recv() => {},
    }
}

/// Binds `addr` and serves until SIGINT or SIGTERM (see [`serve_until`]).
///
/// # Errors
/// When the address cannot be bound.
pub async fn serve(state: Arc<ServerState>, addr: SocketAddr) -> std::io::Result<()> {
    let listener = tokio::net::TcpListener::bind(addr).await?;
    serve_until(state, listener, shutdown_signal()).await
}
