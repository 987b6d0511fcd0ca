//! What an HTTP destination's answer means: the answer table and `Retry-After`.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use chrono::{DateTime, NaiveDateTime, Utc};
use reqwest::header::HeaderMap;
use serde_json::Value;

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
/// | 2xx but 202 | [`Answer::Done`] |
/// | 202 | [`Answer::Uncertain`] |
/// | 408, 425, 429 | [`Answer::NotSent`] |
/// | 409 | [`Answer::InProgress`] |
/// | 422 | [`Answer::KeyReused`] |
/// | other 4xx | [`Answer::Rejected`], or [`Answer::NotSent`] when the answer is a [rate limit](rate_limited) |
/// | 503 | [`Answer::RetryAfter`] |
/// | 502, 504, other 5xx, 1xx, 3xx | [`Answer::Uncertain`] |
///
/// **A refusal that is a rate limit is not sent.** Several APIs answer their rate limit with a 403, not a 429
/// (Salesforce, GitHub, Google: see [`rate_limited`]); read as rejected, the effect would fail for good though
/// the destination only said "later". So a 4xx the default table reads as rejected is read as
/// [`Answer::NotSent`] (pending again, no sooner than its `Retry-After`) when [`rate_limited`] says it is one
/// ([`read`](Self::read)). An answer you set yourself, for the status (`.answer(403, Answer::Rejected)`) or its
/// class (`.answer_class(4, Answer::Rejected)`), stands as you set it: rate limit or not.
///
/// **A 202 is not done.** RFC 9110 (15.3.3): "The 202 (Accepted) status code indicates that the request has been
/// accepted for processing, but the processing has not been completed. The request might or might not eventually
/// be acted upon, as it might be disallowed when processing actually takes place." Read as done, an effect the
/// destination refuses later would be reported done; so a 202 is [`Answer::Uncertain`] (reconciled by the
/// confirmation, which finds the finished object or not). A destination whose 202 means the work is done (an
/// e-mail API that answers 202 to every send it takes for delivery) declares it: `.answer(202, Answer::Done)`
/// (settings: `answers = { "202" = "done" }`), or `.answer_class(2, Answer::Done)`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AnswerTable {
    exact: BTreeMap<u16, Answer>,
    classes: BTreeMap<u8, Answer>,
    /// The statuses whose exact entry the user set.
    chosen: BTreeSet<u16>,
    /// The classes whose entry the user set.
    chosen_classes: BTreeSet<u8>,
}

impl Default for AnswerTable {
    fn default() -> Self {
        let exact = BTreeMap::from([
            (408, Answer::NotSent),
            (409, Answer::InProgress),
            // RFC 9110: accepted, "but the processing has not been completed": not done (see the type docs).
            (202, Answer::Uncertain),
            (422, Answer::KeyReused),
            (425, Answer::NotSent),
            (429, Answer::NotSent),
            (503, Answer::RetryAfter),
        ]);
        let classes = BTreeMap::from([(2, Answer::Done), (4, Answer::Rejected)]);
        Self {
            exact,
            classes,
            chosen: BTreeSet::new(),
            chosen_classes: BTreeSet::new(),
        }
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

    /// What the answer `status`, with its `headers` and `body`, means: [`get`](Self::get), except that a 4xx
    /// the default table reads as [`Answer::Rejected`] is [`Answer::NotSent`] when it is a
    /// [rate limit](rate_limited). An entry the user set for the status or its class stands.
    pub fn read(&self, status: u16, headers: &HeaderMap, body: &[u8]) -> Answer {
        match self.get(status) {
            Answer::Rejected if !self.chosen(status) && rate_limited(status, headers, body) => {
                Answer::NotSent
            }
            a => a,
        }
    }

    /// Whether the entry `status` is read by is one the user set.
    pub(crate) fn chosen(&self, status: u16) -> bool {
        if self.exact.contains_key(&status) {
            self.chosen.contains(&status)
        } else {
            self.chosen_classes.contains(&((status / 100) as u8))
        }
    }

    /// Sets the answer of one status (100 to 599).
    pub(crate) fn set(&mut self, status: u16, answer: Answer) {
        self.exact.insert(status, answer);
        self.chosen.insert(status);
    }

    /// Sets the answer of a class (`4` for 4xx), below the exact codes: the defaults' exact codes of that
    /// class are dropped, so `4xx = rejected` means every 4xx.
    pub(crate) fn set_class(&mut self, class: u8, answer: Answer) {
        self.exact.retain(|s, _| (s / 100) as u8 != class);
        self.chosen.retain(|s| (s / 100) as u8 != class);
        self.classes.insert(class, answer);
        self.chosen_classes.insert(class);
    }
}

/// Whether a 4xx answer says it is a rate limit: the request was not taken, come back later. Any of:
///
/// * **a valid `Retry-After`** (delta-seconds or an HTTP-date, read by [`parse_retry_after`]): HTTP's semantics
///   (RFC 7231, kept by RFC 9110), "Servers send the "Retry-After" header field to indicate how long the user
///   agent ought to wait before making a follow-up request"; a refusal for good has no later.
/// * **`x-ratelimit-remaining: 0` on a 403**: GitHub's REST API, "If you exceed your primary rate limit, you
///   will receive a 403 Forbidden or 429 Too Many Requests response, and the x-ratelimit-remaining header will
///   be 0". Only on a 403: the last request a limit allows answers its own 404 or 422 with 0 remaining.
/// * **a top-level `message` naming a "secondary rate limit"**: GitHub, "If you exceed a secondary rate limit,
///   you will receive a 403 Forbidden or 429 Too Many Requests response and an error message that indicates
///   that you exceeded a secondary rate limit" (`"You have exceeded a secondary rate limit. ..."`).
/// * **an `errorCode` `REQUEST_LIMIT_EXCEEDED`** in the body (a JSON array of errors, or one error object):
///   Salesforce's REST API, of its 403: "The request has been refused. [...] If the error code is
///   REQUEST_LIMIT_EXCEEDED, you've exceeded API request limits in your org" (`[{"message": "TotalRequests
///   Limit exceeded.", "errorCode": "REQUEST_LIMIT_EXCEEDED"}]`).
/// * **an `error.errors[].reason` `rateLimitExceeded` or `userRateLimitExceeded`**: Google APIs' JSON error
///   format (`domain` `usageLimits`); Drive: "If you exceed a quota, you'll receive a 403: User rate limit
///   exceeded HTTP status code response. [...] you should use an exponential backoff algorithm and try again
///   later". Not `dailyLimitExceeded` nor `quotaExceeded`: a quota spent for the day, which Google's quota
///   pages (Campaign Manager 360's) advise not to retry without fixing, stays a refusal.
///
/// A 1xx, 2xx, 3xx or 5xx is never one here: the answer table reads those.
pub fn rate_limited(status: u16, headers: &HeaderMap, body: &[u8]) -> bool {
    if !(400..500).contains(&status) {
        return false;
    }
    let header = |name: &str| headers.get(name).and_then(|v| v.to_str().ok());
    if header("retry-after").is_some_and(|v| parse_retry_after(v, Utc::now()).is_some()) {
        return true;
    }
    if status == 403 && header("x-ratelimit-remaining").is_some_and(|v| v.trim() == "0") {
        return true;
    }
    let Ok(v) = serde_json::from_slice::<Value>(body) else {
        return false;
    };
    let salesforce =
        |e: &Value| e.get("errorCode").and_then(Value::as_str) == Some("REQUEST_LIMIT_EXCEEDED");
    let github = v
        .get("message")
        .and_then(Value::as_str)
        .is_some_and(|m| m.to_ascii_lowercase().contains("secondary rate limit"));
    let google = v
        .pointer("/error/errors")
        .and_then(Value::as_array)
        .is_some_and(|errors| {
            errors.iter().any(|e| {
                matches!(
                    e.get("reason").and_then(Value::as_str),
                    Some("rateLimitExceeded" | "userRateLimitExceeded")
                )
            })
        });
    github
        || google
        || salesforce(&v)
        || v.as_array()
            .is_some_and(|errors| errors.iter().any(salesforce))
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
            (202, Answer::Uncertain),
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

    fn headers(lines: &[(&'static str, &'static str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in lines {
            h.insert(*k, v.parse().unwrap());
        }
        h
    }

    #[test]
    fn a_rate_limit_is_read_from_the_vendors_markers_only() {
        let none = HeaderMap::new();
        for (what, status, h, body) in [
            (
                "retry-after seconds",
                403,
                headers(&[("retry-after", "30")]),
                "",
            ),
            (
                "retry-after date",
                400,
                headers(&[("retry-after", "Sun, 06 Nov 1994 08:49:37 GMT")]),
                "",
            ),
            (
                "github",
                403,
                headers(&[("x-ratelimit-remaining", "0")]),
                "",
            ),
            (
                "github secondary",
                403,
                none.clone(),
                r#"{"message":"You have exceeded a secondary rate limit and have been temporarily blocked"}"#,
            ),
            (
                "salesforce",
                403,
                none.clone(),
                r#"[{"message":"TotalRequests Limit exceeded.","errorCode":"REQUEST_LIMIT_EXCEEDED"}]"#,
            ),
            (
                "salesforce object",
                403,
                none.clone(),
                r#"{"message":"x","errorCode":"REQUEST_LIMIT_EXCEEDED"}"#,
            ),
            (
                "google",
                403,
                none.clone(),
                r#"{"error":{"errors":[{"domain":"usageLimits","reason":"rateLimitExceeded"}],"code":403}}"#,
            ),
        ] {
            assert!(rate_limited(status, &h, body.as_bytes()), "{what}");
        }
        for (what, status, h, body) in [
            ("plain 403", 403, none.clone(), r#"{"message":"forbidden"}"#),
            (
                "a retry-after that is none",
                403,
                headers(&[("retry-after", "soon")]),
                "",
            ),
            (
                "some remaining",
                403,
                headers(&[("x-ratelimit-remaining", "12")]),
                "",
            ),
            (
                "0 remaining on a 404",
                404,
                headers(&[("x-ratelimit-remaining", "0")]),
                "",
            ),
            (
                "a daily quota",
                403,
                none.clone(),
                r#"{"error":{"errors":[{"domain":"usageLimits","reason":"dailyLimitExceeded"}],"code":403}}"#,
            ),
            (
                "another salesforce code",
                403,
                none.clone(),
                r#"[{"message":"no","errorCode":"INSUFFICIENT_ACCESS"}]"#,
            ),
            ("not json", 403, none.clone(), "REQUEST_LIMIT_EXCEEDED"),
            ("a 503", 503, headers(&[("retry-after", "30")]), ""),
            ("a 200", 200, headers(&[("x-ratelimit-remaining", "0")]), ""),
        ] {
            assert!(!rate_limited(status, &h, body.as_bytes()), "{what}");
        }
    }

    #[test]
    fn only_a_default_refusal_is_read_as_a_rate_limit() {
        let limit = headers(&[("retry-after", "30")]);
        let t = AnswerTable::default();
        assert_eq!(t.read(403, &limit, b""), Answer::NotSent);
        assert_eq!(t.read(403, &HeaderMap::new(), b""), Answer::Rejected);
        // The defaults' other readings are not refusals.
        assert_eq!(t.read(409, &limit, b""), Answer::InProgress);
        assert_eq!(t.read(422, &limit, b""), Answer::KeyReused);
        // What the user set stands: the status, or its class.
        let mut t = AnswerTable::default();
        t.set(403, Answer::Rejected);
        assert_eq!(t.read(403, &limit, b""), Answer::Rejected);
        assert_eq!(t.read(401, &limit, b""), Answer::NotSent);
        let mut t = AnswerTable::default();
        t.set(403, Answer::Rejected);
        t.set_class(4, Answer::Rejected);
        assert_eq!(t.read(401, &limit, b""), Answer::Rejected);
        assert_eq!(t.read(429, &limit, b""), Answer::Rejected);
        // Another class set leaves 4xx's default reading.
        let mut t = AnswerTable::default();
        t.set_class(5, Answer::Rejected);
        assert_eq!(t.read(403, &limit, b""), Answer::NotSent);
        assert_eq!(t.read(500, &limit, b""), Answer::Rejected);
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
