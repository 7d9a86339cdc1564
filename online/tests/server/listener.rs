//! `POST /get-online-features` through the listener (`serve_until`), which serves it
//! without the router: the same status, content type and body as the router gives,
//! for good and bad requests, with and without the token, and counted the same in
//! `/metrics`.

use std::collections::BTreeMap;
use std::net::SocketAddr;

use axum::body::Body;
use axum::http::Request;
use http_body_util::BodyExt;
use quiver_online::listen::serve_until;
use quiver_online::server::router;
use tower::ServiceExt;

use super::fixture;

/// (status, content type, body) of an answer.
type Answer = (u16, String, String);

async fn via_router(
    state: &std::sync::Arc<quiver_online::server::ServerState>,
    method: &str,
    path: &str,
    body: &str,
    token: Option<&str>,
) -> Answer {
    let mut req = Request::builder().method(method).uri(path).header("content-type", "application/json");
    if let Some(t) = token {
        req = req.header("authorization", format!("Bearer {t}"));
    }
    let resp = router(state.clone()).oneshot(req.body(Body::from(body.to_string())).unwrap()).await.unwrap();
    let status = resp.status().as_u16();
    let content_type = resp.headers().get("content-type").map_or("", |v| v.to_str().unwrap()).to_string();
    let bytes = resp.into_body().collect().await.unwrap().to_bytes();
    (status, content_type, String::from_utf8(bytes.to_vec()).unwrap())
}

/// One HTTP/1.1 request on a new connection, read until the server closes it.
async fn via_socket(addr: SocketAddr, method: &str, path: &str, body: &str, token: Option<&str>) -> Answer {
    let auth = token.map_or(String::new(), |t| format!("authorization: Bearer {t}\r\n"));
    let request = format!(
        "{method} {path} HTTP/1.1\r\nhost: test\r\ncontent-type: application/json\r\n{auth}content-length: {}\r\nconnection: close\r\n\r\n{body}",
        body.len()
    );
    // (A blocking socket on a blocking thread: the test needs no more of tokio.)
    let raw = tokio::task::spawn_blocking(move || {
        use std::io::{Read, Write};
        let mut stream = std::net::TcpStream::connect(addr).unwrap();
        stream.write_all(request.as_bytes()).unwrap();
        let mut raw = Vec::new();
        stream.read_to_end(&mut raw).unwrap();
        raw
    })
    .await
    .unwrap();
    let text = String::from_utf8(raw).unwrap();
    let (head, body) = text.split_once("\r\n\r\n").unwrap();
    let status = head.split(' ').nth(1).unwrap().parse().unwrap();
    let content_type = head
        .lines()
        .find_map(|l| l.split_once(':').filter(|(name, _)| name.eq_ignore_ascii_case("content-type")).map(|(_, v)| v.trim().to_string()))
        .unwrap_or_default();
    (status, content_type, body.to_string())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_listener_answers_features_as_the_router_does() {
    let f = fixture(None, Some("s3cret")).await;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(serve_until(f.state.clone(), listener, async {
        let _ = stopped.await;
    }));
    let many = format!(r#"{{"entities": {{"driver_id": [{}]}}, "features": ["stats:rate"]}}"#, vec!["1"; 10_001].join(","));
    let t = Some("s3cret");
    let cases: Vec<(&str, &str, &str, Option<&str>)> = vec![
        (
            "POST",
            "/get-online-features",
            r#"{"entities": {"driver_id": [1, 2, 3, 4]}, "features": ["stats:rate", "stats:trips", "stats:emb"]}"#,
            t,
        ),
        (
            "POST",
            "/get-online-features",
            r#"{"entities": {"driver_id": [1, 9], "customer_id": ["c1", "c2"]}, "feature_service": "ranker", "full_feature_names": true}"#,
            t,
        ),
        ("POST", "/get-online-features?x=1", r#"{"features": ["stats:trips"], "entities": {"driver_id": [3]}}"#, t),
        ("POST", "/get-online-features", "{not json", t),
        ("POST", "/get-online-features", r#"{"entities": {"driver_id": [1]}, "features": ["stats:nope"]}"#, t),
        ("POST", "/get-online-features", r#"{"entities": {"driver_id": [1]}, "features": ["stats:rate", "stats:rate"]}"#, t),
        ("POST", "/get-online-features", &many, t),
        ("POST", "/get-online-features", r#"{"entities": {"driver_id": [1]}, "features": ["stats:rate"]}"#, None),
        ("POST", "/get-online-features", r#"{"entities": {"driver_id": [1]}, "features": ["stats:rate"]}"#, Some("wrong")),
        ("GET", "/get-online-features", "", t),
        ("POST", "/get-online-features/", "{}", t),
    ];
    let mut counted: BTreeMap<u16, usize> = BTreeMap::new();
    for (method, path, body, token) in &cases {
        let expected = via_router(&f.state, method, path, body, *token).await;
        let got = via_socket(addr, method, path, body, *token).await;
        assert_eq!(got, expected, "{method} {path} {}", &body[..body.len().min(80)]);
        if path.starts_with("/get-online-features") && !path.ends_with('/') {
            *counted.entry(expected.0).or_default() += 2;
        }
    }
    // Every status was seen, and each answer counted once per way it came.
    assert_eq!(counted.keys().copied().collect::<Vec<_>>(), vec![200, 400, 401, 405, 413], "{counted:?}");
    let (_, _, metrics) = via_router(&f.state, "GET", "/metrics", "", t).await;
    for (status, n) in &counted {
        let line = format!("quiver_requests_total{{route=\"/get-online-features\",status=\"{status}\"}} {n}\n");
        assert!(metrics.contains(&line), "{line}{metrics}");
    }
    stop.send(()).unwrap();
    server.await.unwrap().unwrap();
}
