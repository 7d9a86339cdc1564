//! `quiver init DIR [--demo]`.

use std::path::PathBuf;

use super::Ctx;

/// Create a new feature repository in DIR.
#[derive(Debug, clap::Args)]
pub struct Init {
    dir: PathBuf,
    /// Add demo definitions (drivers and customers) and sample Parquet data.
    #[arg(long)]
    demo: bool,
}

impl Init {
    pub fn run(self, _ctx: &Ctx) -> anyhow::Result<()> {
        let Init { dir, demo } = self;
        let files = quiver::init(&dir, demo, chrono::Utc::now())?;
        println!(
            "created {}repository `{}` in {} ({} files)",
            if demo { "demo " } else { "" },
            quiver::project_name(&dir),
            dir.display(),
            files.len()
        );
        if demo {
            println!("next: cd {} && quiver apply && quiver list", dir.display());
        } else {
            println!("next: define features in {}/features.yaml, then `quiver apply`", dir.display());
        }
        Ok(())
    }
}
