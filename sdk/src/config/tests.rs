//! The config's parsing, overlays and refusals.

use super::*;

fn parse(text: &str, env: &[(&str, &str)]) -> Result<Config> {
    let env = env.iter().map(|(k, v)| (k.to_string(), v.to_string()));
    Config::parse(Path::new("/repo"), Path::new("/repo/quiver.yaml"), text, env)
}

#[test]
fn defaults_fill_a_minimal_file() {
    let c = parse("project: demo\n", &[]).unwrap();
    assert_eq!(c.registry_path, PathBuf::from("/repo/registry.json"));
    assert_eq!(c.offline_root, StoreLocation::Local("/repo/data".into()));
    assert_eq!(c.online_store, OnlineStoreConfig::Embedded { path: "/repo/online.db".into() });
    assert_eq!((c.server.host.as_str(), c.server.port), ("127.0.0.1", 6566));
    assert_eq!(c.kafka_brokers, "127.0.0.1:9092");
}

#[test]
fn environment_beats_file_and_file_beats_default() {
    let text = "project: demo\nonline_store: {type: embedded, path: x.db}\nserver: {port: 7000}\n";
    let c = parse(
        text,
        &[
            ("QUIVER_ONLINE_STORE_TYPE", "redis"),
            ("QUIVER_ONLINE_STORE_URL", "redis://127.0.0.1:7777/1"),
            ("QUIVER_SERVER_HOST", "0.0.0.0"),
            ("QUIVER_REPO", "/elsewhere"),
            ("QUIVER_OFFLINE_STORE_PATH", "s3://bucket/tables"),
        ],
    )
    .unwrap();
    assert_eq!(c.online_store, OnlineStoreConfig::Redis { url: "redis://127.0.0.1:7777/1".into() });
    assert_eq!(c.server.host, "0.0.0.0");
    assert_eq!(c.server.port, 7000, "file value kept where env is silent");
    assert_eq!(c.offline_root, StoreLocation::Uri("s3://bucket/tables".into(), StorageOptions::default()));
    let c = parse(text, &[("QUIVER_SERVER_PORT", "7100"), ("QUIVER_PROJECT", "2024"), ("QUIVER_SERVER_AUTH_TOKEN", "123456")]).unwrap();
    assert_eq!(c.server.port, 7100);
    assert_eq!(c.project, "2024");
    assert_eq!(c.server.auth_token.as_deref(), Some("123456"));
}

#[test]
fn bad_settings_name_the_setting() {
    let err = |text: &str, env: &[(&str, &str)]| parse(text, env).unwrap_err().to_string();
    assert!(err("registry: r.json\n", &[]).contains("missing `project`"));
    assert!(err("project: demo\nonline_store: {type: memcached}\n", &[]).contains("online_store.type `memcached`"));
    assert!(err("project: demo\nserver: {port: 99999}\n", &[]).contains("server.port `99999`"));
    assert!(err("project: demo\nonline_store: {type: redis, url: http://x}\n", &[]).contains("expected a redis:// or rediss:// URL"));
    let e = err("project: demo\n", &[("QUIVER_SERVER_PROT", "1")]);
    assert!(e.contains("QUIVER_SERVER_PROT") && e.contains("unknown setting `server.prot`"), "{e}");
    assert!(err("project: demo\nservr: {}\n", &[]).contains("unknown field `servr`"));
    assert!(err("project: my demo\n", &[]).contains("project `my demo`"));
    assert!(err("project: demo\nserving_log: {enabled: maybe}\n", &[]).contains("serving_log.enabled `maybe`"));
    assert!(err("project: demo\nserving_log: {sample_rate: 0}\n", &[]).contains("serving_log.sample_rate `0`"));
    assert!(err("project: demo\n", &[("QUIVER_SERVING_LOG_BATCH_ROWS", "-3")]).contains("serving_log.batch_rows `-3`"));
    assert!(err("project: demo\nmax_future_skew: soon\n", &[]).contains("max_future_skew `soon`"));
    assert!(err("project: demo\nserver: {max_cells: 0}\n", &[]).contains("server.max_cells `0`"));
    assert!(err("project: demo\nserver: {request_timeout: 0}\n", &[]).contains("server.request_timeout `0`"));
    assert!(err("project: demo\n", &[("QUIVER_SERVER_MAX_CONNECTIONS", "many")]).contains("server.max_connections `many`"));
}

#[test]
fn limits_have_defaults_and_can_be_set() {
    let c = parse("project: demo\n", &[]).unwrap();
    assert_eq!(c.max_future_skew, std::time::Duration::from_secs(300));
    assert_eq!((c.server.max_cells, c.server.max_connections), (1_000_000, 1_024));
    assert_eq!(c.server.request_timeout, std::time::Duration::from_secs(10));
    assert_eq!(c.event_horizon(1_000_000), 301_000_000);
    let c = parse(
        "project: demo\nmax_future_skew: 0\nserver: {max_cells: 5_000, request_timeout: 2s, max_connections: 8}\n",
        &[("QUIVER_MAX_FUTURE_SKEW", "1h")],
    )
    .unwrap();
    assert_eq!(c.max_future_skew, std::time::Duration::from_secs(3600), "the environment wins");
    assert_eq!((c.server.max_cells, c.server.max_connections), (5_000, 8));
    assert_eq!(c.server.request_timeout, std::time::Duration::from_secs(2));
}

#[test]
fn a_token_in_the_file_is_flagged_one_from_the_environment_is_not() {
    let c = parse("project: demo\nserver: {auth_token: s3cret}\n", &[]).unwrap();
    assert!(c.server.auth_token_in_file);
    let c = parse("project: demo\nserver: {auth_token: s3cret}\n", &[("QUIVER_SERVER_AUTH_TOKEN", "other")]).unwrap();
    assert!(!c.server.auth_token_in_file);
    assert_eq!(c.server.auth_token.as_deref(), Some("other"));
    let c = parse("project: demo\n", &[("QUIVER_SERVER_AUTH_TOKEN", "other")]).unwrap();
    assert!(!c.server.auth_token_in_file);
}

#[test]
fn a_redis_cluster_takes_its_seed_nodes() {
    let c = parse(
        "project: demo\nonline_store: {type: redis_cluster, urls: [redis://10.0.0.1:6379, redis://10.0.0.2:6379], replica_acks: 1}\n",
        &[],
    )
    .unwrap();
    let urls = vec!["redis://10.0.0.1:6379".to_string(), "redis://10.0.0.2:6379".to_string()];
    assert_eq!(c.online_store, OnlineStoreConfig::RedisCluster { urls, replica_acks: 1 });
    let err = |text: &str| parse(text, &[]).unwrap_err().to_string();
    assert!(err("project: demo\nonline_store: {type: redis_cluster}\n").contains("online_store.urls: missing"));
    assert!(err("project: demo\nonline_store: {type: redis_cluster, urls: [http://x]}\n").contains("`http://x`: expected a redis://"));
    assert!(
        err("project: demo\nonline_store: {type: redis_cluster, urls: [redis://x], replica_acks: lots}\n").contains("replica_acks `lots`")
    );
    assert!(err("project: demo\nonline_store: {type: redis_cluster, url: redis://x}\n").contains("takes `urls`"));
    assert!(err("project: demo\nonline_store: {type: redis, urls: [redis://x]}\n").contains("a setting of type redis_cluster"));
}

#[test]
fn storage_options_reach_every_object_store_location_and_hide_their_values() {
    let text = "project: demo\noffline_store:\n  path: s3://lake/features\n  storage_options:\n    AWS_REGION: us-east-1\n    AWS_ALLOW_HTTP: true\n    AWS_SECRET_ACCESS_KEY: hush\nserving_log: {enabled: true}\n";
    let c = parse(text, &[]).unwrap();
    let StoreLocation::Uri(root, options) = &c.offline_root else { panic!("{:?}", c.offline_root) };
    assert_eq!(root, "s3://lake/features");
    let got: Vec<(&str, &str)> = options.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    assert_eq!(got, [("AWS_ALLOW_HTTP", "true"), ("AWS_REGION", "us-east-1"), ("AWS_SECRET_ACCESS_KEY", "hush")]);
    assert_eq!(c.serving_log.location, StoreLocation::Uri("s3://lake/features/_serving_log".into(), options.clone()));
    let mut view = crate::FeatureView::new("v");
    view.source.path = Some("s3://other/v".into());
    assert_eq!(c.view_table(&view), StoreLocation::Uri("s3://other/v".into(), options.clone()));
    assert!(!format!("{c:?}").contains("hush"), "a secret in Debug output");
    let err = parse("project: demo\noffline_store: {storage_options: {AWS_REGION: [a]}}\n", &[]).unwrap_err().to_string();
    assert!(err.contains("offline_store.storage_options.AWS_REGION: expected a string"), "{err}");
}

#[test]
fn serving_log_is_off_by_default_and_lives_under_the_offline_root() {
    let c = parse("project: demo\n", &[]).unwrap();
    assert!(!c.serving_log.enabled);
    assert_eq!(c.serving_log.location, StoreLocation::Local("/repo/data/_serving_log".into()));
    assert_eq!((c.serving_log.sample_rate, c.serving_log.batch_rows, c.serving_log.batch_ms), (1.0, 100_000, 1_000));
    let c = parse(
        "project: demo\nserving_log: {enabled: true, path: logs/served, sample_rate: 0.25, batch_ms: 200}\n",
        &[("QUIVER_SERVING_LOG_BATCH_ROWS", "50")],
    )
    .unwrap();
    assert!(c.serving_log.enabled);
    assert_eq!(c.serving_log.location, StoreLocation::Local("/repo/logs/served".into()));
    assert_eq!((c.serving_log.sample_rate, c.serving_log.batch_rows, c.serving_log.batch_ms), (0.25, 50, 200));
    let c = parse("project: demo\n", &[("QUIVER_SERVING_LOG_ENABLED", "true")]).unwrap();
    assert!(c.serving_log.enabled, "the environment turns it on");
}

#[test]
fn stream_metrics_are_urls_in_a_list_or_comma_separated() {
    let load = |yaml: &str, env: &[(&str, &str)]| parse(yaml, env).map(|c| c.server.stream_metrics).map_err(|e| e.to_string());
    assert_eq!(load("project: p\n", &[]).unwrap(), Vec::<String>::new());
    assert_eq!(
        load("project: p\nserver: {stream_metrics: [http://10.0.0.1:9100/metrics, http://h:1/metrics]}\n", &[]).unwrap(),
        vec!["http://10.0.0.1:9100/metrics".to_string(), "http://h:1/metrics".to_string()]
    );
    assert_eq!(
        load("project: p\n", &[("QUIVER_SERVER_STREAM_METRICS", "http://a:1/metrics, http://b:2/metrics")]).unwrap(),
        vec!["http://a:1/metrics".to_string(), "http://b:2/metrics".to_string()]
    );
    let e = load("project: p\nserver: {stream_metrics: [a:1]}\n", &[]).unwrap_err();
    assert!(e.contains("server.stream_metrics `a:1`: expected http://HOST:PORT/metrics"), "{e}");
}
