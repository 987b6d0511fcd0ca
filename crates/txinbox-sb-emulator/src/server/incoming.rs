//! Parsers of what a client sends: one message from headers and body, a batch, the receive `?timeout=`.

use std::time::Duration;

use hyper::body::Bytes;
use hyper::header::{HeaderMap, HeaderName};
use percent_encoding::percent_decode_str;
use serde_json::Value;

use crate::broker::IncomingMessage;
use crate::wire::{self, PropertyValue, SenderProperties};

/// One message: body as-is (no conversion [doc PROPS]), Content-Type kept for the receiver
/// [doc PROPS "Message body"], system properties from `BrokerProperties` and one custom property
/// per other header [doc SEND, PROPS]. Header values are read as bytes, since the crate sends raw
/// UTF-8.
pub(crate) fn single_message(
    headers: &HeaderMap,
    body: Bytes,
    content_type: Option<String>,
) -> Result<Vec<IncomingMessage>, String> {
    let sender = match headers.get("brokerproperties") {
        Some(raw) => wire::parse_broker_properties(raw.as_bytes())?,
        None => SenderProperties::default(),
    };
    let mut properties: Vec<(String, PropertyValue)> = Vec::new();
    for (name, value) in headers {
        let name = name.as_str();
        if wire::is_reserved_header(name) || properties.iter().any(|(n, _)| n == name) {
            continue;
        }
        properties.push((
            name.to_string(),
            PropertyValue::from_header(value.as_bytes()),
        ));
    }
    Ok(vec![IncomingMessage {
        body,
        content_type,
        sender,
        properties,
    }])
}

/// A batch: a JSON array of `{"Body", "BrokerProperties", "UserProperties"}` [doc BATCH].
pub(crate) fn parse_batch(body: &[u8]) -> Result<Vec<IncomingMessage>, String> {
    let items: Vec<Value> = serde_json::from_slice(body)
        .map_err(|e| format!("The batch body is not a JSON array: {e}"))?;
    if items.is_empty() {
        return Err("The batch holds no message.".into());
    }
    let mut messages = Vec::with_capacity(items.len());
    for (index, item) in items.iter().enumerate() {
        let Value::Object(item) = item else {
            return Err(format!("Batch item {index} is not a JSON object."));
        };
        let body = match item.get("Body") {
            None | Some(Value::Null) => Bytes::new(),
            Some(Value::String(s)) => Bytes::from(s.clone()),
            Some(_) => return Err(format!("Batch item {index}: Body must be a string.")),
        };
        let sender = match item.get("BrokerProperties") {
            None | Some(Value::Null) => SenderProperties::default(),
            Some(Value::Object(map)) => wire::sender_properties_from_map(map)
                .map_err(|e| format!("Batch item {index}: {e}"))?,
            Some(_) => {
                return Err(format!(
                    "Batch item {index}: BrokerProperties must be an object."
                ))
            }
        };
        let mut properties = Vec::new();
        match item.get("UserProperties") {
            None | Some(Value::Null) => {}
            Some(Value::Object(map)) => {
                for (name, value) in map {
                    if HeaderName::from_bytes(name.as_bytes()).is_err() {
                        return Err(format!(
                            "Batch item {index}: {name:?} is not a valid property name."
                        ));
                    }
                    let value = PropertyValue::from_json(value)
                        .map_err(|e| format!("Batch item {index}: {e}"))?;
                    properties.push((name.clone(), value));
                }
            }
            Some(_) => {
                return Err(format!(
                    "Batch item {index}: UserProperties must be an object."
                ))
            }
        }
        messages.push(IncomingMessage {
            body,
            content_type: None,
            sender,
            properties,
        });
    }
    Ok(messages)
}

/// The long-poll wait a receive asks for with `?timeout=` (seconds, fractional allowed), capped at `max`;
/// `default` (capped) when absent. A value that is not a finite non-negative number is refused (→ 400).
pub(crate) fn timeout_from_query(
    query: Option<&str>,
    default: Duration,
    max: Duration,
) -> Result<Duration, String> {
    let Some(query) = query else {
        return Ok(default.min(max));
    };
    for pair in query.split('&') {
        let (name, value) = pair.split_once('=').unwrap_or((pair, ""));
        if name.eq_ignore_ascii_case("timeout") {
            let value = percent_decode_str(value).decode_utf8_lossy();
            let seconds: f64 = value
                .trim()
                .parse()
                .ok()
                .filter(|s: &f64| s.is_finite() && *s >= 0.0)
                .ok_or_else(|| format!("timeout={value} is not a number of seconds"))?;
            let requested = Duration::try_from_secs_f64(seconds).unwrap_or(max);
            return Ok(requested.min(max));
        }
    }
    Ok(default.min(max))
}
