//! Dates plus or minus a configured duration, for stores and runtimes: a duration too long for a date
//! (`Duration::MAX` for "for ever", or a keep of a million years read from a settings file) gives the
//! latest or the earliest date there is instead of overflowing.

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
