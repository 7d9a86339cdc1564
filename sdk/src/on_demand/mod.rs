//! On-demand views' expressions (docs/transformations.md): the names they may read
//! besides columns, and [`compile`]: which columns those are, in the one order every
//! path builds their input batch in, and the view compiled. The views themselves are
//! data of [`crate::definitions`]; `quiver_runtime::on_demand` evaluates them.

mod compile;

pub use compile::{ColumnOrigin, columns, described, keys, program, request_fields};

pub use crate::definitions::{OnDemandFeature, OnDemandView};

/// The request's time, by its name in expressions: offline the spine row's time,
/// online the moment the server read the store.
pub const REQUEST_TIME: &str = "request_time";

/// A feature view's event time, by its name in expressions (`view.event_timestamp`):
/// the time of the row the view answered with, null when none is live. Not for event
/// logs (their answers span many events) nor on-demand views.
pub const EVENT_TIMESTAMP: &str = "event_timestamp";
