//! Message identity: who consumes (`consumer_name`) and which unit of work (`message_id`).
//!
//! The identity must be stable across every redelivery, dead-letter and redrive. It is resolved from the
//! message in a fixed order (see [`IdentityPolicy::resolve`]): CloudEvents attributes, then a structured
//! CloudEvents body, then the producer-set broker id (Service Bus `MessageId`; SQS FIFO
//! `MessageDeduplicationId` only when the SQS consumer opts in, since AWS replaces it on a move to a FIFO DLQ),
//! and the broker-assigned id only when the user opts in.

use std::fmt;

use crate::broker::message::ReceivedMessage;
use crate::error::BadInput;

/// Longest consumer name accepted.
pub const MAX_CONSUMER_NAME_LEN: usize = 128;
/// Longest message id, source, business key or other identity field accepted.
pub const MAX_ID_LEN: usize = 512;

/// The logical name of a consumer. Part of every inbox key, so that the same event can feed independent
/// consumers (stock, billing, support) without one blocking the others.
///
/// Allowed: 1 to 128 characters from `A-Z a-z 0-9 . _ - :`.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ConsumerName(String);

impl ConsumerName {
    /// Validates and wraps a consumer name.
    ///
    /// ```
    /// use txinbox_core::ConsumerName;
    /// assert!(ConsumerName::new("crm-followup").is_ok());
    /// assert!(ConsumerName::new("").is_err());
    /// assert!(ConsumerName::new("has space").is_err());
    /// ```
    pub fn new(name: impl Into<String>) -> Result<Self, BadInput> {
        let name = name.into();
        if name.is_empty() || name.len() > MAX_CONSUMER_NAME_LEN {
            return Err(BadInput::InvalidConsumerName {
                name,
                reason: "must be 1 to 128 characters",
            });
        }
        if !name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-' | ':'))
        {
            return Err(BadInput::InvalidConsumerName {
                name,
                reason: "allowed characters are A-Z a-z 0-9 . _ - :",
            });
        }
        Ok(Self(name))
    }

    /// The name as a string slice.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for ConsumerName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// Where the message id came from. Recorded on the inbox row and in metrics.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum IdOrigin {
    /// CloudEvents attributes (`ce-id`, binary mode) on the broker message.
    CloudEventsAttributes,
    /// A structured-mode CloudEvents JSON body (`specversion`, `id`, `source`).
    CloudEventsBody,
    /// The producer-set broker id: SQS FIFO `MessageDeduplicationId`, Service Bus `MessageId`.
    ProducerId,
    /// The broker-assigned id (SQS `MessageId`). Changes on redrive: opt-in only.
    BrokerId,
}

impl IdOrigin {
    /// A short stable label, used in the inbox row and as a metric label.
    pub fn as_str(self) -> &'static str {
        match self {
            IdOrigin::CloudEventsAttributes => "cloudevents_attributes",
            IdOrigin::CloudEventsBody => "cloudevents_body",
            IdOrigin::ProducerId => "producer_id",
            IdOrigin::BrokerId => "broker_id",
        }
    }
}

/// The resolved identity of one delivery, and the metadata the inbox row records.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Identity {
    /// The consumer this identity is scoped to.
    pub consumer: ConsumerName,
    /// Producer-defined source (CloudEvents `source`); empty when the broker id is used.
    pub source: String,
    /// The producer-defined message id, stable across redelivery and redrive.
    pub message_id: String,
    /// Where `message_id` came from.
    pub origin: IdOrigin,
    /// CloudEvents `type` or equivalent.
    pub event_type: Option<String>,
    /// Contract version (`ce-dataschema` or the `contractversion` extension).
    pub contract_version: Option<String>,
    /// Tenant (the `tenantid` extension).
    pub tenant_id: Option<String>,
    /// Business key: catches two different messages asking for the same effect.
    pub business_key: Option<String>,
    /// The event's own time (CloudEvents `time`: the `ce-time` attribute or the structured body's `time`),
    /// when it is present and valid RFC 3339. It is the producer's, so every copy of the event carries the
    /// same value: the partitioned layout of the PostgreSQL store places markers by it.
    pub event_time: Option<chrono::DateTime<chrono::Utc>>,
}

impl Identity {
    /// The business key with the tenant it is unique within, as every store keeps them: no tenant and an empty
    /// one are the same tenant (`""`). `None` without a business key.
    pub fn business_slot(&self) -> Option<(&str, &str)> {
        Some((
            self.tenant_id.as_deref().unwrap_or(""),
            self.business_key.as_deref()?,
        ))
    }
}

/// A function from a message to its business key (for example
/// `criar_tarefa_followup:oportunidade_2481:reuniao_184`).
///
/// Returning `Ok(None)` means the message has no business key. Returning an error (or panicking) dead-letters
/// the message as bad input. The key must never contain free text from a model, a timestamp, an attempt number or a
/// consumer-generated id.
pub type BusinessKeyFn =
    std::sync::Arc<dyn Fn(&ReceivedMessage) -> Result<Option<String>, String> + Send + Sync>;

/// How identities are resolved for one consumer.
#[derive(Clone)]
#[must_use = "an IdentityPolicy does nothing until given to an Inbox"]
pub struct IdentityPolicy {
    consumer: ConsumerName,
    allow_broker_id: bool,
    business_key: Option<BusinessKeyFn>,
}

impl fmt::Debug for IdentityPolicy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("IdentityPolicy")
            .field("consumer", &self.consumer)
            .field("allow_broker_id", &self.allow_broker_id)
            .field("business_key", &self.business_key.is_some())
            .finish()
    }
}

/// Names of the CloudEvents binary-mode attributes read from the message's attributes (lower-case; the
/// adapters lower-case attribute names). Extensions follow the CloudEvents naming rule (lower-case
/// alphanumerics).
pub mod ce {
    /// Event id (required).
    pub const ID: &str = "ce-id";
    /// Event source (required with `ce-id`).
    pub const SOURCE: &str = "ce-source";
    /// Event type.
    pub const TYPE: &str = "ce-type";
    /// Spec version.
    pub const SPECVERSION: &str = "ce-specversion";
    /// Data schema: used as the contract version when `ce-contractversion` is absent.
    pub const DATASCHEMA: &str = "ce-dataschema";
    /// Extension: contract version.
    pub const CONTRACT_VERSION: &str = "ce-contractversion";
    /// Extension: business key.
    pub const BUSINESS_KEY: &str = "ce-businesskey";
    /// Extension: tenant id.
    pub const TENANT_ID: &str = "ce-tenantid";
    /// Event time (RFC 3339).
    pub const TIME: &str = "ce-time";
}

impl IdentityPolicy {
    /// A policy for `consumer`: CloudEvents, then the producer id; the broker id is refused.
    pub fn new(consumer: ConsumerName) -> Self {
        Self {
            consumer,
            allow_broker_id: false,
            business_key: None,
        }
    }

    /// Accept the broker-assigned id as a last resort. SQS assigns a new `MessageId` on redrive, so a
    /// redriven message would look new: every use is counted in `txinbox_identity_broker_fallback_total`
    /// and warned about.
    pub fn allow_broker_id(mut self, allow: bool) -> Self {
        self.allow_broker_id = allow;
        self
    }

    /// Compute the business key with `f` (overrides a `ce-businesskey` attribute).
    pub fn business_key(
        mut self,
        f: impl Fn(&ReceivedMessage) -> Result<Option<String>, String> + Send + Sync + 'static,
    ) -> Self {
        self.business_key = Some(std::sync::Arc::new(f));
        self
    }

    /// The consumer name.
    pub fn consumer(&self) -> &ConsumerName {
        &self.consumer
    }

    /// Resolves the identity of `msg`, or says why it has none.
    pub fn resolve(&self, msg: &ReceivedMessage) -> Result<Identity, BadInput> {
        let attr = |k: &str| msg.attribute(k).map(str::to_owned);
        let mut event_time = None;
        let (source, message_id, origin, event_type, mut contract_version, tenant, mut bkey) =
            if let Some(id) = attr(ce::ID) {
                event_time = msg.attribute(ce::TIME).and_then(parse_time);
                let source = attr(ce::SOURCE).ok_or(BadInput::NoIdentity {
                    detail: "ce-id present without ce-source",
                })?;
                (
                    source,
                    id,
                    IdOrigin::CloudEventsAttributes,
                    attr(ce::TYPE),
                    attr(ce::CONTRACT_VERSION).or_else(|| attr(ce::DATASCHEMA)),
                    attr(ce::TENANT_ID),
                    attr(ce::BUSINESS_KEY),
                )
            } else if let Some(ev) = structured_cloudevent(&msg.body) {
                event_time = ev.time.as_deref().and_then(parse_time);
                (
                    ev.source,
                    ev.id,
                    IdOrigin::CloudEventsBody,
                    ev.event_type,
                    ev.contract_version,
                    ev.tenant,
                    ev.business_key,
                )
            } else if let Some(id) = msg.producer_id.clone() {
                (
                    String::new(),
                    id,
                    IdOrigin::ProducerId,
                    None,
                    None,
                    None,
                    None,
                )
            } else if let (true, Some(id)) = (self.allow_broker_id, msg.broker_id.clone()) {
                metrics::counter!(crate::metrics::IDENTITY_BROKER_FALLBACK, "consumer" => self.consumer.to_string())
                    .increment(1);
                tracing::warn!(
                    consumer = %self.consumer,
                    broker_id = %id,
                    "identity falls back to the broker-assigned id; a redrive will give this message a new id"
                );
                (
                    String::new(),
                    id,
                    IdOrigin::BrokerId,
                    None,
                    None,
                    None,
                    None,
                )
            } else {
                return Err(BadInput::NoIdentity {
                    detail: "no ce-id attribute, no CloudEvents body and no producer id",
                });
            };
        if let Some(f) = &self.business_key {
            bkey =
                contain_key_panic(|| f(msg))?.map_err(|detail| BadInput::BusinessKey { detail })?;
        }
        if contract_version.as_deref() == Some("") {
            contract_version = None;
        }
        check_field("message_id", &message_id, false)?;
        // Only an identity without a source (a producer or broker id) has the empty one: a CloudEvent's
        // source is required, and an empty one would share the producer ids' namespace.
        let sourceless = matches!(origin, IdOrigin::ProducerId | IdOrigin::BrokerId);
        check_field("source", &source, sourceless)?;
        if let Some(k) = &bkey {
            check_business_key(k)?;
        }
        // The marker row keeps these too (the tenant in the business-key index): a NUL or an oversized value
        // would fail the insert on every redelivery, so they are refused here, before the transaction.
        for (field, value) in [
            ("tenant_id", &tenant),
            ("event_type", &event_type),
            ("contract_version", &contract_version),
        ] {
            if let Some(v) = value {
                check_field(field, v, true)?;
            }
        }
        Ok(Identity {
            consumer: self.consumer.clone(),
            source,
            message_id,
            origin,
            event_type,
            contract_version,
            tenant_id: tenant,
            business_key: bkey,
            event_time,
        })
    }
}

/// The tenant of a message as [`IdentityPolicy::resolve`] reads it: the `ce-tenantid` attribute of a
/// binary-mode event (one with a `ce-id` attribute), else the `tenantid` of a structured CloudEvent body;
/// a message identified otherwise has none. The shard router reads it with this same function, so a
/// message's shard and its marker's tenant always agree.
pub(crate) fn tenant_of(msg: &ReceivedMessage) -> Option<String> {
    if msg.attribute(ce::ID).is_some() {
        return msg.attribute(ce::TENANT_ID).map(str::to_owned);
    }
    structured_cloudevent(&msg.body).and_then(|ev| ev.tenant)
}

/// A CloudEvents `time` (RFC 3339); an invalid one is ignored (the event is placed by its broker time).
fn parse_time(s: &str) -> Option<chrono::DateTime<chrono::Utc>> {
    chrono::DateTime::parse_from_rfc3339(s.trim())
        .ok()
        .map(|t| t.with_timezone(&chrono::Utc))
}

impl Identity {
    /// Sets the business key after checking it like every identity field ([`BadInput::BusinessKey`] when it
    /// is empty, over 512 bytes or has a control character).
    pub fn set_business_key(&mut self, key: String) -> Result<(), BadInput> {
        check_business_key(&key)?;
        self.business_key = Some(key);
        Ok(())
    }
}

/// Runs a business-key function, the user's code on an outside message: a panic (an index past the end of a
/// hostile body) is that message's bad input, not the worker task's end with its deliveries unsettled.
pub(crate) fn contain_key_panic<T>(f: impl FnOnce() -> T) -> Result<T, BadInput> {
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)).map_err(|payload| {
        let why = payload
            .downcast_ref::<&str>()
            .map(|s| (*s).to_owned())
            .or_else(|| payload.downcast_ref::<String>().cloned())
            .unwrap_or_default();
        BadInput::BusinessKey {
            detail: format!("the business key function panicked: {why}"),
        }
    })
}

/// A business key is checked like an identity field, but refused as a business key (`invalid_business_key`):
/// the message has an identity, only its key is unusable.
fn check_business_key(key: &str) -> Result<(), BadInput> {
    check_field("business_key", key, false).map_err(|_| BadInput::BusinessKey {
        detail: format!(
            "the key must be non-empty, at most {MAX_ID_LEN} bytes, without control characters (it has {} bytes)",
            key.len()
        ),
    })
}

/// Whether `value` fits the rule every identity field shares: at most [`MAX_ID_LEN`] bytes, no control
/// character (emptiness is each caller's own rule).
pub(crate) fn fits_id_field(value: &str) -> bool {
    value.len() <= MAX_ID_LEN && !value.chars().any(char::is_control)
}

fn check_field(field: &'static str, value: &str, may_be_empty: bool) -> Result<(), BadInput> {
    if (!may_be_empty && value.trim().is_empty()) || !fits_id_field(value) {
        return Err(BadInput::InvalidIdentityField {
            field,
            reason: "must be non-empty, at most 512 bytes, without control characters",
        });
    }
    Ok(())
}

struct StructuredEvent {
    id: String,
    source: String,
    event_type: Option<String>,
    contract_version: Option<String>,
    tenant: Option<String>,
    business_key: Option<String>,
    time: Option<String>,
}

fn structured_cloudevent(body: &[u8]) -> Option<StructuredEvent> {
    // Cheap pre-check so non-JSON bodies are not parsed twice.
    let first = body.iter().find(|b| !b.is_ascii_whitespace())?;
    if *first != b'{' {
        return None;
    }
    let v: serde_json::Value = serde_json::from_slice(body).ok()?;
    let obj = v.as_object()?;
    obj.get("specversion")?.as_str()?;
    let s = |k: &str| obj.get(k).and_then(|x| x.as_str()).map(str::to_owned);
    Some(StructuredEvent {
        id: s("id")?,
        source: s("source")?,
        event_type: s("type"),
        contract_version: s("contractversion").or_else(|| s("dataschema")),
        tenant: s("tenantid"),
        business_key: s("businesskey"),
        time: s("time"),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The shard router and the identity read one tenant, whatever shape the message has.
    #[test]
    fn the_tenant_of_a_message_is_the_tenant_of_its_identity() {
        let structured = r#"{"specversion":"1.0","id":"e1","source":"crm","tenantid":"globex"}"#;
        /// A body, its attributes and its producer id.
        type Shape<'a> = (&'a str, Vec<(&'a str, &'a str)>, Option<&'a str>);
        let shapes: Vec<Shape<'_>> = vec![
            (
                "{}",
                vec![("ce-id", "a"), ("ce-source", "s"), ("ce-tenantid", "acme")],
                None,
            ),
            (
                structured,
                vec![("ce-id", "a"), ("ce-source", "s"), ("ce-tenantid", "acme")],
                None,
            ),
            (structured, vec![("ce-tenantid", "acme")], None),
            (structured, vec![], None),
            ("{}", vec![("ce-tenantid", "acme")], Some("p-1")),
            (
                r#"{"specversion":"1.0","tenantid":"globex"}"#,
                vec![],
                Some("p-2"),
            ),
            ("{}", vec![("ce-id", "a"), ("ce-source", "s")], None),
        ];
        for (body, attrs, producer_id) in shapes {
            let mut m = ReceivedMessage::new(body.as_bytes().to_vec());
            for (k, v) in &attrs {
                m.attributes.insert((*k).into(), (*v).into());
            }
            m.producer_id = producer_id.map(str::to_owned);
            let identity = policy().resolve(&m).unwrap();
            assert_eq!(tenant_of(&m), identity.tenant_id, "{body} {attrs:?}");
        }
    }

    fn policy() -> IdentityPolicy {
        IdentityPolicy::new(ConsumerName::new("c").unwrap())
    }

    #[test]
    fn cloudevents_attributes_win_over_producer_id() {
        let mut m = ReceivedMessage::new(b"{}".to_vec());
        m.attributes.insert("ce-id".into(), "evt-1".into());
        m.attributes.insert("ce-source".into(), "crm".into());
        m.attributes
            .insert("ce-type".into(), "meeting.ended".into());
        m.producer_id = Some("dedup-9".into());
        let id = policy().resolve(&m).unwrap();
        assert_eq!(
            (id.source.as_str(), id.message_id.as_str(), id.origin),
            ("crm", "evt-1", IdOrigin::CloudEventsAttributes)
        );
        assert_eq!(id.event_type.as_deref(), Some("meeting.ended"));
    }

    #[test]
    fn structured_body_then_producer_id_then_refusal() {
        let m = ReceivedMessage::new(
            br#"{"specversion":"1.0","id":"e2","source":"s","type":"t","data":{}}"#.to_vec(),
        );
        let id = policy().resolve(&m).unwrap();
        assert_eq!(
            (id.message_id.as_str(), id.origin),
            ("e2", IdOrigin::CloudEventsBody)
        );

        let mut m = ReceivedMessage::new(b"x".to_vec());
        m.producer_id = Some("p1".into());
        assert_eq!(policy().resolve(&m).unwrap().origin, IdOrigin::ProducerId);

        let mut m = ReceivedMessage::new(b"x".to_vec());
        m.broker_id = Some("b1".into());
        assert!(matches!(
            policy().resolve(&m),
            Err(BadInput::NoIdentity { .. })
        ));
        let id = policy().allow_broker_id(true).resolve(&m).unwrap();
        assert_eq!(id.origin, IdOrigin::BrokerId);
    }

    #[test]
    fn bad_fields_are_rejected() {
        let mut m = ReceivedMessage::new(b"x".to_vec());
        m.producer_id = Some("bad\nid".into());
        assert!(matches!(
            policy().resolve(&m),
            Err(BadInput::InvalidIdentityField {
                field: "message_id",
                ..
            })
        ));
        let mut m = ReceivedMessage::new(b"x".to_vec());
        m.attributes.insert("ce-id".into(), "e".into());
        assert!(matches!(
            policy().resolve(&m),
            Err(BadInput::NoIdentity { .. })
        ));
    }

    /// A CloudEvent's source is required: an empty one would give the identity of a producer id (source "")
    /// and make another message with that id look like a duplicate of this one.
    #[test]
    fn a_cloudevent_with_an_empty_source_has_no_identity() {
        let mut m = ReceivedMessage::new(b"x".to_vec());
        m.attributes.insert("ce-id".into(), "42".into());
        m.attributes.insert("ce-source".into(), "  ".into());
        assert!(matches!(
            policy().resolve(&m),
            Err(BadInput::InvalidIdentityField {
                field: "source",
                ..
            })
        ));
        let m = ReceivedMessage::new(br#"{"specversion":"1.0","id":"42","source":""}"#.to_vec());
        assert!(matches!(
            policy().resolve(&m),
            Err(BadInput::InvalidIdentityField {
                field: "source",
                ..
            })
        ));
        let mut m = ReceivedMessage::new(b"x".to_vec());
        m.producer_id = Some("42".into());
        assert_eq!(policy().resolve(&m).unwrap().source, "");
    }

    #[test]
    fn business_key_function_errors_are_bad_input() {
        let mut m = ReceivedMessage::new(b"x".to_vec());
        m.producer_id = Some("p".into());
        let p = policy().business_key(|_| Err("no opportunity".into()));
        assert!(matches!(p.resolve(&m), Err(BadInput::BusinessKey { .. })));
    }
}
