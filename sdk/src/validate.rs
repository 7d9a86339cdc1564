//! Validation of a whole [`Definitions`]: names, duplicates, cross references, key types
//! and column clashes. The first problem found is reported, as one line.

use std::collections::{BTreeMap, BTreeSet};

use crate::definitions::{Definitions, known};
use crate::error::DefinitionError;

/// The longest window: ten years.
const MAX_WINDOW_SECS: u64 = 3650 * 86_400;

/// Names become column names (`view__feature`), Delta table folders and Redis key parts,
/// so they are plain identifiers.
fn check_name(kind: &'static str, name: &str) -> Result<(), DefinitionError> {
    let bad = |reason| DefinitionError::BadName { kind, name: name.to_string(), reason };
    let mut chars = name.chars();
    match chars.next() {
        None => return Err(bad("empty (expected a name)")),
        Some(c) if !(c.is_ascii_alphabetic() || c == '_') => {
            return Err(bad("must start with a letter or `_`"));
        }
        _ => {}
    }
    if !chars.all(|c| c.is_ascii_alphanumeric() || c == '_') {
        return Err(bad("only letters, digits and `_` are allowed"));
    }
    if name.to_ascii_lowercase().starts_with("_quiver") {
        return Err(bad("names starting with `_quiver` are reserved for quiver's own columns"));
    }
    Ok(())
}

fn no_duplicates<'a>(kind: &'static str, scope: &str, names: impl Iterator<Item = &'a str>) -> Result<(), DefinitionError> {
    let mut seen = BTreeSet::new();
    for name in names {
        if !seen.insert(name) {
            return Err(DefinitionError::Duplicate { kind, name: name.to_string(), scope: scope.to_string() });
        }
    }
    Ok(())
}

/// How [`Definitions::validate_with`] checks the features services reference.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Services {
    /// Every reference names a feature of the version it reads.
    Checked,
    /// Only what the definitions alone can answer ([`Definitions::validate_unmerged`]).
    Deferred,
}

impl Definitions {
    /// Checks the definitions as a whole.
    ///
    /// # Errors
    /// The first [`DefinitionError`] found: a bad or duplicate name, an entity without
    /// join keys, a view naming an unknown entity, a join key with two types, a column
    /// that is both a key and a feature, a service naming a missing view or feature.
    ///
    /// ```
    /// use quiver_sdk::{Definitions, FeatureService};
    /// let defs = Definitions::default()
    ///     .with_feature_service(FeatureService::new("ranker").with_feature("nope", "x"));
    /// let err = defs.validate().unwrap_err().to_string();
    /// assert!(err.contains("unknown feature view `nope`"), "{err}");
    /// ```
    pub fn validate(&self) -> Result<(), DefinitionError> {
        self.validate_with(Services::Checked)
    }

    /// As [`Definitions::validate`], but a feature service's references are checked
    /// only where these definitions alone can answer: a reference to a version they do
    /// not hold, or to a feature the view's latest version lacks, is left to the check
    /// of the definitions as the registry will hold them — the registry may pin it to a
    /// version that has the feature (docs/versions.md#services-and-on-demand-views-are-pinned).
    /// `apply` and `plan` check the definitions of a file this way, then
    /// [`Definitions::validate`] what they would record.
    ///
    /// # Errors
    /// As [`Definitions::validate`], less those references.
    pub fn validate_unmerged(&self) -> Result<(), DefinitionError> {
        self.validate_with(Services::Deferred)
    }

    fn validate_with(&self, services: Services) -> Result<(), DefinitionError> {
        // A reference to a version these definitions do not hold — a file pinning a
        // version the registry holds — is checked against the view's latest; `apply`
        // checks the version itself against the registry ([`Definitions::check_versions`]).
        let unpinned;
        let defs = match self.without_unknown_versions() {
            Some(d) => {
                unpinned = d;
                &unpinned
            }
            None => self,
        };
        defs.check_entities()?;
        defs.check_views()?;
        defs.check_on_demand_views()?;
        defs.check_services(services)?;
        defs.check_monitoring()
    }

    /// Every reference to a version (`view@N:feature` of a service, `view@N` input of an
    /// on-demand view, of any live version) names a live version (docs/versions.md).
    ///
    /// # Errors
    /// [`DefinitionError::UnknownVersion`] naming who refers to it and the live ones.
    pub fn check_versions(&self) -> Result<(), DefinitionError> {
        for s in &self.feature_services {
            for r in s.features.iter().filter(|r| r.version.is_some()) {
                if let Some(missing) = self.missing_version(&r.view_name()) {
                    return Err(DefinitionError::UnknownVersion { by: format!("feature service `{}`", s.name), reason: missing.0 });
                }
            }
        }
        for o in self.on_demand_views.iter().chain(&self.earlier_versions.on_demand_views) {
            for input in &o.inputs {
                if let Some(missing) = self.missing_version(input) {
                    return Err(DefinitionError::UnknownVersion {
                        by: format!("on-demand view `{}`", o.versioned_name()),
                        reason: missing.0,
                    });
                }
            }
        }
        Ok(())
    }

    /// These definitions with each reference to a version they do not hold made a
    /// reference to the view's latest; `None` when there is none.
    fn without_unknown_versions(&self) -> Option<Definitions> {
        let unknown = |name: &str| self.missing_version(name).is_some();
        let any = self.feature_services.iter().flat_map(|s| &s.features).any(|r| r.version.is_some() && unknown(&r.view_name()))
            || self.on_demand_views.iter().flat_map(|o| &o.inputs).any(|i| unknown(i));
        if !any {
            return None;
        }
        let mut out = self.clone();
        for r in out.feature_services.iter_mut().flat_map(|s| &mut s.features) {
            if r.version.is_some() && unknown(&r.view_name()) {
                r.version = None;
            }
        }
        for input in out.on_demand_views.iter_mut().flat_map(|o| &mut o.inputs) {
            if unknown(input) {
                *input = crate::definitions::split_version(input).map_or_else(|| input.clone(), |(name, _)| name.to_string());
            }
        }
        Some(out)
    }

    /// On-demand views (docs/transformations.md): names, inputs defined before them,
    /// request fields, and every expression compiled against what it may read.
    fn check_on_demand_views(&self) -> Result<(), DefinitionError> {
        no_duplicates("on-demand view", "", self.on_demand_views.iter().map(|v| v.name.as_str()))?;
        for (at, view) in self.on_demand_views.iter().enumerate() {
            let bad = |reason: String| DefinitionError::OnDemand { view: view.name.clone(), reason };
            check_name("on-demand view", &view.name)?;
            if view.name.contains("__") {
                return Err(DefinitionError::BadName {
                    kind: "on-demand view",
                    name: view.name.clone(),
                    reason: "`__` separates view and feature in column names",
                });
            }
            if self.feature_view(&view.name).is_some() {
                return Err(bad("a feature view has the same name (`view:feature` must name one of them)".into()));
            }
            if view.features.is_empty() {
                return Err(bad("no features (expected at least one {name, dtype, expr})".into()));
            }
            let scope = format!(" in on-demand view `{}`", view.name);
            no_duplicates("input", &scope, view.inputs.iter().map(|i| i.as_str()))?;
            for input in &view.inputs {
                let plain = crate::definitions::split_version(input).map_or(input.as_str(), |(name, _)| name);
                let earlier = self.on_demand_views[..at].iter().any(|o| o.name == plain);
                if self.feature_view(input).is_none() && !earlier {
                    let reason = if self.on_demand_view(input).is_some() {
                        format!("input `{input}` is an on-demand view defined after it, or itself (define it first)")
                    } else {
                        let views = self.feature_views.iter().map(|v| v.name.as_str());
                        let demand = self.on_demand_views[..at].iter().map(|v| v.name.as_str());
                        format!("unknown input `{input}` (known: {})", known(views.chain(demand)))
                    };
                    return Err(bad(reason));
                }
            }
            // An input's rows' event time is `input.event_timestamp` in an expression.
            for input in &view.inputs {
                if let Some(v) = self.feature_view(input)
                    && !v.is_event_log()
                    && v.served_feature(crate::on_demand::EVENT_TIMESTAMP).is_some()
                {
                    return Err(bad(format!(
                        "input `{input}` has a feature named `event_timestamp`, the name of its rows' event time in an expression (rename the feature)"
                    )));
                }
            }
            no_duplicates("request field", &scope, view.request.iter().map(|f| f.name.as_str()))?;
            let keys = crate::on_demand::keys(self, view);
            for field in &view.request {
                check_name("request field", &field.name)?;
                if field.name == crate::on_demand::REQUEST_TIME {
                    return Err(bad("a request field cannot be called `request_time` (the request's own time has that name)".into()));
                }
            }
            // A request field may share a name with an input's feature (`amount` beside
            // `stats.amount`: the bare name is the field), never with a join key, its own
            // or one of an on-demand view it reads.
            for field in crate::on_demand::request_fields(self, view) {
                if keys.iter().any(|k| k.name == field.name) {
                    return Err(bad(format!("request field `{}` is a join key of its inputs", field.name)));
                }
                if let Some(other) = view.request.iter().find(|f| f.name == field.name && f.dtype != field.dtype) {
                    return Err(bad(format!(
                        "request field `{}` is {} here but {} in an on-demand view it reads",
                        other.name, other.dtype, field.dtype
                    )));
                }
            }
            no_duplicates("feature", &scope, view.features.iter().map(|f| f.name.as_str()))?;
            for feature in &view.features {
                check_name("feature", &feature.name)?;
            }
            crate::on_demand::program(self, view).map_err(|e| DefinitionError::BadExpression {
                view: view.name.clone(),
                feature: e.feature,
                expr: e.expr,
                reason: e.reason,
            })?;
        }
        Ok(())
    }

    /// Entities and the one type of each join key.
    fn check_entities(&self) -> Result<(), DefinitionError> {
        no_duplicates("entity", "", self.entities.iter().map(|e| e.name.as_str()))?;
        let mut key_types: BTreeMap<&str, (&str, crate::KeyType)> = BTreeMap::new();
        for entity in &self.entities {
            check_name("entity", &entity.name)?;
            if entity.join_keys.is_empty() {
                return Err(DefinitionError::NoJoinKeys { entity: entity.name.clone() });
            }
            let scope = format!(" in entity `{}`", entity.name);
            no_duplicates("join key", &scope, entity.join_keys.iter().map(|k| k.name.as_str()))?;
            for key in &entity.join_keys {
                check_name("join key", &key.name)?;
                match key_types.get(key.name.as_str()) {
                    Some((first, t)) if *t != key.dtype => {
                        return Err(DefinitionError::KeyTypeClash {
                            key: key.name.clone(),
                            first_entity: first.to_string(),
                            first_type: t.to_string(),
                            entity: entity.name.clone(),
                            dtype: key.dtype.to_string(),
                        });
                    }
                    Some(_) => {}
                    None => {
                        key_types.insert(&key.name, (&entity.name, key.dtype));
                    }
                }
            }
        }
        Ok(())
    }

    fn check_views(&self) -> Result<(), DefinitionError> {
        no_duplicates("feature view", "", self.feature_views.iter().map(|v| v.name.as_str()))?;
        for view in &self.feature_views {
            check_name("feature view", &view.name)?;
            if view.name.contains("__") {
                return Err(DefinitionError::BadName {
                    kind: "feature view",
                    name: view.name.clone(),
                    reason: "`__` separates view and feature in column names",
                });
            }
            if view.entities.is_empty() {
                return Err(DefinitionError::EmptyView { view: view.name.clone(), what: "entities" });
            }
            if view.features.is_empty() {
                return Err(DefinitionError::EmptyView { view: view.name.clone(), what: "features" });
            }
            let scope = format!(" in feature view `{}`", view.name);
            no_duplicates("entity", &scope, view.entities.iter().map(|e| e.as_str()))?;
            for entity in &view.entities {
                if self.entity(entity).is_none() {
                    return Err(DefinitionError::UnknownEntity {
                        view: view.name.clone(),
                        entity: entity.clone(),
                        known: known(self.entities.iter().map(|e| e.name.as_str())),
                    });
                }
            }
            no_duplicates("feature", &scope, view.features.iter().map(|f| f.name.as_str()))?;
            for feature in &view.features {
                check_name("feature", &feature.name)?;
            }
            self.check_columns(view)?;
            self.check_write_time(view)?;
            self.check_aggregations(view)?;
            if let Some(stream) = &view.source.stream
                && stream.topic.trim().is_empty()
            {
                return Err(DefinitionError::EmptyTopic { view: view.name.clone() });
            }
        }
        Ok(())
    }

    /// Services name existing views and features, each once.
    fn check_services(&self, services: Services) -> Result<(), DefinitionError> {
        no_duplicates("feature service", "", self.feature_services.iter().map(|s| s.name.as_str()))?;
        for service in &self.feature_services {
            check_name("feature service", &service.name)?;
            if service.features.is_empty() {
                return Err(DefinitionError::EmptyService { service: service.name.clone() });
            }
            let refs: Vec<String> = service.features.iter().map(|r| r.to_string()).collect();
            let scope = format!(" in feature service `{}`", service.name);
            no_duplicates("feature reference", &scope, refs.iter().map(|r| r.as_str()))?;
            for (reference, text) in service.features.iter().zip(&refs) {
                let deferred = services == Services::Deferred && reference.version.is_none();
                if let Some(demand) = self.on_demand_view(&reference.view_name()) {
                    if demand.feature(&reference.feature).is_none() && !deferred {
                        return Err(DefinitionError::UnknownFeature {
                            service: service.name.clone(),
                            reference: text.clone(),
                            view: demand.name.clone(),
                            known: known(demand.features.iter().map(|f| f.name.as_str())),
                        });
                    }
                    continue;
                }
                let Some(view) = self.feature_view(&reference.view_name()) else {
                    return Err(DefinitionError::UnknownView {
                        service: service.name.clone(),
                        view: reference.view_name(),
                        known: known(
                            self.feature_views.iter().map(|v| v.name.as_str()).chain(self.on_demand_views.iter().map(|v| v.name.as_str())),
                        ),
                    });
                };
                if view.served_feature(&reference.feature).is_none() && !deferred {
                    return Err(DefinitionError::UnknownFeature {
                        service: service.name.clone(),
                        reference: text.clone(),
                        view: view.name.clone(),
                        known: known(view.served_features().iter().map(|f| f.name.as_str())),
                    });
                }
            }
        }
        Ok(())
    }

    /// The columns of a view's table — join keys, timestamps, features — are distinct.
    fn check_columns(&self, view: &crate::FeatureView) -> Result<(), DefinitionError> {
        let clash = |column: &str, reason| DefinitionError::ColumnClash { view: view.name.clone(), column: column.to_string(), reason };
        let keys = self.join_keys(view);
        let is_key = |c: &str| keys.iter().any(|k| k.name == c);
        let ts = view.source.timestamp_field.as_str();
        check_name("timestamp field", ts)?;
        if is_key(ts) {
            return Err(clash(ts, "is both a join key and the timestamp field"));
        }
        if let Some(created) = view.source.created_timestamp_field.as_deref() {
            check_name("created timestamp field", created)?;
            if created == ts {
                return Err(clash(created, "is both the timestamp and the created timestamp field"));
            }
            if is_key(created) {
                return Err(clash(created, "is both a join key and the created timestamp field"));
            }
        }
        for feature in &view.features {
            let name = feature.name.as_str();
            if is_key(name) {
                return Err(clash(name, "is both a join key and a feature"));
            }
            if name == ts || Some(name) == view.source.created_timestamp_field.as_deref() {
                return Err(clash(name, "is both a timestamp field and a feature"));
            }
        }
        Ok(())
    }

    /// Write-time expressions (docs/transformations.md#write-time): raw columns that are
    /// neither features, keys nor times, each read by something, and the filter and
    /// every expression compiled against the raw row.
    fn check_write_time(&self, view: &crate::FeatureView) -> Result<(), DefinitionError> {
        let bad = |reason: String| DefinitionError::WriteTime { view: view.name.clone(), reason };
        let raw = &view.source.raw;
        no_duplicates("raw column", &format!(" in feature view `{}`", view.name), raw.iter().map(|f| f.name.as_str()))?;
        let keys = self.join_keys(view);
        for column in raw {
            check_name("raw column", &column.name)?;
            let name = column.name.as_str();
            if !column.expr.is_empty() {
                return Err(bad(format!(
                    "raw column `{name}` has an `expr` (raw columns are read as they come; compute a feature instead)"
                )));
            }
            // A feature computed from a raw column may have its name (`country:
            // lower(country)`); one stored as it comes is read from its own column.
            if view.features.iter().any(|f| f.name == name && f.expr.is_empty()) {
                return Err(bad(format!(
                    "raw column `{name}` is named like a feature without `expr` (such a feature is read from its own column: leave it out of `raw`)"
                )));
            }
            if keys.iter().any(|k| k.name == name) {
                return Err(bad(format!("raw column `{name}` is a join key (join keys are read and stored as they come)")));
            }
            if name == view.source.timestamp_field || Some(name) == view.source.created_timestamp_field.as_deref() {
                return Err(bad(format!("raw column `{name}` is a timestamp field (timestamps are read and stored as they come)")));
            }
        }
        if let Some(filter) = &view.source.filter
            && filter.trim().is_empty()
        {
            return Err(bad("`source.filter` is empty (remove it, or write a boolean expression)".into()));
        }
        if !raw.is_empty() && !view.has_write_expressions() {
            return Err(bad("it declares raw columns but no `source.filter` or feature `expr` reads them".into()));
        }
        crate::write_time::compile(self, view).map_err(|e| {
            let filter = e.feature == crate::write_time::FILTER;
            DefinitionError::BadWriteExpression {
                view: view.name.clone(),
                what: if filter { "source filter".into() } else { format!("feature `{}`", e.feature) },
                expr: e.expr,
                reason: if filter {
                    e.reason.replace("which a bool feature cannot hold", "not a boolean (a filter keeps the rows where it is true)")
                } else {
                    e.reason
                },
            }
        })?;
        Ok(())
    }

    /// An event log's aggregations (docs/aggregations.md): names, columns, functions, windows.
    fn check_aggregations(&self, view: &crate::FeatureView) -> Result<(), DefinitionError> {
        if !view.is_event_log() {
            return Ok(());
        }
        if !view.ttl.is_unbounded() {
            return Err(DefinitionError::EventLogTtl { view: view.name.clone() });
        }
        let scope = format!(" in feature view `{}`", view.name);
        no_duplicates("aggregation", &scope, view.aggregations.iter().map(|a| a.name.as_str()))?;
        let keys = self.join_keys(view);
        for agg in &view.aggregations {
            check_name("aggregation", &agg.name)?;
            let bad = |reason: String| DefinitionError::BadAggregation { view: view.name.clone(), aggregation: agg.name.clone(), reason };
            let source = &view.source;
            let clashes = keys.iter().any(|k| k.name == agg.name)
                || agg.name == source.timestamp_field
                || source.created_timestamp_field.as_deref() == Some(agg.name.as_str())
                || view.feature(&agg.name).is_some();
            if clashes {
                return Err(bad("the name clashes with a column of the view (aggregations are served under their own names)".into()));
            }
            let Some(column) = view.feature(&agg.column) else {
                return Err(bad(format!(
                    "unknown column `{}` (the view's event columns are its features: {})",
                    agg.column,
                    known(view.features.iter().map(|f| f.name.as_str()))
                )));
            };
            if agg.output_dtype(column.dtype).is_none() {
                return Err(bad(if agg.function.is_numeric() {
                    format!(
                        "{} needs a numeric column (int32, int64, float32 or float64); `{}` is {}",
                        agg.function, agg.column, column.dtype
                    )
                } else {
                    format!("last_k needs an int, float or string column; `{}` is {}", agg.column, column.dtype)
                }));
            }
            let (window, hop) = (agg.window.secs(), agg.hop().secs());
            if window == 0 {
                return Err(bad("window must be positive (e.g. 1h, 7d)".into()));
            }
            if hop == 0 {
                return Err(bad("hop must be positive (e.g. 5m, 1h)".into()));
            }
            if window > MAX_WINDOW_SECS {
                return Err(bad(format!("window {} is longer than 3650d", agg.window)));
            }
            if window % hop != 0 {
                let hint = if agg.hop.is_none() { " (the default hop; give one that divides the window)" } else { "" };
                return Err(bad(format!("window {} is not a multiple of its hop {}{hint}", agg.window, agg.hop())));
            }
            match (agg.function, agg.k) {
                (crate::AggFunction::LastK, None) => return Err(bad(format!("last_k needs k (1 to {})", crate::aggregation::MAX_K))),
                (crate::AggFunction::LastK, Some(k)) if k == 0 || k > crate::aggregation::MAX_K => {
                    return Err(bad(format!("k must be 1 to {}, got {k}", crate::aggregation::MAX_K)));
                }
                (crate::AggFunction::LastK, Some(_)) | (_, None) => {}
                (f, Some(_)) => return Err(bad(format!("k applies only to last_k, not to {f}"))),
            }
        }
        Ok(())
    }
}
impl Definitions {
    /// Every view's and service's thresholds in range, naming served features.
    pub(crate) fn check_monitoring(&self) -> Result<(), DefinitionError> {
        let bad = |what: String, reason: String| DefinitionError::Monitoring { what, reason };
        for v in &self.feature_views {
            let served: Vec<&str> = if v.aggregations.is_empty() {
                v.features.iter().map(|f| f.name.as_str()).collect()
            } else {
                v.aggregations.iter().map(|a| a.name.as_str()).collect()
            };
            v.monitoring.check(served.iter().copied()).map_err(|e| bad(format!("feature view `{}`", v.name), e))?;
        }
        for v in &self.on_demand_views {
            v.monitoring.check(v.features.iter().map(|f| f.name.as_str())).map_err(|e| bad(format!("on-demand view `{}`", v.name), e))?;
        }
        for s in &self.feature_services {
            s.monitoring.check().map_err(|e| bad(format!("feature service `{}`", s.name), e))?;
        }
        Ok(())
    }
}
