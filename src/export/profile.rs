//! A training set's profile and vocabularies, built as its shards are written
//! (docs/monitoring.md, docs/export.md#the-pytorch-loader).

use std::collections::BTreeMap;

use crate::monitor::profile::{Profile, ProfileDoc};
use arrow::array::{AsArray, RecordBatch};
use quiver_sdk::Definitions;

use super::{ManifestFeature, VOCABULARY_LIMIT};

/// The profile of a training set's features and the vocabularies of its string
/// columns, built shard by shard.
pub(super) struct TrainingProfile {
    /// Per feature: its reference, output column and type (`None`: not profiled).
    columns: Vec<(String, String, Option<quiver_sdk::DType>)>,
    profiles: Vec<Profile>,
    /// Per string column: its distinct values, `None` once past [`VOCABULARY_LIMIT`].
    vocabularies: BTreeMap<String, Option<std::collections::BTreeSet<String>>>,
}

impl TrainingProfile {
    pub(super) fn new(defs: &Definitions, features: &[ManifestFeature]) -> TrainingProfile {
        let columns: Vec<_> = features
            .iter()
            .map(|f| {
                let dtype = f.reference.parse().ok().and_then(|r| defs.feature_dtype(&r));
                (f.reference.clone(), f.column.clone(), dtype)
            })
            .collect();
        TrainingProfile { profiles: vec![Profile::default(); columns.len()], columns, vocabularies: BTreeMap::new() }
    }

    pub(super) fn add(&mut self, batch: &RecordBatch) {
        for ((_, column, dtype), profile) in self.columns.iter().zip(&mut self.profiles) {
            if let (Some(dtype), Some(array)) = (dtype, batch.column_by_name(column)) {
                profile.add_array(array.as_ref(), *dtype);
            }
        }
        for (field, array) in batch.schema().fields().iter().zip(batch.columns()) {
            // Every string layout a spine may bring (Utf8, LargeUtf8, Utf8View).
            let strings: Box<dyn Iterator<Item = Option<&str>>> = if let Some(s) = array.as_string_opt::<i32>() {
                Box::new(s.iter())
            } else if let Some(s) = array.as_string_opt::<i64>() {
                Box::new(s.iter())
            } else if let Some(s) = array.as_string_view_opt() {
                Box::new(s.iter())
            } else {
                continue;
            };
            let entry = self.vocabularies.entry(field.name().clone()).or_insert_with(|| Some(Default::default()));
            if let Some(set) = entry {
                for value in strings.flatten() {
                    if !set.contains(value) {
                        set.insert(value.to_string());
                    }
                }
                if set.len() > VOCABULARY_LIMIT {
                    *entry = None;
                }
            }
        }
    }

    pub(super) fn finish(self) -> (BTreeMap<String, ProfileDoc>, BTreeMap<String, Vec<String>>) {
        let profile = self
            .columns
            .into_iter()
            .zip(self.profiles)
            .filter(|((_, _, t), _)| t.is_some())
            .map(|((r, _, _), p)| (r, (&p).into()))
            .collect();
        let vocabularies = self.vocabularies.into_iter().filter_map(|(c, v)| Some((c, v?.into_iter().collect()))).collect();
        (profile, vocabularies)
    }
}
