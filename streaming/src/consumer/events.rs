//! What a running stream tells its caller: events to show (the library never prints)
//! and the injected fault a test uses to crash it at the exactly-once window.

use std::fmt;
use std::sync::Arc;

/// Something a running stream reports; its `Display` is the line `quiver stream` prints.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Event {
    /// Subscribed: these topics, this consumer group.
    Started { topics: Vec<String>, group: String },
    /// A partition was assigned to this consumer (its Delta progress is read).
    Assigned { topic: String, partition: i32 },
    /// A partition was taken from this consumer.
    Revoked { topic: String, partition: i32 },
    /// The registry changed and its definitions are in use from the next batch.
    Reloaded { version: u64 },
    /// A version of a view made while the stream runs is fed from the next batch on
    /// (`view@N`, its topic).
    Added { view: String, topic: String },
    /// Something failed and is being handled (retried, dropped to be read again, kept).
    Warning(String),
}

impl fmt::Display for Event {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Event::Started { topics, group } => {
                write!(f, "streaming {} into both stores (group {group}); Ctrl-C to stop", topics.join(", "))
            }
            Event::Assigned { topic, partition } => write!(f, "assigned {topic}[{partition}]"),
            Event::Revoked { topic, partition } => write!(f, "revoked {topic}[{partition}]"),
            Event::Reloaded { version } => write!(f, "registry version {version}: definitions reloaded"),
            Event::Added { view, topic } => write!(f, "feeding {view} from {topic} too, from the next batch on"),
            Event::Warning(message) => write!(f, "warning: {message}"),
        }
    }
}

type EventFn = dyn Fn(&Event) + Send + Sync;
type CommitFn = dyn Fn(u64) + Send + Sync;

/// The caller's hooks into a running stream.
#[derive(Clone)]
pub struct Hooks {
    on_event: Arc<EventFn>,
    before_commit: Option<Arc<CommitFn>>,
}

impl Default for Hooks {
    /// Events go to `tracing`; no fault.
    fn default() -> Self {
        Hooks {
            on_event: Arc::new(|event: &Event| match event {
                Event::Warning(_) => tracing::warn!("{event}"),
                _ => tracing::info!("{event}"),
            }),
            before_commit: None,
        }
    }
}

impl fmt::Debug for Hooks {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Hooks").field("before_commit", &self.before_commit.is_some()).finish_non_exhaustive()
    }
}

impl Hooks {
    /// Sends every event to `f` instead of `tracing`.
    pub fn on_event(mut self, f: impl Fn(&Event) + Send + Sync + 'static) -> Self {
        self.on_event = Arc::new(f);
        self
    }

    /// An injected fault: `f` is called with the batch's number (from 1) once the batch
    /// is in both stores and before its offsets are committed to Kafka, the window
    /// exactly-once has to get right. A crash test aborts the process there.
    pub fn before_commit(mut self, f: impl Fn(u64) + Send + Sync + 'static) -> Self {
        self.before_commit = Some(Arc::new(f));
        self
    }

    pub(super) fn emit(&self, event: Event) {
        (self.on_event)(&event);
    }

    pub(super) fn warn(&self, message: String) {
        self.emit(Event::Warning(message));
    }

    pub(super) fn committing(&self, batch: u64) {
        if let Some(f) = &self.before_commit {
            f(batch);
        }
    }
}
