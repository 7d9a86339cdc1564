//! Issue 53 through `quiver online` (docs/online.md#request-fields): a repeated
//! `--entity` or `--request` is refused naming the option and the name; only the join
//! keys and the request fields the features asked for read are taken (a declared field
//! they do not read is neither needed nor taken); `--request-null` sends a null.

use std::path::PathBuf;

use crate::common::{fails_alone, ok};

/// `channel_norm` reads only `channel`; `ratio` and `has_amount` only `amount`.
const FRAUD: &str = "on_demand_views:\n  - name: fraud\n    inputs: [driver_hourly]\n    \
                     request: [{name: amount, dtype: float64}, {name: channel, dtype: string}]\n    features:\n      \
                     - {name: ratio, dtype: float64, expr: 'amount / driver_hourly.conv_rate'}\n      \
                     - {name: channel_norm, dtype: string, expr: 'lower(channel)'}\n      \
                     - {name: has_amount, dtype: bool, expr: 'amount IS NOT NULL'}\n";

fn repo() -> (tempfile::TempDir, PathBuf) {
    let tmp = tempfile::tempdir().unwrap();
    ok(tmp.path(), &["init", "demo", "--demo"]);
    let repo = tmp.path().join("demo");
    let yaml = std::fs::read_to_string(repo.join("features.yaml")).unwrap();
    std::fs::write(repo.join("features.yaml"), format!("{yaml}{FRAUD}")).unwrap();
    ok(&repo, &["apply"]);
    ok(&repo, &["ingest", "driver_hourly", "sample_data/driver_hourly.parquet"]);
    ok(&repo, &["materialize", "2000-01-01T00:00:00Z", "now"]);
    (tmp, repo)
}

/// The value and status `quiver online` printed for column `name`.
fn answered(out: &str, name: &str) -> (String, String) {
    let line = out.lines().find(|l| l.split_whitespace().next() == Some(name)).unwrap_or_else(|| panic!("no {name}: {out}"));
    let words: Vec<&str> = line.split_whitespace().collect();
    (words[1].to_string(), words[2].to_string())
}

/// Before: a repeated `--entity` answered under the first value, a repeated
/// `--request` was sent as two columns of one name, and `--request-null` did not exist.
#[test]
fn a_name_given_twice_is_refused_naming_the_option() {
    let (_tmp, repo) = repo();
    let cases: [(&[&str], &str); 3] = [
        (
            &["--features", "driver_hourly:conv_rate", "--entity", "driver_id=1001", "--entity", "driver_id=1002"],
            "--entity `driver_id` is given twice",
        ),
        (
            &["--features", "fraud:channel_norm", "--entity", "driver_id=1001", "--request", "channel=a", "--request", "channel=b"],
            "--request `channel` is given twice",
        ),
        (
            &["--features", "fraud:channel_norm", "--entity", "driver_id=1001", "--request", "channel=a", "--request-null", "channel"],
            "--request-null `channel` is given twice",
        ),
    ];
    for (args, want) in cases {
        let args: Vec<&str> = std::iter::once("online").chain(args.iter().copied()).collect();
        fails_alone(&repo, &args, 1, &[want]);
    }
}

/// Before: `channel_norm` demanded `amount` ("needed by `fraud:channel_norm`"), and an
/// `amount` or a `customer_id` the features do not read was taken without a word.
#[test]
fn only_the_join_keys_and_request_fields_read_are_needed_and_taken() {
    let (_tmp, repo) = repo();
    let out = ok(&repo, &["online", "--features", "fraud:channel_norm", "--entity", "driver_id=1001", "--request", "channel=WEB"]);
    assert_eq!(answered(&out, "fraud__channel_norm"), ("\"web\"".into(), "PRESENT".into()), "{out}");
    fails_alone(
        &repo,
        &["online", "--features", "fraud:channel_norm", "--entity", "driver_id=1001", "--request", "channel=WEB", "--request", "amount=3"],
        1,
        &["`amount` is neither a join key nor a request field of the features asked for (allowed: `driver_id`, `channel`)"],
    );
    fails_alone(
        &repo,
        &["online", "--features", "driver_hourly:conv_rate", "--entity", "driver_id=1001", "--entity", "customer_id=C001"],
        1,
        &["`customer_id` is neither a join key nor a request field of the features asked for (allowed: `driver_id`)"],
    );
    // A missing field names the features that read it, not every one asked for.
    fails_alone(
        &repo,
        &["online", "--features", "fraud:channel_norm,fraud:ratio", "--entity", "driver_id=1001", "--request", "channel=x"],
        1,
        &["missing request field `amount` (float64, needed by `fraud:ratio`, goes beside"],
    );
}

/// `--request-null` sends a null (the expression reads NULL); `--request NAME=null` is
/// the text "null" for a string field.
#[test]
fn request_null_sends_a_null() {
    let (_tmp, repo) = repo();
    let out =
        ok(&repo, &["online", "--features", "fraud:has_amount,fraud:ratio", "--entity", "driver_id=1001", "--request-null", "amount"]);
    assert_eq!(answered(&out, "fraud__has_amount"), ("false".into(), "PRESENT".into()), "{out}");
    assert_eq!(answered(&out, "fraud__ratio"), ("null".into(), "NULL_VALUE".into()), "{out}");
    let out = ok(&repo, &["online", "--features", "fraud:channel_norm", "--entity", "driver_id=1001", "--request-null", "channel"]);
    assert_eq!(answered(&out, "fraud__channel_norm"), ("null".into(), "NULL_VALUE".into()), "{out}");
    let out = ok(&repo, &["online", "--features", "fraud:channel_norm", "--entity", "driver_id=1001", "--request", "channel=null"]);
    assert_eq!(answered(&out, "fraud__channel_norm"), ("\"null\"".into(), "PRESENT".into()), "{out}");
    let help = ok(&repo, &["online", "--help"]);
    assert!(help.contains("--request-null <NAME>"), "{help}");
}
