//! Dense entity ids: the spine's distinct join-key tuples numbered `0..n`, and the
//! lookup of feature rows into the same numbering, which is all the as-of kernel needs
//! to know about keys.
//!
//! A single `int64` key (the common case) hashes the integers directly; any other key
//! (strings, composite keys) hashes Arrow's row encoding of the tuple.

use arrow::array::{Array, ArrayRef, AsArray};
use arrow::datatypes::{DataType, Int64Type};
use arrow::row::{RowConverter, SortField};
use hashbrown::HashMap;
use quiver_gpu_join::NO_ENTITY;

use crate::error::Result;

/// The spine's entities for one set of join keys.
#[derive(Debug)]
pub struct EntityIndex {
    kind: Kind,
    /// Entity id of each spine row ([`NO_ENTITY`] when a key is null).
    pub spine_ids: Vec<u32>,
    pub n_entities: u32,
}

#[derive(Debug)]
enum Kind {
    Int(HashMap<i64, u32>),
    Rows { converter: RowConverter, map: HashMap<Box<[u8]>, u32> },
}

fn single_int(keys: &[ArrayRef]) -> bool {
    keys.len() == 1 && *keys[0].data_type() == DataType::Int64
}

impl EntityIndex {
    /// Numbers the distinct key tuples of the spine, in order of first appearance.
    ///
    /// # Errors
    /// When Arrow cannot encode the key types.
    pub fn build(spine_keys: &[ArrayRef]) -> Result<EntityIndex> {
        let n = spine_keys.first().map_or(0, |a| a.len());
        let mut spine_ids = Vec::with_capacity(n);
        let mut next = 0u32;
        let kind = if single_int(spine_keys) {
            let values = spine_keys[0].as_primitive::<Int64Type>();
            let mut map = HashMap::with_capacity(n / 4);
            for i in 0..n {
                if values.is_null(i) {
                    spine_ids.push(NO_ENTITY);
                    continue;
                }
                let id = *map.entry(values.value(i)).or_insert_with(|| {
                    next += 1;
                    next - 1
                });
                spine_ids.push(id);
            }
            Kind::Int(map)
        } else {
            let converter = RowConverter::new(spine_keys.iter().map(|a| SortField::new(a.data_type().clone())).collect())?;
            let rows = converter.convert_columns(spine_keys)?;
            let mut map: HashMap<Box<[u8]>, u32> = HashMap::with_capacity(n / 4);
            for i in 0..n {
                if spine_keys.iter().any(|k| k.is_null(i)) {
                    spine_ids.push(NO_ENTITY);
                    continue;
                }
                let bytes = rows.row(i);
                let id = match map.get(bytes.as_ref()) {
                    Some(&id) => id,
                    None => {
                        map.insert(bytes.as_ref().into(), next);
                        next += 1;
                        next - 1
                    }
                };
                spine_ids.push(id);
            }
            Kind::Rows { converter, map }
        };
        Ok(EntityIndex { kind, spine_ids, n_entities: next })
    }

    /// Writes the entity id of each feature row into `out` ([`NO_ENTITY`] for keys not
    /// in the spine). `keys` must have the spine keys' types and `out` their length.
    ///
    /// # Errors
    /// When Arrow cannot encode the key types.
    pub fn lookup(&self, keys: &[ArrayRef], out: &mut [u32]) -> Result<()> {
        let n = keys.first().map_or(0, |a| a.len());
        assert_eq!(out.len(), n, "one id per feature row");
        match &self.kind {
            Kind::Int(map) => {
                let values = keys[0].as_primitive::<Int64Type>();
                let find = |v: &i64| map.get(v).copied().unwrap_or(NO_ENTITY);
                if values.null_count() == 0 {
                    for (slot, v) in out.iter_mut().zip(values.values().iter()) {
                        *slot = find(v);
                    }
                } else {
                    for (i, slot) in out.iter_mut().enumerate() {
                        *slot = if values.is_null(i) { NO_ENTITY } else { find(&values.value(i)) };
                    }
                }
            }
            Kind::Rows { converter, map } => {
                let rows = converter.convert_columns(keys)?;
                for (i, slot) in out.iter_mut().enumerate() {
                    *slot = if keys.iter().any(|k| k.is_null(i)) {
                        NO_ENTITY
                    } else {
                        map.get(rows.row(i).as_ref()).copied().unwrap_or(NO_ENTITY)
                    };
                }
            }
        }
        Ok(())
    }
}
