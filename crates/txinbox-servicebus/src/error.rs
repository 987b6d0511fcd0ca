//! Errors of the Service Bus adapter. Every Service Bus call that fails returns the core's [`BrokerError`],
//! classified here from the HTTP status the service answered or the client error's kind (never from text),
//! keeping the `azure_core` error as its source; [`ServiceBusError`] adds only what is the adapter's own (an
//! invalid connection string or options).
//!
//! Secrets never appear in an error: SAS keys, signatures and bearer tokens are not kept anywhere.

use std::time::Duration;

use azure_core::error::ErrorKind;
use txinbox_core::{BrokerError, BrokerErrorKind};

/// An error of the Service Bus adapter outside the broker contract: a connection string or options it
/// refuses, before any call to Service Bus.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ServiceBusError {
    /// The connection string or the options are invalid.
    #[error("invalid Service Bus configuration: {detail}")]
    Config {
        /// What is wrong.
        detail: String,
    },
}

/// The service answered an HTTP status the adapter checked itself (the crate returns `Ok` whatever the
/// status on a receive): the source of such a [`BrokerError`].
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{entity} answered HTTP {status}")]
#[non_exhaustive]
pub struct UnexpectedStatus {
    /// The entity path.
    pub entity: String,
    /// The HTTP status.
    pub status: u16,
}

/// A complete or abandon was retried after an attempt that may have applied (its answer was lost, or it was
/// answered with a server error), and a later attempt found no lock, or failed and was not retried (a refusal
/// such as 401 or 410, the last attempt, or [`SettleNotRetried`]): the earlier attempt may have completed (or abandoned) the message, and
/// a 404 then is probably its doing, but that cannot be known. The source of an
/// [`OutcomeUnknown`](BrokerErrorKind::OutcomeUnknown) error, whose own source is the later attempt's error.
/// Never a renewal's: a renewal removes no lock, so its 404 is [`LockLost`](BrokerErrorKind::LockLost)
/// whatever came before.
#[derive(Debug, thiserror::Error)]
#[error(
    "attempt {attempt} failed ({}) after an earlier attempt that may have applied ({earlier})",
    .source.kind()
)]
#[non_exhaustive]
pub struct AmbiguousSettle {
    /// The attempt that answered 404, or that was not retried.
    pub attempt: u32,
    /// How the earlier attempt failed: [`OutcomeUnknown`](BrokerErrorKind::OutcomeUnknown) (no answer) or
    /// [`ServerError`](BrokerErrorKind::ServerError) (a 5xx other than 503).
    pub earlier: BrokerErrorKind,
    /// That attempt's error.
    #[source]
    pub source: BrokerError,
}

/// The last attempt of a complete or abandon was answered with a server error (a 5xx other than 503 and 504)
/// and was not retried (it was the last of [`ServiceBusOptions::settle_attempts`](crate::ServiceBusOptions),
/// or [`SettleNotRetried`]): Microsoft, Delete Message: "500 Internal error.", nothing more, so the attempt may
/// have completed (or abandoned) the message, and it may be gone. The source of an
/// [`OutcomeUnknown`](BrokerErrorKind::OutcomeUnknown) error, whose own source is that attempt's error. Never
/// a renewal's (a renewal removes no lock: its server error stays a [`ServerError`](BrokerErrorKind::ServerError)).
#[derive(Debug, thiserror::Error)]
#[error("attempt {attempt} was answered with a server error and not retried: it may have applied")]
#[non_exhaustive]
pub struct SettleMayHaveApplied {
    /// The attempt answered with the server error.
    pub attempt: u32,
    /// That attempt's error.
    #[source]
    pub source: BrokerError,
}

/// A complete, abandon or renewal failed with an error worth retrying, and was not retried: the wait before
/// the next attempt (the service's `Retry-After`, or the adapter's backoff) would end less than
/// [`SETTLE_LOCK_MARGIN`](crate::receiver::SETTLE_LOCK_MARGIN) before the lock does, or is longer than
/// [`MAX_SETTLE_WAIT`](crate::receiver::MAX_SETTLE_WAIT). After a refusal (429, 503) the settle is not done
/// and the message comes back when its lock ends; after a lost answer or a server error (500) it may have been
/// done (Microsoft, Delete Message: "500 Internal error.", nothing more), so the message may be gone. The
/// source of an error of the failed attempt's kind (mostly [`Throttled`](BrokerErrorKind::Throttled)), whose
/// own source is that attempt's error; for a complete or abandon given up on a server error, that error is in
/// turn the source of a [`SettleMayHaveApplied`].
#[derive(Debug, thiserror::Error)]
#[error("not retried after attempt {attempt}: the next would wait {wait:?}, with {lock_left:?} of the lock left")]
#[non_exhaustive]
pub struct SettleNotRetried {
    /// The attempt that failed.
    pub attempt: u32,
    /// The wait before the next attempt: the service's `Retry-After`, or the adapter's backoff when longer.
    pub wait: Duration,
    /// How long the lock had left, as far as the adapter knew.
    pub lock_left: Duration,
    /// That attempt's error.
    #[source]
    pub source: BrokerError,
}

/// Classifies an error the crate (or our HTTP client) raised during `op` into the core's [`BrokerError`],
/// keeping it as the source.
pub(crate) fn client_error(op: &'static str, err: azure_core::Error) -> BrokerError {
    let kind = match err.kind() {
        _ if err.downcast_ref::<ForeignHost>().is_some() => BrokerErrorKind::Protocol,
        ErrorKind::HttpResponse { status, .. } => {
            BrokerErrorKind::of_http_status(u16::from(*status))
        }
        ErrorKind::Io => BrokerErrorKind::OutcomeUnknown,
        ErrorKind::Credential => BrokerErrorKind::Unauthorized,
        ErrorKind::DataConversion => BrokerErrorKind::Protocol,
        _ => BrokerErrorKind::Configuration,
    };
    let after = err.downcast_ref::<ServiceRetryAfter>().map(|r| r.after);
    BrokerError::new(kind, op, err).with_retry_after(after)
}

/// Classifies the error of a send (a publish, a dead-letter forward, a redrive's re-send) of a message whose
/// body is `body_len` bytes as [`client_error`] does, but for a 403: on a send it is about the message or the
/// entity, not the credentials (Microsoft, Send Message: "403 Quota exceeded or message too large."; an
/// authorization failure is "401 Authorization failure."). A body of at most [`ALWAYS_FITS_BODY`] fits every
/// tier's message size, whatever its properties: its 403 is the entity's quota (a full queue, which frees as
/// its messages are received), [`Throttled`](BrokerErrorKind::Throttled) and retried; a larger one's may be
/// its size, [`Rejected`](BrokerErrorKind::Rejected). Neither is
/// [`Unauthorized`](BrokerErrorKind::Unauthorized).
///
/// The service's `Retry-After` of a throttled send is kept, at most [`MAX_SEND_RETRY_AFTER`].
pub(crate) fn send_error(op: &'static str, err: azure_core::Error, body_len: usize) -> BrokerError {
    let refused =
        matches!(err.kind(), ErrorKind::HttpResponse { status, .. } if u16::from(*status) == 403);
    if refused {
        let kind = if body_len <= ALWAYS_FITS_BODY {
            BrokerErrorKind::Throttled
        } else {
            BrokerErrorKind::Rejected
        };
        return BrokerError::new(kind, op, err);
    }
    let e = client_error(op, err);
    let after = e.retry_after().map(|a| a.min(MAX_SEND_RETRY_AFTER));
    e.with_retry_after(after)
}

/// The largest body that fits a message on every tier, whatever its properties: Microsoft (Service Bus quotas)
/// gives a maximum message size of 256 KB on the Standard tier (Premium: 1 MB or more), properties included,
/// and a maximum header size of 64 KB; 256 KiB less 64 KiB.
pub const ALWAYS_FITS_BODY: usize = 192 * 1024;

/// The longest `Retry-After` a send's error carries, whatever the service said (a hostile or buggy value would
/// otherwise hold the outbox's message for as long); the same bound as a receive's wait.
pub const MAX_SEND_RETRY_AFTER: Duration = Duration::from_secs(30);

/// The source our HTTP client gives the error of a settle's, renewal's or send's answer that carried
/// `Retry-After` (the crate's own status check keeps only the status), so that the retry waits as long as the
/// service asked.
#[derive(Debug, thiserror::Error)]
#[error("answered {status} with Retry-After {after:?}")]
#[non_exhaustive]
pub struct ServiceRetryAfter {
    /// The HTTP status.
    pub status: u16,
    /// The wait the service asked for.
    pub after: Duration,
}

/// Our HTTP client refused a request to a host that is not the namespace's (`{namespace}.servicebus.windows.net`
/// over HTTPS, or the configured endpoint): a lock URI (the service's `Location`) naming another host. Nothing
/// was sent, so no credential left. A [`Protocol`](BrokerErrorKind::Protocol) error's source.
#[derive(Debug, thiserror::Error)]
#[error("refused to send a request to {host:?}, which is not the namespace's host")]
#[non_exhaustive]
pub struct ForeignHost {
    /// The scheme and host (and port) the request named.
    pub host: String,
}

/// The error our HTTP client raises when a request gets no answer in time.
#[derive(Debug, thiserror::Error)]
#[error("no answer within {0:?}")]
pub struct RequestTimedOut(pub Duration);

#[cfg(test)]
mod tests {
    use super::*;
    use std::error::Error as _;

    #[test]
    fn client_errors_keep_their_source_and_meaning() {
        let io = azure_core::Error::new(ErrorKind::Io, RequestTimedOut(Duration::from_secs(3)));
        let e = client_error("complete", io);
        assert_eq!(e.kind(), BrokerErrorKind::OutcomeUnknown);
        assert!(e
            .source()
            .unwrap()
            .downcast_ref::<azure_core::Error>()
            .is_some());

        let http = ErrorKind::http_response(azure_core::StatusCode::NotFound, None).into_error();
        let e = client_error("renew-lock", http);
        assert_eq!(e.kind(), BrokerErrorKind::LockLost);
        assert_eq!(e.operation(), "renew-lock");
        let http = ErrorKind::http_response(azure_core::StatusCode::Gone, None).into_error();
        assert_eq!(
            client_error("send", http).kind(),
            BrokerErrorKind::EntityNotFound
        );
        let forbidden =
            || ErrorKind::http_response(azure_core::StatusCode::Forbidden, None).into_error();
        // "403 Quota exceeded or message too large.": a body that fits every tier meets a full entity (retried),
        // a larger one may be too large.
        assert_eq!(
            send_error("send", forbidden(), ALWAYS_FITS_BODY).kind(),
            BrokerErrorKind::Throttled
        );
        assert_eq!(
            send_error("send", forbidden(), ALWAYS_FITS_BODY + 1).kind(),
            BrokerErrorKind::Rejected
        );
        assert_eq!(
            client_error("receive", forbidden()).kind(),
            BrokerErrorKind::Unauthorized
        );
        let foreign = azure_core::Error::new(
            ErrorKind::Other,
            ForeignHost {
                host: "https://elsewhere.example".into(),
            },
        );
        assert_eq!(
            client_error("complete", foreign).kind(),
            BrokerErrorKind::Protocol
        );
        let unauthorized =
            ErrorKind::http_response(azure_core::StatusCode::Unauthorized, None).into_error();
        assert_eq!(
            send_error("send", unauthorized, 2).kind(),
            BrokerErrorKind::Unauthorized
        );
    }
}
