//! ISO 8601 durations as Azure Service Bus uses them (`PT1M`, `P14D`, ...), and the redelivery path in
//! seconds.

use std::time::Duration;

/// The longest redelivery path in whole seconds (`dead` the dead-letter or poison queue's retention, if the
/// queue has one), by the workers' own rule: [`txinbox_core::RetentionPolicy::longest_redelivery_path`].
pub(crate) fn redelivery_path(own: u64, dead: Option<u64>, grace: u64) -> u64 {
    txinbox_core::RetentionPolicy::longest_redelivery_path(
        Duration::from_secs(own),
        dead.map(Duration::from_secs),
        Duration::from_secs(grace),
    )
    .as_secs()
}

/// Parses an ISO 8601 duration (`PnYnMnWnDTnHnMnS`) into whole seconds,
/// rounding a fractional second up. A year counts as 365 days and a month as
/// 30 days (Service Bus values are given in days or smaller units in practice).
/// Returns `None` for anything that is not such a duration.
#[cfg(test)]
pub(crate) fn parse_iso8601_seconds(text: &str) -> Option<u64> {
    parse_iso8601(text).map(ceil_secs)
}

/// Whole seconds of `d`, a fraction rounded up: what an upper bound (a time to live) is compared with.
pub(crate) fn ceil_secs(d: Duration) -> u64 {
    d.as_secs() + u64::from(d.subsec_nanos() > 0)
}

/// Parses an ISO 8601 duration (`PnYnMnWnDTnHnMnS`) exactly (to the nanosecond), as
/// [`parse_iso8601_seconds`] does: a lower bound (a lock duration) is compared with it, fraction included.
pub(crate) fn parse_iso8601(text: &str) -> Option<Duration> {
    let rest = text.trim().strip_prefix('P')?;
    if rest.is_empty() {
        return None;
    }
    let (date, time) = match rest.split_once('T') {
        Some((_, "")) => return None,
        Some((d, t)) => (d, Some(t)),
        None => (rest, None),
    };
    let mut total = 0f64;
    total += components(
        date,
        &[
            ('Y', 365.0 * 86400.0),
            ('M', 30.0 * 86400.0),
            ('W', 7.0 * 86400.0),
            ('D', 86400.0),
        ],
    )?;
    if let Some(time) = time {
        total += components(time, &[('H', 3600.0), ('M', 60.0), ('S', 1.0)])?;
    }
    if !total.is_finite() || total.ceil() >= u64::MAX as f64 {
        return None;
    }
    Duration::try_from_secs_f64(total).ok()
}

/// Sums `<number><unit>` pairs whose units appear in `units`' order.
fn components(mut text: &str, units: &[(char, f64)]) -> Option<f64> {
    let mut total = 0f64;
    let mut next_unit = 0;
    while !text.is_empty() {
        let end = text.find(|c: char| !(c.is_ascii_digit() || c == '.' || c == ','))?;
        let number: f64 = text[..end].replace(',', ".").parse().ok()?;
        let unit = text[end..].chars().next()?;
        let index = units[next_unit..].iter().position(|(u, _)| *u == unit)? + next_unit;
        total += number * units[index].1;
        next_unit = index + 1;
        text = &text[end + unit.len_utf8()..];
    }
    Some(total)
}

/// Formats an interval that may have a fraction of a second for messages: `20 s`, `16.666 s` (to the
/// millisecond, rounded down).
pub(crate) fn exact(d: Duration) -> String {
    let ms = d.as_millis();
    if ms % 1000 == 0 {
        format!("{} s", ms / 1000)
    } else {
        format!("{}.{:03} s", ms / 1000, ms % 1000)
    }
}

/// Formats seconds for messages: `60 s`, `10 min`, `14 d`.
pub(crate) fn human(seconds: u64) -> String {
    if seconds >= 86400 && seconds % 86400 == 0 {
        format!("{seconds} s = {} d", seconds / 86400)
    } else if seconds >= 86400 {
        format!("{seconds} s = {:.1} d", seconds as f64 / 86400.0)
    } else if seconds >= 60 && seconds % 60 == 0 {
        format!("{seconds} s = {} min", seconds / 60)
    } else {
        format!("{seconds} s")
    }
}

#[cfg(test)]
mod tests {
    use super::parse_iso8601_seconds as p;

    #[test]
    fn parses_service_bus_durations() {
        assert_eq!(p("PT1M"), Some(60));
        assert_eq!(p("PT30S"), Some(30));
        assert_eq!(p("PT10M"), Some(600));
        assert_eq!(p("P14D"), Some(14 * 86400));
        assert_eq!(p("P1DT2H3M4.5S"), Some(86400 + 7200 + 180 + 5));
        assert_eq!(p("P1W"), Some(7 * 86400));
        assert_eq!(p("P1M"), Some(30 * 86400));
        assert_eq!(
            p("P10675199DT2H48M5.4775807S"),
            Some(10675199 * 86400 + 2 * 3600 + 48 * 60 + 6)
        );
    }

    #[test]
    fn rejects_garbage() {
        for bad in [
            "",
            "P",
            "PT",
            "1M",
            "PT1X",
            "P1H",
            "PT1S1M",
            "10 minutes",
            "PTM",
        ] {
            assert_eq!(p(bad), None, "{bad:?}");
        }
    }
}
