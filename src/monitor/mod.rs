//! Monitoring (docs/monitoring.md): profiles of a reference and a current window
//! compared feature by feature — PSI over the reference's deciles or categories, the
//! Kolmogorov–Smirnov distance, the null rate's change, the `NOT_FOUND` rate — against
//! each feature's limits, into a [`MonitorReport`] stored under `.quiver/monitor/`. The
//! current window's values are counted exactly into the reference's bins, as the
//! server's gauges count what they serve ([`live`]), so both give one PSI.
//!
//! Where profiles come from is [`sources`]: a training set's manifest, a view's Delta
//! rows by event time, the serving log by request time. The statistics themselves are
//! `crate::monitor::profile`'s.

pub(crate) mod live;
pub(crate) mod profile;
pub(crate) mod sources;

use std::collections::BTreeMap;
use std::path::PathBuf;

use crate::monitor::profile::{Binning, Bins, CategoryShares, Profile, ks};
use quiver_sdk::monitoring::Limits;
use quiver_sdk::types::format_instant;
use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};

/// A window of data to profile.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Window {
    /// The training set exported to this folder (its manifest's profile).
    Training(PathBuf),
    /// Views' Delta rows with event times in `since..until` (UTC microseconds).
    Offline { since: i64, until: i64 },
    /// The serving log's rows with request times in `since..until`.
    Serving { since: i64, until: i64 },
}

impl Window {
    /// `training:DIR`, `offline:T1..T2` or `serving:T1..T2` ([`Window::KINDS`]), each
    /// time in the one time grammar ([`crate::ops::parse_time`]: RFC 3339, a date, `now`,
    /// `2h` before now). `what` names the argument in errors.
    ///
    /// # Errors
    /// [`Error::Invalid`] naming `what` and the text.
    ///
    /// ```
    /// use quiver::Window;
    /// use quiver::sdk::Timestamp;
    /// let w = Window::parse("--current", "serving:2026-01-01..2026-01-02", Timestamp(0)).unwrap();
    /// assert_eq!(w, Window::Serving { since: 1_767_225_600_000_000, until: 1_767_312_000_000_000 });
    /// assert!(Window::parse("--current", "serving:2026-01-02..2026-01-01", Timestamp(0)).is_err());
    /// ```
    pub fn parse(what: &str, text: &str, now: quiver_sdk::Timestamp) -> Result<Window> {
        let expected = format!("expected {}", Window::KINDS);
        let expected = expected.as_str();
        let bad = |m: String| Error::Invalid(format!("{what} `{text}`: {m}"));
        let (kind, rest) = text.split_once(':').ok_or_else(|| bad(expected.into()))?;
        if kind == "training" {
            if rest.is_empty() {
                return Err(bad("no folder after `training:`".into()));
            }
            return Ok(Window::Training(PathBuf::from(rest)));
        }
        if kind != "offline" && kind != "serving" {
            return Err(bad(format!("unknown window kind `{kind}` ({expected})")));
        }
        let (a, b) = rest.split_once("..").ok_or_else(|| bad(format!("no `..` between the window's two times ({expected})")))?;
        let since = crate::ops::parse_time(what, a, now)?.0;
        let until = crate::ops::parse_time(what, b, now)?.0;
        if since >= until {
            return Err(bad(format!("{} is not before {}", format_instant(since), format_instant(until))));
        }
        Ok(if kind == "offline" { Window::Offline { since, until } } else { Window::Serving { since, until } })
    }

    /// Every kind of window, as `--help` and errors name them.
    pub const KINDS: &str = "training:DIR, offline:T1..T2 or serving:T1..T2";

    /// The version of `r`'s view this window reads: a training set's references name
    /// the version they read as its manifest does (none: version 1); a window over the
    /// stores reads a plain reference's latest version (docs/versions.md).
    pub fn version_read(&self, defs: &quiver_sdk::Definitions, r: &quiver_sdk::FeatureRef) -> u32 {
        match (r.version, self) {
            (None, Window::Training(_)) => quiver_sdk::definitions::FIRST_VERSION,
            _ => defs.version_read(r),
        }
    }

    /// As written in reports: `training:/abs/dir`, `offline:2026-...Z..2026-...Z`.
    pub fn describe(&self) -> String {
        match self {
            Window::Training(dir) => format!("training:{}", dir.display()),
            Window::Offline { since, until } => format!("offline:{}..{}", format_instant(*since), format_instant(*until)),
            Window::Serving { since, until } => format!("serving:{}..{}", format_instant(*since), format_instant(*until)),
        }
    }
}

/// A comparison of two windows, feature by feature (docs/monitoring.md's JSON shape).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct MonitorReport {
    pub reference: String,
    pub current: String,
    /// When the comparison was made (RFC 3339).
    pub created_at: String,
    /// The feature service monitored, if one was named.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub service: Option<String>,
    pub features: Vec<FeatureDrift>,
}

impl MonitorReport {
    /// Whether any feature crossed a threshold.
    pub fn breached(&self) -> bool {
        self.features.iter().any(|f| !f.breaches.is_empty())
    }
}

/// One feature's statistics, limits and breaches.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FeatureDrift {
    /// `view:feature`.
    pub feature: String,
    pub kind: Kind,
    /// `None` when there are no values to compare on either side.
    pub psi: Option<f64>,
    /// Numbers and list lengths only.
    pub ks: Option<f64>,
    pub null_rate: Rates,
    /// Of a serving window: the share of lookups that found no row.
    pub not_found_rate: Option<f64>,
    /// Of a serving window: the share of lookups whose row was past the view's TTL.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub outside_max_age_rate: Option<f64>,
    /// Of numbers: each side's share of NaN and infinite values (values, not nulls, and
    /// in no bin of PSI nor in KS), without a threshold.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub non_finite_rate: Option<Rates>,
    /// Values profiled on each side (nulls included).
    pub count: Counts,
    pub limits: Limits,
    /// Which statistics crossed their limit.
    pub breaches: Vec<Statistic>,
    /// The decile bins PSI was computed over, with each side's shares (numbers, list lengths).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bins: Option<Bins>,
    /// The categories PSI was computed over, with each side's shares; the last is "other".
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub categories: Option<CategoryShares>,
    /// The version of the view each side read, when they differ (docs/versions.md): a
    /// new version may mean something else, so the drift may be the definition's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub versions: Option<Versions>,
}

/// The version of a feature's view each side of a comparison read.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Versions {
    pub reference: u32,
    pub current: u32,
}

/// What a feature's values are compared as.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Kind {
    Numeric,
    Categorical,
    /// Statistics of list lengths.
    List,
    /// Bytes: null rates only.
    Other,
}

/// A statistic with a threshold, as a report's `breaches` name it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Statistic {
    Psi,
    Ks,
    NullRate,
    NotFoundRate,
}

impl Statistic {
    pub fn as_str(self) -> &'static str {
        match self {
            Statistic::Psi => "psi",
            Statistic::Ks => "ks",
            Statistic::NullRate => "null_rate",
            Statistic::NotFoundRate => "not_found_rate",
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Rates {
    pub reference: Option<f64>,
    pub current: Option<f64>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Counts {
    pub reference: u64,
    pub current: u64,
}

/// The bins each feature's current values are counted into ([`Profile::counting`]):
/// the reference profile's ([`Binning::of`]), by `view:feature`; features whose
/// reference has no values to bin are left out.
pub fn binnings(reference: &Profiles) -> BTreeMap<String, std::sync::Arc<Binning>> {
    reference.iter().filter_map(|(name, p)| Some((name.clone(), std::sync::Arc::new(Binning::of(p)?)))).collect()
}

/// Compares one feature's reference and current profiles against `limits`; `served`:
/// the current profile is of a serving window (lookups, with their `NOT_FOUND` rate).
///
/// PSI's current shares are the current values counted into the reference's bins when
/// the current profile counted them ([`Profile::counting`], an offline or serving
/// window), else read off its sketches (a training set), with their error bound.
pub fn compare(feature: &str, reference: &Profile, current: &Profile, limits: Limits, served: bool) -> FeatureDrift {
    let (mut psi, mut ks_distance, mut bins, mut categories) = (None, None, None, None);
    let counted = current.counted.as_ref();
    let kind = match (&reference.numbers, &reference.categories, &reference.lengths) {
        (Some(_), _, _) | (None, None, Some(_)) => {
            let (r, c) = if reference.numbers.is_some() {
                (reference.numbers.as_ref(), current.numbers.as_ref())
            } else {
                (reference.lengths.as_ref(), current.lengths.as_ref())
            };
            if let Some(r) = r {
                bins = match counted {
                    Some(counted) => Bins::counted(r, counted),
                    None => c.and_then(|c| Bins::deciles(r, c)),
                };
                psi = bins.as_ref().map(Bins::psi);
                ks_distance = c.and_then(|c| ks(r, c));
            }
            if reference.numbers.is_some() { Kind::Numeric } else { Kind::List }
        }
        (None, Some(r), _) => {
            categories = CategoryShares::of(r, current);
            psi = categories.as_ref().map(CategoryShares::psi);
            Kind::Categorical
        }
        // The reference has no values (all null, or bytes): the current's kind, if any.
        (None, None, None) => match (&current.numbers, &current.categories, &current.lengths) {
            (Some(_), _, _) => Kind::Numeric,
            (None, Some(_), _) => Kind::Categorical,
            (None, None, Some(_)) => Kind::List,
            _ => Kind::Other,
        },
    };
    let lookups = current.count;
    let share = |n: u64| (served && lookups > 0).then(|| n as f64 / lookups as f64);
    let (not_found_rate, outside_max_age_rate) = (share(current.not_found), share(current.outside_max_age));
    let null_rate = Rates { reference: reference.null_rate(), current: current.null_rate() };
    let non_finite_rate =
        (kind == Kind::Numeric).then(|| Rates { reference: reference.non_finite_rate(), current: current.non_finite_rate() });
    let breaches = breaches(psi, ks_distance, null_rate, not_found_rate, limits);
    FeatureDrift {
        feature: feature.to_string(),
        kind,
        psi,
        ks: ks_distance,
        null_rate,
        not_found_rate,
        outside_max_age_rate,
        non_finite_rate,
        count: Counts { reference: reference.count, current: current.count },
        limits,
        breaches,
        bins,
        categories,
        versions: None,
    }
}

/// Which statistics cross their limits: `psi`, `ks`, `null_rate` (the change, either
/// way), `not_found_rate` (when it has a limit).
pub(crate) fn breaches(psi: Option<f64>, ks: Option<f64>, null_rate: Rates, not_found_rate: Option<f64>, limits: Limits) -> Vec<Statistic> {
    let mut out = Vec::new();
    if psi.is_some_and(|p| p > limits.psi) {
        out.push(Statistic::Psi);
    }
    if ks.is_some_and(|k| k > limits.ks) {
        out.push(Statistic::Ks);
    }
    if let (Some(r), Some(c)) = (null_rate.reference, null_rate.current)
        && (c - r).abs() > limits.null_rate
    {
        out.push(Statistic::NullRate);
    }
    if let (Some(limit), Some(rate)) = (limits.not_found_rate, not_found_rate)
        && rate > limit
    {
        out.push(Statistic::NotFoundRate);
    }
    out
}

impl crate::reports::Report for MonitorReport {
    const DIR: &'static str = ".quiver/monitor";

    /// Its time, then a hash of its windows and service.
    fn file_name(&self) -> String {
        use sha2::Digest;
        let stamp: String = self.created_at.chars().filter(char::is_ascii_alphanumeric).collect();
        let what = format!("{} {} {:?}", self.reference, self.current, self.service);
        let hash: String = sha2::Sha256::digest(what.as_bytes()).iter().take(4).map(|b| format!("{b:02x}")).collect();
        format!("{stamp}-{hash}.json")
    }
}

/// Profiles keyed by `view:feature`.
pub type Profiles = BTreeMap<String, Profile>;
