//! The spine of a join or an export (docs/offline.md, docs/export.md#without-a-spine):
//! the one type every front end builds, whichever options it spells it with.

use std::collections::BTreeMap;
use std::path::PathBuf;

use arrow::array::RecordBatch;
use arrow::datatypes::DataType;
use quiver_offline::historical::{self, MadeSpine};

use crate::error::Result;
use crate::repo::Repo;

/// The entity dataframe of a join: a file (Parquet or CSV), rows in memory, or made
/// from the offline store.
#[derive(Debug, Clone, PartialEq)]
pub enum Spine {
    File(PathBuf),
    /// Rows in memory, and the name errors call them by (`entity_df`).
    Batch(RecordBatch, String),
    /// Made from the offline store: every entity as of a time, or every row of a view.
    Made(MadeSpine),
}

impl Spine {
    pub fn file(path: impl Into<PathBuf>) -> Spine {
        Spine::File(path.into())
    }

    /// Where the spine came from, for messages and the manifest.
    pub(crate) fn label(&self) -> String {
        match self {
            Spine::File(p) => p.display().to_string(),
            Spine::Batch(_, name) => name.clone(),
            Spine::Made(made) => made.describe(),
        }
    }

    /// The rows, read as the join keys' types where the spine is a file, made from the
    /// tables of `joined` (at `versions`) where it is made.
    pub(crate) async fn read(
        self,
        repo: &Repo,
        defs: &quiver_sdk::Definitions,
        key_types: &[(String, DataType)],
        joined: &[&quiver_sdk::FeatureView],
        versions: &BTreeMap<String, u64>,
    ) -> Result<RecordBatch> {
        match self {
            Spine::File(path) => Ok(historical::read_spine(&path, key_types)?),
            Spine::Batch(batch, _) => Ok(batch),
            Spine::Made(made) => Ok(made.make(&repo.config, defs, joined, versions).await?),
        }
    }
}

impl From<PathBuf> for Spine {
    fn from(path: PathBuf) -> Spine {
        Spine::File(path)
    }
}

impl From<&str> for Spine {
    fn from(path: &str) -> Spine {
        Spine::File(path.into())
    }
}

impl From<String> for Spine {
    fn from(path: String) -> Spine {
        Spine::File(path.into())
    }
}

impl From<&std::path::Path> for Spine {
    fn from(path: &std::path::Path) -> Spine {
        Spine::File(path.into())
    }
}

impl From<&PathBuf> for Spine {
    fn from(path: &PathBuf) -> Spine {
        Spine::File(path.clone())
    }
}

impl From<MadeSpine> for Spine {
    fn from(made: MadeSpine) -> Spine {
        Spine::Made(made)
    }
}
