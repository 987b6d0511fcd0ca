//! Queue properties and the duration formats the control API accepts.

use std::time::Duration;

use serde::{Deserialize, Serialize};

/// The longest lock duration the service allows: 5 minutes [doc ARM].
pub const MAX_LOCK_DURATION: Duration = Duration::from_secs(5 * 60);

/// The longest duplicate-detection window the service allows: 7 days [doc DUP].
pub const MAX_DUPLICATE_DETECTION_WINDOW: Duration = Duration::from_secs(7 * 24 * 60 * 60);

/// Properties of an emulated queue, with the service's defaults [doc ARM, DUP, TTL, QUOTA].
///
/// Build one with [`QueueProperties::default`] and the chainable setters. Unlike the real service,
/// durations below the documented minimums are allowed (for example a 1.5 s lock) so tests run fast.
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub struct QueueProperties {
    /// How long a peek-lock holds a message; default 1 minute, at most 5 minutes [doc ARM].
    pub lock_duration: Duration,
    /// Deliveries after which the broker dead-letters a message; default 10 [doc ARM, DLQ].
    pub max_delivery_count: u32,
    /// Whether sends with a MessageId seen within the window are dropped; default off [doc DUP].
    pub requires_duplicate_detection: bool,
    /// How long a MessageId is remembered; default 10 minutes [doc DUP].
    pub duplicate_detection_history_time_window: Duration,
    /// TTL of messages that set none, and the cap of those that do; `None` = never expire [doc TTL].
    pub default_message_time_to_live: Option<Duration>,
    /// Whether expired messages go to the dead-letter queue instead of being dropped [doc TTL].
    pub dead_lettering_on_message_expiration: bool,
    /// Whether every message must carry a SessionId [doc SESS].
    pub requires_session: bool,
    /// Largest accepted message (body plus properties) in KiB; default 256 (Standard tier) [doc QUOTA].
    pub max_message_size_in_kilobytes: u32,
}

impl Default for QueueProperties {
    fn default() -> Self {
        Self {
            lock_duration: Duration::from_secs(60),
            max_delivery_count: 10,
            requires_duplicate_detection: false,
            duplicate_detection_history_time_window: Duration::from_secs(10 * 60),
            default_message_time_to_live: None,
            dead_lettering_on_message_expiration: false,
            requires_session: false,
            max_message_size_in_kilobytes: 256,
        }
    }
}

impl QueueProperties {
    /// Sets the lock duration.
    pub fn lock_duration(mut self, value: Duration) -> Self {
        self.lock_duration = value;
        self
    }

    /// Sets the maximum delivery count.
    pub fn max_delivery_count(mut self, value: u32) -> Self {
        self.max_delivery_count = value;
        self
    }

    /// Turns duplicate detection on with the given history window.
    pub fn duplicate_detection(mut self, window: Duration) -> Self {
        self.requires_duplicate_detection = true;
        self.duplicate_detection_history_time_window = window;
        self
    }

    /// Sets the default (and maximum) message time to live.
    pub fn default_message_time_to_live(mut self, value: Duration) -> Self {
        self.default_message_time_to_live = Some(value);
        self
    }

    /// Sets whether expired messages are dead-lettered.
    pub fn dead_lettering_on_message_expiration(mut self, value: bool) -> Self {
        self.dead_lettering_on_message_expiration = value;
        self
    }

    /// Sets whether the queue requires sessions.
    pub fn requires_session(mut self, value: bool) -> Self {
        self.requires_session = value;
        self
    }

    /// Sets the largest accepted message size in KiB.
    pub fn max_message_size_in_kilobytes(mut self, value: u32) -> Self {
        self.max_message_size_in_kilobytes = value;
        self
    }

    /// Reads the control API's JSON (`{"lockDuration":"PT1.5S","maxDeliveryCount":3,...}`; see the
    /// crate docs), starting from the defaults.
    pub fn from_json(json: &str) -> Result<Self, String> {
        let input: QueuePropertiesInput =
            serde_json::from_str(json).map_err(|e| format!("invalid queue properties: {e}"))?;
        Self::default().apply(input)
    }

    /// Checks the ranges the emulator enforces.
    pub(crate) fn validate(&self) -> Result<(), String> {
        if self.lock_duration.is_zero() || self.lock_duration > MAX_LOCK_DURATION {
            return Err("lockDuration must be above zero and at most PT5M".into());
        }
        if self.max_delivery_count == 0 || self.max_delivery_count > i32::MAX as u32 {
            return Err("maxDeliveryCount must be at least 1".into());
        }
        if self.duplicate_detection_history_time_window.is_zero()
            || self.duplicate_detection_history_time_window > MAX_DUPLICATE_DETECTION_WINDOW
        {
            return Err(
                "duplicateDetectionHistoryTimeWindow must be above zero and at most P7D".into(),
            );
        }
        if self
            .default_message_time_to_live
            .is_some_and(|d| d.is_zero())
        {
            return Err("defaultMessageTimeToLive must be above zero".into());
        }
        if self.max_message_size_in_kilobytes == 0 {
            return Err("maxMessageSizeInKilobytes must be at least 1".into());
        }
        Ok(())
    }

    /// Applies the fields present in a control-API request on top of `self`.
    pub(crate) fn apply(mut self, input: QueuePropertiesInput) -> Result<Self, String> {
        if let Some(v) = input.lock_duration {
            self.lock_duration = v.to_duration("lockDuration")?;
        }
        if let Some(v) = input.max_delivery_count {
            self.max_delivery_count = v;
        }
        if let Some(v) = input.requires_duplicate_detection {
            self.requires_duplicate_detection = v;
        }
        if let Some(v) = input.duplicate_detection_history_time_window {
            self.duplicate_detection_history_time_window =
                v.to_duration("duplicateDetectionHistoryTimeWindow")?;
        }
        if let Some(v) = input.default_message_time_to_live {
            self.default_message_time_to_live = Some(v.to_duration("defaultMessageTimeToLive")?);
        }
        if let Some(v) = input.dead_lettering_on_message_expiration {
            self.dead_lettering_on_message_expiration = v;
        }
        if let Some(v) = input.requires_session {
            self.requires_session = v;
        }
        if let Some(v) = input.max_message_size_in_kilobytes {
            self.max_message_size_in_kilobytes = v;
        }
        self.validate()?;
        Ok(self)
    }

    pub(crate) fn to_output(&self) -> QueuePropertiesOutput {
        QueuePropertiesOutput {
            lock_duration: format_iso8601(self.lock_duration),
            lock_duration_ms: millis(self.lock_duration),
            max_delivery_count: self.max_delivery_count,
            requires_duplicate_detection: self.requires_duplicate_detection,
            duplicate_detection_history_time_window: format_iso8601(
                self.duplicate_detection_history_time_window,
            ),
            default_message_time_to_live: self.default_message_time_to_live.map(format_iso8601),
            dead_lettering_on_message_expiration: self.dead_lettering_on_message_expiration,
            requires_session: self.requires_session,
            max_message_size_in_kilobytes: self.max_message_size_in_kilobytes,
        }
    }
}

fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// The body of `PUT /$emulator/queues/{path}`: every field optional, names as in ARM's
/// `SBQueueProperties` [doc ARM].
#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub(crate) struct QueuePropertiesInput {
    lock_duration: Option<DurationInput>,
    max_delivery_count: Option<u32>,
    requires_duplicate_detection: Option<bool>,
    duplicate_detection_history_time_window: Option<DurationInput>,
    default_message_time_to_live: Option<DurationInput>,
    dead_lettering_on_message_expiration: Option<bool>,
    requires_session: Option<bool>,
    max_message_size_in_kilobytes: Option<u32>,
}

/// A duration in the control API: an ISO 8601 string (`"PT1.5S"`) or a number of milliseconds.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
enum DurationInput {
    Millis(f64),
    Iso(String),
}

impl DurationInput {
    fn to_duration(&self, field: &str) -> Result<Duration, String> {
        match self {
            DurationInput::Millis(ms) => Duration::try_from_secs_f64(ms / 1000.0)
                .map_err(|_| format!("{field}: {ms} is not a valid number of milliseconds")),
            DurationInput::Iso(text) => parse_iso8601(text)
                .ok_or_else(|| format!("{field}: {text:?} is not an ISO 8601 duration")),
        }
    }
}

/// Queue properties as the control API reports them.
#[derive(Clone, Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct QueuePropertiesOutput {
    /// ISO 8601, for example `PT1.5S`.
    pub lock_duration: String,
    /// The same in milliseconds.
    pub lock_duration_ms: u64,
    /// Maximum delivery count.
    pub max_delivery_count: u32,
    /// Duplicate detection on or off.
    pub requires_duplicate_detection: bool,
    /// ISO 8601 duplicate-detection window.
    pub duplicate_detection_history_time_window: String,
    /// ISO 8601 default TTL, absent when messages never expire by default.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub default_message_time_to_live: Option<String>,
    /// Dead-lettering on expiration on or off.
    pub dead_lettering_on_message_expiration: bool,
    /// Sessions required or not.
    pub requires_session: bool,
    /// Largest message in KiB.
    pub max_message_size_in_kilobytes: u32,
}

/// Parses an ISO 8601 duration of days, hours, minutes and (fractional) seconds, for example
/// `PT1M`, `PT1.5S`, `P1DT2H`, `P2W`. Years and months are refused (their length varies).
pub fn parse_iso8601(text: &str) -> Option<Duration> {
    let rest = text.trim().strip_prefix(['P', 'p'])?;
    let mut total = 0f64;
    let mut in_time = false;
    let mut number = String::new();
    let mut saw_component = false;
    for c in rest.chars() {
        match c {
            '0'..='9' | '.' | ',' => number.push(if c == ',' { '.' } else { c }),
            'T' | 't' if !in_time && number.is_empty() => in_time = true,
            _ => {
                let value: f64 = number.parse().ok()?;
                number.clear();
                let unit = match (in_time, c.to_ascii_uppercase()) {
                    (false, 'W') => 7.0 * 86_400.0,
                    (false, 'D') => 86_400.0,
                    (true, 'H') => 3_600.0,
                    (true, 'M') => 60.0,
                    (true, 'S') => 1.0,
                    _ => return None,
                };
                total += value * unit;
                saw_component = true;
            }
        }
    }
    if !number.is_empty() || !saw_component {
        return None;
    }
    Duration::try_from_secs_f64(total).ok()
}

/// Formats a duration as ISO 8601 (`PT1M30S`, `PT1.5S`, `P1DT2H`).
pub fn format_iso8601(d: Duration) -> String {
    let total_ms = d.as_millis();
    let days = total_ms / 86_400_000;
    let hours = total_ms / 3_600_000 % 24;
    let minutes = total_ms / 60_000 % 60;
    let seconds = total_ms / 1000 % 60;
    let ms = total_ms % 1000;
    let mut out = String::from("P");
    if days > 0 {
        out.push_str(&format!("{days}D"));
    }
    if hours > 0 || minutes > 0 || seconds > 0 || ms > 0 || days == 0 {
        out.push('T');
        if hours > 0 {
            out.push_str(&format!("{hours}H"));
        }
        if minutes > 0 {
            out.push_str(&format!("{minutes}M"));
        }
        if seconds > 0 || ms > 0 || (hours == 0 && minutes == 0) {
            if ms > 0 {
                let frac = format!("{ms:03}");
                out.push_str(&format!("{seconds}.{}S", frac.trim_end_matches('0')));
            } else {
                out.push_str(&format!("{seconds}S"));
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_iso8601_durations() {
        assert_eq!(parse_iso8601("PT1M"), Some(Duration::from_secs(60)));
        assert_eq!(parse_iso8601("PT1.5S"), Some(Duration::from_millis(1500)));
        assert_eq!(
            parse_iso8601("P1DT2H"),
            Some(Duration::from_secs(26 * 3600))
        );
        assert_eq!(parse_iso8601("P2W"), Some(Duration::from_secs(14 * 86_400)));
        assert_eq!(parse_iso8601("PT0,25S"), Some(Duration::from_millis(250)));
        assert_eq!(parse_iso8601("P1Y"), None);
        assert_eq!(parse_iso8601("PT"), None);
        assert_eq!(parse_iso8601("1M"), None);
        assert_eq!(parse_iso8601("PT5"), None);
        assert_eq!(parse_iso8601("P1H"), None);
    }

    #[test]
    fn formats_iso8601_durations() {
        assert_eq!(format_iso8601(Duration::from_secs(60)), "PT1M");
        assert_eq!(format_iso8601(Duration::from_millis(1500)), "PT1.5S");
        assert_eq!(format_iso8601(Duration::from_secs(90)), "PT1M30S");
        assert_eq!(format_iso8601(Duration::ZERO), "PT0S");
        assert_eq!(format_iso8601(Duration::from_secs(86_400)), "P1D");
        assert_eq!(format_iso8601(Duration::from_secs(26 * 3600)), "P1DT2H");
    }

    #[test]
    fn applies_control_api_input() {
        let input: QueuePropertiesInput = serde_json::from_str(
            r#"{"lockDuration":"PT1.5S","maxDeliveryCount":3,"defaultMessageTimeToLive":2500}"#,
        )
        .unwrap();
        let props = QueueProperties::default().apply(input).unwrap();
        assert_eq!(props.lock_duration, Duration::from_millis(1500));
        assert_eq!(props.max_delivery_count, 3);
        assert_eq!(
            props.default_message_time_to_live,
            Some(Duration::from_millis(2500))
        );

        let bad: QueuePropertiesInput =
            serde_json::from_str(r#"{"lockDuration":"PT10M"}"#).unwrap();
        assert!(QueueProperties::default().apply(bad).is_err());
        assert!(serde_json::from_str::<QueuePropertiesInput>(r#"{"lockDurationX":1}"#).is_err());
    }
}
