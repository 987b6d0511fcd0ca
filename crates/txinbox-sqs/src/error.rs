//! Errors of the SQS adapter, classified from the SDK's typed errors (never from their text).

use std::error::Error as StdError;

use aws_sdk_sqs::error::{ProvideErrorMetadata, SdkError};
use txinbox_core::{BoxError, BrokerError};

/// What kind of failure an SQS call met. Decides the [`BrokerError`] variant and whether a retry can help.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum AwsErrorKind {
    /// The receipt handle is no longer valid or the message is no longer in flight: the visibility (our lease)
    /// was lost.
    ReceiptInvalid,
    /// The queue does not exist (`QueueDoesNotExist`).
    QueueNotFound,
    /// SQS throttled the request (`RequestThrottled`, `ThrottlingException`, KMS throttling, HTTP 429/503).
    Throttled,
    /// The credentials were refused or lack a permission (`AccessDenied`, `InvalidSecurity`, HTTP 401/403).
    Unauthorized,
    /// The request timed out or its connection dropped: it may or may not have taken effect.
    OutcomeUnknown,
    /// The service refused the request as invalid (a client error a retry will not fix).
    Rejected,
    /// The request could not be built or sent (a configuration problem, e.g. no region or no HTTP client).
    Construction,
    /// A server-side failure (HTTP 5xx other than 503).
    ServerError,
}

impl AwsErrorKind {
    /// Whether the same call may succeed if retried.
    pub fn is_retryable(self) -> bool {
        matches!(
            self,
            AwsErrorKind::Throttled | AwsErrorKind::OutcomeUnknown | AwsErrorKind::ServerError
        )
    }
}

/// An error of the SQS adapter.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SqsError {
    /// The options are inconsistent (for example a heartbeat interval not below the visibility timeout).
    #[error("invalid SQS options: {detail}")]
    InvalidOptions {
        /// What is wrong.
        detail: String,
    },
    /// An SQS API call failed.
    #[error("SQS {op} failed ({kind:?}{}{})", code.as_deref().map(|c| format!(", {c}")).unwrap_or_default(), message.as_deref().map(|m| format!(": {m}")).unwrap_or_default())]
    Aws {
        /// The API operation (`ReceiveMessage`, `DeleteMessage`, ...).
        op: &'static str,
        /// The classification.
        kind: AwsErrorKind,
        /// The service's error code, when the service answered.
        code: Option<String>,
        /// The service's error message, when the service answered.
        message: Option<String>,
        /// The SDK error.
        #[source]
        source: BoxError,
    },
    /// Some entries of a `DeleteMessageBatch` (or the retry of one) failed.
    #[error(
        "SQS DeleteMessageBatch entry failed ({code}, sender fault: {sender_fault}): {message}"
    )]
    BatchEntry {
        /// The entry's error code.
        code: String,
        /// The entry's error message.
        message: String,
        /// Whether SQS blames the request (not retryable) rather than itself.
        sender_fault: bool,
    },
    /// A message could not be forwarded to the dead-letter queue (nothing was deleted).
    #[error("cannot dead-letter: {detail}")]
    DeadLetter {
        /// Why.
        detail: String,
    },
    /// A received message lacks a field SQS always sets (a receipt handle).
    #[error("SQS returned a message without {field}")]
    Incomplete {
        /// The missing field.
        field: &'static str,
    },
    /// Writing progress failed.
    #[error("writing progress failed: {0}")]
    Progress(#[source] std::io::Error),
    /// A redrive stopped on an error; `report` says what was moved before it.
    #[error("redrive stopped after moving {} message(s): {source}", report.moved)]
    RedriveInterrupted {
        /// What the redrive did before the error.
        report: crate::redrive::RedriveReport,
        /// The error.
        #[source]
        source: Box<SqsError>,
    },
}

impl SqsError {
    /// Classifies an SDK error of operation `op`. Service errors are classified with
    /// [`SdkError::as_service_error`] and their error code; transport errors by their SDK variant.
    pub fn from_sdk<E, R>(op: &'static str, err: SdkError<E, R>) -> Self
    where
        E: ProvideErrorMetadata + StdError + Send + Sync + 'static,
        R: std::fmt::Debug + Send + Sync + 'static,
    {
        let (kind, code, message) = match &err {
            SdkError::ServiceError(_) => {
                let se = err.as_service_error();
                let code = se.and_then(|e| e.code()).map(str::to_owned);
                let message = se.and_then(|e| e.message()).map(str::to_owned);
                (kind_of_code(code.as_deref()), code, message)
            }
            SdkError::TimeoutError(_) | SdkError::DispatchFailure(_) => {
                // A dispatch failure before any byte was sent cannot have taken effect, but the SDK does not
                // say which part failed in a way stable across versions: treat both as unknown (retryable).
                (AwsErrorKind::OutcomeUnknown, None, None)
            }
            SdkError::ResponseError(_) => (AwsErrorKind::OutcomeUnknown, None, None),
            SdkError::ConstructionFailure(_) => (AwsErrorKind::Construction, None, None),
            _ => (AwsErrorKind::OutcomeUnknown, None, None),
        };
        SqsError::Aws {
            op,
            kind,
            code,
            message,
            source: Box::new(err),
        }
    }

    /// The classification, for [`SqsError::Aws`] and batch entries.
    pub fn kind(&self) -> Option<AwsErrorKind> {
        match self {
            SqsError::Aws { kind, .. } => Some(*kind),
            SqsError::BatchEntry { code, .. } => Some(kind_of_code(Some(code))),
            SqsError::RedriveInterrupted { source, .. } => source.kind(),
            _ => None,
        }
    }

    /// Whether retrying the same call may help.
    pub fn is_retryable(&self) -> bool {
        match self {
            SqsError::BatchEntry {
                sender_fault: false,
                code,
                ..
            } => kind_of_code(Some(code)) != AwsErrorKind::ReceiptInvalid,
            _ => self.kind().is_some_and(AwsErrorKind::is_retryable),
        }
    }
}

/// Error codes as SQS sends them over the JSON and the query protocols (moto uses both spellings).
fn kind_of_code(code: Option<&str>) -> AwsErrorKind {
    let Some(code) = code else {
        return AwsErrorKind::ServerError;
    };
    let short = code.rsplit('.').next().unwrap_or(code);
    match short {
        "ReceiptHandleIsInvalid" | "MessageNotInflight" | "InvalidReceiptHandle" => {
            AwsErrorKind::ReceiptInvalid
        }
        "QueueDoesNotExist" | "NonExistentQueue" | "QueueDeletedRecently" => {
            AwsErrorKind::QueueNotFound
        }
        "RequestThrottled"
        | "ThrottlingException"
        | "Throttling"
        | "KmsThrottled"
        | "OverLimit"
        | "ServiceUnavailable" => AwsErrorKind::Throttled,
        "AccessDenied"
        | "AccessDeniedException"
        | "InvalidSecurity"
        | "InvalidClientTokenId"
        | "SignatureDoesNotMatch"
        | "ExpiredToken"
        | "UnrecognizedClientException"
        | "KmsAccessDenied" => AwsErrorKind::Unauthorized,
        "InternalError" | "InternalFailure" | "ServiceUnavailableException" => {
            AwsErrorKind::ServerError
        }
        _ => AwsErrorKind::Rejected,
    }
}

impl From<SqsError> for BrokerError {
    fn from(e: SqsError) -> Self {
        let detail = e.to_string();
        match e.kind() {
            Some(AwsErrorKind::ReceiptInvalid) => BrokerError::LockLost { detail },
            Some(AwsErrorKind::QueueNotFound) => BrokerError::EntityNotFound { detail },
            Some(AwsErrorKind::Throttled) => BrokerError::Throttled {
                detail,
                source: Some(Box::new(e)),
            },
            Some(AwsErrorKind::Unauthorized) => BrokerError::Unauthorized { detail },
            Some(AwsErrorKind::OutcomeUnknown) => BrokerError::Unknown {
                source: Box::new(e),
            },
            _ => {
                let retryable = e.is_retryable();
                BrokerError::Other {
                    source: Box::new(e),
                    retryable,
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_of_both_protocols_are_classified() {
        assert_eq!(
            kind_of_code(Some("AWS.SimpleQueueService.NonExistentQueue")),
            AwsErrorKind::QueueNotFound
        );
        assert_eq!(
            kind_of_code(Some("QueueDoesNotExist")),
            AwsErrorKind::QueueNotFound
        );
        assert_eq!(
            kind_of_code(Some("ReceiptHandleIsInvalid")),
            AwsErrorKind::ReceiptInvalid
        );
        assert_eq!(
            kind_of_code(Some("AWS.SimpleQueueService.MessageNotInflight")),
            AwsErrorKind::ReceiptInvalid
        );
        assert_eq!(
            kind_of_code(Some("RequestThrottled")),
            AwsErrorKind::Throttled
        );
        assert_eq!(
            kind_of_code(Some("AccessDenied")),
            AwsErrorKind::Unauthorized
        );
        assert_eq!(
            kind_of_code(Some("InvalidParameterValue")),
            AwsErrorKind::Rejected
        );
    }

    #[test]
    fn broker_error_mapping_keeps_the_meaning() {
        let lost: BrokerError = SqsError::BatchEntry {
            code: "ReceiptHandleIsInvalid".into(),
            message: "gone".into(),
            sender_fault: true,
        }
        .into();
        assert!(matches!(lost, BrokerError::LockLost { .. }));
        let internal = SqsError::BatchEntry {
            code: "InternalError".into(),
            message: "try again".into(),
            sender_fault: false,
        };
        assert!(internal.is_retryable());
        let b: BrokerError = internal.into();
        assert!(b.is_retryable());
        let bad: BrokerError = SqsError::InvalidOptions { detail: "x".into() }.into();
        assert!(!bad.is_retryable());
    }
}
