//! Dates plus or minus a configured duration, for stores and runtimes: a duration too long for a date
//! (`Duration::MAX` for "for ever", or a keep of a million years read from a settings file) gives the
//! latest or the earliest date there is instead of overflowing. And the one doubling delay that every
//! backoff of the runtimes follows.

use std::time::Duration;

use chrono::{DateTime, Utc};

/// `t + d`, or the latest date there is when that is past it.
///
/// ```
/// use std::time::Duration;
/// use chrono::{DateTime, Utc};
///
/// let now = Utc::now();
/// assert_eq!(txinbox_core::time::after(now, Duration::from_secs(60)), now + chrono::Duration::seconds(60));
/// assert_eq!(txinbox_core::time::after(now, Duration::MAX), DateTime::<Utc>::MAX_UTC);
/// ```
pub fn after(t: DateTime<Utc>, d: Duration) -> DateTime<Utc> {
    chrono::Duration::from_std(d)
        .ok()
        .and_then(|d| t.checked_add_signed(d))
        .unwrap_or(DateTime::<Utc>::MAX_UTC)
}

/// `t - d`, or the earliest date there is when that is before it.
///
/// ```
/// use std::time::Duration;
/// use chrono::{DateTime, Utc};
///
/// let now = Utc::now();
/// assert_eq!(txinbox_core::time::before(now, Duration::MAX), DateTime::<Utc>::MIN_UTC);
/// ```
pub fn before(t: DateTime<Utc>, d: Duration) -> DateTime<Utc> {
    chrono::Duration::from_std(d)
        .ok()
        .and_then(|d| t.checked_sub_signed(d))
        .unwrap_or(DateTime::<Utc>::MIN_UTC)
}

/// `t` as every store keeps a time: within years 1 to 9999, rounded down to the microsecond. A date past the
/// last instant of year 9999 (a keep of "for ever") is that instant, one before year 1 its first.
pub fn kept(t: DateTime<Utc>) -> DateTime<Utc> {
    let first =
        DateTime::<Utc>::from_timestamp(-62_135_596_800, 0).unwrap_or(DateTime::<Utc>::MIN_UTC);
    let last = DateTime::<Utc>::from_timestamp(253_402_300_799, 999_999_000)
        .unwrap_or(DateTime::<Utc>::MAX_UTC);
    let t = t.clamp(first, last);
    t - chrono::Duration::nanoseconds(i64::from(t.timestamp_subsec_nanos() % 1000))
}

/// `text` cut to at most `max` bytes, on a character boundary.
pub(crate) fn cut(text: &str, max: usize) -> &str {
    if text.len() <= max {
        return text;
    }
    let mut end = max;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    &text[..end]
}

/// The `nth` (1 = the first; 0 is taken for it) of a series of delays that starts at `first` and doubles
/// each time up to `max` (a `max` below `first` is taken as `first`), without overflowing: the series the
/// worker's pause after failed receives, its release after a panic, an unavailable shard's release and an
/// effect's retry all follow.
///
/// ```
/// use std::time::Duration;
///
/// let s = |n| txinbox_core::time::doubled(Duration::from_secs(1), Duration::from_secs(60), n).as_secs();
/// assert_eq!((1..=8).map(s).collect::<Vec<_>>(), [1, 2, 4, 8, 16, 32, 60, 60]);
/// assert_eq!(s(0), 1);
/// assert_eq!(s(u32::MAX), 60);
/// ```
pub fn doubled(first: Duration, max: Duration, nth: u32) -> Duration {
    let doublings = nth.saturating_sub(1).min(31);
    first.saturating_mul(1u32 << doublings).min(max.max(first))
}
