//! The plan: new definitions diffed against the applied ones, per object and per field.

use std::fmt;

use serde::Serialize;
use serde_json::Value;

use super::{Kept, ObjectKind};
use crate::definitions::Definitions;

/// One changed field of an object: its path (`ttl`, `features[trips].dtype`) and the old
/// and new JSON values (`None` when the field was absent).
#[derive(Debug, Clone, PartialEq)]
pub struct FieldChange {
    pub path: String,
    pub old: Option<Value>,
    pub new: Option<Value>,
}

/// What happened to an object.
#[derive(Debug, Clone, PartialEq)]
pub enum ChangeOp {
    Added,
    Removed,
    Changed(Vec<FieldChange>),
}

/// A change to one object.
#[derive(Debug, Clone, PartialEq)]
pub struct Change {
    pub kind: ObjectKind,
    pub name: String,
    pub op: ChangeOp,
}

impl Change {
    pub(super) fn key(&self) -> String {
        format!("{}/{}", self.kind, self.name)
    }

    /// `+ feature_view driver_hourly`, `~ entity driver (join_keys[driver_id].dtype)`.
    pub fn summary(&self) -> String {
        match &self.op {
            ChangeOp::Added => format!("+ {} {}", self.kind, self.name),
            ChangeOp::Removed => format!("- {} {}", self.kind, self.name),
            ChangeOp::Changed(fields) => {
                let paths: Vec<&str> = fields.iter().map(|f| f.path.as_str()).collect();
                format!("~ {} {} ({})", self.kind, self.name, paths.join(", "))
            }
        }
    }
}

/// The difference between the applied definitions and new ones.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Plan {
    pub changes: Vec<Change>,
    /// Objects the new definitions lack that stay, defined by another front end.
    pub kept: Vec<Kept>,
    /// Views a breaking change gives a new version beside the previous one
    /// (docs/versions.md).
    pub versions: Vec<super::NewVersion>,
}

impl Plan {
    pub fn is_empty(&self) -> bool {
        self.changes.is_empty()
    }

    /// Counts of (added, changed, removed) objects.
    pub fn counts(&self) -> (usize, usize, usize) {
        let mut c = (0, 0, 0);
        for ch in &self.changes {
            match ch.op {
                ChangeOp::Added => c.0 += 1,
                ChangeOp::Changed(_) => c.1 += 1,
                ChangeOp::Removed => c.2 += 1,
            }
        }
        c
    }
}

fn show(v: &Option<Value>) -> String {
    match v {
        None => "(absent)".to_string(),
        Some(v) => v.to_string(),
    }
}

impl fmt::Display for Plan {
    /// One line per object, then one indented line per changed field.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for change in &self.changes {
            match &change.op {
                ChangeOp::Added => writeln!(f, "+ {} {}", change.kind, change.name)?,
                ChangeOp::Removed => writeln!(f, "- {} {}", change.kind, change.name)?,
                ChangeOp::Changed(fields) => {
                    writeln!(f, "~ {} {}", change.kind, change.name)?;
                    for field in fields {
                        match (&field.old, &field.new) {
                            (None, Some(new)) => writeln!(f, "    {}: added {}", field.path, new)?,
                            (Some(old), None) => writeln!(f, "    {}: removed (was {})", field.path, old)?,
                            _ => writeln!(f, "    {}: {} -> {}", field.path, show(&field.old), show(&field.new))?,
                        }
                    }
                }
            }
        }
        for v in &self.versions {
            writeln!(f, "^ {v}")?;
        }
        for k in &self.kept {
            let from = k.origin.as_deref().map_or_else(|| "before origins were recorded".to_string(), |o| format!("from {o}"));
            writeln!(f, "= {} {} (kept: defined {from}; `--remove {}/{}` removes it)", k.kind, k.name, k.kind, k.name)?;
        }
        let (a, c, r) = self.counts();
        write!(f, "{a} to add, {c} to change, {r} to remove")?;
        if !self.kept.is_empty() {
            write!(f, ", {} kept (defined elsewhere)", self.kept.len())?;
        }
        Ok(())
    }
}

fn objects_of(defs: &Definitions) -> Vec<(ObjectKind, String, Value)> {
    fn json<T: Serialize>(t: &T) -> Value {
        serde_json::to_value(t).expect("definitions serialise to JSON")
    }
    let mut out = Vec::new();
    for e in &defs.entities {
        out.push((ObjectKind::Entity, e.name.clone(), json(e)));
    }
    for v in &defs.feature_views {
        out.push((ObjectKind::FeatureView, v.name.clone(), json(v)));
    }
    for s in &defs.feature_services {
        out.push((ObjectKind::FeatureService, s.name.clone(), json(s)));
    }
    for v in &defs.on_demand_views {
        out.push((ObjectKind::OnDemandView, v.name.clone(), json(v)));
    }
    out
}

/// An array whose elements are all objects with a string `name` (features, join keys)
/// is diffed by name; any other array as a whole.
fn named_items(items: &[Value]) -> Option<Vec<(&str, &Value)>> {
    items.iter().map(|v| v.get("name").and_then(Value::as_str).map(|n| (n, v))).collect()
}

fn diff_values(path: &str, old: &Value, new: &Value, out: &mut Vec<FieldChange>) {
    let join = |key: &str| {
        if path.is_empty() { key.to_string() } else { format!("{path}.{key}") }
    };
    match (old, new) {
        (Value::Object(a), Value::Object(b)) => {
            let mut keys: Vec<&String> = a.keys().chain(b.keys()).collect();
            keys.sort();
            keys.dedup();
            for key in keys {
                let p = join(key);
                match (a.get(key), b.get(key)) {
                    (Some(x), Some(y)) => diff_values(&p, x, y, out),
                    (x, y) => out.push(FieldChange { path: p, old: x.cloned(), new: y.cloned() }),
                }
            }
        }
        (Value::Array(a), Value::Array(b)) if a != b => {
            match (named_items(a), named_items(b)) {
                (Some(na), Some(nb)) => {
                    let before = out.len();
                    for (name, x) in &na {
                        let p = format!("{path}[{name}]");
                        match nb.iter().find(|(n, _)| n == name) {
                            Some((_, y)) => diff_values(&p, x, y, out),
                            None => out.push(FieldChange { path: p, old: Some((*x).clone()), new: None }),
                        }
                    }
                    for (name, y) in &nb {
                        if !na.iter().any(|(n, _)| n == name) {
                            out.push(FieldChange { path: format!("{path}[{name}]"), old: None, new: Some((*y).clone()) });
                        }
                    }
                    if out.len() == before {
                        // Same items, another order: the order is the change.
                        let names = |items: &[(&str, &Value)]| Value::from(items.iter().map(|(n, _)| *n).collect::<Vec<_>>());
                        out.push(FieldChange { path: format!("{path} (order)"), old: Some(names(&na)), new: Some(names(&nb)) });
                    }
                }
                _ => out.push(FieldChange { path: path.to_string(), old: Some(old.clone()), new: Some(new.clone()) }),
            }
        }
        _ if old != new => out.push(FieldChange { path: path.to_string(), old: Some(old.clone()), new: Some(new.clone()) }),
        _ => {}
    }
}

/// The per-field difference from `old` to `new`: added objects, changed objects with
/// each changed field, removed objects, in kind order then name order.
pub fn diff(old: &Definitions, new: &Definitions) -> Plan {
    let before = objects_of(old);
    let after = objects_of(new);
    let mut changes = Vec::new();
    for (kind, name, new_value) in &after {
        match before.iter().find(|(k, n, _)| k == kind && n == name) {
            None => changes.push(Change { kind: *kind, name: name.clone(), op: ChangeOp::Added }),
            Some((_, _, old_value)) => {
                let mut fields = Vec::new();
                diff_values("", old_value, new_value, &mut fields);
                if !fields.is_empty() {
                    changes.push(Change { kind: *kind, name: name.clone(), op: ChangeOp::Changed(fields) });
                }
            }
        }
    }
    for (kind, name, _) in &before {
        if !after.iter().any(|(k, n, _)| k == kind && n == name) {
            changes.push(Change { kind: *kind, name: name.clone(), op: ChangeOp::Removed });
        }
    }
    changes.sort_by(|a, b| (a.kind, &a.name).cmp(&(b.kind, &b.name)));
    Plan { changes, kept: Vec::new(), versions: Vec::new() }
}
