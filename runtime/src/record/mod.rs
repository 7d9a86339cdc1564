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
//! or before the writer's clock, so at any `now` after it a window holds the newest
//! tiles of its series, down to its tail. The tiles are therefore stored newest first,
//! each as the step back in hops from the one before and its own sums (one per sums
//! cell: counts, sums and squares), and a lookup walks them once, adding each into one
//! running partial per cell; a window takes the running sums when the walk passes its
//! tail. What else a window can need is stored once per series, not per tile: for a
//! min or max the extremes of the suffixes of tiles where they change (a few steps), for
//! last and last_k the series' k latest values with the tile each is in. Counts, steps
//! and integers are varints, a float sum that is a short decimal (fares, minutes) a
//! zigzag varint and its scale, exact either way (see `codec::put_sums`): a lookup's
//! cost is mostly the bytes it moves, so a record is kept small — about 390 bytes for
//! 50 events over a week and ten aggregations, where suffix partials per tile took 1.3 KB.

mod codec;
mod layout;

use std::collections::BTreeMap;

use codec::{
    STORED, get_extreme, get_i64, get_order, get_size, get_sums, get_var, get_zig, put_extreme, put_i64, put_order, put_sums, put_var,
    put_zig, skip_sums,
};
pub use layout::{CellKind, Layout, Tails};

/// One aggregation's answer at a time: its value, and the time of the latest event in
/// its window (UTC microseconds; `None`: no event).
#[derive(Debug, Clone, PartialEq)]
pub struct WindowAnswer {
    pub value: Value,
    pub latest_event: Option<i64>,
}

use crate::encoding::{DecodeError, Reader, Value, order_bytes, write_value};
use crate::state::{EventOrder, Num, Partial, Sums};
use quiver_sdk::aggregation::{AggFunction, Aggregation};
use quiver_sdk::types::DType;

const FORMAT: u8 = 8;

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
    match (agg.function, &mut p.latest[..]) {
        // The decoded values are the answer's: moved, not copied.
        (AggFunction::Last, [(_, first), ..]) => std::mem::replace(first, Value::Null),
        (AggFunction::LastK, latest) if matches!(column, DType::String) => Value::ListString(
            latest.iter_mut().filter_map(|(_, v)| if let Value::String(s) = v { Some(std::mem::take(s)) } else { None }).collect(),
        ),
        _ => p.finish(agg, column),
    }
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
    pub fn build(layout: &Layout<'_>, events: &[Event], at: quiver_sdk::Timestamp, version: i64) -> AggRecord {
        let now = at.0;
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
    pub fn answer(&self, layout: &Layout<'_>, now: i64) -> Vec<WindowAnswer> {
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
                WindowAnswer { value: finish(agg, layout.columns[i].1, partial), latest_event: last }
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

    /// Packs the record: the header, the answer at the clock with the time until which
    /// it holds, then per series the tile count and, with tiles, the latest event
    /// time, the newest tile's start in hops, the tiles newest first (each the step back
    /// in hops from the one before and its own sums, one per sums cell), then per other
    /// cell what any window's suffix of tiles can need: for min/max the suffix extremes
    /// where they change, for last/last_k the series' k latest values.
    pub fn encode(&self, layout: &Layout<'_>) -> Vec<u8> {
        let mut out = Vec::with_capacity(64);
        out.extend_from_slice(&order_bytes(self.version));
        out.extend_from_slice(&order_bytes(0));
        out.push(FORMAT);
        out.extend_from_slice(&self.layout.to_le_bytes());
        put_i64(&mut out, self.clock);
        // The answer at the clock and until when it holds, then the rest's length (so
        // that a lookup answered from the former still knows the record is whole).
        let answer = self.answer_at_clock(layout);
        put_var(&mut out, answer.len() as u64);
        out.extend_from_slice(&answer);
        let rest = self.encode_series(layout);
        put_var(&mut out, rest.len() as u64);
        out.extend_from_slice(&rest);
        out
    }

    /// The record's answer at its clock, and the first time after it at which any
    /// window's answer can differ: a pending event's time, or when a window's tail
    /// passes the oldest tile it holds (`oldest start + hop + window`). Between the two
    /// no event enters or leaves any window, so the answer is the same, bit for bit.
    pub fn answer_holds_until(&self, layout: &Layout<'_>) -> i64 {
        let mut until = self.pending.iter().map(|e| e.order.0).min().unwrap_or(i64::MAX);
        for (i, &(s, _)) in layout.cells.iter().enumerate() {
            let agg = layout.agg(i);
            let tail = agg.tail(self.clock);
            if let Some(oldest) = self.series[s].tiles.iter().find(|t| t.start >= tail && t.start <= self.clock) {
                until = until.min(oldest.start.saturating_add(agg.hop_us()).saturating_add(agg.window_us()));
            }
        }
        until
    }

    /// The cached answer's bytes: until when it holds, then per aggregation how long
    /// before the clock its latest event is (0: none, else 1 + the distance) and its value.
    fn answer_at_clock(&self, layout: &Layout<'_>) -> Vec<u8> {
        let mut out = Vec::with_capacity(16 + 12 * layout.cells.len());
        put_i64(&mut out, self.answer_holds_until(layout));
        for WindowAnswer { value, latest_event: last } in self.answer(layout, self.clock) {
            put_var(&mut out, last.map_or(0, |t| (self.clock.wrapping_sub(t) as u64).wrapping_add(1)));
            write_value(&mut out, &value);
        }
        out
    }

    /// The tiles of every series and the pending events, as described at [`AggRecord::encode`].
    fn encode_series(&self, layout: &Layout<'_>) -> Vec<u8> {
        let mut out = Vec::with_capacity(64);
        put_var(&mut out, self.series.len() as u64);
        for ((hop, cells), series) in layout.series.iter().zip(&self.series) {
            let n = series.tiles.len();
            put_var(&mut out, n as u64);
            let Some(newest) = series.tiles.last() else {
                continue;
            };
            put_i64(&mut out, series.tiles.iter().map(|t| t.last_ts).max().unwrap_or(0));
            let newest_hops = newest.start.div_euclid(*hop);
            put_zig(&mut out, newest_hops);
            // Each tile written with the sums of itself and every newer tile, per sums
            // cell; a low part of a sum only where pending events may be added to it.
            let exact = !self.pending.is_empty();
            let mut area = Vec::new();
            let mut backs = Vec::with_capacity(n);
            let mut offsets = Vec::with_capacity(n);
            let mut suffix: Vec<Sums> = vec![Sums::default(); cells.len()];
            for tile in series.tiles.iter().rev() {
                backs.push((newest_hops - tile.start.div_euclid(*hop)) as u64);
                offsets.push(area.len() as u64);
                for ((p, (_, kind)), sums) in tile.partials.iter().zip(cells).zip(&mut suffix) {
                    if let CellKind::Sums { numeric, integer, squares } = *kind {
                        sums.merge(&p.sums);
                        put_sums(&mut area, sums, numeric, integer, squares, exact);
                    }
                }
            }
            // The index: per tile (newest first) how many hops before the newest it
            // starts and where its sums are, at fixed widths, so that a window finds its
            // oldest tile by binary search.
            let (wb, wo) = (width(backs[n - 1]), width(offsets[n - 1]));
            out.push((wb << 4) | wo);
            for v in &backs {
                out.extend_from_slice(&v.to_le_bytes()[..usize::from(wb)]);
            }
            for v in &offsets {
                out.extend_from_slice(&v.to_le_bytes()[..usize::from(wo)]);
            }
            put_var(&mut out, area.len() as u64);
            out.extend_from_slice(&area);
            for (c, (_, kind)) in cells.iter().enumerate() {
                let newest_first = series.tiles.iter().rev().enumerate().map(|(j, t)| (j, &t.partials[c]));
                match *kind {
                    CellKind::Sums { .. } => {}
                    CellKind::Extreme(f) => {
                        let mut steps: Vec<(usize, Num)> = Vec::new();
                        for (j, p) in newest_first {
                            if let Some(x) = p.extreme
                                && steps.last().is_none_or(|(_, best)| strictly_better(f, x, best))
                            {
                                steps.push((j, x));
                            }
                        }
                        put_var(&mut out, steps.len() as u64);
                        let mut at = 0;
                        for (j, x) in steps {
                            put_var(&mut out, (j - at) as u64);
                            at = j;
                            put_extreme(&mut out, Some(x));
                        }
                    }
                    CellKind::Latest { k } => {
                        let latest: Vec<(usize, &Value)> =
                            newest_first.flat_map(|(j, p)| p.latest.iter().map(move |(_, v)| (j, v))).take(k).collect();
                        put_var(&mut out, latest.len() as u64);
                        let mut at = 0;
                        for (j, v) in latest {
                            put_var(&mut out, (j - at) as u64);
                            at = j;
                            write_value(&mut out, v);
                        }
                    }
                }
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
    /// record's bytes, as [`AggRecord::answer`] of the record. Until the first change
    /// after the clock ([`AggRecord::answer_holds_until`]) that is the answer stored
    /// with the record, exactly; after it, [`AggRecord::answer_from_tiles`].
    ///
    /// # Errors
    /// [`DecodeError`] for bytes that are not such a record, or a record of another
    /// layout (written before the view's aggregations changed, or by an older version).
    pub fn answer_stored(layout: &Layout<'_>, bytes: &[u8], now: i64) -> Result<Vec<WindowAnswer>, DecodeError> {
        Self::answer_stored_at(layout, &layout.tails(now), bytes)
    }

    /// [`AggRecord::answer_stored`] at `tails.now`, with the windows' tails computed
    /// once for every record a lookup answers.
    ///
    /// # Errors
    /// As [`AggRecord::answer_stored`].
    pub fn answer_stored_at(layout: &Layout<'_>, tails: &Tails, bytes: &[u8]) -> Result<Vec<WindowAnswer>, DecodeError> {
        let (clock, cached, rest) = Self::open(layout, bytes)?;
        let now = tails.now.max(clock);
        let mut answer = Reader::new(cached);
        if get_i64(&mut answer)? > now {
            let mut out = Vec::with_capacity(layout.cells.len());
            for _ in 0..layout.cells.len() {
                let back = get_var(&mut answer)?;
                let last = back.checked_sub(1).map(|b| clock.wrapping_sub(b as i64));
                out.push(WindowAnswer { value: answer.value()?, latest_event: last });
            }
            if !answer.is_done() {
                return Err(DecodeError("trailing bytes after a record's answer".into()));
            }
            return Ok(out);
        }
        if clock > tails.now {
            // A record written after `now` (the server's clock behind the writer's):
            // answered as of its clock.
            return Self::answer_indexed(layout, rest, &layout.tails(clock));
        }
        Self::answer_indexed(layout, rest, tails)
    }

    /// The layout (the view's fingerprint) a record's bytes were written under; `None`
    /// for bytes that are not a record of this format.
    pub fn layout_of(bytes: &[u8]) -> Option<u64> {
        match bytes.get(16..25)? {
            [FORMAT, print @ ..] => Some(u64::from_le_bytes(print.try_into().ok()?)),
            _ => None,
        }
    }

    /// A record's clock, its cached answer's bytes and the rest (tiles and pending
    /// events), after checking its format, layout and length.
    fn open<'b>(layout: &Layout<'_>, bytes: &'b [u8]) -> Result<(i64, &'b [u8], &'b [u8]), DecodeError> {
        let mut r = Reader::new(bytes);
        r.take(16)?;
        if r.byte()? != FORMAT {
            return Err(DecodeError("not an aggregation record of this version (materialize again)".into()));
        }
        if u64::from_le_bytes(r.array()?) != layout.fingerprint {
            return Err(DecodeError("an aggregation record of another layout".into()));
        }
        let clock = get_i64(&mut r)?;
        let len = get_size(&mut r)?;
        let cached = r.take(len)?;
        if get_size(&mut r)? != r.remaining() {
            return Err(DecodeError("an aggregation record of the wrong length".into()));
        }
        Ok((clock, cached, r.take(r.remaining())?))
    }

    /// Every aggregation's value at `now` from a record's tiles and pending events,
    /// whatever its stored answer says (floats to a rounding or two of
    /// [`AggRecord::answer`]): per window a binary search of its series' index for its
    /// oldest tile, whose suffix sums are the window's; its extremes and latest values
    /// are those stored for the tiles it holds. Nothing is read tile by tile.
    ///
    /// # Errors
    /// As [`AggRecord::answer_stored`].
    pub fn answer_from_tiles(layout: &Layout<'_>, bytes: &[u8], now: i64) -> Result<Vec<WindowAnswer>, DecodeError> {
        let (clock, _, rest) = Self::open(layout, bytes)?;
        Self::answer_indexed(layout, rest, &layout.tails(now.max(clock)))
    }

    /// [`AggRecord::answer_from_tiles`] from the bytes after the stored answer, at
    /// `tails.now` or, for a record written later, at its clock.
    fn answer_indexed(layout: &Layout<'_>, bytes: &[u8], tails: &Tails) -> Result<Vec<WindowAnswer>, DecodeError> {
        let mut r = Reader::new(bytes);
        if get_size(&mut r)? != layout.series.len() {
            return Err(DecodeError("an aggregation record of another layout".into()));
        }
        let aggs = layout.view.aggregations.len();
        let (now, tail_hops, tails) = (tails.now, &tails.hops, &tails.times);
        let mut partials: Vec<(Partial, Option<i64>)> = (0..aggs).map(|_| (Partial::default(), None)).collect();
        // Per aggregation: how many of its series' tiles (newest first) its window holds.
        let mut held: Vec<usize> = vec![0; aggs];
        let past = || DecodeError("a tile past the record".into());
        for (s, (_, cells)) in layout.series.iter().enumerate() {
            let n = get_size(&mut r)?;
            if n == 0 {
                continue;
            }
            let latest = get_i64(&mut r)?;
            let newest_hops = get_zig(&mut r)?;
            let widths = r.byte()?;
            let (wb, wo) = (usize::from(widths >> 4), usize::from(widths & 15));
            if !matches!(wb, 1 | 2 | 4 | 8) || !matches!(wo, 1 | 2 | 4 | 8) {
                return Err(DecodeError(format!("bad index widths {widths:#x}")));
            }
            let backs = r.take(n.checked_mul(wb).ok_or_else(past)?)?;
            let offsets = r.take(n.checked_mul(wo).ok_or_else(past)?)?;
            let len = get_size(&mut r)?;
            let area = r.take(len)?;
            let entry = |bytes: &[u8], w: usize, k: usize| -> u64 {
                let at = k * w;
                match w {
                    1 => u64::from(bytes[k]),
                    2 => u64::from(u16::from_le_bytes([bytes[at], bytes[at + 1]])),
                    4 => u64::from(u32::from_le_bytes(bytes[at..at + 4].try_into().expect("4 bytes"))),
                    _ => u64::from_le_bytes(bytes[at..at + 8].try_into().expect("8 bytes")),
                }
            };
            // The sums of the tiles a window holds: those of its oldest tile, decoded
            // once per (tile, cell) however many windows end there.
            let mut read: [Option<((usize, usize), Sums)>; 2] = [None, None];
            let mut sums_at = |tile: usize, c: usize| -> Result<Sums, DecodeError> {
                if let Some((_, s)) = read.iter().flatten().find(|(k, _)| *k == (tile, c)) {
                    return Ok(*s);
                }
                let at = usize::try_from(entry(offsets, wo, tile)).map_err(|_| past())?;
                let mut bytes = Reader::new(area.get(at..).ok_or_else(past)?);
                let mut found = Sums::default();
                for (k, (_, kind)) in cells[..=c].iter().enumerate() {
                    if let CellKind::Sums { numeric, integer, squares } = *kind {
                        if k == c {
                            found = get_sums(&mut bytes, numeric, integer, squares)?;
                        } else {
                            skip_sums(&mut bytes, integer, squares)?;
                        }
                    }
                }
                read.rotate_right(1);
                read[0] = Some(((tile, c), found));
                Ok(found)
            };
            let members = &layout.by_tail[s];
            for &i in members {
                // The tiles starting at or after the tail: at most `limit` hops before
                // the newest (the backs ascend).
                let limit = newest_hops.checked_sub(tail_hops[i]).ok_or_else(past)?;
                let (mut lo, mut hi) = (0usize, n);
                while lo < hi {
                    let mid = (lo + hi) / 2;
                    if limit >= 0 && entry(backs, wb, mid) <= limit as u64 {
                        lo = mid + 1;
                    } else {
                        hi = mid;
                    }
                }
                held[i] = lo;
                let c = layout.cells[i].1;
                if lo > 0 && matches!(cells[c].1, CellKind::Sums { .. }) {
                    partials[i].0.sums = sums_at(lo - 1, c)?;
                }
            }
            for &i in members {
                if held[i] > 0 {
                    partials[i].1 = Some(latest);
                }
            }
            for (c, (_, kind)) in cells.iter().enumerate() {
                let readers = || layout.readers[s][c].iter().copied();
                match *kind {
                    CellKind::Sums { .. } => {}
                    CellKind::Extreme(_) => {
                        let mut at = 0usize;
                        for _ in 0..get_size(&mut r)? {
                            at = at.checked_add(get_size(&mut r)?).ok_or_else(past)?;
                            let x = get_extreme(&mut r)?;
                            // The suffix extreme of the tiles up to `at` (newest first)
                            // for the windows holding that tile.
                            for i in readers().filter(|&i| held[i] > at) {
                                partials[i].0.extreme = x;
                            }
                        }
                    }
                    CellKind::Latest { k } => {
                        let count = get_size(&mut r)?;
                        if count > k {
                            return Err(DecodeError(format!("{count} latest values where at most {k} are kept")));
                        }
                        let mut at = 0usize;
                        for _ in 0..count {
                            at = at.checked_add(get_size(&mut r)?).ok_or_else(past)?;
                            let mut value = Some(r.value()?);
                            let takes = |i: usize, partials: &[(Partial, Option<i64>)]| {
                                held[i] > at && partials[i].0.latest.len() < layout.agg(i).keep()
                            };
                            // Cloned for every window that takes it but the last, which has it.
                            let last = readers().rfind(|&i| takes(i, &partials));
                            for i in readers() {
                                if takes(i, &partials) {
                                    let v = if Some(i) == last { value.take() } else { value.clone() };
                                    partials[i].0.latest.push((STORED, v.expect("the last taker takes it")));
                                }
                            }
                        }
                    }
                }
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
            for (i, &tail) in tails.iter().enumerate() {
                if order.0 >= tail && order.0 <= now {
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
        Ok(partials
            .into_iter()
            .enumerate()
            .map(|(i, (p, last))| WindowAnswer { value: finish(layout.agg(i), layout.columns[i].1, p), latest_event: last })
            .collect())
    }
}

/// The bytes an index entry takes to hold `max`: 1, 2, 4 or 8.
fn width(max: u64) -> u8 {
    match max {
        0..=0xff => 1,
        0x100..=0xffff => 2,
        0x1_0000..=0xffff_ffff => 4,
        _ => 8,
    }
}

/// Whether `x` is a better min (or max) than `best` (a tie is not).
fn strictly_better(f: AggFunction, x: Num, best: &Num) -> bool {
    let order = x.order(best);
    if f == AggFunction::Min { order == std::cmp::Ordering::Less } else { order == std::cmp::Ordering::Greater }
}

#[cfg(test)]
mod tests;
