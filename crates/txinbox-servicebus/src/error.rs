//! Errors of the Service Bus adapter, classified from the HTTP status the service answered (never from text).

use std::time::Duration;

use azure_core::error::ErrorKind;
use txinbox_core::{BoxError, BrokerError};

/// What a Service Bus REST call met. Decides the [`BrokerError`] variant and whether a retry can help.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum FailureKind {
    /// 404 on a lock URI: the lock expired, was used already, or the message is gone [doc DEL/UNLOCK/RENEW].
    LockLost,
    /// 410: the queue or subscription does not exist [doc SEND/PEEK].
    EntityNotFound,
    /// 429 or 503: the namespace or entity is throttled (the REST status is undocumented; both are seen).
    Throttled,
    /// 401 or 403: the SAS or bearer token was refused, lacks a right, or a quota is exceeded.
    Unauthorized,
    /// No answer: the connection dropped, or the request timed out. It may or may not have taken effect.
    OutcomeUnknown,
    /// 500 or another 5xx: a server-side failure, worth retrying.
    ServerError,
    /// Another 4xx: the service refused the request as invalid; a retry will not help.
    Rejected,
    /// The answer could not be read (a malformed `BrokerProperties`, a non-UTF-8 body, no lock location).
    Protocol,
    /// The request could not be built or sent (configuration, credential).
    Construction,
}

impl FailureKind {
    /// Whether the same call may succeed if retried.
    pub fn is_retryable(self) -> bool {
        matches!(
            self,
            FailureKind::Throttled | FailureKind::OutcomeUnknown | FailureKind::ServerError
        )
    }

    /// Classifies an HTTP status.
    pub fn of_status(status: u16) -> Self {
        match status {
            404 => FailureKind::LockLost,
            410 => FailureKind::EntityNotFound,
            429 | 503 => FailureKind::Throttled,
            401 | 403 => FailureKind::Unauthorized,
            408 | 504 => FailureKind::OutcomeUnknown,
            500..=599 => FailureKind::ServerError,
            _ => FailureKind::Rejected,
        }
    }
}

/// An error of the Service Bus adapter.
///
/// Secrets never appear in the message: SAS keys, signatures and bearer tokens are not kept in any variant.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ServiceBusError {
    /// The connection string or the options are invalid.
    #[error("invalid Service Bus configuration: {detail}")]
    Config {
        /// What is wrong.
        detail: String,
    },
    /// The service answered an unexpected HTTP status.
    #[error("Service Bus {op} on {entity} answered HTTP {status} ({kind:?}){}", retry_after.map(|d| format!(", retry after {} s", d.as_secs())).unwrap_or_default())]
    Status {
        /// The operation (`receive`, `complete`, `abandon`, `renew`, `send`).
        op: &'static str,
        /// The entity path.
        entity: String,
        /// The HTTP status.
        status: u16,
        /// Its classification.
        kind: FailureKind,
        /// The service's `Retry-After`, when it sent one (receive only: the crate hides other headers).
        retry_after: Option<Duration>,
        /// The underlying client error, when the crate raised one.
        #[source]
        source: Option<Box<azure_core::Error>>,
    },
    /// The request failed without an HTTP answer (dropped connection, timeout) or could not be sent.
    #[error("Service Bus {op} on {entity} failed ({kind:?}): {source}")]
    Transport {
        /// The operation.
        op: &'static str,
        /// The entity path.
        entity: String,
        /// Its classification ([`FailureKind::OutcomeUnknown`] unless the request could not be built).
        kind: FailureKind,
        /// The client error.
        #[source]
        source: Box<azure_core::Error>,
    },
    /// A response could not be understood.
    #[error("Service Bus {op} on {entity}: unreadable response: {detail}")]
    Protocol {
        /// The operation.
        op: &'static str,
        /// The entity path.
        entity: String,
        /// What was wrong.
        detail: String,
        /// The underlying error, if any.
        #[source]
        source: Option<BoxError>,
    },
    /// A complete was retried after an attempt whose answer was lost, and the retry found no lock: the first
    /// attempt probably completed the message, but that cannot be known.
    #[error("Service Bus {op} on {entity}: an earlier attempt's answer was lost and the retry found no lock ({detail})")]
    AmbiguousSettle {
        /// The operation.
        op: &'static str,
        /// The entity path.
        entity: String,
        /// What happened.
        detail: String,
    },
    /// Forwarding a message to the dead-letter destination failed; the original was not completed.
    #[error("cannot forward to the dead-letter destination {destination}: {source}")]
    DeadLetterForward {
        /// The destination queue.
        destination: String,
        /// The send error.
        #[source]
        source: Box<ServiceBusError>,
    },
    /// Writing progress failed.
    #[error("writing progress failed: {0}")]
    Progress(#[source] std::io::Error),
    /// A redrive stopped on an error; `report` says what it did before.
    #[error("redrive stopped after moving {} message(s): {source}", report.moved)]
    RedriveInterrupted {
        /// What the redrive did before the error.
        report: crate::redrive::RedriveReport,
        /// The error.
        #[source]
        source: Box<ServiceBusError>,
    },
}

impl ServiceBusError {
    /// Classifies an error the crate (or our HTTP client) raised during `op` on `entity`.
    pub fn from_client(op: &'static str, entity: &str, err: azure_core::Error) -> Self {
        match err.kind().clone() {
            ErrorKind::HttpResponse { status, .. } => {
                let status = u16::from(status);
                ServiceBusError::Status {
                    op,
                    entity: entity.to_owned(),
                    status,
                    kind: FailureKind::of_status(status),
                    retry_after: None,
                    source: Some(Box::new(err)),
                }
            }
            ErrorKind::Io => ServiceBusError::Transport {
                op,
                entity: entity.to_owned(),
                kind: FailureKind::OutcomeUnknown,
                source: Box::new(err),
            },
            ErrorKind::Credential => ServiceBusError::Transport {
                op,
                entity: entity.to_owned(),
                kind: FailureKind::Unauthorized,
                source: Box::new(err),
            },
            ErrorKind::DataConversion => ServiceBusError::Protocol {
                op,
                entity: entity.to_owned(),
                detail: "the client could not read the answer".into(),
                source: Some(Box::new(err)),
            },
            _ => ServiceBusError::Transport {
                op,
                entity: entity.to_owned(),
                kind: FailureKind::Construction,
                source: Box::new(err),
            },
        }
    }

    /// The classification.
    pub fn kind(&self) -> FailureKind {
        match self {
            ServiceBusError::Config { .. } => FailureKind::Construction,
            ServiceBusError::Status { kind, .. } | ServiceBusError::Transport { kind, .. } => *kind,
            ServiceBusError::Protocol { .. } => FailureKind::Protocol,
            ServiceBusError::AmbiguousSettle { .. } => FailureKind::OutcomeUnknown,
            ServiceBusError::DeadLetterForward { source, .. }
            | ServiceBusError::RedriveInterrupted { source, .. } => source.kind(),
            ServiceBusError::Progress(_) => FailureKind::Construction,
        }
    }

    /// The HTTP status the service answered, if it answered.
    pub fn status(&self) -> Option<u16> {
        match self {
            ServiceBusError::Status { status, .. } => Some(*status),
            ServiceBusError::DeadLetterForward { source, .. }
            | ServiceBusError::RedriveInterrupted { source, .. } => source.status(),
            _ => None,
        }
    }

    /// The service's `Retry-After`, if it sent one.
    pub fn retry_after(&self) -> Option<Duration> {
        match self {
            ServiceBusError::Status { retry_after, .. } => *retry_after,
            _ => None,
        }
    }

    /// Whether retrying the same call may help.
    pub fn is_retryable(&self) -> bool {
        self.kind().is_retryable()
    }
}

impl From<ServiceBusError> for BrokerError {
    fn from(e: ServiceBusError) -> Self {
        let detail = e.to_string();
        match e.kind() {
            FailureKind::LockLost => BrokerError::LockLost { detail },
            FailureKind::EntityNotFound => BrokerError::EntityNotFound { detail },
            FailureKind::Throttled => BrokerError::Throttled {
                detail,
                source: Some(Box::new(e)),
            },
            FailureKind::Unauthorized => BrokerError::Unauthorized { detail },
            FailureKind::OutcomeUnknown => BrokerError::Unknown {
                source: Box::new(e),
            },
            kind => BrokerError::Other {
                source: Box::new(e),
                retryable: kind.is_retryable(),
            },
        }
    }
}

/// The error our HTTP client raises when a request gets no answer in time.
#[derive(Debug, thiserror::Error)]
#[error("no answer within {0:?}")]
pub struct RequestTimedOut(pub Duration);

#[cfg(test)]
mod tests {
    use super::*;

    fn status(code: u16) -> ServiceBusError {
        ServiceBusError::Status {
            op: "complete",
            entity: "q".into(),
            status: code,
            kind: FailureKind::of_status(code),
            retry_after: None,
            source: None,
        }
    }

    #[test]
    fn statuses_map_to_the_broker_errors_the_inbox_understands() {
        assert!(matches!(
            BrokerError::from(status(404)),
            BrokerError::LockLost { .. }
        ));
        assert!(matches!(
            BrokerError::from(status(410)),
            BrokerError::EntityNotFound { .. }
        ));
        assert!(matches!(
            BrokerError::from(status(429)),
            BrokerError::Throttled { .. }
        ));
        assert!(matches!(
            BrokerError::from(status(503)),
            BrokerError::Throttled { .. }
        ));
        assert!(matches!(
            BrokerError::from(status(401)),
            BrokerError::Unauthorized { .. }
        ));
        assert!(matches!(
            BrokerError::from(status(403)),
            BrokerError::Unauthorized { .. }
        ));
        let internal = BrokerError::from(status(500));
        assert!(matches!(
            internal,
            BrokerError::Other {
                retryable: true,
                ..
            }
        ));
        assert!(!BrokerError::from(status(400)).is_retryable());
    }

    #[test]
    fn client_errors_keep_their_status_and_source() {
        let io = azure_core::Error::new(ErrorKind::Io, RequestTimedOut(Duration::from_secs(3)));
        let e = ServiceBusError::from_client("complete", "q", io);
        assert_eq!(e.kind(), FailureKind::OutcomeUnknown);
        assert!(std::error::Error::source(&e).is_some());
        assert!(matches!(BrokerError::from(e), BrokerError::Unknown { .. }));

        let http = ErrorKind::http_response(azure_core::StatusCode::NotFound, None).into_error();
        let e = ServiceBusError::from_client("renew", "q", http);
        assert_eq!(e.status(), Some(404));
        assert_eq!(e.kind(), FailureKind::LockLost);
    }
}
