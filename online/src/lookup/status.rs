//! The one rule of statuses (docs/online.md): a view's latest row as a lookup at some
//! time answers it, and the status of each of its values.

use quiver_sdk::FeatureView;

/// The status of one value (Feast's names).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Status {
    Present,
    NullValue,
    NotFound,
    OutsideMaxAge,
}

impl Status {
    pub fn as_str(&self) -> &'static str {
        match self {
            Status::Present => "PRESENT",
            Status::NullValue => "NULL_VALUE",
            Status::NotFound => "NOT_FOUND",
            Status::OutsideMaxAge => "OUTSIDE_MAX_AGE",
        }
    }

    /// The status named as in answers and the serving log (`PRESENT`, ...).
    pub fn parse(text: &str) -> Option<Status> {
        [Status::Present, Status::NullValue, Status::NotFound, Status::OutsideMaxAge].into_iter().find(|s| s.as_str() == text)
    }
}

/// A view's latest row as a lookup at some time answers it: the one rule of statuses
/// ([`Row::judge`], then [`Row::status`]), which both answer paths and `verify` use.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Row {
    /// No row, one that cannot be read, or a key that has expired: `NOT_FOUND`.
    Missing,
    /// Older than the view's TTL (its event time): `OUTSIDE_MAX_AGE`, the values null.
    Expired(i64),
    /// Its values are served (its event time): `PRESENT`, or `NULL_VALUE` for a null.
    Live(i64),
}

impl Row {
    /// The latest row of an entity, with event time `event_ts` (`None`: no row was
    /// ever written), as a lookup at `at` (UTC microseconds) answers it: missing once
    /// the key has expired (the TTL plus [`quiver_runtime::encoding::KEY_GRACE_MS`] after
    /// the event, as both stores expire keys), expired past the TTL, else live. An event
    /// log's records have no TTL: they are live while stored.
    pub fn judge(view: &FeatureView, event_ts: Option<i64>, at: i64) -> Row {
        let Some(ts) = event_ts else { return Row::Missing };
        if quiver_runtime::encoding::expire_at_ms(view, ts).is_some_and(|expire| at.div_euclid(1000) >= expire) {
            return Row::Missing;
        }
        if view.ttl_us().is_some_and(|ttl| at.saturating_sub(ts) > ttl) {
            return Row::Expired(ts);
        }
        Row::Live(ts)
    }

    /// The status of one of the row's values (`null`: the value is null).
    pub fn status(self, null: bool) -> Status {
        match self {
            Row::Missing => Status::NotFound,
            Row::Expired(_) => Status::OutsideMaxAge,
            Row::Live(_) if null => Status::NullValue,
            Row::Live(_) => Status::Present,
        }
    }

    /// Its event time, when there is a row.
    pub fn event_ts(self) -> Option<i64> {
        match self {
            Row::Missing => None,
            Row::Expired(ts) | Row::Live(ts) => Some(ts),
        }
    }
}
