//! The read+write floor under one `/get-online-features` answer (a benchmark limit run by
//! `bench/serve_bench.py`; not a test, not part of the product).
//!
//!     serve_floor REDIS_URL PORT KEYS_FILE BODY_FILE
//!
//! Serves `POST /get-online-features` as `quiver serve` would if parsing the request,
//! building the keys, decoding the rows and writing the JSON cost nothing: each request
//! reads the keys of `KEYS_FILE` (one per line) through the same store (`RedisStore`, one
//! MGET on its multiplexed connection) and answers with the bytes of `BODY_FILE` (the
//! answer `quiver serve` gave to that request), on the same runtime (one worker per
//! core), HTTP stack and allocator. What is left is the HTTP server, the store round
//! trip and the answer's bytes through the kernel: the most any server built this way
//! can answer at that size on this machine.
//!
//! With `QUIVER_FLOOR_PER_CORE=1` it serves thread-per-core instead: one current-thread
//! runtime per core, each with its own `SO_REUSEPORT` listener and store connection (the
//! layout issue #19 asked about; measured against the default in bench/RESULTS.md).
//!
//! With `QUIVER_FLOOR_SPIN_NS=N` each request also spins N ns of CPU (half before the
//! store call, half after): the floor made to cost what a server's own work costs, to
//! see how the tail moves with CPU per request alone (`bench/serve_layouts.py --spins`).

use std::sync::Arc;

use axum::Router;
use axum::extract::State;
use axum::http::header;
use axum::response::IntoResponse;
use axum::routing::post;
use axum::serve::ListenerExt;
use quiver_online::{OnlineStore, RedisStore};

#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

struct Floor {
    store: RedisStore,
    keys: Vec<String>,
    body: axum::body::Bytes,
    /// Busy CPU per request, split around the store call.
    spin: std::time::Duration,
}

/// Spins the CPU for `d` (not even a clock read for zero: the floor stays the floor).
fn spin(d: std::time::Duration) {
    if d.is_zero() {
        return;
    }
    let began = std::time::Instant::now();
    while began.elapsed() < d {
        std::hint::spin_loop();
    }
}

/// The floor's one route.
fn app(floor: Floor) -> Router {
    Router::new().route("/get-online-features", post(answer)).with_state(Arc::new(floor))
}

async fn answer(State(floor): State<Arc<Floor>>, _request: axum::body::Bytes) -> impl IntoResponse {
    spin(floor.spin / 2);
    let rows = floor.store.read(&floor.keys).await.expect("the store answers");
    spin(floor.spin / 2);
    // The rows must have come back: a floor that reads nothing measures nothing.
    assert!(rows.iter().all(Option::is_some), "every key of the keys file is stored");
    ([(header::CONTENT_TYPE, "application/json")], floor.body.clone())
}

fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [url, port, keys, body] = args.as_slice() else {
        anyhow::bail!("usage: serve_floor REDIS_URL PORT KEYS_FILE BODY_FILE");
    };
    let keys: Vec<String> = std::fs::read_to_string(keys)?.lines().map(str::to_string).collect();
    let body = axum::body::Bytes::from(std::fs::read(body)?);
    let port: u16 = port.parse()?;
    let spin = std::time::Duration::from_nanos(std::env::var("QUIVER_FLOOR_SPIN_NS").map_or(Ok(0), |v| v.parse())?);
    if std::env::var("QUIVER_FLOOR_PER_CORE").is_ok_and(|v| v == "1") {
        let cores = std::thread::available_parallelism().map_or(1, usize::from);
        let threads: Vec<_> = (0..cores)
            .map(|_| {
                let (url, keys, body) = (url.clone(), keys.clone(), body.clone());
                std::thread::spawn(move || {
                    tokio::runtime::Builder::new_current_thread().enable_all().build()?.block_on(async move {
                        let store = RedisStore::connect(&url).await?;
                        let app = app(Floor { store, keys, body, spin });
                        let socket = tokio::net::TcpSocket::new_v4()?;
                        socket.set_reuseport(true)?;
                        socket.bind(([127, 0, 0, 1], port).into())?;
                        let listener = socket.listen(1024)?.tap_io(|tcp| {
                            let _ = tcp.set_nodelay(true);
                        });
                        axum::serve(listener, app).await?;
                        anyhow::Ok(())
                    })
                })
            })
            .collect();
        for t in threads {
            t.join().expect("a serving thread")?;
        }
        return Ok(());
    }
    tokio::runtime::Builder::new_multi_thread().enable_all().build()?.block_on(async move {
        let store = RedisStore::connect(url).await?;
        let app = app(Floor { store, keys, body, spin });
        // As `quiver serve`: no Nagle delay on small answers.
        let listener = tokio::net::TcpListener::bind(("127.0.0.1", port)).await?.tap_io(|tcp| {
            let _ = tcp.set_nodelay(true);
        });
        axum::serve(listener, app).await?;
        Ok(())
    })
}
