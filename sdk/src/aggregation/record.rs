//! One entity's online record of an event log: what a lookup needs to answer every
//! aggregation of the view at any `now` until the record is rewritten.
//!
//! - **Tiles**, one series per distinct hop: the tile starting at `s` (a multiple of
//!   the hop) holds one [`Partial`] per aggregation with that hop, of the events with
//!   `s <= ts < s + hop`. A window's tail is a multiple of its hop, so a window is a
//!   whole number of tiles: those with `tail <= s <= now`. Tiles older than the
//!   longest window of their series needs are dropped when the record is written.
//! - **Pending events**: those dated after the writer's clock, kept as they are. The
//!   tile holding `now` must not count events after `now`, so an event enters a tile
//!   only once the writer's clock has passed it; until then a lookup adds it itself
//!   when its time has come.
//!
//! Encoded, a record starts with the 16-byte ordering header of every online row (here
//! the Delta version it is complete as of), so the stores' guarded write keeps the
//! newest rebuild and a replay rewrites the same bytes.

use std::collections::BTreeMap;

use super::Aggregation;
use super::state::{Dd, EventOrder, Num, Partial, Sums};
use crate::definitions::FeatureView;
use crate::encoding::{DecodeError, Reader, Value, fingerprint, order_bytes, write_value};
use crate::types::DType;

const FORMAT: u8 = 2;

/// One event of an event log: its order and one value per view feature (in the
/// view's order; null for a column it lacks).
#[derive(Debug, Clone, PartialEq)]
pub struct Event {
    pub order: EventOrder,
    pub values: Vec<Value>,
}

/// The tiles of one hop.
#[derive(Debug, Clone, PartialEq)]
pub struct TileSeries {
    pub hop_us: i64,
    /// By start time, ascending.
    pub tiles: Vec<Tile>,
}

/// The partials of one hop-long stretch of time.
#[derive(Debug, Clone, PartialEq)]
pub struct Tile {
    pub start: i64,
    /// The latest event time in the tile (whatever its values).
    pub last_ts: i64,
    /// One per aggregation of the series, in [`Layout`] order.
    pub partials: Vec<Partial>,
}

/// An entity's record.
#[derive(Debug, Clone, PartialEq)]
pub struct AggRecord {
    /// The Delta version the record is complete as of.
    pub version: i64,
    /// The view's [`fingerprint`] when written: a record of another layout is not used.
    pub layout: u64,
    /// One per hop, in [`Layout`] order.
    pub series: Vec<TileSeries>,
    /// Events dated after the writer's clock, in no particular order.
    pub pending: Vec<Event>,
}

/// Which aggregations of a view share a hop, and where their columns are.
#[derive(Debug, Clone)]
pub struct Layout<'a> {
    pub view: &'a FeatureView,
    /// Per hop (in order of first appearance): the hop and the aggregations' indices.
    pub series: Vec<(i64, Vec<usize>)>,
    /// Per aggregation: its column's position among the view's features and type.
    pub columns: Vec<(usize, DType)>,
}

impl<'a> Layout<'a> {
    /// The layout of a (validated) event log.
    pub fn of(view: &'a FeatureView) -> Layout<'a> {
        let mut series: Vec<(i64, Vec<usize>)> = Vec::new();
        for (i, a) in view.aggregations.iter().enumerate() {
            match series.iter_mut().find(|(h, _)| *h == a.hop_us()) {
                Some((_, members)) => members.push(i),
                None => series.push((a.hop_us(), vec![i])),
            }
        }
        let columns = view
            .aggregations
            .iter()
            .map(|a| view.features.iter().enumerate().find(|(_, f)| f.name == a.column).map_or((0, DType::Int64), |(k, f)| (k, f.dtype)))
            .collect();
        Layout { view, series, columns }
    }

    fn agg(&self, i: usize) -> &Aggregation {
        &self.view.aggregations[i]
    }

    /// The first event time any window of the view can count at `now`: what a record
    /// built at `now` must be built from.
    pub fn earliest_tail(&self, now: i64) -> i64 {
        self.view.aggregations.iter().map(|a| a.tail(now)).min().unwrap_or(now)
    }

    /// The longest window plus hop of the view: how long after its latest event a
    /// record can still count it.
    pub fn reach_us(&self) -> i64 {
        self.view.aggregations.iter().map(|a| a.window_us().saturating_add(a.hop_us())).max().unwrap_or(0)
    }
}

impl AggRecord {
    /// The record of an entity without events: what a lookup assumes when none is stored.
    pub fn empty(layout: &Layout<'_>) -> AggRecord {
        let series = layout.series.iter().map(|(hop_us, _)| TileSeries { hop_us: *hop_us, tiles: Vec::new() }).collect();
        AggRecord { version: -1, layout: fingerprint(layout.view), series, pending: Vec::new() }
    }

    /// The record of an entity's `events` (any order) for lookups at `now` or later:
    /// events within the longest window of their hop go into tiles, those after `now`
    /// stay pending, older ones are left out.
    pub fn build(layout: &Layout<'_>, events: &[Event], now: i64, version: i64) -> AggRecord {
        let mut series = Vec::with_capacity(layout.series.len());
        for (hop, members) in &layout.series {
            let oldest = members.iter().map(|&i| layout.agg(i).tail(now)).min().unwrap_or(now);
            let mut tiles: BTreeMap<i64, Tile> = BTreeMap::new();
            for e in events.iter().filter(|e| e.order.0 >= oldest && e.order.0 <= now) {
                let start = e.order.0 - e.order.0.rem_euclid(*hop);
                let tile = tiles.entry(start).or_insert_with(|| Tile {
                    start,
                    last_ts: e.order.0,
                    partials: vec![Partial::default(); members.len()],
                });
                tile.last_ts = tile.last_ts.max(e.order.0);
                for (p, &i) in tile.partials.iter_mut().zip(members) {
                    p.push(layout.agg(i), e.order, &e.values[layout.columns[i].0]);
                }
            }
            series.push(TileSeries { hop_us: *hop, tiles: tiles.into_values().collect() });
        }
        let pending = events.iter().filter(|e| e.order.0 > now).cloned().collect();
        AggRecord { version, layout: fingerprint(layout.view), series, pending }
    }

    /// Every aggregation's value at `now`, in the view's order, with the time of the
    /// latest event in its window (`None`: no event).
    pub fn answer(&self, layout: &Layout<'_>, now: i64) -> Vec<(Value, Option<i64>)> {
        let mut out = vec![(Value::Null, None); layout.view.aggregations.len()];
        for ((_, members), series) in layout.series.iter().zip(&self.series) {
            for (slot, &i) in members.iter().enumerate() {
                let agg = layout.agg(i);
                let tail = agg.tail(now);
                let mut partial = Partial::default();
                let mut last: Option<i64> = None;
                let first = series.tiles.partition_point(|t| t.start < tail);
                for tile in series.tiles[first..].iter().take_while(|t| t.start <= now) {
                    partial.merge(agg, &tile.partials[slot]);
                    last = last.max(Some(tile.last_ts));
                }
                for e in self.pending.iter().filter(|e| e.order.0 >= tail && e.order.0 <= now) {
                    partial.push(agg, e.order, &e.values[layout.columns[i].0]);
                    last = last.max(Some(e.order.0));
                }
                out[i] = (partial.finish(agg, layout.columns[i].1), last);
            }
        }
        out
    }

    /// When no window can count any of the record's events any more: the latest event
    /// plus the longest window and hop, in milliseconds since the epoch (at least 1).
    pub fn expire_at_ms(&self, layout: &Layout<'_>) -> Option<i64> {
        let tiles = self.series.iter().flat_map(|s| s.tiles.iter().map(|t| t.last_ts));
        let latest = tiles.chain(self.pending.iter().map(|e| e.order.0)).max()?;
        Some(latest.saturating_add(layout.reach_us()).div_euclid(1000).saturating_add(1).max(1))
    }

    /// Packs the record.
    pub fn encode(&self, layout: &Layout<'_>) -> Vec<u8> {
        let mut out = Vec::with_capacity(64);
        out.extend_from_slice(&order_bytes(self.version));
        out.extend_from_slice(&order_bytes(0));
        out.push(FORMAT);
        out.extend_from_slice(&self.layout.to_le_bytes());
        put_len(&mut out, self.series.len());
        for ((_, members), series) in layout.series.iter().zip(&self.series) {
            put_i64(&mut out, series.hop_us);
            put_len(&mut out, series.tiles.len());
            for tile in &series.tiles {
                put_i64(&mut out, tile.start);
                put_i64(&mut out, tile.last_ts);
                for (p, &i) in tile.partials.iter().zip(members) {
                    put_partial(&mut out, layout.agg(i), p);
                }
            }
        }
        put_len(&mut out, self.pending.len());
        for e in &self.pending {
            put_order(&mut out, e.order);
            put_len(&mut out, e.values.len());
            for v in &e.values {
                write_value(&mut out, v);
            }
        }
        out
    }

    /// Unpacks a record written under `layout`.
    ///
    /// # Errors
    /// [`DecodeError`] for bytes that are not such a record, or a record of another
    /// layout (written before the view's aggregations changed).
    pub fn decode(layout: &Layout<'_>, bytes: &[u8]) -> Result<AggRecord, DecodeError> {
        let mut r = Reader::new(bytes);
        let version = (u64::from_be_bytes(r.array()?) ^ (1 << 63)) as i64;
        r.take(8)?;
        if r.take(1)?[0] != FORMAT {
            return Err(DecodeError("not an aggregation record".into()));
        }
        let print = u64::from_le_bytes(r.array()?);
        if print != fingerprint(layout.view) || r.len()? != layout.series.len() {
            return Err(DecodeError("an aggregation record of another layout".into()));
        }
        let mut series = Vec::with_capacity(layout.series.len());
        for (_, members) in &layout.series {
            let hop_us = get_i64(&mut r)?;
            let n = r.len()?;
            let mut tiles = Vec::with_capacity(n.min(1 << 16));
            for _ in 0..n {
                let (start, last_ts) = (get_i64(&mut r)?, get_i64(&mut r)?);
                let partials = members.iter().map(|&i| get_partial(&mut r, layout.agg(i))).collect::<Result<_, _>>()?;
                tiles.push(Tile { start, last_ts, partials });
            }
            series.push(TileSeries { hop_us, tiles });
        }
        let n = r.len()?;
        let mut pending = Vec::with_capacity(n.min(1 << 16));
        for _ in 0..n {
            let order = get_order(&mut r)?;
            let values = r.list(Reader::value)?;
            if values.len() != layout.view.features.len() {
                return Err(DecodeError("a pending event of another layout".into()));
            }
            pending.push(Event { order, values });
        }
        if !r.is_done() {
            return Err(DecodeError("trailing bytes after an aggregation record".into()));
        }
        Ok(AggRecord { version, layout: print, series, pending })
    }
}

fn put_len(out: &mut Vec<u8>, n: usize) {
    out.extend_from_slice(&(n as u32).to_le_bytes());
}

fn put_i64(out: &mut Vec<u8>, v: i64) {
    out.extend_from_slice(&v.to_le_bytes());
}

fn put_f64(out: &mut Vec<u8>, v: f64) {
    out.extend_from_slice(&v.to_le_bytes());
}

fn put_order(out: &mut Vec<u8>, (ts, created, seq): EventOrder) {
    put_i64(out, ts);
    put_i64(out, created);
    put_i64(out, seq);
}

fn get_i64(r: &mut Reader<'_>) -> Result<i64, DecodeError> {
    Ok(i64::from_le_bytes(r.array()?))
}

fn get_f64(r: &mut Reader<'_>) -> Result<f64, DecodeError> {
    Ok(f64::from_le_bytes(r.array()?))
}

fn get_order(r: &mut Reader<'_>) -> Result<EventOrder, DecodeError> {
    Ok((get_i64(r)?, get_i64(r)?, get_i64(r)?))
}

/// Only what the function reads: a count is 8 bytes, a tile of stddev 40.
fn put_partial(out: &mut Vec<u8>, agg: &Aggregation, p: &Partial) {
    use super::AggFunction as F;
    match agg.function {
        F::Count | F::Sum | F::Avg | F::Stddev => {
            put_i64(out, p.sums.n);
            match agg.function {
                F::Count => {}
                F::Sum => {
                    put_i64(out, p.sums.int_sum);
                    put_f64(out, p.sums.sum.hi);
                    put_f64(out, p.sums.sum.lo);
                }
                F::Avg => {
                    put_f64(out, p.sums.sum.hi);
                    put_f64(out, p.sums.sum.lo);
                }
                _ => {
                    for x in [p.sums.sum.hi, p.sums.sum.lo, p.sums.squares.hi, p.sums.squares.lo] {
                        put_f64(out, x);
                    }
                }
            }
        }
        F::Min | F::Max => match p.extreme {
            None => out.push(0),
            Some(Num::I(x)) => {
                out.push(1);
                put_i64(out, x);
            }
            Some(Num::F(x)) => {
                out.push(2);
                put_f64(out, x);
            }
        },
        F::Last | F::LastK => {
            put_len(out, p.latest.len());
            for (order, value) in &p.latest {
                put_order(out, *order);
                write_value(out, value);
            }
        }
    }
}

fn get_partial(r: &mut Reader<'_>, agg: &Aggregation) -> Result<Partial, DecodeError> {
    use super::AggFunction as F;
    let mut p = Partial::default();
    let dd = |r: &mut Reader<'_>| -> Result<Dd, DecodeError> { Ok(Dd { hi: get_f64(r)?, lo: get_f64(r)? }) };
    match agg.function {
        F::Count | F::Sum | F::Avg | F::Stddev => {
            let mut sums = Sums { n: get_i64(r)?, ..Sums::default() };
            match agg.function {
                F::Count => {}
                F::Sum => {
                    sums.int_sum = get_i64(r)?;
                    sums.sum = dd(r)?;
                }
                F::Avg => sums.sum = dd(r)?,
                _ => {
                    sums.sum = dd(r)?;
                    sums.squares = dd(r)?;
                }
            }
            p.sums = sums;
        }
        F::Min | F::Max => {
            p.extreme = match r.take(1)?[0] {
                0 => None,
                1 => Some(Num::I(get_i64(r)?)),
                2 => Some(Num::F(get_f64(r)?)),
                t => return Err(DecodeError(format!("unknown extreme tag {t}"))),
            }
        }
        F::Last | F::LastK => {
            let n = r.len()?;
            for _ in 0..n.min(super::MAX_K as usize) {
                let order = get_order(r)?;
                p.latest.push((order, r.value()?));
            }
        }
    }
    Ok(p)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::aggregation::AggFunction;
    use crate::{DType, FeatureView, Ttl};

    fn view() -> FeatureView {
        let mut v = FeatureView::new("rides").with_entity("rider").with_feature("fare", DType::Float64).with_feature("city", DType::String);
        v.aggregations = vec![
            Aggregation::new("fare_sum", AggFunction::Sum, "fare", Ttl::from_secs(3600)),
            Aggregation::new("cities", AggFunction::LastK, "city", Ttl::from_secs(7 * 86_400)).with_k(2),
            Aggregation::new("n", AggFunction::Count, "fare", Ttl::from_secs(1800)).with_hop(Ttl::from_secs(600)),
        ];
        v
    }

    #[test]
    fn records_round_trip_and_answer_like_a_scan() {
        let v = view();
        let layout = Layout::of(&v);
        let m = 60_000_000i64;
        let events: Vec<Event> = (0..50)
            .map(|i| Event {
                order: (i * 7 * m, 0, i),
                values: vec![if i % 4 == 0 { Value::Null } else { Value::Float64(i as f64 / 2.0) }, Value::String(format!("c{}", i % 3))],
            })
            .collect();
        let now = 200 * m;
        let record = AggRecord::build(&layout, &events, now, 3);
        assert!(!record.pending.is_empty(), "events after now stay pending");
        let decoded = AggRecord::decode(&layout, &record.encode(&layout)).unwrap();
        assert_eq!(decoded, record);
        for at in [now, now + 3 * m, now + 61 * m] {
            let answer = decoded.answer(&layout, at);
            for (i, agg) in v.aggregations.iter().enumerate() {
                let mut p = Partial::default();
                for e in events.iter().filter(|e| e.order.0 >= agg.tail(at) && e.order.0 <= at) {
                    p.push(agg, e.order, &e.values[layout.columns[i].0]);
                }
                assert_eq!(answer[i].0, p.finish(agg, layout.columns[i].1), "{} at {at}", agg.name);
            }
        }
    }

    #[test]
    fn a_record_of_another_layout_is_refused() {
        let v = view();
        let record = AggRecord::build(&Layout::of(&v), &[], 0, 1).encode(&Layout::of(&v));
        let mut changed = v.clone();
        changed.aggregations[0].window = Ttl::from_secs(7200);
        assert!(AggRecord::decode(&Layout::of(&changed), &record).is_err());
    }
}
