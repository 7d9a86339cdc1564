//! A lookup's answer written straight as the `/get-online-features` JSON: each stored
//! row decoded once and each requested value written as JSON text into its feature's
//! part of the answer, with no answer columns built, moved and freed. The server's path
//! when no serving log takes the columns; byte for byte what
//! [`super::wire::response_json`] writes of [`LookupPlan::lookup`]'s columns (tested
//! below against it).

use std::cell::RefCell;
use std::time::Instant;

use quiver_runtime::encoding::{KeyValue, Value};
use quiver_sdk::registry::Registered;
use quiver_sdk::types::write_rfc3339;

use super::on_demand::OnDemandPlan;
use super::wire::{json_str, quoted, write_value};
use super::{Entities, EntityColumns, LookupPhases, LookupPlan, Row, RowReader, Status, answer_records};
use crate::error::Result;
use crate::store::OnlineStore;

/// One requested feature's part of the answer: its values, statuses and event times as
/// JSON array items, without the brackets.
#[derive(Debug, Default)]
struct Part {
    values: Vec<u8>,
    statuses: Vec<u8>,
    /// Its own event times (an aggregation's); unused for a plain view's feature.
    times: Vec<u8>,
    /// The plain view whose row times this feature shares ([`Scratch::times`]).
    view: Option<usize>,
    /// The on-demand feature (its answer position) whose event times this one has too.
    shares: Option<usize>,
}

/// The buffers of one answer, kept per thread for the next (freed instead when they
/// grew past [`KEEP_BYTES`]).
#[derive(Debug, Default)]
struct Scratch {
    /// Per requested feature, in answer order.
    parts: Vec<Part>,
    /// Per view of the plan: its rows' event times (plain views).
    times: Vec<Vec<u8>>,
    /// One decoded row (the last row's values stay until the next answer decodes).
    values: Vec<Value>,
    /// Per answer position: its values when on-demand features read them.
    inputs: Vec<Vec<Value>>,
    /// Per view of the plan: its live rows' event times when on-demand features read them.
    live: Vec<Vec<Option<i64>>>,
}

const KEEP_BYTES: usize = 1 << 20;

impl Scratch {
    fn bytes(&self) -> usize {
        let parts: usize = self.parts.iter().map(|p| p.values.capacity() + p.statuses.capacity() + p.times.capacity()).sum();
        let values = self.values.capacity() + self.inputs.iter().map(Vec::capacity).sum::<usize>();
        parts + self.times.iter().map(Vec::capacity).sum::<usize>() + values * size_of::<Value>()
    }
}

thread_local! {
    static SCRATCH: RefCell<Scratch> = RefCell::default();
}

/// When an answer is read for, and how its metadata is written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AnswerAt {
    /// The request's time, UTC microseconds.
    pub now: i64,
    /// Feast's `include_feature_view_version_metadata`: name each view read and its
    /// version (docs/versions.md).
    pub versions: bool,
}

impl LookupPlan {
    /// [`LookupPlan::lookup`], answered as the `/get-online-features` JSON document (the join
    /// keys as given, then the features) at `at.now`, recording the time of its phases in
    /// `phases`; with `at.versions`, its metadata names each view read and its version.
    ///
    /// # Errors
    /// As [`LookupPlan::lookup`].
    pub async fn answer_json(
        &self,
        store: &dyn OnlineStore,
        project: &str,
        defs: &Registered,
        asked: Entities<'_>,
        at: AnswerAt,
        phases: &mut LookupPhases,
    ) -> Result<Vec<u8>> {
        let AnswerAt { now, versions } = at;
        if let Some(on_demand) = &self.on_demand {
            on_demand.check(asked.0, asked.1)?;
        }
        let entities = asked.0;
        let (n, stored, read) = self.read_stored(store, project, entities, phases).await?;
        SCRATCH.with(|scratch| {
            let mut scratch = scratch.borrow_mut();
            self.write_parts(&mut scratch, defs, &stored, n, now);
            if let Some(on_demand) = &self.on_demand {
                phases.uncomputed += self.write_on_demand(on_demand, &mut scratch, asked, now, n)?;
            }
            let written = Instant::now();
            phases.decode = written - read;
            let out = self.assemble(&scratch, entities, if versions { &self.versions_json } else { &[] });
            phases.encode = written.elapsed();
            if scratch.bytes() > KEEP_BYTES {
                *scratch = Scratch::default();
            }
            Ok(out)
        })
    }

    /// Each requested feature's values, statuses and times from the stored rows (`n`
    /// per view, views in plan order).
    fn write_parts(&self, scratch: &mut Scratch, defs: &Registered, stored: &[Option<Vec<u8>>], n: usize, now: i64) {
        let Scratch { parts, times, values, inputs, live } = scratch;
        let answered = self.refs.len();
        if parts.len() < self.names.len() {
            parts.resize_with(self.names.len(), Part::default);
        }
        if times.len() < self.views.len() {
            times.resize_with(self.views.len(), Vec::new);
        }
        for part in &mut parts[..self.names.len()] {
            part.values.clear();
            part.statuses.clear();
            part.times.clear();
            part.view = None;
            part.shares = None;
        }
        // What on-demand features read: kept as values.
        let mut reads = vec![false; self.names.len()];
        if let Some(on_demand) = &self.on_demand {
            on_demand.columns_read().for_each(|j| reads[j] = true);
            if inputs.len() < self.names.len() {
                inputs.resize_with(self.names.len(), Vec::new);
            }
            if live.len() < self.views.len() {
                live.resize_with(self.views.len(), Vec::new);
            }
            inputs.iter_mut().for_each(Vec::clear);
            live.iter_mut().for_each(Vec::clear);
        }
        for (i, planned) in self.views.iter().enumerate() {
            let view = &planned.view;
            let rows = &stored[i * n..(i + 1) * n];
            if view.is_event_log() {
                let answers = answer_records(&defs.layouts, view, rows, now);
                for row in 0..rows.len() {
                    for &(j, k) in &planned.wanted {
                        let (value, status, ts) = answers.cell(row, k);
                        if reads[j] {
                            inputs[j].push(value.clone());
                        }
                        if j < answered {
                            cell(&mut parts[j], row, value, status);
                            time(&mut parts[j].times, row, ts);
                        }
                    }
                    if planned.times {
                        live[i].push(answers.latest(row, &planned.wanted));
                    }
                }
                continue;
            }
            let shared = &mut times[i];
            shared.clear();
            for &(j, _) in &planned.wanted {
                parts[j].view = Some(i);
            }
            let mut reader = RowReader::new(&defs.layouts, view, planned, now);
            for (row, bytes) in rows.iter().enumerate() {
                let read = reader.read(bytes.as_deref(), values);
                time(shared, row, read.event_ts().unwrap_or(0));
                if planned.times {
                    live[i].push(if let Row::Live(ts) = read { Some(ts) } else { None });
                }
                for &(j, k) in &planned.wanted {
                    let v = if matches!(read, Row::Live(_)) { &values[k] } else { &Value::Null };
                    if reads[j] {
                        inputs[j].push(v.clone());
                    }
                    if j < answered {
                        cell(&mut parts[j], row, v, read.status(matches!(v, Value::Null)));
                    }
                }
            }
        }
    }

    /// Computes the on-demand features from what [`LookupPlan::write_parts`] kept for them and
    /// writes their parts; how many values could not be computed.
    fn write_on_demand(&self, on_demand: &OnDemandPlan, scratch: &mut Scratch, asked: Entities<'_>, now: i64, n: usize) -> Result<u64> {
        let Scratch { parts, inputs, live, .. } = scratch;
        let computed = {
            let column = |j: usize| -> &[Value] { &inputs[j] };
            let times = |i: usize| -> &[Option<i64>] { &live[i] };
            on_demand.evaluate(&column, &times, asked, now, n)?
        };
        for (o, (((j, _), values), times)) in on_demand.answered().zip(&computed.values).zip(&computed.event_times).enumerate() {
            let part = &mut parts[j];
            for (row, value) in values.iter().enumerate() {
                let status = if matches!(value, Value::Null) { Status::NullValue } else { Status::Present };
                cell(part, row, value, status);
            }
            // Features reading the same views have the same times: written once.
            if let Some(same) = computed.event_times[..o].iter().position(|t| t == times) {
                part.shares = on_demand.answered().nth(same).map(|(k, _)| k);
                continue;
            }
            for (row, &ts) in times.iter().enumerate() {
                time(&mut part.times, row, ts);
            }
        }
        Ok(computed.failed)
    }

    /// The answer document: the names, the join-key columns as given, then each
    /// feature's part.
    fn assemble<'a>(&self, scratch: &'a Scratch, entities: &EntityColumns, metadata: &[u8]) -> Vec<u8> {
        let parts = &scratch.parts[..self.refs.len()];
        let times_of = |p: &'a Part| -> &'a [u8] {
            match (p.view, p.shares) {
                (Some(i), _) => &scratch.times[i],
                (None, Some(k)) => &scratch.parts[k].times,
                (None, None) => &p.times,
            }
        };
        // A key cell is at most ~60 bytes beside its 22-byte time and `"PRESENT"`.
        let keys: usize = entities.iter().map(|(name, values)| 64 + name.len() + values.len() * 96).sum();
        let features: usize =
            parts.iter().zip(&self.names).map(|(p, name)| 64 + name.len() + p.values.len() + p.statuses.len() + times_of(p).len()).sum();
        let mut out = Vec::with_capacity(64 + keys + features);
        out.extend_from_slice(br#"{"metadata":{"feature_names":["#);
        for (i, (name, _)) in entities.iter().enumerate() {
            if i > 0 {
                out.push(b',');
            }
            json_str(&mut out, name);
        }
        // The features' names, written once per plan: each after a comma.
        out.extend_from_slice(&self.names_json[usize::from(entities.is_empty() && !self.names_json.is_empty())..]);
        out.push(b']');
        out.extend_from_slice(metadata);
        out.extend_from_slice(br#"},"results":["#);
        let mut first = true;
        let mut open = |out: &mut Vec<u8>| {
            if !std::mem::take(&mut first) {
                out.push(b',');
            }
            out.extend_from_slice(br#"{"values":["#);
        };
        for (_, keys) in entities {
            open(&mut out);
            for (row, key) in keys.iter().enumerate() {
                if row > 0 {
                    out.push(b',');
                }
                match key {
                    KeyValue::Int(i) => write_value(&mut out, &Value::Int64(*i)),
                    KeyValue::Str(s) => json_str(&mut out, s),
                }
            }
            out.extend_from_slice(br#"],"statuses":["#);
            for row in 0..keys.len() {
                out.extend_from_slice(&quoted(Status::Present)[usize::from(row == 0)..]);
            }
            out.extend_from_slice(br#"],"event_timestamps":["#);
            for row in 0..keys.len() {
                time(&mut out, row, 0);
            }
            out.extend_from_slice(b"]}");
        }
        for p in parts {
            open(&mut out);
            out.extend_from_slice(&p.values);
            out.extend_from_slice(br#"],"statuses":["#);
            out.extend_from_slice(&p.statuses);
            out.extend_from_slice(br#"],"event_timestamps":["#);
            out.extend_from_slice(times_of(p));
            out.extend_from_slice(b"]}");
        }
        out.extend_from_slice(b"]}");
        out
    }
}

/// Row `row`'s value and status of one feature.
fn cell(part: &mut Part, row: usize, value: &Value, status: Status) {
    if row > 0 {
        part.values.push(b',');
    }
    write_value(&mut part.values, value);
    part.statuses.extend_from_slice(&quoted(status)[usize::from(row == 0)..]);
}

/// Row `row`'s event time (UTC microseconds) as a JSON string.
fn time(out: &mut Vec<u8>, row: usize, ts: i64) {
    if row > 0 {
        out.push(b',');
    }
    // A key's time and a missing row's: copied, not computed.
    if ts == 0 {
        out.extend_from_slice(EPOCH);
        return;
    }
    out.push(b'"');
    write_rfc3339(out, ts);
    out.push(b'"');
}

/// `write_rfc3339` of 0, quoted (tested below).
const EPOCH: &[u8] = br#""1970-01-01T00:00:00Z""#;

#[cfg(test)]
mod tests;
