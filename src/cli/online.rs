//! `quiver online --features ... --entity KEY=VALUE... [--request NAME=VALUE...]
//! [--request-null NAME...]`: one lookup from the shell.

use quiver::runtime::encoding::{KeyValue, Value};

use super::{Ctx, runtime};

/// Look up online features for one entity.
#[derive(Debug, clap::Args)]
#[command(group(clap::ArgGroup::new("asked").required(true).args(["features", "service"])))]
pub struct Online {
    /// `view:feature` references, comma separated.
    #[arg(long, value_delimiter = ',')]
    features: Vec<String>,
    /// A feature service's name, instead of `--features`.
    #[arg(long)]
    service: Option<String>,
    /// A join key value, KEY=VALUE; repeat for composite keys.
    #[arg(long = "entity", required = true)]
    entities: Vec<String>,
    /// A request field of the on-demand features asked for, NAME=VALUE (text as is for
    /// a string field, JSON otherwise); repeat for each.
    #[arg(long = "request")]
    request: Vec<String>,
    /// A request field sent as null (for a string field, `--request NAME=null` sends
    /// the text "null"); repeat for each.
    #[arg(long = "request-null", value_name = "NAME")]
    request_null: Vec<String>,
}

impl Online {
    pub fn run(self, ctx: &Ctx) -> anyhow::Result<()> {
        let repo = ctx.open()?;
        let defs = repo.applied()?.definitions;
        let mut columns = Vec::new();
        for e in &self.entities {
            let Some((name, text)) = e.split_once('=') else {
                anyhow::bail!("--entity `{e}`: expected KEY=VALUE");
            };
            if columns.iter().any(|(given, _)| given == name) {
                anyhow::bail!("--entity `{name}` is given twice");
            }
            let key_type = defs
                .feature_views
                .iter()
                .flat_map(|v| defs.join_keys(v))
                .find(|k| k.name == name)
                .map(|k| k.dtype)
                .ok_or_else(|| anyhow::anyhow!("--entity `{e}`: `{name}` is not a join key of any feature view"))?;
            let value = match key_type {
                quiver::sdk::KeyType::Int64 => KeyValue::Int(
                    text.parse().map_err(|_| anyhow::anyhow!("--entity `{e}`: `{name}` is int64, `{text}` is not an integer"))?,
                ),
                quiver::sdk::KeyType::String => KeyValue::Str(text.to_string()),
            };
            columns.push((name.to_string(), vec![value]));
        }
        let mut fields: Vec<(String, Vec<serde_json::Value>)> = Vec::new();
        let given =
            self.request.iter().map(|r| ("--request", r.as_str())).chain(self.request_null.iter().map(|n| ("--request-null", n.as_str())));
        for (option, r) in given {
            let (name, text) = match (option, r.split_once('=')) {
                ("--request", Some((name, text))) => (name, Some(text)),
                ("--request", None) => anyhow::bail!("--request `{r}`: expected NAME=VALUE"),
                _ => (r, None),
            };
            let dtype = defs
                .on_demand_views
                .iter()
                .flat_map(|v| &v.request)
                .find(|f| f.name == name)
                .map(|f| f.dtype)
                .ok_or_else(|| anyhow::anyhow!("{option} `{r}`: `{name}` is not a request field of any on-demand view"))?;
            if fields.iter().any(|(given, _)| given == name) {
                anyhow::bail!("{option} `{name}` is given twice");
            }
            // Text that is not JSON is a string; a wrong type is refused by the lookup,
            // in the words every front end uses.
            let value = match (text, dtype) {
                (None, _) => serde_json::Value::Null,
                (Some(text), quiver::sdk::DType::String) => serde_json::Value::String(text.to_string()),
                (Some(text), _) => serde_json::from_str(text).unwrap_or_else(|_| serde_json::Value::String(text.to_string())),
            };
            fields.push((name.to_string(), vec![value]));
        }
        let n_keys = columns.len();
        let rt = runtime()?;
        let lookup = repo.lookup(columns).with_columns(fields).with_full_names(true);
        let lookup = match self.service {
            Some(service) => lookup.with_service(service),
            None => lookup.with_features(self.features),
        };
        let result = rt.block_on(async { lookup.await })?;
        for column in result.iter().skip(n_keys) {
            println!(
                "{:<36} {:<24} {:<16} {}",
                column.name,
                show_value(&column.values[0]),
                column.statuses[0].as_str(),
                column.event_ts[0].map(quiver::sdk::types::format_instant).unwrap_or_default()
            );
        }
        Ok(())
    }
}

fn show_value(v: &Value) -> String {
    match v {
        Value::Null => "null".into(),
        Value::Int32(x) => x.to_string(),
        Value::Int64(x) => x.to_string(),
        Value::Float32(x) => format!("{x:?}"),
        Value::Float64(x) => format!("{x:?}"),
        Value::Bool(x) => x.to_string(),
        Value::String(x) => format!("{x:?}"),
        Value::Bytes(x) => format!("<{} bytes>", x.len()),
        Value::Timestamp(x) => quiver::sdk::types::format_instant(*x),
        Value::ListInt64(x) => format!("{x:?}"),
        Value::ListFloat32(x) => format!("{x:?}"),
        Value::ListFloat64(x) => format!("{x:?}"),
        Value::ListString(x) => format!("{x:?}"),
    }
}
