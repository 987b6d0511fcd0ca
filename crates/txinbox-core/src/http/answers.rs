//! What an HTTP destination's answer means: the answer table and `Retry-After`.

use std::collections::BTreeMap;
use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use chrono::{DateTime, NaiveDateTime, Utc};

/// What an answer to an effect's call means. The [default table](AnswerTable::default) follows the IETF
/// httpapi Idempotency-Key draft and HTTP's own semantics; override an entry per destination with
/// [`HttpEffectBuilder::answer`](super::HttpEffectBuilder::answer).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Answer {
    /// The destination did it: done, with the reference read from the answer (a 2xx without the declared
    /// reference is uncertain, never done).
    Done,
    /// Nothing happened; come back later: pending again after a backoff, no sooner than the answer's
    /// `Retry-After`.
    NotSent,
    /// Not sent when the answer carries a valid `Retry-After` (the server said when to come back), uncertain
    /// otherwise (a 503 without it may come from a gateway that forwarded the request).
    RetryAfter,
    /// The destination is still processing a request with this key (the draft's 409): not final, reconciled
    /// after a backoff, never failed.
    InProgress,
    /// May have happened: reconciled before any retry.
    Uncertain,
    /// Refused, nothing happened: failed with the answer as evidence.
    Rejected,
    /// The key was used before with another body (the draft's 422): failed, with the hashes of this request's
    /// body and of the first call's as evidence (a bug in the sender, or another sender using the key). At a
    /// destination not said to keep keys ([`Key::none`](super::Key::none), or no key declared) it is read as
    /// [`Answer::Rejected`]: its 422 is its own refusal.
    KeyReused,
}

impl Answer {
    /// Every answer, with the name the settings file uses.
    pub const ALL: [(Answer, &'static str); 7] = [
        (Answer::Done, "done"),
        (Answer::NotSent, "not_sent"),
        (Answer::RetryAfter, "retry_after"),
        (Answer::InProgress, "in_progress"),
        (Answer::Uncertain, "uncertain"),
        (Answer::Rejected, "rejected"),
        (Answer::KeyReused, "key_reused"),
    ];

    /// The settings file's name of this answer (`in_progress`).
    pub fn as_str(self) -> &'static str {
        Self::ALL
            .iter()
            .find(|(a, _)| *a == self)
            .map_or("uncertain", |(_, n)| n)
    }
}

impl fmt::Display for Answer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for Answer {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        Self::ALL
            .iter()
            .find(|(_, n)| *n == s)
            .map(|(a, _)| *a)
            .ok_or_else(|| {
                let names: Vec<&str> = Self::ALL.iter().map(|(_, n)| *n).collect();
                format!("unknown answer {s:?} (one of {})", names.join(", "))
            })
    }
}

/// How a destination's status codes are read: exact codes first, then classes (`4xx`), then
/// [`Answer::Uncertain`].
///
/// | status | default answer |
/// |---|---|
/// | 2xx | [`Answer::Done`] |
/// | 408, 425, 429 | [`Answer::NotSent`] |
/// | 409 | [`Answer::InProgress`] |
/// | 422 | [`Answer::KeyReused`] |
/// | other 4xx | [`Answer::Rejected`] |
/// | 503 | [`Answer::RetryAfter`] |
/// | 502, 504, other 5xx, 1xx, 3xx | [`Answer::Uncertain`] |
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AnswerTable {
    exact: BTreeMap<u16, Answer>,
    classes: BTreeMap<u8, Answer>,
}

impl Default for AnswerTable {
    fn default() -> Self {
        let exact = BTreeMap::from([
            (408, Answer::NotSent),
            (409, Answer::InProgress),
            (422, Answer::KeyReused),
            (425, Answer::NotSent),
            (429, Answer::NotSent),
            (503, Answer::RetryAfter),
        ]);
        let classes = BTreeMap::from([(2, Answer::Done), (4, Answer::Rejected)]);
        Self { exact, classes }
    }
}

impl AnswerTable {
    /// What `status` means.
    pub fn get(&self, status: u16) -> Answer {
        self.exact
            .get(&status)
            .or_else(|| self.classes.get(&((status / 100) as u8)))
            .copied()
            .unwrap_or(Answer::Uncertain)
    }

    /// Sets the answer of one status (100 to 599).
    pub(crate) fn set(&mut self, status: u16, answer: Answer) {
        self.exact.insert(status, answer);
    }

    /// Sets the answer of a class (`4` for 4xx), below the exact codes: the defaults' exact codes of that
    /// class are dropped, so `4xx = rejected` means every 4xx.
    pub(crate) fn set_class(&mut self, class: u8, answer: Answer) {
        self.exact.retain(|s, _| (s / 100) as u8 != class);
        self.classes.insert(class, answer);
    }
}

/// A status or a class as the settings file names it: `"409"` or `"4xx"`.
pub(crate) enum StatusMatch {
    Exact(u16),
    Class(u8),
}

impl FromStr for StatusMatch {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        let bad = || format!("{s:?} is neither a status (100 to 599) nor a class (1xx to 5xx)");
        if let Some(c) = s.strip_suffix("xx").or_else(|| s.strip_suffix("XX")) {
            return match c.parse::<u8>() {
                Ok(c @ 1..=5) => Ok(StatusMatch::Class(c)),
                _ => Err(bad()),
            };
        }
        match s.parse::<u16>() {
            Ok(n @ 100..=599) => Ok(StatusMatch::Exact(n)),
            _ => Err(bad()),
        }
    }
}

/// The longest delay a `Retry-After` is taken at: a day. A longer one (a hostile or broken answer, up to
/// `u64::MAX` seconds) would park the effect beyond any alert; at a day it is tried again, and counts its
/// attempts towards `max_attempts` as any call that reached nobody.
pub const MAX_RETRY_AFTER: Duration = Duration::from_secs(24 * 3600);

/// The delay a `Retry-After` value asks for: delta-seconds or an HTTP-date (IMF-fixdate, and the obsolete
/// RFC 850 and asctime forms), from `now`, at most [`MAX_RETRY_AFTER`]; a date in the past asks for none.
/// `None` when the value is neither.
pub fn parse_retry_after(value: &str, now: DateTime<Utc>) -> Option<Duration> {
    let v = value.trim();
    if !v.is_empty() && v.bytes().all(|b| b.is_ascii_digit()) {
        let secs = v.parse().unwrap_or(u64::MAX);
        return Some(Duration::from_secs(secs).min(MAX_RETRY_AFTER));
    }
    let at = DateTime::parse_from_rfc2822(v)
        .map(|d| d.with_timezone(&Utc))
        .ok()
        .or_else(|| {
            ["%A, %d-%b-%y %H:%M:%S GMT", "%a %b %e %H:%M:%S %Y"]
                .iter()
                .find_map(|f| NaiveDateTime::parse_from_str(v, f).ok())
                .map(|n| n.and_utc())
        })?;
    Some(
        (at - now)
            .to_std()
            .unwrap_or(Duration::ZERO)
            .min(MAX_RETRY_AFTER),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_default_table_is_the_drafts() {
        let t = AnswerTable::default();
        for (status, answer) in [
            (200, Answer::Done),
            (201, Answer::Done),
            (204, Answer::Done),
            (301, Answer::Uncertain),
            (400, Answer::Rejected),
            (404, Answer::Rejected),
            (408, Answer::NotSent),
            (409, Answer::InProgress),
            (422, Answer::KeyReused),
            (429, Answer::NotSent),
            (500, Answer::Uncertain),
            (502, Answer::Uncertain),
            (503, Answer::RetryAfter),
            (504, Answer::Uncertain),
            (100, Answer::Uncertain),
        ] {
            assert_eq!(t.get(status), answer, "{status}");
        }
    }

    #[test]
    fn a_class_override_replaces_the_classes_exact_defaults() {
        let mut t = AnswerTable::default();
        t.set_class(4, Answer::Uncertain);
        assert_eq!(t.get(409), Answer::Uncertain);
        assert_eq!(t.get(503), Answer::RetryAfter);
        t.set(409, Answer::Done);
        assert_eq!(t.get(409), Answer::Done);
        assert!(matches!("4xx".parse(), Ok(StatusMatch::Class(4))));
        assert!(matches!("409".parse(), Ok(StatusMatch::Exact(409))));
        for bad in ["6xx", "99", "600", "4x", "", "abc"] {
            assert!(bad.parse::<StatusMatch>().is_err(), "{bad}");
        }
        assert_eq!("in_progress".parse(), Ok(Answer::InProgress));
        assert!("progress"
            .parse::<Answer>()
            .unwrap_err()
            .contains("key_reused"));
    }

    #[test]
    fn retry_after_reads_seconds_and_every_http_date_form() {
        let now = DateTime::parse_from_rfc3339("1994-11-06T08:49:30Z")
            .unwrap()
            .with_timezone(&Utc);
        assert_eq!(
            parse_retry_after("120", now),
            Some(Duration::from_secs(120))
        );
        assert_eq!(parse_retry_after(" 0 ", now), Some(Duration::ZERO));
        // A delay beyond a day, in seconds or as a date, is taken as a day.
        for far in [
            "99999999999999999999999",
            "86401",
            "Fri, 31 Dec 9999 23:59:59 GMT",
        ] {
            assert_eq!(parse_retry_after(far, now), Some(MAX_RETRY_AFTER), "{far}");
        }
        for date in [
            "Sun, 06 Nov 1994 08:49:37 GMT",
            "Sunday, 06-Nov-94 08:49:37 GMT",
            "Sun Nov  6 08:49:37 1994",
        ] {
            assert_eq!(
                parse_retry_after(date, now),
                Some(Duration::from_secs(7)),
                "{date}"
            );
        }
        assert_eq!(
            parse_retry_after("Sun, 06 Nov 1994 08:00:00 GMT", now),
            Some(Duration::ZERO)
        );
        for bad in ["", "-1", "1.5", "soon", "Sun, 99 Nov 1994 08:49:37 GMT"] {
            assert_eq!(parse_retry_after(bad, now), None, "{bad}");
        }
    }
}
