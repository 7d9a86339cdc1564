//! Dead letters: messages that do not fit their view, sent to `<topic>.dlq` with the
//! reason and source in headers; refused ones retried, then sent cut short.

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use rdkafka::config::ClientConfig;
use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::FutureRecord;

use super::StreamOptions;
use super::writer::Writer;
use crate::error::{Error, Result};
use crate::metrics::Metrics;

/// The payload bytes a dead letter keeps when the dead-letter topic refused it whole.
pub const TRUNCATED_PAYLOAD_BYTES: usize = 1024;

/// Tries of a dead letter the dead-letter topic refuses, in each form (whole, then cut).
const REFUSED_TRIES: u32 = 3;

/// A message that failed the view's schema, bound for the dead-letter topic.
pub(super) struct DeadLetter {
    pub(super) topic: String,
    pub(super) partition: i32,
    pub(super) offset: i64,
    pub(super) key: Option<Vec<u8>>,
    pub(super) payload: Vec<u8>,
    pub(super) reason: String,
}

/// Whether the broker refused a record for what it is (too large, invalid, not
/// allowed), so that sending it again unchanged cannot succeed.
fn refused(e: &rdkafka::error::KafkaError) -> bool {
    use rdkafka::types::RDKafkaErrorCode as C;
    matches!(
        e.rdkafka_error_code(),
        Some(
            C::MessageSizeTooLarge
                | C::InvalidMessageSize
                | C::InvalidMessage
                | C::InvalidRecord
                | C::BadMessage
                | C::MessageBatchTooLarge
                | C::InvalidTopic
                | C::TopicAuthorizationFailed
                | C::PolicyViolation
                | C::InvalidRequiredAcks
        )
    )
}

impl Writer {
    /// Sends the dead letters, each acknowledged by the broker. Transient failures are
    /// retried until they pass (or shutdown: `Ok(false)`); a letter the topic refuses
    /// ([`refused`]) is tried [`REFUSED_TRIES`] times whole, then as many times with
    /// its payload cut to [`TRUNCATED_PAYLOAD_BYTES`].
    ///
    /// # Errors
    /// [`Error::Kafka`] when a dead letter is refused even cut short.
    pub(super) fn deliver_dead_letters(&self, dead: &[DeadLetter]) -> Result<bool> {
        let mut pending: Vec<(usize, bool)> = (0..dead.len()).map(|i| (i, false)).collect();
        let mut refusals = vec![0u32; dead.len()];
        let mut wait = Duration::from_millis(100);
        while !pending.is_empty() {
            let results = self.send_dead_letters(dead, &pending);
            let mut next = Vec::new();
            let mut transient = None;
            for ((i, cut), result) in pending.iter().copied().zip(results) {
                let Err(e) = result else {
                    if cut {
                        Metrics::add(&self.metrics.dead_letters_truncated, 1);
                    }
                    continue;
                };
                if !refused(&e) {
                    transient = Some(e);
                    next.push((i, cut));
                    continue;
                }
                refusals[i] += 1;
                let d = &dead[i];
                if refusals[i] < REFUSED_TRIES {
                    next.push((i, cut));
                } else if !cut {
                    self.options.hooks.warn(format!(
                        "{}{} refused the dead letter of {}[{}]@{} ({e}); sending it with the payload cut to {TRUNCATED_PAYLOAD_BYTES} bytes (the whole message stays in {} at that offset)",
                        d.topic, self.options.dlq_suffix, d.topic, d.partition, d.offset, d.topic
                    ));
                    refusals[i] = 0;
                    next.push((i, true));
                } else {
                    return Err(Error::Kafka {
                        brokers: self.options.brokers.clone(),
                        message: format!(
                            "{}{} refused the dead letter of {}[{}]@{} even cut to {TRUNCATED_PAYLOAD_BYTES} bytes ({e}); stopping with nothing of the batch committed",
                            d.topic, self.options.dlq_suffix, d.topic, d.partition, d.offset
                        ),
                    });
                }
            }
            pending = next;
            if pending.is_empty() {
                break;
            }
            Metrics::add(&self.metrics.retries, 1);
            if let Some(e) = transient {
                self.options.hooks.warn(format!("sending dead letters failed ({e}); retrying in {wait:?}"));
            }
            let until = Instant::now() + wait;
            while Instant::now() < until {
                if self.shutdown.load(Ordering::Relaxed) {
                    return Ok(false);
                }
                std::thread::sleep(Duration::from_millis(50));
            }
            wait = (wait * 2).min(Duration::from_secs(5));
        }
        Ok(true)
    }

    /// Sends the dead letters `which` names (index, payload cut short), one result each.
    pub(super) fn send_dead_letters(
        &self,
        dead: &[DeadLetter],
        which: &[(usize, bool)],
    ) -> Vec<std::result::Result<(), rdkafka::error::KafkaError>> {
        let texts: Vec<(String, String, String, String)> = which
            .iter()
            .map(|&(i, _)| {
                let d = &dead[i];
                (
                    format!("{}{}", d.topic, self.options.dlq_suffix),
                    d.partition.to_string(),
                    d.offset.to_string(),
                    d.payload.len().to_string(),
                )
            })
            .collect();
        self.rt.block_on(async {
            let mut sends = Vec::with_capacity(which.len());
            for (&(i, cut), (dlq, partition, offset, size)) in which.iter().zip(&texts) {
                let d = &dead[i];
                let mut headers = OwnedHeaders::new()
                    .insert(Header { key: "quiver.error", value: Some(d.reason.as_bytes()) })
                    .insert(Header { key: "quiver.source.topic", value: Some(d.topic.as_bytes()) })
                    .insert(Header { key: "quiver.source.partition", value: Some(partition.as_bytes()) })
                    .insert(Header { key: "quiver.source.offset", value: Some(offset.as_bytes()) });
                let payload = if cut {
                    headers = headers.insert(Header { key: "quiver.payload.truncated", value: Some(size.as_bytes()) });
                    &d.payload[..d.payload.len().min(TRUNCATED_PAYLOAD_BYTES)]
                } else {
                    &d.payload[..]
                };
                let mut record = FutureRecord::to(dlq).payload(payload).headers(headers);
                if let Some(key) = &d.key {
                    record = record.key(key);
                }
                sends.push(self.producer.send(record, Duration::from_secs(10)));
            }
            futures::future::join_all(sends).await.into_iter().map(|r| r.map(|_| ()).map_err(|(e, _)| e)).collect()
        })
    }
}

/// Creates the dead-letter topics when missing (one partition each).
pub(super) async fn ensure_dead_letter_topics(options: &StreamOptions, topics: &[String]) -> Result<()> {
    use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
    use rdkafka::client::DefaultClientContext;
    let kafka = |e: String| Error::Kafka { brokers: options.brokers.clone(), message: e };
    let admin: AdminClient<DefaultClientContext> =
        ClientConfig::new().set("bootstrap.servers", &options.brokers).create().map_err(|e| kafka(e.to_string()))?;
    let names: Vec<String> = topics.iter().map(|t| format!("{t}{}", options.dlq_suffix)).collect();
    let new: Vec<NewTopic> = names.iter().map(|n| NewTopic::new(n, 1, TopicReplication::Fixed(1))).collect();
    let results = admin
        .create_topics(&new, &AdminOptions::new().operation_timeout(Some(Duration::from_secs(10))))
        .await
        .map_err(|e| kafka(format!("creating dead-letter topics: {e}")))?;
    for r in results {
        match r {
            Ok(_) | Err((_, rdkafka::types::RDKafkaErrorCode::TopicAlreadyExists)) => {}
            Err((topic, code)) => return Err(kafka(format!("creating dead-letter topic {topic}: {code}"))),
        }
    }
    Ok(())
}
