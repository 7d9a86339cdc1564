//! One entity's online record of an event log: what a lookup needs to answer every
//! aggregation of the view at any `now` until the record is rewritten.
//!
//! - **Tiles**, one series per distinct hop: the tile starting at `s` (a multiple of
//!   the hop) holds the partials of the events with `s <= ts < s + hop`. A window's
//!   tail is a multiple of its hop, so a window is a whole number of tiles: those with
//!   `tail <= s <= now`. Tiles older than the longest window of their series needs are
//!   dropped when the record is written.
//! - **Cells**: the aggregations of a series that read the same column the same way
//!   share one partial per tile — count, sum, avg and stddev of a column one set of
//!   sums, min (or max) of a column one extreme, last and last_k of a column one list
//!   of the latest values (as long as the longest k). Ten aggregations over three
//!   columns are then about four partials per tile.
//! - **Pending events**: those dated after the writer's clock, kept as they are. The
//!   tile holding `now` must not count events after `now`, so an event enters a tile
//!   only once the writer's clock has passed it; until then a lookup adds it itself
//!   when its time has come.
//!
//! Encoded, a record starts with the 16-byte ordering header of every online row (here
//! the Delta version it is complete as of), so the stores' guarded write keeps the
//! newest rebuild and a replay rewrites the same bytes.
//!
//! A lookup reads the bytes without decoding the whole record. Every stored tile is at
//! or before the writer's clock, so at any `now` after it a window holds a suffix of its
//! series' tiles; each tile is therefore stored as the merge of itself and every later
//! tile (its suffix partials), an index of the tiles' starts and sizes comes first, and a
//! window is answered by one pass over the index (a byte or two a tile) and one tile's
//! partials, whatever the window's length. A suffix list of latest values equal to the
//! next tile's is stored once and referred to. Counts, sizes, hop steps and integers are
//! varints and sums keep one float each (see `codec::put_cell`): a lookup's cost is
//! mostly the bytes it moves, so a record is kept small.

mod codec;
mod layout;

use std::collections::BTreeMap;

use codec::{get_cell, get_i64, get_order, get_size, get_var, get_zig, put_cell, put_i64, put_order, put_var, put_zig, skip_cell};
pub use layout::{CellKind, Layout};

use super::Aggregation;
use super::state::{EventOrder, Partial};
use crate::encoding::{DecodeError, Reader, Value, order_bytes, write_value};
use crate::types::DType;

const FORMAT: u8 = 6;

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
    /// One per cell of the series, in [`Layout`] order.
    pub partials: Vec<Partial>,
}

/// An entity's record.
#[derive(Debug, Clone, PartialEq)]
pub struct AggRecord {
    /// The Delta version the record is complete as of.
    pub version: i64,
    /// The view's [`crate::encoding::fingerprint`] when written: a record of another layout is not used.
    pub layout: u64,
    /// One per hop, in [`Layout`] order.
    pub series: Vec<TileSeries>,
    /// Events dated after the writer's clock, in no particular order.
    pub pending: Vec<Event>,
    /// The writer's clock: the record answers for it or later. A lookup at an earlier
    /// time (a server clock behind the writer's) is answered as of the clock — its head
    /// tile already counts events up to the clock, and a suffix cannot be taken back.
    pub clock: i64,
}

/// Aggregation `agg`'s value from its cell's partial of the window.
fn finish(agg: &Aggregation, column: DType, mut p: Partial) -> Value {
    p.latest.truncate(agg.keep());
    p.finish(agg, column)
}

impl AggRecord {
    /// The record of an entity without events: what a lookup assumes when none is stored.
    pub fn empty(layout: &Layout<'_>) -> AggRecord {
        let series = layout.series.iter().map(|(hop_us, _)| TileSeries { hop_us: *hop_us, tiles: Vec::new() }).collect();
        AggRecord { version: -1, layout: layout.fingerprint, series, pending: Vec::new(), clock: i64::MIN }
    }

    /// The record of an entity's `events` (any order) for lookups at `now` or later:
    /// events within the longest window of their hop go into tiles, those after `now`
    /// stay pending, older ones are left out.
    pub fn build(layout: &Layout<'_>, events: &[Event], now: i64, version: i64) -> AggRecord {
        let mut series = Vec::with_capacity(layout.series.len());
        for (s, (hop, cells)) in layout.series.iter().enumerate() {
            let oldest = layout.series_tail(s, now);
            let mut tiles: BTreeMap<i64, Tile> = BTreeMap::new();
            for e in events.iter().filter(|e| e.order.0 >= oldest && e.order.0 <= now) {
                let start = e.order.0 - e.order.0.rem_euclid(*hop);
                let tile = tiles.entry(start).or_insert_with(|| Tile {
                    start,
                    last_ts: e.order.0,
                    partials: vec![Partial::default(); cells.len()],
                });
                tile.last_ts = tile.last_ts.max(e.order.0);
                for (p, (column, kind)) in tile.partials.iter_mut().zip(cells) {
                    kind.push(p, e.order, &e.values[*column]);
                }
            }
            series.push(TileSeries { hop_us: *hop, tiles: tiles.into_values().collect() });
        }
        let pending = events.iter().filter(|e| e.order.0 > now).cloned().collect();
        AggRecord { version, layout: layout.fingerprint, series, pending, clock: now }
    }

    /// Every aggregation's value at `now`, in the view's order, with the time of the
    /// latest event in its window (`None`: no event): by merging the window's tiles.
    pub fn answer(&self, layout: &Layout<'_>, now: i64) -> Vec<(Value, Option<i64>)> {
        let now = now.max(self.clock);
        (0..layout.view.aggregations.len())
            .map(|i| {
                let agg = layout.agg(i);
                let (s, c) = layout.cells[i];
                let kind = layout.series[s].1[c].1;
                let tail = agg.tail(now);
                let mut partial = Partial::default();
                let mut last: Option<i64> = None;
                let tiles = &self.series[s].tiles;
                let first = tiles.partition_point(|t| t.start < tail);
                for tile in tiles[first..].iter().take_while(|t| t.start <= now) {
                    kind.merge(&mut partial, &tile.partials[c]);
                    last = last.max(Some(tile.last_ts));
                }
                for e in self.pending.iter().filter(|e| e.order.0 >= tail && e.order.0 <= now) {
                    kind.push(&mut partial, e.order, &e.values[layout.columns[i].0]);
                    last = last.max(Some(e.order.0));
                }
                (finish(agg, layout.columns[i].1, partial), last)
            })
            .collect()
    }

    /// When no window can count any of the record's events any more: the latest event
    /// plus the longest window and hop, in milliseconds since the epoch (at least 1).
    pub fn expire_at_ms(&self, layout: &Layout<'_>) -> Option<i64> {
        let tiles = self.series.iter().flat_map(|s| s.tiles.iter().map(|t| t.last_ts));
        let latest = tiles.chain(self.pending.iter().map(|e| e.order.0)).max()?;
        Some(latest.saturating_add(layout.reach_us()).div_euclid(1000).saturating_add(1).max(1))
    }

    /// Packs the record: per series the tile count, the latest event time, the index
    /// (tile starts in hops and sizes), then each tile's suffix partials, one per cell.
    pub fn encode(&self, layout: &Layout<'_>) -> Vec<u8> {
        let mut out = Vec::with_capacity(64);
        out.extend_from_slice(&order_bytes(self.version));
        out.extend_from_slice(&order_bytes(0));
        out.push(FORMAT);
        out.extend_from_slice(&self.layout.to_le_bytes());
        put_i64(&mut out, self.clock);
        put_var(&mut out, self.series.len() as u64);
        for ((hop, cells), series) in layout.series.iter().zip(&self.series) {
            let n = series.tiles.len();
            put_var(&mut out, n as u64);
            put_i64(&mut out, series.tiles.iter().map(|t| t.last_ts).max().unwrap_or(0));
            // Suffix partials: each tile merged with the next tile's suffix, from the
            // newest tile back (the newest with an empty one).
            let none = Partial::default();
            let mut suffixes: Vec<Vec<Partial>> = Vec::with_capacity(n);
            for tile in series.tiles.iter().rev() {
                let merged = tile
                    .partials
                    .iter()
                    .zip(cells)
                    .enumerate()
                    .map(|(c, (p, (_, kind)))| {
                        let mut m = p.clone();
                        kind.merge(&mut m, suffixes.last().map_or(&none, |later: &Vec<Partial>| &later[c]));
                        m
                    })
                    .collect();
                suffixes.push(merged);
            }
            suffixes.reverse();
            // Tiles are written from the newest back, so that a latest list equal to
            // the next tile's is not written again: a reference (tag 1, then how far past
            // the end of its own tile the list is) to the nearest newer tile's written
            // list (tag 0, then the list).
            let mut tile_bytes: Vec<Vec<u8>> = Vec::with_capacity(n);
            let mut written: Vec<Option<usize>> = vec![None; cells.len()]; // bytes from the area's end
            let mut after = 0; // bytes of the tiles newer than this one
            for k in (0..n).rev() {
                let mut bytes = Vec::new();
                let mut inline = Vec::new();
                for (c, (_, kind)) in cells.iter().enumerate() {
                    let p = &suffixes[k][c];
                    if let CellKind::Latest { .. } = kind {
                        if k + 1 < n && suffixes[k + 1][c].latest == p.latest {
                            let from_end = written[c].expect("the newest list is written");
                            bytes.push(1);
                            put_var(&mut bytes, (after - from_end) as u64);
                            continue;
                        }
                        bytes.push(0);
                        inline.push((c, bytes.len()));
                    }
                    put_cell(&mut bytes, kind, p);
                }
                after += bytes.len();
                for (c, at) in inline {
                    written[c] = Some(after - at);
                }
                tile_bytes.push(bytes);
            }
            tile_bytes.reverse();
            // The index (after its length in bytes, so a lookup can stop early): the
            // first tile's start in hops, then each tile's distance in hops from the one
            // before and its size in bytes.
            let mut index = Vec::with_capacity(2 * n + 4);
            for (k, (t, bytes)) in series.tiles.iter().zip(&tile_bytes).enumerate() {
                let hops = t.start.div_euclid(*hop);
                if k == 0 {
                    put_zig(&mut index, hops);
                } else {
                    put_var(&mut index, (hops - series.tiles[k - 1].start.div_euclid(*hop)) as u64);
                }
                put_var(&mut index, bytes.len() as u64);
            }
            put_var(&mut out, index.len() as u64);
            out.extend_from_slice(&index);
            put_var(&mut out, after as u64);
            for bytes in tile_bytes {
                out.extend_from_slice(&bytes);
            }
        }
        put_var(&mut out, self.pending.len() as u64);
        for e in &self.pending {
            put_order(&mut out, e.order);
            put_var(&mut out, e.values.len() as u64);
            for v in &e.values {
                write_value(&mut out, v);
            }
        }
        out
    }

    /// Every aggregation's value at `now` (at or after the writer's clock) from a
    /// record's bytes, as [`AggRecord::answer`] of the record (floats to a rounding or
    /// two): per window one tile's cell found in one pass over the series' index, plus
    /// the pending events that are due.
    ///
    /// # Errors
    /// [`DecodeError`] for bytes that are not such a record, or a record of another
    /// layout (written before the view's aggregations changed, or by an older version).
    pub fn answer_stored(layout: &Layout<'_>, bytes: &[u8], now: i64) -> Result<Vec<(Value, Option<i64>)>, DecodeError> {
        let mut r = Reader::new(bytes);
        r.take(16)?;
        if r.take(1)?[0] != FORMAT {
            return Err(DecodeError("not an aggregation record of this version (materialize again)".into()));
        }
        let print = u64::from_le_bytes(r.array()?);
        let clock = get_i64(&mut r)?;
        if print != layout.fingerprint || get_size(&mut r)? != layout.series.len() {
            return Err(DecodeError("an aggregation record of another layout".into()));
        }
        let now = now.max(clock);
        let mut partials: Vec<(Partial, Option<i64>)> = vec![(Partial::default(), None); layout.view.aggregations.len()];
        let past = || DecodeError("a tile past the record".into());
        for (s, (hop, cells)) in layout.series.iter().enumerate() {
            let n = get_size(&mut r)?;
            let latest = get_i64(&mut r)?;
            let len = get_size(&mut r)?;
            let mut index = Reader::new(r.take(len)?);
            let len = get_size(&mut r)?;
            let area = r.take(len)?;
            let at = |pos: usize| area.get(pos..).map(Reader::new).ok_or_else(past);
            // Aggregation `i`'s cell in the tile at `offset` (`size` bytes long).
            let cell = |i: usize, offset: usize, size: usize| -> Result<Partial, DecodeError> {
                let c = layout.cells[i].1;
                let mut tile = at(offset)?;
                for (_, kind) in &cells[..c] {
                    skip_cell(&mut tile, kind)?;
                }
                let kind = &cells[c].1;
                match kind {
                    CellKind::Latest { .. } => match tile.take(1)?[0] {
                        0 => get_cell(&mut tile, kind),
                        1 => {
                            let ahead = get_size(&mut tile)?;
                            get_cell(&mut at(offset.checked_add(size).and_then(|end| end.checked_add(ahead)).ok_or_else(past)?)?, kind)
                        }
                        t => Err(DecodeError(format!("unknown latest tag {t}"))),
                    },
                    _ => get_cell(&mut tile, kind),
                }
            };
            // One pass of the index (the first tile's start in hops, then per tile the
            // step in hops and the size) answers the series' aggregations in the order
            // of their tails, each from the first tile at or after its tail, and stops
            // once all are answered.
            let members = &layout.by_tail[s];
            let tail = |next: usize| members.get(next).map(|&i| layout.agg(i).tail(now));
            let (mut hops, mut offset, mut next) = (0i64, 0usize, 0usize);
            let mut want = tail(0);
            for k in 0..n {
                let Some(mut t) = want else {
                    break;
                };
                hops = if k == 0 {
                    get_zig(&mut index)?
                } else {
                    let step = i64::try_from(get_var(&mut index)?).map_err(|_| past())?;
                    hops.checked_add(step).ok_or_else(past)?
                };
                let start = hops.checked_mul(*hop).ok_or_else(past)?;
                let size = get_size(&mut index)?;
                while start >= t {
                    let i = members[next];
                    partials[i] = (cell(i, offset, size)?, Some(latest));
                    next += 1;
                    want = tail(next);
                    match want {
                        Some(w) => t = w,
                        None => break,
                    }
                }
                offset = offset.checked_add(size).ok_or_else(past)?;
            }
        }
        let n = get_size(&mut r)?;
        for _ in 0..n {
            let order = get_order(&mut r)?;
            let count = get_size(&mut r)?;
            let values = (0..count).map(|_| r.value()).collect::<Result<Vec<_>, _>>()?;
            if values.len() != layout.view.features.len() {
                return Err(DecodeError("a pending event of another layout".into()));
            }
            for (i, agg) in layout.view.aggregations.iter().enumerate() {
                if order.0 >= agg.tail(now) && order.0 <= now {
                    let (s, c) = layout.cells[i];
                    let (p, last) = &mut partials[i];
                    layout.series[s].1[c].1.push(p, order, &values[layout.columns[i].0]);
                    *last = (*last).max(Some(order.0));
                }
            }
        }
        if !r.is_done() {
            return Err(DecodeError("trailing bytes after an aggregation record".into()));
        }
        Ok(partials.into_iter().enumerate().map(|(i, (p, last))| (finish(layout.agg(i), layout.columns[i].1, p), last)).collect())
    }
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
        // Aggregations sharing cells with those above: the sums of fare, the latest
        // cities (a shorter k), and an extreme beside them.
        let (h1, h2) = (v.aggregations[0].hop(), v.aggregations[1].hop());
        v.aggregations.extend([
            Aggregation::new("fare_avg", AggFunction::Avg, "fare", Ttl::from_secs(7200)).with_hop(h1),
            Aggregation::new("fare_std", AggFunction::Stddev, "fare", Ttl::from_secs(3600)).with_hop(h1),
            Aggregation::new("n_h", AggFunction::Count, "fare", Ttl::from_secs(3 * 3600)).with_hop(h1),
            Aggregation::new("last_city", AggFunction::Last, "city", Ttl::from_secs(3600)).with_hop(h2),
            Aggregation::new("fare_max", AggFunction::Max, "fare", Ttl::from_secs(86_400)).with_hop(h1),
        ]);
        v
    }

    #[test]
    fn aggregations_reading_a_column_alike_share_a_cell() {
        let v = view();
        let layout = Layout::of(&v);
        let cell = |name: &str| layout.cells[v.aggregations.iter().position(|a| a.name == name).unwrap()];
        assert_eq!(cell("fare_sum"), cell("fare_avg"));
        assert_eq!(cell("fare_sum"), cell("fare_std"));
        assert_eq!(cell("fare_sum"), cell("n_h"));
        assert_eq!(cell("cities"), cell("last_city"));
        assert_ne!(cell("fare_max"), cell("fare_sum"));
        let (s, c) = cell("fare_sum");
        assert!(matches!(layout.series[s].1[c].1, CellKind::Sums { numeric: true, integer: false, squares: true }));
        let (s, c) = cell("cities");
        assert_eq!(layout.series[s].1[c].1, CellKind::Latest { k: 2 });
    }

    /// Equal answers, floats to 1e-12 relative (a stored sum is rounded once).
    fn assert_close(got: &[(Value, Option<i64>)], want: &[(Value, Option<i64>)], what: &str) {
        assert_eq!(got.len(), want.len(), "{what}");
        for (g, w) in got.iter().zip(want) {
            match (&g.0, &w.0) {
                (Value::Float64(a), Value::Float64(b)) => {
                    assert!(a == b || (a - b).abs() <= 1e-12 * b.abs().max(1e-300) || (a.is_nan() && b.is_nan()), "{what}: {a} vs {b}")
                }
                _ => assert_eq!(g, w, "{what}"),
            }
            assert_eq!(g.1, w.1, "{what}: the latest event's time");
        }
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
        let bytes = record.encode(&layout);
        for at in [now, now + 3 * m, now + 61 * m, now + 3 * 86_400 * m / 1440, now + 8 * 86_400 * 1_000_000] {
            let answer = record.answer(&layout, at);
            assert_close(&AggRecord::answer_stored(&layout, &bytes, at).unwrap(), &answer, &format!("the stored answer at {at}"));
            for (i, agg) in v.aggregations.iter().enumerate() {
                let mut p = Partial::default();
                let mut last = None;
                for e in events.iter().filter(|e| e.order.0 >= agg.tail(at) && e.order.0 <= at) {
                    p.push(agg, e.order, &e.values[layout.columns[i].0]);
                    last = last.max(Some(e.order.0));
                }
                assert_eq!(answer[i].0, p.finish(agg, layout.columns[i].1), "{} at {at}", agg.name);
                assert_eq!(answer[i].1, last, "{} at {at}: the latest event's time", agg.name);
            }
        }
        // Before the writer's clock: answered as of the clock, by both.
        let early = now - 90 * m;
        assert_close(&AggRecord::answer_stored(&layout, &bytes, early).unwrap(), &record.answer(&layout, now), "a lookup before the clock");
        assert_eq!(record.answer(&layout, early), record.answer(&layout, now));
        for cut in [0, 10, 17, bytes.len() / 2, bytes.len() - 1] {
            assert!(AggRecord::answer_stored(&layout, &bytes[..cut], now).is_err(), "truncated at {cut}");
        }
    }

    #[test]
    fn overflowing_sums_and_negative_integers_survive_the_compact_cells() {
        let mut v = FeatureView::new("t").with_entity("e").with_feature("x", DType::Float64).with_feature("i", DType::Int64);
        let w = Ttl::from_secs(3600);
        v.aggregations = vec![
            Aggregation::new("x_sum", AggFunction::Sum, "x", w),
            Aggregation::new("x_std", AggFunction::Stddev, "x", w),
            Aggregation::new("i_sum", AggFunction::Sum, "i", w),
            Aggregation::new("i_avg", AggFunction::Avg, "i", w),
            Aggregation::new("i_min", AggFunction::Min, "i", w),
        ];
        let layout = Layout::of(&v);
        let m = 60_000_000i64;
        for big in [1e308, 3.5] {
            // (1e308: the sums overflow, and the record keeps them as they are.)
            let events: Vec<Event> = (0..20)
                .map(|j| Event {
                    order: (j * 3 * m, 0, j),
                    values: vec![Value::Float64(big * (j % 3) as f64), Value::Int64(-(1 << 60) + j * 977)],
                })
                .collect();
            let record = AggRecord::build(&layout, &events, 61 * m, 1);
            let bytes = record.encode(&layout);
            for at in [61 * m, 70 * m, 100 * m] {
                let want = record.answer(&layout, at);
                if big > 1e300 {
                    assert_eq!(want[0].0, Value::Float64(f64::INFINITY), "the fare sum overflows");
                }
                assert!(matches!(want[4].0, Value::Int64(x) if x < -(1 << 59)), "{:?}", want[4]);
                assert_close(&AggRecord::answer_stored(&layout, &bytes, at).unwrap(), &want, &format!("{big} at {at}"));
            }
        }
    }

    #[test]
    fn a_record_of_another_layout_is_refused() {
        let v = view();
        let record = AggRecord::build(&Layout::of(&v), &[], 0, 1).encode(&Layout::of(&v));
        let mut changed = v.clone();
        changed.aggregations[0].window = Ttl::from_secs(7200);
        assert!(AggRecord::answer_stored(&Layout::of(&changed), &record, 0).is_err());
    }
}
