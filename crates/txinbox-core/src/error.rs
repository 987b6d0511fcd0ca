//! Errors. Each enum is `#[non_exhaustive]`, keeps its source, and says whether a retry can help.

use std::time::Duration;

/// A boxed error from user or SDK code.
pub type BoxError = Box<dyn std::error::Error + Send + Sync + 'static>;

/// Input the inbox cannot accept. Configuration errors (an invalid consumer name) are returned when the inbox
/// is built; message errors dead-letter the message with [`BadInput::reason`] as the reason.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum BadInput {
    /// The consumer name is empty, too long or has characters outside the allowed set.
    #[error("invalid consumer name {name:?}: {reason}")]
    InvalidConsumerName {
        /// The rejected name.
        name: String,
        /// Why.
        reason: &'static str,
    },
    /// The message carries no usable identity.
    #[error("message has no usable identity: {detail}")]
    NoIdentity {
        /// What was missing.
        detail: &'static str,
    },
    /// An identity field is empty, too long or has control characters.
    #[error("invalid {field}: {reason}")]
    InvalidIdentityField {
        /// Which field.
        field: &'static str,
        /// Why.
        reason: &'static str,
    },
    /// The user's business-key function refused the message.
    #[error("business key could not be computed: {detail}")]
    BusinessKey {
        /// The function's message.
        detail: String,
    },
    /// The body is not valid UTF-8 where text was required.
    #[error("body is not valid UTF-8: {0}")]
    NotUtf8(#[source] std::str::Utf8Error),
    /// The body is not the expected JSON.
    #[error("body is not the expected JSON: {0}")]
    InvalidJson(#[source] serde_json::Error),
    /// The body exceeds the configured limit.
    #[error("payload of {size} bytes exceeds the limit of {limit} bytes")]
    PayloadTooLarge {
        /// Body size.
        size: usize,
        /// Configured limit.
        limit: usize,
    },
    /// The contract version is not one this consumer supports.
    #[error("unsupported contract version {found:?} (supported: {supported:?})")]
    UnsupportedContractVersion {
        /// The version on the message (None when absent but required).
        found: Option<String>,
        /// What the consumer accepts.
        supported: Vec<String>,
    },
}

impl BadInput {
    /// The dead-letter reason code for this error (stable, used as a metric label).
    pub fn reason(&self) -> &'static str {
        match self {
            BadInput::InvalidConsumerName { .. } => "invalid_consumer_name",
            BadInput::NoIdentity { .. } => "no_identity",
            BadInput::InvalidIdentityField { .. } => "invalid_identity",
            BadInput::BusinessKey { .. } => "invalid_business_key",
            BadInput::NotUtf8(_) => "invalid_utf8",
            BadInput::InvalidJson(_) => "invalid_json",
            BadInput::PayloadTooLarge { .. } => "payload_too_large",
            BadInput::UnsupportedContractVersion { .. } => "unsupported_contract_version",
        }
    }
}

/// What kind of broker failure a [`BrokerError`] is: one classification for every adapter, deciding how the
/// inbox, the worker and the lease keeper react and whether a retry can help.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum BrokerErrorKind {
    /// The lock or receipt is no longer ours (Service Bus 404 on the lock URI, SQS `ReceiptHandleIsInvalid`,
    /// a lease that ran out). The message will be (or was) redelivered; the inbox absorbs that redelivery.
    LockLost,
    /// The queue, topic or subscription does not exist (Service Bus 410, SQS `QueueDoesNotExist`).
    EntityNotFound,
    /// The broker throttles (HTTP 429/503, SQS `RequestThrottled`): retry later, after
    /// [`BrokerError::retry_after`] when the broker said.
    Throttled,
    /// The credentials were refused or lack a right (HTTP 401/403, SQS `AccessDenied`). A retry will not help.
    Unauthorized,
    /// No answer (timeout, dropped connection): the request may or may not have taken effect.
    OutcomeUnknown,
    /// The broker refused the request as invalid (another 4xx, an SQS client error). A retry will not help.
    Rejected,
    /// The request could not be built or sent, or the adapter is not set up for it (no region, no credential,
    /// no dead-letter destination). A retry will not help.
    Configuration,
    /// A server-side failure (HTTP 500 and other 5xx): worth retrying.
    ServerError,
    /// The broker's answer could not be understood (a missing lock location or receipt handle, an unreadable
    /// body).
    Protocol,
}

impl BrokerErrorKind {
    /// Whether the same call may succeed if retried.
    pub fn is_retryable(self) -> bool {
        matches!(
            self,
            BrokerErrorKind::Throttled
                | BrokerErrorKind::OutcomeUnknown
                | BrokerErrorKind::ServerError
        )
    }

    /// A stable snake-case name (`lock_lost`, `throttled`, ...), fit for a metric label.
    pub fn as_str(self) -> &'static str {
        match self {
            BrokerErrorKind::LockLost => "lock_lost",
            BrokerErrorKind::EntityNotFound => "entity_not_found",
            BrokerErrorKind::Throttled => "throttled",
            BrokerErrorKind::Unauthorized => "unauthorized",
            BrokerErrorKind::OutcomeUnknown => "outcome_unknown",
            BrokerErrorKind::Rejected => "rejected",
            BrokerErrorKind::Configuration => "configuration",
            BrokerErrorKind::ServerError => "server_error",
            BrokerErrorKind::Protocol => "protocol",
        }
    }

    /// Classifies an HTTP status a broker answered: 404 lock lost (the only 404 a settle or renewal meets is
    /// on its lock URI), 410 entity not found, 429/503 throttled, 401/403 unauthorized, 408/504 outcome
    /// unknown, other 5xx server error, anything else rejected.
    pub fn of_http_status(status: u16) -> Self {
        match status {
            404 => BrokerErrorKind::LockLost,
            410 => BrokerErrorKind::EntityNotFound,
            429 | 503 => BrokerErrorKind::Throttled,
            401 | 403 => BrokerErrorKind::Unauthorized,
            408 | 504 => BrokerErrorKind::OutcomeUnknown,
            500..=599 => BrokerErrorKind::ServerError,
            _ => BrokerErrorKind::Rejected,
        }
    }
}

impl std::fmt::Display for BrokerErrorKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            BrokerErrorKind::LockLost => "lock or receipt lost",
            BrokerErrorKind::EntityNotFound => "entity not found",
            BrokerErrorKind::Throttled => "throttled by the broker",
            BrokerErrorKind::Unauthorized => "unauthorized",
            BrokerErrorKind::OutcomeUnknown => "outcome unknown",
            BrokerErrorKind::Rejected => "rejected by the broker",
            BrokerErrorKind::Configuration => "configuration",
            BrokerErrorKind::ServerError => "broker server error",
            BrokerErrorKind::Protocol => "unreadable broker answer",
        })
    }
}

/// An error talking to the broker (receive, settle, renew, send), the same type for every adapter.
///
/// It carries the [`kind`](Self::kind), the broker [`operation`](Self::operation) that failed
/// (`ReceiveMessage`, `DeleteMessageBatch`, `complete`, `renew-lock`, ...), the adapter's or SDK's error as
/// its [`source`](std::error::Error::source) (walk the chain and `downcast_ref` to reach the SDK's type), and
/// the broker's [`retry_after`](Self::retry_after) when it sent one. Its message shows the operation, the
/// kind and the source chain, with the secrets a cause may quote masked ([`redact_secrets`]); adapters never put a
/// credential in an error.
#[derive(Debug)]
#[non_exhaustive]
pub struct BrokerError {
    kind: BrokerErrorKind,
    operation: &'static str,
    retry_after: Option<Duration>,
    source: BoxError,
}

impl BrokerError {
    /// A broker error of `kind` met by `operation`, caused by `source`.
    pub fn new(
        kind: BrokerErrorKind,
        operation: &'static str,
        source: impl Into<BoxError>,
    ) -> Self {
        Self {
            kind,
            operation,
            retry_after: None,
            source: source.into(),
        }
    }

    /// Sets the delay the broker asked for before a retry (`Retry-After`).
    pub fn with_retry_after(mut self, after: Option<Duration>) -> Self {
        self.retry_after = after;
        self
    }

    /// The classification.
    pub fn kind(&self) -> BrokerErrorKind {
        self.kind
    }

    /// The broker operation that failed, as the adapter names it (`ReceiveMessage`, `complete`, ...).
    pub fn operation(&self) -> &'static str {
        self.operation
    }

    /// The delay the broker asked for before a retry, when it said.
    pub fn retry_after(&self) -> Option<Duration> {
        self.retry_after
    }

    /// Whether the same call may succeed if retried.
    pub fn is_retryable(&self) -> bool {
        self.kind.is_retryable()
    }

    /// The first error of type `T` down the source chain (the SDK's or client's error, an adapter's own),
    /// for callers that need more than the [`kind`](Self::kind).
    pub fn find_source<T: std::error::Error + 'static>(&self) -> Option<&T> {
        let mut cause: Option<&(dyn std::error::Error + 'static)> = Some(self.source.as_ref());
        while let Some(c) = cause {
            if let Some(t) = c.downcast_ref::<T>() {
                return Some(t);
            }
            cause = c.source();
        }
        None
    }

    /// Consumes the error, returning its source.
    pub fn into_source(self) -> BoxError {
        self.source
    }
}

impl std::fmt::Display for BrokerError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        use std::fmt::Write as _;
        let mut text = format!("{} failed ({})", self.operation, self.kind);
        if let Some(after) = self.retry_after {
            write!(text, ", retry after {} ms", after.as_millis())?;
        }
        // The whole chain: SDK errors often say little at the top ("service error") and the detail below.
        let mut cause: Option<&(dyn std::error::Error + 'static)> = Some(self.source.as_ref());
        while let Some(c) = cause {
            write!(text, ": {c}")?;
            cause = c.source();
        }
        // A cause may quote an endpoint with its credential (a client's error its URL): the worker logs this
        // text, readiness answers it and a worker that gives up reports it.
        f.write_str(&redact_secrets(&text))
    }
}

impl std::error::Error for BrokerError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(self.source.as_ref())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, thiserror::Error)]
    #[error("outer")]
    struct Outer(#[source] std::io::Error);

    #[test]
    fn broker_errors_keep_their_source_and_say_the_whole_chain() {
        let io = std::io::Error::new(std::io::ErrorKind::TimedOut, "no answer");
        let e = BrokerError::new(BrokerErrorKind::OutcomeUnknown, "complete", Outer(io))
            .with_retry_after(Some(Duration::from_secs(2)));
        assert!(e.is_retryable());
        assert_eq!(e.operation(), "complete");
        assert_eq!(
            e.to_string(),
            "complete failed (outcome unknown), retry after 2000 ms: outer: no answer"
        );
        let src = std::error::Error::source(&e).unwrap();
        let outer = src.downcast_ref::<Outer>().unwrap();
        assert_eq!(outer.0.kind(), std::io::ErrorKind::TimedOut);
        let io = e.find_source::<std::io::Error>().unwrap();
        assert_eq!(io.kind(), std::io::ErrorKind::TimedOut);
        assert!(e.find_source::<std::fmt::Error>().is_none());
    }

    /// A broker error's text is what the worker logs for a failing receive, what readiness answers for the
    /// queue and what the worker's report gives as the reason it gave up: a cause down its chain that quotes
    /// an endpoint with a credential (a SAS `sig=`, a URL's user info, a connection string's key) is shown
    /// masked there.
    #[test]
    fn a_broker_errors_text_masks_the_secrets_its_chain_quotes() {
        let io = std::io::Error::other(
            "HTTP 401 from https://ns.servicebus.windows.net/q/messages/head?sig=SECRETsig1&se=1 via http://proxyuser:SECRETpw2@proxy:3128 (Endpoint=sb://ns/;SharedAccessKeyName=r;SharedAccessKey=SECRETkey3)",
        );
        let e = BrokerError::new(BrokerErrorKind::Unauthorized, "receive", Outer(io));
        let shown = e.to_string();
        for secret in ["SECRETsig1", "SECRETpw2", "SECRETkey3"] {
            assert!(!shown.contains(secret), "{secret} in {shown}");
        }
        assert!(
            shown.starts_with("receive failed (unauthorized): outer: HTTP 401 from https://ns.servicebus.windows.net/q/***/***?sig=***"),
            "{shown}"
        );
    }

    #[test]
    fn http_statuses_are_classified() {
        let k = BrokerErrorKind::of_http_status;
        assert_eq!(k(404), BrokerErrorKind::LockLost);
        assert_eq!(k(410), BrokerErrorKind::EntityNotFound);
        assert_eq!(
            (k(429), k(503)),
            (BrokerErrorKind::Throttled, BrokerErrorKind::Throttled)
        );
        assert_eq!(k(403), BrokerErrorKind::Unauthorized);
        assert_eq!(k(504), BrokerErrorKind::OutcomeUnknown);
        assert!(k(500).is_retryable());
        assert!(!k(400).is_retryable());
    }
}

/// `url` for a log line, an error or a `Debug`: the password of its user info (on HTTP the whole user info,
/// where APIs take a token as the user name: `userinfo_mask`), every query value (an API key or a SAS signature
/// may be one; a part without `=` too) and the fragment masked as `***`, and on HTTP (`http`, `https`, `ws`,
/// `wss`, `git+https` and the like) the path after its first segment masked segment by segment: a webhook's
/// secret is in its path (`https://hooks.slack.com/services/***/***/***`, `https://discord.com/api/***/***/***`).
/// A Service Bus `SharedAccessKey=` value is masked wherever it is (a connection string given for a URL).
/// The first segment is kept where it reads as a plain name (at most 16 lowercase letters, digits, `-`, `_`,
/// `.`: `v1`, `api`, `services`), masked otherwise (Telegram's `/botTOKEN/...`). Scheme, host and port are
/// kept, and `{placeholders}` of a URL template, a whole segment or a whole query value. `sqlite:FILE`, a
/// database's URL and other forms that are not HTTP keep their path (a database's name, a file). A password
/// written with a `/`, `?` or `#` unencoded is masked up to its `@`, even one of digits that reads like a port,
/// and so is a port followed by an `@` further on (`http://h:***@b` for `http://h:8080/a@b`): see
/// `password_at`.
///
/// ```
/// use txinbox_core::error::redact_url;
/// assert_eq!(
///     redact_url("postgres://crm:s3cret@db/crm?sslmode=require"),
///     "postgres://crm:***@db/crm?sslmode=***"
/// );
/// assert_eq!(
///     redact_url("https://crm.example/v1/tasks/{external_ref}?api_key=k"),
///     "https://crm.example/v1/***/{external_ref}?api_key=***"
/// );
/// assert_eq!(
///     redact_url("https://hooks.slack.com/services/T000/B000/XXXXXXXX"),
///     "https://hooks.slack.com/services/***/***/***"
/// );
/// ```
pub fn redact_url(url: &str) -> String {
    // The password first: one written with a `/`, `?` or `#` unencoded would otherwise be read as a path or a
    // query and shown.
    let unmasked;
    let (url, http) = match url.split_once("://") {
        Some((scheme, rest)) => (
            match userinfo_mask(scheme, rest) {
                Some((from, to)) => {
                    unmasked = format!("{scheme}://{}***{}", &rest[..from], &rest[to..]);
                    unmasked.as_str()
                }
                None => url,
            },
            is_http(scheme),
        ),
        None => (url, false),
    };
    let (url, fragment) = match url.split_once('#') {
        Some((u, f)) => (u, Some(f)),
        None => (url, None),
    };
    let (base, query) = match url.split_once('?') {
        Some((b, q)) => (b, Some(q)),
        None => (url, None),
    };
    let placeholder = |s: &str| s.len() > 2 && s.starts_with('{') && s.ends_with('}');
    let out = match base.split_once("://") {
        Some((scheme, rest)) if http => {
            let (authority, path) = rest.split_at(rest.find('/').unwrap_or(rest.len()));
            if is_sqs_queue_path(path) {
                // An SQS queue URL: an account id and a queue name, neither a secret, both needed to tell
                // which queue an error is about.
                return redact_query_and_fragment(
                    format!("{scheme}://{authority}{path}"),
                    query,
                    fragment,
                );
            }
            let segments: Vec<&str> = path
                .split('/')
                .skip(1)
                .enumerate()
                .map(|(i, s)| {
                    let plain = i == 0
                        && s.len() <= 16
                        && s.bytes().all(|b| {
                            b.is_ascii_lowercase()
                                || b.is_ascii_digit()
                                || matches!(b, b'-' | b'_' | b'.')
                        });
                    if s.is_empty() || plain || placeholder(s) {
                        s
                    } else {
                        "***"
                    }
                })
                .collect();
            let mut out = format!("{scheme}://{authority}");
            for s in segments {
                out.push('/');
                out.push_str(s);
            }
            out
        }
        _ => base.to_owned(),
    };
    redact_query_and_fragment(out, query, fragment)
}

/// `out` with `query` (every value masked, a template's `{placeholder}` kept) and `fragment` (masked), and a
/// Service Bus key that follows it masked.
fn redact_query_and_fragment(
    mut out: String,
    query: Option<&str>,
    fragment: Option<&str>,
) -> String {
    let placeholder = |s: &str| s.len() > 2 && s.starts_with('{') && s.ends_with('}');
    if let Some(q) = query {
        let parts: Vec<String> = q
            .split('&')
            .map(|p| match p.split_once('=') {
                Some((k, v)) if placeholder(v) => format!("{k}={v}"),
                Some((k, _)) => format!("{k}=***"),
                None if p.is_empty() || placeholder(p) => p.to_owned(),
                None => "***".to_owned(),
            })
            .collect();
        out.push('?');
        out.push_str(&parts.join("&"));
    }
    match fragment {
        Some("") => out.push('#'),
        Some(_) => out.push_str("#***"),
        None => {}
    }
    // A Service Bus connection string given for a URL: its key follows the `sb://` URL, in what reads as its path.
    mask_after(&out, "SharedAccessKey=")
}

/// Whether `path` is an SQS queue URL's: `/ACCOUNT/QUEUE`, a 12-digit account id and a queue name (AWS: "Queue
/// names are limited to 80 characters. Alphanumeric characters plus hyphens (-) and underscores (_) are
/// allowed", a FIFO queue's ending in `.fifo`).
fn is_sqs_queue_path(path: &str) -> bool {
    let mut parts = path.strip_prefix('/').unwrap_or("").split('/');
    let (Some(account), Some(queue), None) = (parts.next(), parts.next(), parts.next()) else {
        return false;
    };
    let name = queue.strip_suffix(".fifo").unwrap_or(queue);
    account.len() == 12
        && account.bytes().all(|b| b.is_ascii_digit())
        && !name.is_empty()
        && queue.len() <= 80
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_'))
}

/// Whether `scheme` is HTTP's (`http`, `https`, `ws`, `wss`, and `git+https` and the like).
fn is_http(scheme: &str) -> bool {
    scheme.rsplit('+').next().is_some_and(|s| {
        ["http", "https", "ws", "wss"]
            .iter()
            .any(|h| s.eq_ignore_ascii_case(h))
    })
}

/// The scheme `url` starts with (`postgres`, `sqlite`, `mysql`), to name in an error about a URL that cannot
/// be used: up to its first `:`, a letter then letters, digits, `+`, `-` or `.` (at most 32). What does not
/// start with one (a libpq `host=db password=...` string or a bare password given for a URL) has none, and
/// is never quoted.
///
/// ```
/// use txinbox_core::error::url_scheme;
/// assert_eq!(url_scheme("mysql://root:s3cret@db/app"), Some("mysql"));
/// assert_eq!(url_scheme("host=db user=crm password=s3cret"), None);
/// ```
pub fn url_scheme(url: &str) -> Option<&str> {
    let (scheme, _) = url.split_once(':')?;
    let mut chars = scheme.chars();
    let letter = chars.next().is_some_and(|c| c.is_ascii_alphabetic());
    (letter
        && scheme.len() <= 32
        && chars.all(|c| c.is_ascii_alphanumeric() || matches!(c, '+' | '-' | '.')))
    .then_some(scheme)
}

/// `text` with each character that could rewrite a terminal's or a log's line, or forge one, written as its
/// escape (`\n`, `\u{1b}`): control characters (C0, DEL, C1: ESC, CR, LF, BEL, CSI) and the bidirectional
/// overrides and isolates (U+202A-U+202E, U+2066-U+2069), which make a line read in another order than it is
/// written. For values quoted from outside input (a destination's answer, a dead letter's id, a Terraform
/// string) in text meant for a person.
pub fn escape_untrusted(text: &str) -> std::borrow::Cow<'_, str> {
    let hostile =
        |c: char| c.is_control() || matches!(c, '\u{202A}'..='\u{202E}' | '\u{2066}'..='\u{2069}');
    if text.chars().any(hostile) {
        text.chars()
            .map(|c| {
                if hostile(c) {
                    c.escape_default().to_string()
                } else {
                    c.to_string()
                }
            })
            .collect::<String>()
            .into()
    } else {
        text.into()
    }
}

/// `text` with the secrets an error may quote masked as `***`: the password of a URL
/// (`postgres://user:PASSWORD@host`), an HTTP URL as [`redact_url`] shows it (its user info, its path past the
/// first segment, its query values and fragment: a webhook's token, an API key), a Service Bus
/// `SharedAccessKey=KEY` and a SAS token's `sig=SIGNATURE`. An error can quote them from where they were read:
/// a settings file's line in a TOML parse error, a connection string, a driver's message, a readiness check's
/// reason. The rest of the text is kept as it is. A URL's password is found as [`redact_url`] finds it.
pub fn redact_secrets(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(at) = rest.find("://") {
        let (head, tail) = rest.split_at(at + 3);
        out.push_str(head);
        // The URL ends at anything a URL does not hold; its password, if any, is masked.
        let end = tail
            .find(|c: char| matches!(c, '"' | '\'' | '`' | '<' | '>') || c.is_whitespace())
            .unwrap_or(tail.len());
        let url = &tail[..end];
        // The scheme starts after the last character that cannot be in one (on its boundary: it may be
        // several bytes long).
        let scheme_at = head[..at]
            .char_indices()
            .rev()
            .find(|(_, c)| !(c.is_ascii_alphanumeric() || matches!(c, '+' | '-' | '.')))
            .map_or(0, |(i, c)| i + c.len_utf8());
        let scheme = &head[scheme_at..at];
        if is_http(scheme) {
            // An HTTP URL is shown as `redact_url` shows it (its path and query may hold a token), without the
            // punctuation of the text that follows it.
            let url = url.trim_end_matches([')', ']', ',', '.', ';', ':', '!']);
            out.push_str(&redact_url(&format!("{scheme}://{url}"))[scheme.len() + 3..]);
            rest = &tail[url.len()..];
            continue;
        }
        match userinfo_mask(scheme, url) {
            Some((from, to)) => {
                out.push_str(&url[..from]);
                out.push_str("***");
                out.push_str(&url[to..]);
            }
            None => out.push_str(url),
        }
        rest = &tail[end..];
    }
    out.push_str(rest);
    for key in ["SharedAccessKey=", "sig="] {
        out = mask_after(&out, key);
    }
    out
}

/// What of a URL's user info to mask, given its scheme and what follows its `://`: the span of `rest` that
/// `***` stands for. On HTTP (`http`, `https`, `ws`, `wss`, and `git+https` and the like) the whole user info,
/// the user name with the password: APIs take a token as the user name (`https://TOKEN@api.example`,
/// `https://TOKEN:x-oauth-basic@host`, an API key as the user of HTTP basic authentication), where a parser
/// reads it (an `@` in the authority). On other schemes, and where the user info is written with a `/`, `?` or
/// `#` unencoded, the password only ([`password_at`]): a database's or a broker's user name is not a secret, and it helps to
/// read an error (`postgres://crm:***@db`).
fn userinfo_mask(scheme: &str, rest: &str) -> Option<(usize, usize)> {
    let http = is_http(scheme);
    let authority_end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    match rest[..authority_end].rfind('@') {
        Some(at) if http && at > 0 => Some((0, at)),
        // No `@` in the authority: a password written with a `/`, `?` or `#` unencoded, or a port and an `@`
        // further on, which cannot be told apart; what comes before the colon may be the host, kept.
        _ => password_at(rest).map(|(colon, at)| (colon + 1, at)),
    }
}

/// Where the password of a URL is, given what follows its `://`: (the colon before it, the `@` after it).
///
/// As a URL parser reads it, the user info ends at the last `@` of the authority, which ends at the first `/`,
/// `?` or `#`. When there is no `@` there but the authority holds a colon and an `@` comes further on, the
/// password was written with a `/`, `?` or `#` unencoded (no parser reads such a URL, but a log line or an error
/// quotes it as written), and it runs from that colon to that first `@`: `postgres://crm:123/x@db/app` is
/// shown `postgres://crm:***@db/app`. A password of digits reads like a port there, and a port followed by an
/// `@` in the path or query (`http://h:8080/a@b`, `https://h:443/users/@me`) cannot be told from it, so the
/// rule never looks at what follows the colon: such a port is masked with the rest (`http://h:***@b`), the
/// price of never showing a password. URLs with no `@` after a port (`https://h:8443/v1/tasks`), with their
/// user info in the authority (`postgres://u:p@h:5432/db`), or with no port (`https://h/users/@me`) are read
/// as a parser reads them.
fn password_at(rest: &str) -> Option<(usize, usize)> {
    let authority_end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    let authority = &rest[..authority_end];
    if let Some(at) = authority.rfind('@') {
        return authority[..at].find(':').map(|colon| (colon, at));
    }
    let colon = authority.find(':')?;
    let at = colon + rest[colon..].find('@')?;
    Some((colon, at))
}

/// `text` with the value after each `key` (up to `;`, `&`, a quote or a space) masked.
fn mask_after(text: &str, key: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(at) = rest.find(key) {
        let (head, tail) = rest.split_at(at + key.len());
        out.push_str(head);
        let end = tail
            .find(|c: char| matches!(c, ';' | '&' | '"' | '\'') || c.is_whitespace())
            .unwrap_or(tail.len());
        if end > 0 {
            out.push_str("***");
        }
        rest = &tail[end..];
    }
    out.push_str(rest);
    out
}

#[cfg(test)]
mod redact_tests {
    use super::redact_secrets as redact;

    #[test]
    fn redact_masks_url_passwords_and_sas_keys_and_keeps_the_rest() {
        assert_eq!(
            redact("2 | url = \"postgres://crm:s3cret@db/crm\" x"),
            "2 | url = \"postgres://crm:***@db/crm\" x"
        );
        assert_eq!(
            redact("postgresql://u:p:w@h:5432/db?x=1 and sqlite:file.db"),
            "postgresql://u:***@h:5432/db?x=1 and sqlite:file.db"
        );
        assert_eq!(
            redact("Endpoint=sb://ns.servicebus.windows.net/;SharedAccessKeyName=Root;SharedAccessKey=abc+/=;"),
            "Endpoint=sb://ns.servicebus.windows.net/;SharedAccessKeyName=Root;SharedAccessKey=***;"
        );
        assert_eq!(
            redact("SharedAccessSignature sr=x&sig=AbC%3D&se=1"),
            "SharedAccessSignature sr=x&sig=***&se=1"
        );
        // A password written with a `/`, `?` or `#` unencoded (no parser reads it, a line quotes it as written).
        for (url, masked) in [
            ("postgres://crm:pa/ss@db/crm", "postgres://crm:***@db/crm"),
            ("postgres://crm:pa?ss@db/crm", "postgres://crm:***@db/crm"),
            ("postgres://crm:pa#ss@db/crm", "postgres://crm:***@db/crm"),
            (
                "postgres://crm:pa/s?s#@db:5432/crm?x=1",
                "postgres://crm:***@db:5432/crm?x=1",
            ),
        ] {
            assert_eq!(
                redact(&format!("url = \"{url}\" x")),
                format!("url = \"{masked}\" x")
            );
            assert_eq!(
                super::redact_url(url).split('?').next(),
                masked.split('?').next()
            );
            for shown in [redact(url), super::redact_url(url)] {
                assert!(!shown.contains("pa") && !shown.contains("ss@"), "{shown}");
            }
        }
        for (url, shown) in [
            (
                "https://crm.example/v1/users/@me?x={key}",
                "https://crm.example/v1/***/***?x={key}",
            ),
            ("https://h:8443/v1/tasks", "https://h:8443/v1/***"),
            ("https://h/users/@me", "https://h/users/***"),
            ("http://127.0.0.1:9/tasks", "http://127.0.0.1:9/tasks"),
        ] {
            assert_eq!(redact(url), shown);
        }
        for plain in [
            "postgres://crm@db/crm",
            "no url here: é ü",
            "a://",
            "x://@",
            "",
        ] {
            assert_eq!(redact(plain), plain);
        }
    }

    /// Text before a `://` that ends in a character of several bytes (`ˤ://`, found by the fuzzer on a
    /// settings file) is not a scheme: the scheme's start was taken one byte after it, inside the character,
    /// and slicing there panicked.
    #[test]
    fn a_scheme_after_a_multibyte_character_is_read_on_a_character_boundary() {
        let text = String::from_utf8(vec![203, 164, 58, 47, 47, 46, 39, 91]).unwrap();
        assert_eq!(redact(&text), text);
        assert_eq!(redact("ˤhttps://tok@h/x"), "ˤhttps://***@h/x");
    }

    /// On HTTP the user name is masked with the password: APIs take a token as the user name
    /// (`https://TOKEN@api.example`, `https://TOKEN:x-oauth-basic@host`); a database's user name is kept.
    #[test]
    fn an_http_user_name_is_masked_as_a_token() {
        for (url, masked) in [
            (
                "https://ghp_T0ken@crm.example/v1",
                "https://***@crm.example/v1",
            ),
            ("https://ghp_T0ken:x-oauth-basic@h/x", "https://***@h/x"),
            ("HTTP://sk_live_T0ken:@h:8443/v1", "HTTP://***@h:8443/v1"),
            (
                "git+https://ghp_T0ken@github.com/o/r",
                "git+https://***@github.com/o/***",
            ),
            ("wss://ghp_T0ken@h/socket", "wss://***@h/socket"),
            ("postgres://crm:s3cret@db/app", "postgres://crm:***@db/app"),
            ("postgres://crm@db/app", "postgres://crm@db/app"),
            ("https://h/users/@me", "https://h/users/***"),
            ("https://@h/x", "https://@h/x"),
        ] {
            assert_eq!(super::redact_url(url), masked);
            assert_eq!(
                redact(&format!("call {url} failed")),
                format!("call {masked} failed")
            );
            assert!(!super::redact_url(url).contains("T0ken"), "{url}");
        }
    }

    /// An SQS queue URL keeps its account id and queue name (neither is a secret, and an error about a queue
    /// must say which), its query values still masked; a path of another shape after a 12-digit segment does
    /// not (seen failing before the carve-out: `http://127.0.0.1:4566/123456789012/***`, which made the
    /// SQS adapter's start-up error about a missing dead-letter queue name no queue).
    #[test]
    fn an_sqs_queue_url_keeps_its_queue_name() {
        for (url, shown) in [
            (
                "https://sqs.eu-west-1.amazonaws.com/123456789012/orders-dlq.fifo",
                "https://sqs.eu-west-1.amazonaws.com/123456789012/orders-dlq.fifo",
            ),
            (
                "http://127.0.0.1:4566/123456789012/crm_events?X-Amz-Signature=abc",
                "http://127.0.0.1:4566/123456789012/crm_events?X-Amz-Signature=***",
            ),
            (
                "https://hooks.example.com/123456789012/TOKEN/more",
                "https://hooks.example.com/123456789012/***/***",
            ),
            (
                "https://hooks.example.com/123456789012/to.ken",
                "https://hooks.example.com/123456789012/***",
            ),
        ] {
            assert_eq!(super::redact_url(url), shown, "{url}");
        }
        assert_eq!(
            redact("cannot use dead-letter queue https://sqs.us-east-1.amazonaws.com/123456789012/q-dlq: gone"),
            "cannot use dead-letter queue https://sqs.us-east-1.amazonaws.com/123456789012/q-dlq: gone"
        );
    }

    /// Webhook destinations carry their secret in the path (Slack's `/services/T/B/TOKEN`, Discord's
    /// `/api/webhooks/ID/TOKEN`, Telegram's `/botTOKEN/sendMessage`, Zapier's `/hooks/catch/ID/SECRET/`), and
    /// APIs take a key as a query value, bare or not, or in the fragment: what follows the host's first path
    /// segment is masked segment by segment (a `{placeholder}` of a template kept), that first segment too where
    /// it does not read as a plain name, and every query value and the fragment. In a log line or an error
    /// ([`redact`]) an HTTP URL is shown the same.
    #[test]
    fn a_webhook_token_in_the_path_or_the_query_is_masked() {
        for (url, masked) in [
            (
                "https://hooks.slack.com/services/T0AAAAAAA/B0BBBBBBB/XXXXXXXXXXXXXXXXXXXXXXXX",
                "https://hooks.slack.com/services/***/***/***",
            ),
            (
                "https://discord.com/api/webhooks/123456789012345678/SeCrEtToKeN-abc_DEF",
                "https://discord.com/api/***/***/***",
            ),
            (
                "https://api.telegram.org/bot123456:ABC-DEF1234ghIkl-zyx57W2v1u123ew11/sendMessage",
                "https://api.telegram.org/***/***",
            ),
            (
                "https://hooks.zapier.com/hooks/catch/1234567/abcdefg/",
                "https://hooks.zapier.com/hooks/***/***/***/",
            ),
            (
                "https://api.example/v2/items?apikey=SeCrEt1&SeCrEt2&x={key}#SeCrEt3",
                "https://api.example/v2/***?apikey=***&***&x={key}#***",
            ),
            (
                "https://h:8443/SeCrEtFirstSegmentToken/x#frag",
                "https://h:8443/***/***#***",
            ),
            (
                "https://crm.example/v1/tasks/{external_ref}",
                "https://crm.example/v1/***/{external_ref}",
            ),
            ("https://crm.example/", "https://crm.example/"),
            ("http://127.0.0.1:9", "http://127.0.0.1:9"),
            // A database's path is its name, kept.
            ("postgres://crm:s3cret@db/crm", "postgres://crm:***@db/crm"),
        ] {
            assert_eq!(super::redact_url(url), masked, "{url}");
            assert_eq!(
                redact(&format!("POST {url} failed: (\"{url}\")")),
                format!("POST {masked} failed: (\"{masked}\")"),
            );
            for secret in ["XXXXXXXX", "SeCrEt", "ABC-DEF", "abcdefg"] {
                assert!(!super::redact_url(url).contains(secret), "{url}");
            }
        }
        // Punctuation after a URL in text is not part of it.
        assert_eq!(
            redact("see (https://hooks.slack.com/services/T0/B0/XXXXXXXX), then"),
            "see (https://hooks.slack.com/services/***/***/***), then"
        );
    }

    /// A Service Bus endpoint or connection string given where a URL goes (`--endpoint`, `SERVICEBUS_ENDPOINT`):
    /// an `sb://` URL keeps its path, which is where a connection string's `;SharedAccessKey=KEY` is read.
    #[test]
    fn a_shared_access_key_after_a_url_is_masked() {
        for url in [
            "sb://emu.local:5380/;SharedAccessKeyName=Root;SharedAccessKey=SECRETkey1=",
            "Endpoint=sb://ns.servicebus.windows.net/;SharedAccessKeyName=Root;SharedAccessKey=SECRETkey1=;EntityPath=q",
        ] {
            let shown = super::redact_url(url);
            assert!(!shown.contains("SECRET"), "{shown}");
            assert!(shown.contains(";SharedAccessKey=***"), "{shown}");
        }
    }

    /// A password of digits written with a `/`, `?` or `#` unencoded reads like a port (`crm:123/x@db`): it is
    /// masked all the same, and so is a real port followed by an `@` further on (`h:8080/a@b`), which cannot be
    /// told from it. URLs whose user info is where a parser reads it, and those with no `@` after a port, are
    /// kept as they are.
    #[test]
    fn a_password_of_digits_is_masked_even_where_it_reads_as_a_port() {
        for (url, masked) in [
            ("postgres://crm:123/x@db/app", "postgres://crm:***@db/app"),
            ("postgres://crm:1/@db/app", "postgres://crm:***@db/app"),
            ("postgres://crm:65535?x@db/app", "postgres://crm:***@db/app"),
            ("postgres://crm:12#x@db/app", "postgres://crm:***@db/app"),
            ("postgres://crm:99999/@db", "postgres://crm:***@db"),
            // The price of never showing such a password: a port before an `@` of the path is masked too.
            ("http://h:8080/a@b", "http://h:***@b"),
            ("https://h:443/users/@me", "https://h:***@me"),
        ] {
            assert_eq!(
                redact(&format!("url = \"{url}\" x")),
                format!("url = \"{masked}\" x")
            );
            assert_eq!(super::redact_url(url), masked);
        }
        for (url, shown) in [
            ("https://h:8443/v1/tasks", "https://h:8443/v1/***"),
            ("postgres://u:p@h:5432/db", "postgres://u:***@h:5432/db"),
            ("postgres://crm@db:5432/crm", "postgres://crm@db:5432/crm"),
            ("https://h/users/@me", "https://h/users/***"),
            ("http://127.0.0.1:9/tasks", "http://127.0.0.1:9/tasks"),
        ] {
            assert_eq!(redact(url), shown);
            assert_eq!(super::redact_url(url), shown);
        }
    }
}
