//! Wire formats: `BrokerProperties`, custom-property headers, dates, error bodies.

use std::time::Duration;

use chrono::{DateTime, Utc};
use serde_json::{Map, Value};

/// `TimeSpan.MaxValue` in seconds: what the service reports as the TimeToLive of a message that
/// never expires [inference; the crate parses it as an f64].
pub(crate) const TIME_SPAN_MAX_SECONDS: f64 = 922_337_203_685.477_5;

/// The longest MessageId or SessionId [doc QUOTA].
pub(crate) const MAX_ID_LEN: usize = 128;

/// Formats a date as RFC 1123 with `GMT`, the format of every date in `BrokerProperties`
/// [doc PROPS]; the crate's RFC 2822 parser accepts it.
pub(crate) fn format_http_date(t: DateTime<Utc>) -> String {
    t.format("%a, %d %b %Y %H:%M:%S GMT").to_string()
}

/// Parses an RFC 1123 / RFC 2822 date; accepts both `GMT` (the docs) and `+0000` (what the crate
/// sends for ScheduledEnqueueTimeUtc).
pub(crate) fn parse_http_date(text: &str) -> Option<DateTime<Utc>> {
    DateTime::parse_from_rfc2822(text.trim())
        .ok()
        .map(|t| t.with_timezone(&Utc))
}

/// The system properties a sender may set in `BrokerProperties` [doc PROPS table].
#[derive(Debug, Default, Clone)]
pub(crate) struct SenderProperties {
    pub message_id: Option<String>,
    pub correlation_id: Option<String>,
    pub session_id: Option<String>,
    pub label: Option<String>,
    pub reply_to: Option<String>,
    pub to: Option<String>,
    pub reply_to_session_id: Option<String>,
    pub partition_key: Option<String>,
    pub time_to_live: Option<TimeToLive>,
    pub scheduled_enqueue_time_utc: Option<DateTime<Utc>>,
    /// Only in batch bodies: the content type rides in BrokerProperties there.
    pub content_type: Option<String>,
}

/// A requested TimeToLive.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) enum TimeToLive {
    /// A finite TTL.
    Finite(Duration),
    /// Larger than any Duration: never expires.
    Unbounded,
}

/// Parses the `BrokerProperties` header of a send. Read-only and unknown properties are ignored,
/// a malformed value is an error (→ 400) [doc PROPS].
pub(crate) fn parse_broker_properties(raw: &[u8]) -> Result<SenderProperties, String> {
    let value: Value = serde_json::from_slice(raw)
        .map_err(|e| format!("BrokerProperties is not valid JSON: {e}"))?;
    let Value::Object(map) = value else {
        return Err("BrokerProperties must be a JSON object".into());
    };
    sender_properties_from_map(&map)
}

pub(crate) fn sender_properties_from_map(
    map: &Map<String, Value>,
) -> Result<SenderProperties, String> {
    let mut props = SenderProperties {
        message_id: string_field(map, "MessageId")?,
        correlation_id: string_field(map, "CorrelationId")?,
        session_id: string_field(map, "SessionId")?,
        label: string_field(map, "Label")?,
        reply_to: string_field(map, "ReplyTo")?,
        to: string_field(map, "To")?,
        reply_to_session_id: string_field(map, "ReplyToSessionId")?,
        partition_key: string_field(map, "PartitionKey")?,
        content_type: string_field(map, "ContentType")?,
        ..SenderProperties::default()
    };
    // TimeToLive is a number of seconds (a double) [doc PROPS]; the batch example writes a .NET
    // TimeSpan string instead (`"TimeToLiveTimeSpan":"0.00:00:40"`) [doc BATCH].
    match map.get("TimeToLive") {
        None | Some(Value::Null) => {}
        Some(Value::Number(n)) => {
            let secs = n.as_f64().ok_or("TimeToLive is not a number")?;
            props.time_to_live = Some(ttl_from_seconds(secs)?);
        }
        Some(_) => return Err("TimeToLive must be a number of seconds".into()),
    }
    match map.get("TimeToLiveTimeSpan") {
        None | Some(Value::Null) => {}
        Some(Value::String(s)) => {
            let d = parse_timespan(s)
                .ok_or_else(|| format!("TimeToLiveTimeSpan {s:?} is not a TimeSpan"))?;
            if d.is_zero() {
                return Err("TimeToLiveTimeSpan must be above zero".into());
            }
            props.time_to_live = Some(TimeToLive::Finite(d));
        }
        Some(_) => return Err("TimeToLiveTimeSpan must be a string".into()),
    }
    if let Some(text) = string_field(map, "ScheduledEnqueueTimeUtc")? {
        let t = parse_http_date(&text)
            .ok_or_else(|| format!("ScheduledEnqueueTimeUtc {text:?} is not an RFC 1123 date"))?;
        props.scheduled_enqueue_time_utc = Some(t);
    }
    for (name, value) in [
        ("MessageId", &props.message_id),
        ("SessionId", &props.session_id),
    ] {
        if let Some(v) = value {
            if v.is_empty() || v.chars().count() > MAX_ID_LEN {
                return Err(format!("{name} must have 1 to {MAX_ID_LEN} characters"));
            }
        }
    }
    // "If SessionId and PartitionKey are both set, they must be equal" [doc PROPS].
    if let (Some(s), Some(p)) = (&props.session_id, &props.partition_key) {
        if s != p {
            return Err("PartitionKey must equal SessionId when both are set".into());
        }
    }
    Ok(props)
}

fn ttl_from_seconds(secs: f64) -> Result<TimeToLive, String> {
    if !secs.is_finite() || secs <= 0.0 {
        return Err("TimeToLive must be a positive number of seconds".into());
    }
    Ok(Duration::try_from_secs_f64(secs)
        .map(TimeToLive::Finite)
        .unwrap_or(TimeToLive::Unbounded))
}

fn string_field(map: &Map<String, Value>, name: &str) -> Result<Option<String>, String> {
    match map.get(name) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => Ok(Some(s.clone())),
        Some(_) => Err(format!("{name} must be a string")),
    }
}

/// Parses a .NET TimeSpan string: `[d.]hh:mm:ss[.fffffff]`.
pub(crate) fn parse_timespan(text: &str) -> Option<Duration> {
    let text = text.trim();
    let (days, clock) = match text.split_once(':') {
        Some((head, tail)) => match head.split_once('.') {
            Some((d, h)) => (d.parse::<u64>().ok()?, format!("{h}:{tail}")),
            None => (0, text.to_string()),
        },
        None => (text.parse::<u64>().ok()?, "0:0:0".to_string()),
    };
    let mut parts = clock.split(':');
    let hours: u64 = parts.next()?.parse().ok()?;
    let minutes: u64 = parts.next()?.parse().ok()?;
    let seconds: f64 = parts.next()?.parse().ok()?;
    if parts.next().is_some() || hours > 23 || minutes > 59 || !(0.0..60.0).contains(&seconds) {
        return None;
    }
    let whole = days
        .checked_mul(86_400)?
        .checked_add(hours * 3600 + minutes * 60)?;
    Duration::from_secs(whole).checked_add(Duration::try_from_secs_f64(seconds).ok()?)
}

/// The value of an application ("custom") property.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum PropertyValue {
    String(String),
    DateTime(DateTime<Utc>),
    Bool(bool),
    Int(i64),
    Double(f64),
}

impl PropertyValue {
    /// Infers the type of a custom-property header value [doc PROPS]: quoted text is a DateTime
    /// when it is an RFC 2616 date and a string otherwise; unquoted `true`/`false` is a Boolean,
    /// then Int64, then Double. The rule says anything else is rejected, but the doc's own SEND
    /// example sends `Priority: High` unquoted and gets 201 [doc SEND example], so it is kept as a
    /// string here.
    pub(crate) fn from_header(raw: &[u8]) -> PropertyValue {
        let text = String::from_utf8_lossy(raw);
        let text = text.trim();
        if text.len() >= 2 && text.starts_with('"') && text.ends_with('"') {
            let inner = &text[1..text.len() - 1];
            return match parse_http_date(inner) {
                Some(t) => PropertyValue::DateTime(t),
                None => PropertyValue::String(inner.to_string()),
            };
        }
        match text {
            "true" => return PropertyValue::Bool(true),
            "false" => return PropertyValue::Bool(false),
            _ => {}
        }
        if let Ok(i) = text.parse::<i64>() {
            return PropertyValue::Int(i);
        }
        match text.parse::<f64>() {
            Ok(f) if f.is_finite() && text.bytes().any(|b| b.is_ascii_digit()) => {
                PropertyValue::Double(f)
            }
            _ => PropertyValue::String(text.to_string()),
        }
    }

    /// Reads a `UserProperties` value of a batch body [doc BATCH].
    pub(crate) fn from_json(value: &Value) -> Result<PropertyValue, String> {
        match value {
            Value::String(s) => Ok(PropertyValue::String(s.clone())),
            Value::Bool(b) => Ok(PropertyValue::Bool(*b)),
            Value::Number(n) => match n.as_i64() {
                Some(i) => Ok(PropertyValue::Int(i)),
                None => n
                    .as_f64()
                    .map(PropertyValue::Double)
                    .ok_or_else(|| "UserProperties number out of range".to_string()),
            },
            _ => Err("UserProperties values must be strings, numbers or booleans".into()),
        }
    }

    /// The header value on receive: strings and dates are quoted [doc PEEK, RAD examples].
    pub(crate) fn to_header(&self) -> String {
        match self {
            PropertyValue::String(s) => format!("\"{s}\""),
            PropertyValue::DateTime(t) => format!("\"{}\"", format_http_date(*t)),
            PropertyValue::Bool(b) => b.to_string(),
            PropertyValue::Int(i) => i.to_string(),
            PropertyValue::Double(f) => f.to_string(),
        }
    }

    /// The value in control-API JSON.
    pub(crate) fn to_json(&self) -> Value {
        match self {
            PropertyValue::String(s) => Value::String(s.clone()),
            PropertyValue::DateTime(t) => Value::String(format_http_date(*t)),
            PropertyValue::Bool(b) => Value::Bool(*b),
            PropertyValue::Int(i) => Value::from(*i),
            PropertyValue::Double(f) => Value::from(*f),
        }
    }

    pub(crate) fn approximate_size(&self) -> usize {
        match self {
            PropertyValue::String(s) => s.len(),
            _ => 8,
        }
    }
}

/// Request headers that are never application properties: HTTP's own, the ones the protocol
/// uses, and restricted names the service drops [doc PROPS].
pub(crate) fn is_reserved_header(name: &str) -> bool {
    const RESERVED: &[&str] = &[
        "accept",
        "accept-charset",
        "accept-encoding",
        "accept-language",
        "authorization",
        "brokerproperties",
        "cache-control",
        "connection",
        "content-encoding",
        "content-length",
        "content-type",
        "cookie",
        "date",
        "expect",
        "host",
        "if-match",
        "if-modified-since",
        "if-none-match",
        "keep-alive",
        "location",
        "pragma",
        "proxy-authorization",
        "proxy-connection",
        "range",
        "referer",
        "retry-after",
        "server",
        "te",
        "trailer",
        "transfer-encoding",
        "upgrade",
        "user-agent",
        "via",
    ];
    RESERVED.contains(&name) || name.starts_with("x-ms-") || name.starts_with("x-forwarded-")
}

/// Serializes JSON with every non-ASCII character escaped as `\uXXXX`, because azure_core 0.21
/// silently drops a response header that is not visible ASCII.
pub(crate) fn ascii_json(value: &Value) -> String {
    let text = value.to_string();
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        if c.is_ascii() {
            out.push(c);
        } else {
            let mut buf = [0u16; 2];
            for unit in c.encode_utf16(&mut buf) {
                out.push_str(&format!("\\u{unit:04x}"));
            }
        }
    }
    out
}

/// An error body shaped like the service's (`<Error><Code>…</Code><Detail>…</Detail></Error>`)
/// [inference].
pub(crate) fn error_xml(code: u16, detail: &str) -> String {
    format!(
        "<Error><Code>{code}</Code><Detail>{}</Detail></Error>",
        xml_escape(detail)
    )
}

fn xml_escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '&' => out.push_str("&amp;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&apos;"),
            c if c.is_control() => out.push(' '),
            c => out.push(c),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dates_round_trip_in_gmt() {
        let t = parse_http_date("Wed, 02 Jul 2014 01:32:27 GMT").unwrap();
        assert_eq!(format_http_date(t), "Wed, 02 Jul 2014 01:32:27 GMT");
        assert_eq!(
            parse_http_date("Wed, 02 Jan 2030 03:04:05 +0000")
                .map(format_http_date)
                .as_deref(),
            Some("Wed, 02 Jan 2030 03:04:05 GMT")
        );
        assert!(parse_http_date("yesterday").is_none());
    }

    #[test]
    fn parses_sender_properties() {
        let p = parse_broker_properties(
            br#"{"Label":"M1","MessageId":"m-1","TimeToLive":90.5,"State":"Ignored","DeliveryCount":7,
                 "ScheduledEnqueueTimeUtc":"Wed, 02 Jan 2030 03:04:05 +0000"}"#,
        )
        .unwrap();
        assert_eq!(p.label.as_deref(), Some("M1"));
        assert_eq!(p.message_id.as_deref(), Some("m-1"));
        assert_eq!(
            p.time_to_live,
            Some(TimeToLive::Finite(Duration::from_secs_f64(90.5)))
        );
        assert!(p.scheduled_enqueue_time_utc.is_some());

        assert!(parse_broker_properties(b"not json").is_err());
        assert!(parse_broker_properties(b"[1]").is_err());
        assert!(parse_broker_properties(br#"{"Label":5}"#).is_err());
        assert!(parse_broker_properties(br#"{"TimeToLive":"ten"}"#).is_err());
        assert!(parse_broker_properties(br#"{"TimeToLive":-1}"#).is_err());
        assert!(parse_broker_properties(br#"{"SessionId":"a","PartitionKey":"b"}"#).is_err());
        let long_id = format!(r#"{{"MessageId":"{}"}}"#, "x".repeat(129));
        assert!(parse_broker_properties(long_id.as_bytes()).is_err());
        assert_eq!(
            parse_broker_properties(br#"{"TimeToLive":1e300}"#)
                .unwrap()
                .time_to_live,
            Some(TimeToLive::Unbounded)
        );
    }

    #[test]
    fn parses_timespans() {
        assert_eq!(parse_timespan("0.00:00:40"), Some(Duration::from_secs(40)));
        assert_eq!(
            parse_timespan("00:01:30.5"),
            Some(Duration::from_millis(90_500))
        );
        assert_eq!(
            parse_timespan("1.02:00:00"),
            Some(Duration::from_secs(26 * 3600))
        );
        assert_eq!(parse_timespan("2"), Some(Duration::from_secs(2 * 86_400)));
        assert_eq!(parse_timespan("00:61:00"), None);
        assert_eq!(parse_timespan("abc"), None);
    }

    #[test]
    fn infers_custom_property_types() {
        assert_eq!(
            PropertyValue::from_header(b"\"High\""),
            PropertyValue::String("High".into())
        );
        assert_eq!(
            PropertyValue::from_header(b"High"),
            PropertyValue::String("High".into())
        );
        assert_eq!(
            PropertyValue::from_header(b"12345"),
            PropertyValue::Int(12345)
        );
        assert_eq!(
            PropertyValue::from_header(b"1.5"),
            PropertyValue::Double(1.5)
        );
        assert_eq!(
            PropertyValue::from_header(b"true"),
            PropertyValue::Bool(true)
        );
        assert_eq!(
            PropertyValue::from_header(b"True"),
            PropertyValue::String("True".into())
        );
        assert_eq!(
            PropertyValue::from_header(b"NaN"),
            PropertyValue::String("NaN".into())
        );
        assert!(matches!(
            PropertyValue::from_header(b"\"Sun, 06 Nov 1994 08:49:37 GMT\""),
            PropertyValue::DateTime(_)
        ));
        assert_eq!(
            PropertyValue::String("12345,ABC".into()).to_header(),
            "\"12345,ABC\""
        );
        assert_eq!(PropertyValue::Int(7).to_header(), "7");
    }

    #[test]
    fn escapes_non_ascii_json() {
        let v = serde_json::json!({"Label": "café 🎉"});
        let s = ascii_json(&v);
        assert!(s.is_ascii());
        assert_eq!(serde_json::from_str::<Value>(&s).unwrap(), v);
    }

    #[test]
    fn escapes_error_details() {
        assert_eq!(
            error_xml(404, "a<b"),
            "<Error><Code>404</Code><Detail>a&lt;b</Detail></Error>"
        );
    }
}
