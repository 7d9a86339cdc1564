//! Builders. They only assemble values; `Definitions::validate` checks them, exactly as
//! it checks YAML, so the two ways cannot drift apart.

use std::collections::BTreeMap;

use crate::aggregation::Aggregation;
use crate::monitoring::{Monitoring, Thresholds};
use crate::types::{DType, KeyType, Ttl};

use super::{Entity, Feature, FeatureRef, FeatureService, FeatureView, JoinKey, Source, StreamFormat, StreamSource};

impl Entity {
    /// An entity with no join keys yet.
    ///
    /// ```
    /// use quiver_sdk::{Entity, KeyType};
    /// let driver = Entity::new("driver").with_join_key("driver_id", KeyType::Int64);
    /// assert_eq!(driver.join_keys[0].name, "driver_id");
    /// ```
    pub fn new(name: impl Into<String>) -> Self {
        Entity { name: name.into(), join_keys: Vec::new(), description: String::new(), tags: BTreeMap::new() }
    }

    #[must_use]
    pub fn with_join_key(mut self, name: impl Into<String>, dtype: KeyType) -> Self {
        self.join_keys.push(JoinKey { name: name.into(), dtype });
        self
    }
}

impl Source {
    /// The default Delta table of the view, with the default event-time column.
    pub fn new() -> Self {
        Source::default()
    }

    #[must_use]
    pub fn with_path(mut self, path: impl Into<String>) -> Self {
        self.path = Some(path.into());
        self
    }

    #[must_use]
    pub fn with_timestamp_field(mut self, field: impl Into<String>) -> Self {
        self.timestamp_field = field.into();
        self
    }

    #[must_use]
    pub fn with_created_timestamp_field(mut self, field: impl Into<String>) -> Self {
        self.created_timestamp_field = Some(field.into());
        self
    }

    #[must_use]
    pub fn with_stream(mut self, topic: impl Into<String>, format: StreamFormat) -> Self {
        self.stream = Some(StreamSource { topic: topic.into(), format });
        self
    }
}

impl FeatureView {
    /// A view with no entities and no features yet, unbounded TTL, online.
    ///
    /// ```
    /// use quiver_sdk::{DType, FeatureView, Ttl};
    /// let view = FeatureView::new("driver_hourly")
    ///     .with_entity("driver")
    ///     .with_feature("conv_rate", DType::Float64)
    ///     .with_ttl(Ttl::parse("2h").unwrap());
    /// assert_eq!(view.ttl.secs(), 7200);
    /// ```
    pub fn new(name: impl Into<String>) -> Self {
        FeatureView {
            name: name.into(),
            version: super::FIRST_VERSION,
            entities: Vec::new(),
            features: Vec::new(),
            ttl: Ttl::UNBOUNDED,
            source: Source::default(),
            online: true,
            tags: BTreeMap::new(),
            description: String::new(),
            aggregations: Vec::new(),
            monitoring: Monitoring::default(),
        }
    }

    /// Sets the view's monitoring thresholds (docs/monitoring.md).
    #[must_use]
    pub fn with_monitoring(mut self, thresholds: Thresholds) -> Self {
        self.monitoring.view = thresholds;
        self
    }

    /// Sets one served feature's monitoring thresholds.
    #[must_use]
    pub fn with_feature_monitoring(mut self, feature: impl Into<String>, thresholds: Thresholds) -> Self {
        self.monitoring.features.insert(feature.into(), thresholds);
        self
    }

    /// Adds a windowed aggregation (making the view an event log).
    #[must_use]
    pub fn with_aggregation(mut self, aggregation: Aggregation) -> Self {
        self.aggregations.push(aggregation);
        self
    }

    #[must_use]
    pub fn with_entity(mut self, entity: impl Into<String>) -> Self {
        self.entities.push(entity.into());
        self
    }

    #[must_use]
    pub fn with_feature(mut self, name: impl Into<String>, dtype: DType) -> Self {
        self.features.push(Feature { name: name.into(), dtype, description: String::new(), expr: String::new() });
        self
    }

    /// Adds a feature its writers compute from the raw row (docs/transformations.md#write-time).
    #[must_use]
    pub fn with_computed_feature(mut self, name: impl Into<String>, dtype: DType, expr: impl Into<String>) -> Self {
        self.features.push(Feature { name: name.into(), dtype, description: String::new(), expr: expr.into() });
        self
    }

    /// Declares an input column that is not a feature, read by the filter and expressions.
    #[must_use]
    pub fn with_raw_column(mut self, name: impl Into<String>, dtype: DType) -> Self {
        self.source.raw.push(Feature { name: name.into(), dtype, description: String::new(), expr: String::new() });
        self
    }

    /// Writes only the rows for which `filter` is true.
    #[must_use]
    pub fn with_filter(mut self, filter: impl Into<String>) -> Self {
        self.source.filter = Some(filter.into());
        self
    }

    #[must_use]
    pub fn with_ttl(mut self, ttl: Ttl) -> Self {
        self.ttl = ttl;
        self
    }

    #[must_use]
    pub fn with_source(mut self, source: Source) -> Self {
        self.source = source;
        self
    }

    #[must_use]
    pub fn with_online(mut self, online: bool) -> Self {
        self.online = online;
        self
    }
}

impl FeatureService {
    pub fn new(name: impl Into<String>) -> Self {
        FeatureService {
            name: name.into(),
            features: Vec::new(),
            description: String::new(),
            tags: BTreeMap::new(),
            monitoring: Thresholds::default(),
        }
    }

    /// Adds `view:feature`.
    #[must_use]
    pub fn with_feature(mut self, view: impl Into<String>, feature: impl Into<String>) -> Self {
        self.features.push(FeatureRef::new(view, feature));
        self
    }

    /// Adds `view@N:feature`: the feature as version `version` of the view defines it,
    /// whatever version is the latest (docs/versions.md).
    #[must_use]
    pub fn with_feature_at(mut self, view: impl Into<String>, version: u32, feature: impl Into<String>) -> Self {
        self.features.push(FeatureRef::new(view, feature).at(version));
        self
    }

    /// Pins every reference to `view` to version `version`: moving a service to a new
    /// version of a view is this one change.
    ///
    /// ```
    /// use quiver_sdk::FeatureService;
    /// let ranker = FeatureService::new("ranker")
    ///     .with_feature("driver_hourly", "conv_rate")
    ///     .with_feature("customer_profile", "age")
    ///     .with_version("driver_hourly", 2);
    /// let refs: Vec<String> = ranker.features.iter().map(ToString::to_string).collect();
    /// assert_eq!(refs, ["driver_hourly@2:conv_rate", "customer_profile:age"]);
    /// let pinned = FeatureService::new("ranker").with_feature_at("driver_hourly", 1, "conv_rate");
    /// assert_eq!(pinned.features[0].to_string(), "driver_hourly@1:conv_rate");
    /// ```
    #[must_use]
    pub fn with_version(mut self, view: &str, version: u32) -> Self {
        for r in self.features.iter_mut().filter(|r| r.view == view) {
            *r = r.clone().at(version);
        }
        self
    }

    /// Sets the service's monitoring thresholds (docs/monitoring.md).
    #[must_use]
    pub fn with_monitoring(mut self, thresholds: Thresholds) -> Self {
        self.monitoring = thresholds;
        self
    }
}
