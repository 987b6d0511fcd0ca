//! What travels on the wire: `BrokerProperties` parsed with our own tolerant types (the crate's struct is too
//! narrow), custom properties as headers (strings quoted, names lower-case), and
//! the lock location.

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};
use serde::Deserialize;
use txinbox_core::{BrokerError, BrokerErrorKind, ReceivedMessage};

/// Every header of a response, names lower-case, read through the crate's `custom_properties::<T>()` (the only
/// way to reach `Location` and the raw `BrokerProperties`).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ResponseHeaders(pub BTreeMap<String, String>);

impl From<azure_core::headers::Headers> for ResponseHeaders {
    fn from(h: azure_core::headers::Headers) -> Self {
        Self(
            h.iter()
                .map(|(k, v)| (k.as_str().to_ascii_lowercase(), v.as_str().to_owned()))
                .collect(),
        )
    }
}

impl ResponseHeaders {
    /// A header by lower-case name.
    pub fn get(&self, name: &str) -> Option<&str> {
        self.0.get(name).map(String::as_str)
    }
}

/// `BrokerProperties` of a received message, every field optional and wide (i64), so that what the service
/// adds or omits never loses a delivery.
#[derive(Clone, Debug, Default, Deserialize, PartialEq)]
#[serde(rename_all = "PascalCase", default)]
#[non_exhaustive]
pub struct BrokerProperties {
    /// Deliveries so far, this one included.
    pub delivery_count: Option<i64>,
    /// Original sequence number of an auto-forwarded message.
    pub enqueued_sequence_number: Option<i64>,
    /// When the service accepted the message (RFC 1123).
    pub enqueued_time_utc: Option<String>,
    /// The lock token (peek-lock only).
    pub lock_token: Option<String>,
    /// Lock expiry (peek-lock only, RFC 1123, whole seconds).
    pub locked_until_utc: Option<String>,
    /// The producer-set (or service-generated) MessageId.
    pub message_id: Option<String>,
    /// The service-assigned sequence number.
    pub sequence_number: Option<i64>,
    /// `Active`, `Deferred`, `Scheduled`.
    pub state: Option<String>,
    /// Seconds.
    pub time_to_live: Option<f64>,
    /// Label (Subject).
    pub label: Option<String>,
    /// CorrelationId.
    pub correlation_id: Option<String>,
    /// SessionId.
    pub session_id: Option<String>,
    /// ReplyTo.
    pub reply_to: Option<String>,
    /// ReplyToSessionId.
    pub reply_to_session_id: Option<String>,
    /// To.
    pub to: Option<String>,
    /// PartitionKey.
    pub partition_key: Option<String>,
    /// ScheduledEnqueueTimeUtc.
    pub scheduled_enqueue_time_utc: Option<String>,
}

impl BrokerProperties {
    /// Parses the header's JSON.
    pub fn parse(raw: &str) -> Result<Self, serde_json::Error> {
        serde_json::from_str(raw)
    }

    /// `EnqueuedTimeUtc` as a time.
    pub fn enqueued_at(&self) -> Option<DateTime<Utc>> {
        self.enqueued_time_utc.as_deref().and_then(parse_http_date)
    }

    /// `LockedUntilUtc` as a time.
    pub fn locked_until(&self) -> Option<DateTime<Utc>> {
        self.locked_until_utc.as_deref().and_then(parse_http_date)
    }
}

/// The broker-neutral view of a peek-locked message from its response headers and body: custom properties
/// as attributes (names lower-case, values unquoted), `MessageId` as the producer id (an empty one is none),
/// the sequence number (from `BrokerProperties`, else from the lock URI) as the broker id, `DeliveryCount`
/// (at least 1), `EnqueuedTimeUtc` and `SessionId` as the group. `BrokerProperties` that are missing or
/// unreadable are logged and read as empty: what they would say is then taken from the lock URI and the
/// custom properties, and identity resolution decides whether the message is still usable. A message without
/// a `Location` (lock URI) cannot be settled: a [`Protocol`](BrokerErrorKind::Protocol) error.
pub fn received_message(
    headers: &ResponseHeaders,
    body: Vec<u8>,
    entity: &str,
    received_at: DateTime<Utc>,
) -> Result<(ReceivedMessage, BrokerProperties), BrokerError> {
    let raw = headers
        .get(RAW_BROKER_PROPERTIES)
        .or_else(|| headers.get("brokerproperties"));
    let props = match raw {
        Some(raw) => BrokerProperties::parse(raw).unwrap_or_else(|e| {
            tracing::warn!(entity, error = %e, "BrokerProperties unreadable; using the lock location and custom properties only");
            BrokerProperties::default()
        }),
        None => {
            // A client given with `http_client` on azure_core's reqwest backend drops a header value that is not
            // visible ASCII (the adapter's own client keeps it).
            tracing::warn!(entity, "no BrokerProperties on a received message");
            BrokerProperties::default()
        }
    };
    let location = headers.get("location").unwrap_or_default();
    if location.is_empty() {
        return Err(BrokerError::new(
            BrokerErrorKind::Protocol,
            "receive",
            format!("a locked message of {entity} came without a Location (lock URI); it cannot be settled and will come back after its lock"),
        ));
    }
    let mut message = ReceivedMessage::new(body);
    message.attributes = raw_custom_properties(headers)
        .into_iter()
        .map(|(k, v)| {
            let v = unquote(&v).to_owned();
            (k, v)
        })
        .collect();
    message.producer_id = props.message_id.clone().filter(|s| !s.is_empty());
    message.broker_id = props
        .sequence_number
        .map(|n| n.to_string())
        .or_else(|| sequence_from_location(location));
    message.delivery_count = props
        .delivery_count
        .and_then(|n| u32::try_from(n).ok())
        .unwrap_or(1)
        .max(1);
    message.enqueued_at = props.enqueued_at();
    message.received_at = received_at;
    message.group_id = props.session_id.clone();
    Ok((message, props))
}

/// The sequence number in a lock URI `…/messages/{seq}/{token}`.
pub fn sequence_from_location(location: &str) -> Option<String> {
    let mut parts = location.trim_end_matches('/').rsplit('/');
    parts.next()?;
    let seq = parts.next()?;
    seq.parse::<i64>().ok().map(|n| n.to_string())
}

/// Parses an RFC 1123 / RFC 2822 date (`Wed, 02 Jul 2014 01:32:27 GMT` or `... +0000`).
pub fn parse_http_date(s: &str) -> Option<DateTime<Utc>> {
    DateTime::parse_from_rfc2822(s.trim())
        .ok()
        .map(|d| d.with_timezone(&Utc))
}

/// The name under which the adapter's HTTP client hands a received message's `BrokerProperties` on, out of
/// the REST crate's reach (the crate's own parse of it is too narrow and would fail the receive).
pub const RAW_BROKER_PROPERTIES: &str = "x-txinbox-brokerproperties";

/// Response headers that are HTTP or Service Bus system headers, not custom properties.
const SYSTEM_HEADERS: &[&str] = &[
    "brokerproperties",
    RAW_BROKER_PROPERTIES,
    "location",
    "content-type",
    "content-length",
    "content-encoding",
    "transfer-encoding",
    "connection",
    "keep-alive",
    "date",
    "server",
    "strict-transport-security",
    "retry-after",
    "vary",
    "cache-control",
    "expires",
    "pragma",
    "set-cookie",
    "via",
    "age",
    "etag",
    "accept-ranges",
];

/// Whether a response header is a custom (application) property.
pub fn is_custom_property(name: &str) -> bool {
    !SYSTEM_HEADERS.contains(&name)
        && !name.starts_with("x-ms-")
        && !name.starts_with("access-control-")
}

/// The custom properties of a response, raw (strings still quoted, as they must be re-sent).
pub fn raw_custom_properties(headers: &ResponseHeaders) -> BTreeMap<String, String> {
    headers
        .0
        .iter()
        .filter(|(k, _)| is_custom_property(k))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect()
}

/// A received property value as text: the service quotes strings and dates (`"High"`); numbers and booleans
/// come bare.
pub fn unquote(v: &str) -> &str {
    let t = v.trim();
    if t.len() >= 2 && t.starts_with('"') && t.ends_with('"') {
        &t[1..t.len() - 1]
    } else {
        t
    }
}

/// A string property value for a send header: quoted, so the service stores a string, and made safe for an
/// HTTP header: control characters become spaces, inner quotes become `'`, and the whole is cut at
/// `max_chars` bytes (on a character boundary). Other characters, non-ASCII included, are kept as they are and
/// go out as raw UTF-8. Microsoft gives a custom property no encoding of its own (REST Introduction: "If a
/// single message is sent or received, each custom property is placed in its own HTTP header."; Send Message:
/// "In addition to the listed properties, the header can contain custom properties."), so an escape would be
/// stored as its own characters (`café` written `caf\u{e9}` reached every consumer as the text `caf\u{e9}`).
/// Raw UTF-8 is what other producers send and what the receive reads back (as UTF-8, see
/// `transport::ReqwestClient`); RFC 7230, 3.2.4: "A recipient SHOULD treat other octets in field content
/// (obs-text) as opaque data."
pub fn quote_property(v: &str, max_chars: usize) -> String {
    let mut out = String::with_capacity(v.len() + 2);
    out.push('"');
    for c in v.chars() {
        if out.len() >= max_chars {
            out.push_str("...");
            break;
        }
        match c {
            '"' => out.push('\''),
            c if c.is_control() => out.push(' '),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

/// Parses `Retry-After`: seconds or an HTTP-date (RFC 9110), as `retry_after_value` reads one value.
pub fn retry_after(headers: &ResponseHeaders) -> Option<std::time::Duration> {
    headers.get("retry-after").and_then(retry_after_value)
}

/// Parses one `Retry-After` value: delay-seconds, or an HTTP-date (RFC 9110, 10.2.3: "Retry-After =
/// HTTP-date / delay-seconds"), which a proxy or gateway in front of the namespace may send; a date is read
/// from now, a date in the past asks for no wait. `None` when the value is neither. Uncapped: the callers
/// cap what they wait (30 s).
pub(crate) fn retry_after_value(v: &str) -> Option<std::time::Duration> {
    retry_after_value_at(v, Utc::now())
}

/// [`retry_after_value`] read at `now`.
pub(crate) fn retry_after_value_at(v: &str, now: DateTime<Utc>) -> Option<std::time::Duration> {
    if let Ok(secs) = v.trim().parse::<f64>() {
        return std::time::Duration::try_from_secs_f64(secs).ok();
    }
    let at = parse_http_date(v)?;
    Some((at - now).to_std().unwrap_or_default())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn broker_properties_are_parsed_tolerantly() {
        let doc = r#"{"DeliveryCount":1,"EnqueuedSequenceNumber":0,"EnqueuedTimeUtc":"Wed, 02 Jul 2014 01:32:27 GMT","Label":"M1","LockToken":"7da9cfd5-40d5-4bb1-8d64-ec5a52e1c547","LockedUntilUtc":"Wed, 02 Jul 2014 01:33:27 GMT","MessageId":"31907572164743c38741631acd554d6f","SequenceNumber":2,"State":"Active","TimeToLive":10}"#;
        let p = BrokerProperties::parse(doc).unwrap();
        assert_eq!(p.delivery_count, Some(1));
        assert_eq!(p.sequence_number, Some(2));
        assert_eq!(p.label.as_deref(), Some("M1"));
        assert_eq!(
            p.enqueued_at().unwrap().to_rfc3339(),
            "2014-07-02T01:32:27+00:00"
        );
        assert_eq!(
            (p.locked_until().unwrap() - p.enqueued_at().unwrap()).num_seconds(),
            60
        );
        // Partitioned entities have huge sequence numbers; unknown and missing fields are fine.
        let p = BrokerProperties::parse(
            r#"{"EnqueuedSequenceNumber":9223372036854775000,"SequenceNumber":9223372036854775000,"NewField":true}"#,
        )
        .unwrap();
        assert_eq!(p.enqueued_sequence_number, Some(9_223_372_036_854_775_000));
        assert_eq!(p.message_id, None);
    }

    /// RFC 9110, 10.2.3: "Retry-After = HTTP-date / delay-seconds"; a proxy or gateway in front of the
    /// namespace may answer with the date form.
    #[test]
    fn retry_after_reads_seconds_and_http_dates() {
        use std::time::Duration;
        let now = parse_http_date("Wed, 02 Jan 2030 03:04:05 GMT").unwrap();
        assert_eq!(
            retry_after_value_at("Wed, 02 Jan 2030 03:04:10 GMT", now),
            Some(Duration::from_secs(5))
        );
        assert_eq!(
            retry_after_value_at("Wed, 02 Jan 2030 03:04:00 GMT", now),
            Some(Duration::ZERO)
        );
        assert_eq!(
            retry_after_value_at(" 7 ", now),
            Some(Duration::from_secs(7))
        );
        assert_eq!(
            retry_after_value_at("0.5", now),
            Some(Duration::from_millis(500))
        );
        assert_eq!(retry_after_value_at("soon", now), None);
        assert_eq!(retry_after_value_at("-3", now), None);
        assert_eq!(retry_after_value_at("", now), None);
    }

    #[test]
    fn dates_accept_gmt_and_offsets() {
        assert_eq!(
            parse_http_date("Wed, 02 Jan 2030 03:04:05 +0000"),
            parse_http_date("Wed, 02 Jan 2030 03:04:05 GMT")
        );
        assert!(parse_http_date("yesterday").is_none());
    }

    #[test]
    fn properties_are_quoted_and_unquoted() {
        assert_eq!(unquote("\"High\""), "High");
        assert_eq!(unquote("12345"), "12345");
        assert_eq!(unquote("\""), "\"");
        assert_eq!(quote_property("a\"b\nc", 100), "\"a'b c\"");
        assert_eq!(quote_property("café 日本", 100), "\"café 日本\"");
        assert_eq!(unquote(&quote_property("café 日本", 100)), "café 日本");
        // Cut on a character boundary: 1 quote + "ab" + "日" is 6 bytes, the limit reached before "本".
        assert_eq!(quote_property("ab日本", 6), "\"ab日...\"");
        assert!(quote_property(&"x".repeat(500), 64).len() <= 70);
    }

    #[test]
    fn custom_properties_exclude_system_headers() {
        let mut h = ResponseHeaders::default();
        for (k, v) in [
            ("brokerproperties", "{}"),
            ("location", "https://x"),
            ("content-type", "text/plain"),
            ("ce-id", "\"e1\""),
            ("x-ms-request-id", "1"),
            ("priority", "\"High\""),
        ] {
            h.0.insert(k.into(), v.into());
        }
        let props = raw_custom_properties(&h);
        assert_eq!(props.keys().collect::<Vec<_>>(), vec!["ce-id", "priority"]);
    }
}
