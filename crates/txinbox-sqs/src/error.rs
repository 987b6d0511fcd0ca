//! Errors of the SQS adapter. Every SQS call that fails returns the core's [`BrokerError`], classified here
//! from the SDK's typed errors (never from their text) and keeping the SDK error as its source; [`SqsError`]
//! is only what is the adapter's own (invalid options, a message it cannot send), as such an error's source.

use std::error::Error as StdError;
use std::sync::Arc;

use aws_sdk_sqs::error::{ProvideErrorMetadata, SdkError};
use txinbox_core::{BrokerError, BrokerErrorKind};

/// What the SQS adapter refuses before calling SQS: invalid options, or a message it cannot send. It reaches
/// callers as the source of a [`BrokerError`] of kind
/// [`Configuration`](BrokerErrorKind::Configuration) (options) or [`Rejected`](BrokerErrorKind::Rejected) (a
/// message).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SqsError {
    /// The options (or a message to publish) are not acceptable.
    #[error("invalid SQS options: {detail}")]
    InvalidOptions {
        /// What is wrong.
        detail: String,
    },
    /// The start-up check found the queue without a dead-letter path.
    #[error("queue {queue_url} has no dead-letter path: no RedrivePolicy and no dead-letter queue configured (a payload collision or a permanent error would come back forever); set one, or opt out with SqsOptions::allow_no_dead_letter(true)")]
    NoDeadLetterPath {
        /// The queue.
        queue_url: String,
    },
    /// A queue could not be used at start (its [`BrokerError`] has the kind of the failed call).
    #[error("cannot use {role} {queue_url}: {error}")]
    Unusable {
        /// `queue` or `dead-letter queue`.
        role: &'static str,
        /// The queue.
        queue_url: String,
        /// The failed call's error, as text (one line, no secret).
        error: String,
    },
}

impl SqsError {
    /// This error as the [`BrokerError`] of `op`, of `kind`.
    pub(crate) fn broker(self, kind: BrokerErrorKind, op: &'static str) -> BrokerError {
        BrokerError::new(kind, op, self)
    }
}

/// One failed entry of a `DeleteMessageBatch` (the source of its [`BrokerError`]).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("entry failed ({code}, sender fault: {sender_fault}): {message}")]
#[non_exhaustive]
pub struct BatchEntryError {
    /// The entry's error code.
    pub code: String,
    /// The entry's error message.
    pub message: String,
    /// Whether SQS blames the request rather than itself.
    pub sender_fault: bool,
}

impl BatchEntryError {
    /// The classification of this entry's failure.
    pub fn kind(&self) -> BrokerErrorKind {
        match kind_of(Some(&self.code), Some(&self.message)) {
            // SQS blames itself: worth another try even when the code is not one we know.
            BrokerErrorKind::Rejected if !self.sender_fault => BrokerErrorKind::ServerError,
            k => k,
        }
    }
}

/// A batch call that failed as a whole (after the SDK's own retries): the source of each of its entries'
/// [`BrokerError`], which all share the call's error (and its kind). SQS reported no entry deleted.
#[derive(Clone, Debug, thiserror::Error)]
#[error("the {operation} call failed as a whole, for each of its {entries} entries")]
#[non_exhaustive]
pub struct BatchCallError {
    /// The batch operation (`DeleteMessageBatch`).
    pub operation: &'static str,
    /// How many entries the call carried.
    pub entries: usize,
    /// The call's error (the SDK's).
    #[source]
    pub error: Arc<dyn StdError + Send + Sync + 'static>,
}

/// Classifies an SDK error of operation `op` into the core's [`BrokerError`], keeping the SDK error as its
/// source. Service errors are classified by their error code; transport errors by their SDK variant.
pub(crate) fn sdk_error<E, R>(op: &'static str, err: SdkError<E, R>) -> BrokerError
where
    E: ProvideErrorMetadata + StdError + Send + Sync + 'static,
    R: std::fmt::Debug + Send + Sync + 'static,
{
    let kind = match &err {
        SdkError::ServiceError(_) => {
            let e = err.as_service_error();
            kind_of(e.and_then(|e| e.code()), e.and_then(|e| e.message()))
        }
        // A dispatch failure before any byte was sent cannot have taken effect, but the SDK does not say
        // which part failed in a way stable across versions: treat it as unknown (retryable).
        SdkError::TimeoutError(_) | SdkError::DispatchFailure(_) | SdkError::ResponseError(_) => {
            BrokerErrorKind::OutcomeUnknown
        }
        SdkError::ConstructionFailure(_) => BrokerErrorKind::Configuration,
        _ => BrokerErrorKind::OutcomeUnknown,
    };
    BrokerError::new(kind, op, err)
}

/// Classifies an SQS error by its code and, where the code alone is too broad, its message. SQS as AWS runs it
/// answers a visibility change or a delete whose message is gone with HTTP 400 `InvalidParameterValue`:
/// "Value ... for parameter ReceiptHandle is invalid. Reason: Message does not exist or is not available for
/// visibility timeout change." That is a lost lease, not a rejected request.
pub(crate) fn kind_of(code: Option<&str>, message: Option<&str>) -> BrokerErrorKind {
    let kind = kind_of_code(code);
    let short = code.map(|c| c.rsplit('.').next().unwrap_or(c));
    if kind == BrokerErrorKind::Rejected && short == Some("InvalidParameterValue") {
        let m = message.unwrap_or_default();
        if m.contains("ReceiptHandle")
            && (m.contains("is invalid")
                || m.contains("Message does not exist or is not available"))
        {
            return BrokerErrorKind::LockLost;
        }
    }
    kind
}

/// Error codes as SQS sends them over the JSON and the query protocols (moto uses both spellings).
pub(crate) fn kind_of_code(code: Option<&str>) -> BrokerErrorKind {
    let Some(code) = code else {
        return BrokerErrorKind::ServerError;
    };
    // The KMS key of an encrypted queue, as the SDK reports its failures: the code SQS sends in its
    // `x-amzn-query-error` header (`KMS.DisabledException`; the model's shape is `KmsDisabled`, the name SQS's
    // JSON body gives). A key disabled, not found, pending deletion or refused by its policy fails every
    // receive and every send until an operator changes it: a configuration of the queue, not a refused
    // request (AWS, ReceiveMessage errors: "KmsDisabled", "KmsInvalidKeyUsage", "KmsInvalidState: The
    // request was rejected because the state of the specified resource is not valid for this request",
    // "KmsNotFound: The request was rejected because the specified entity or resource could not be found",
    // "KmsOptInRequired").
    match code {
        "KMS.AccessDeniedException" => return BrokerErrorKind::Unauthorized,
        "KMS.ThrottlingException" => return BrokerErrorKind::Throttled,
        "KMS.DisabledException"
        | "KMS.InvalidKeyUsageException"
        | "KMS.InvalidStateException"
        | "KMS.NotFoundException"
        | "KMS.OptInRequired" => return BrokerErrorKind::Configuration,
        _ => {}
    }
    let short = code.rsplit('.').next().unwrap_or(code);
    match short {
        // InvalidIdFormat (DeleteMessage): "The specified receipt handle isn't valid for the current version."
        "ReceiptHandleIsInvalid"
        | "MessageNotInflight"
        | "InvalidReceiptHandle"
        | "InvalidIdFormat" => BrokerErrorKind::LockLost,
        "QueueDoesNotExist" | "NonExistentQueue" | "QueueDeletedRecently" => {
            BrokerErrorKind::EntityNotFound
        }
        "RequestThrottled"
        | "ThrottlingException"
        | "Throttling"
        | "KmsThrottled"
        | "OverLimit"
        | "ServiceUnavailable" => BrokerErrorKind::Throttled,
        "AccessDenied"
        | "AccessDeniedException"
        | "InvalidSecurity"
        | "InvalidClientTokenId"
        | "SignatureDoesNotMatch"
        | "ExpiredToken"
        | "UnrecognizedClientException"
        | "KmsAccessDenied" => BrokerErrorKind::Unauthorized,
        "KmsDisabled" | "KmsInvalidKeyUsage" | "KmsInvalidState" | "KmsNotFound"
        | "KmsOptInRequired" => BrokerErrorKind::Configuration,
        // The queue URL or the endpoint, not the request: every call to them fails the same way until an
        // operator changes them (AWS, the errors of every SQS action: "InvalidAddress: The specified ID is
        // invalid", "UnsupportedOperation: Error code 400. Unsupported operation.").
        "InvalidAddress" | "UnsupportedOperation" => BrokerErrorKind::Configuration,
        "InternalError" | "InternalFailure" | "ServiceUnavailableException" => {
            BrokerErrorKind::ServerError
        }
        _ => BrokerErrorKind::Rejected,
    }
}

#[cfg(test)]
mod lease_tests {
    use super::*;

    /// The exact answers of SQS as AWS runs it when the message behind a receipt is gone.
    #[test]
    fn a_receipt_for_a_gone_message_is_a_lost_lease() {
        let visibility = "Value AQEBzbVv...== for parameter ReceiptHandle is invalid. Reason: Message does not exist or is not available for visibility timeout change.";
        assert_eq!(
            kind_of(Some("InvalidParameterValue"), Some(visibility)),
            BrokerErrorKind::LockLost
        );
        assert_eq!(
            kind_of(
                Some("AWS.SimpleQueueService.InvalidParameterValue"),
                Some(visibility)
            ),
            BrokerErrorKind::LockLost
        );
        let delete = "Value AQEB...== for parameter ReceiptHandle is invalid. Reason: The receipt handle has expired.";
        assert_eq!(
            kind_of(Some("InvalidParameterValue"), Some(delete)),
            BrokerErrorKind::LockLost
        );
        assert_eq!(
            kind_of(
                Some("ReceiptHandleIsInvalid"),
                Some("The input receipt handle is invalid.")
            ),
            BrokerErrorKind::LockLost
        );
        assert_eq!(
            kind_of(
                Some("AWS.SimpleQueueService.MessageNotInflight"),
                Some("Message not inflight")
            ),
            BrokerErrorKind::LockLost
        );
        // Another invalid parameter stays a rejected request.
        assert_eq!(
            kind_of(
                Some("InvalidParameterValue"),
                Some("Value 50000 for parameter VisibilityTimeout is invalid. Reason: must be between 0 and 43200.")
            ),
            BrokerErrorKind::Rejected
        );
        let entry = BatchEntryError {
            code: "InvalidParameterValue".into(),
            message: visibility.into(),
            sender_fault: true,
        };
        assert_eq!(entry.kind(), BrokerErrorKind::LockLost);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_of_both_protocols_are_classified() {
        let k = |c| kind_of_code(Some(c));
        assert_eq!(
            k("AWS.SimpleQueueService.NonExistentQueue"),
            BrokerErrorKind::EntityNotFound
        );
        assert_eq!(k("QueueDoesNotExist"), BrokerErrorKind::EntityNotFound);
        assert_eq!(k("ReceiptHandleIsInvalid"), BrokerErrorKind::LockLost);
        assert_eq!(
            k("AWS.SimpleQueueService.MessageNotInflight"),
            BrokerErrorKind::LockLost
        );
        assert_eq!(k("RequestThrottled"), BrokerErrorKind::Throttled);
        assert_eq!(k("AccessDenied"), BrokerErrorKind::Unauthorized);
        assert_eq!(k("InvalidParameterValue"), BrokerErrorKind::Rejected);
    }

    /// The codes of an encrypted queue's KMS failures as the SDK reports them (aws-sdk-sqs matches
    /// `KMS.DisabledException` and the like, the query-compatible codes of `x-amzn-query-error`; the JSON
    /// body's shape names when the header is missing). A key that is disabled, missing, in a wrong state or
    /// refused fails every receive until an operator acts: `Configuration`, which the worker counts as a
    /// persistent receive failure, not `Rejected`. Its throttling and access refusal keep their kinds.
    #[test]
    fn kms_failures_of_an_encrypted_queue_are_classified_by_the_codes_the_sdk_reports() {
        let k = |c| kind_of_code(Some(c));
        for c in [
            "KMS.DisabledException",
            "KMS.InvalidKeyUsageException",
            "KMS.InvalidStateException",
            "KMS.NotFoundException",
            "KMS.OptInRequired",
            "KmsDisabled",
            "KmsInvalidKeyUsage",
            "KmsInvalidState",
            "KmsNotFound",
            "KmsOptInRequired",
        ] {
            assert_eq!(k(c), BrokerErrorKind::Configuration, "{c}");
        }
        assert_eq!(k("KMS.ThrottlingException"), BrokerErrorKind::Throttled);
        assert_eq!(k("KmsThrottled"), BrokerErrorKind::Throttled);
        assert_eq!(
            k("KMS.AccessDeniedException"),
            BrokerErrorKind::Unauthorized
        );
        assert_eq!(k("KmsAccessDenied"), BrokerErrorKind::Unauthorized);
        // DeleteMessage's InvalidIdFormat: "The specified receipt handle isn't valid for the current version."
        assert_eq!(k("InvalidIdFormat"), BrokerErrorKind::LockLost);
    }

    /// Two codes of every SQS action's error list that name the request's target, not the request: AWS,
    /// "InvalidAddress: The specified ID is invalid" (the account id of the queue URL; the common errors of the
    /// query API: "The address <address> is not valid for this web service") and "UnsupportedOperation: Error
    /// code 400. Unsupported operation." The same call to the same queue fails the same way until an operator
    /// changes the URL or the endpoint: `Configuration`, which the worker counts as a persistent receive
    /// failure (and gives up on after `give_up_after`), not `Rejected`, which it retries for ever.
    #[test]
    fn a_queue_url_or_endpoint_sqs_cannot_serve_is_a_configuration_error() {
        for c in [
            "InvalidAddress",
            "AWS.SimpleQueueService.InvalidAddress",
            "UnsupportedOperation",
            "AWS.SimpleQueueService.UnsupportedOperation",
        ] {
            let kind = kind_of(Some(c), Some("m"));
            assert_eq!(kind, BrokerErrorKind::Configuration, "{c}");
            assert!(
                txinbox_core::runtime::worker::is_persistent_receive_error(kind),
                "{c}"
            );
        }
    }

    #[test]
    fn batch_entries_and_options_map_to_the_broker_contract() {
        let entry = |code: &str, sender_fault| BatchEntryError {
            code: code.into(),
            message: "m".into(),
            sender_fault,
        };
        assert_eq!(
            entry("ReceiptHandleIsInvalid", true).kind(),
            BrokerErrorKind::LockLost
        );
        assert!(entry("InternalError", false).kind().is_retryable());
        assert!(entry("SomethingNew", false).kind().is_retryable());
        assert!(!entry("SomethingNew", true).kind().is_retryable());
        let bad = SqsError::InvalidOptions { detail: "x".into() }
            .broker(BrokerErrorKind::Configuration, "connect");
        assert_eq!(bad.kind(), BrokerErrorKind::Configuration);
        assert!(bad.source().unwrap().downcast_ref::<SqsError>().is_some());
    }
}

#[cfg(test)]
mod prop_tests {
    use proptest::prelude::*;

    use super::*;

    proptest! {
        #![proptest_config(ProptestConfig { cases: 2000, failure_persistence: None, ..ProptestConfig::default() })]

        /// Any error code and message SQS (or something in between) answers is classified, never a panic; the
        /// AWS JSON protocol's prefixed codes (`AWS.SimpleQueueService.X`) are classified as `X`; an unknown
        /// code is a rejection, never something retried forever.
        #[test]
        fn every_answer_is_classified(code in proptest::option::of(any::<String>()), message in proptest::option::of(any::<String>())) {
            let kind = kind_of(code.as_deref(), message.as_deref());
            if let Some(c) = &code {
                let prefixed = format!("AWS.SimpleQueueService.{c}");
                if !c.contains('.') {
                    prop_assert_eq!(kind_of(Some(&prefixed), message.as_deref()), kind);
                }
            }
            if code.is_none() {
                prop_assert_eq!(kind, BrokerErrorKind::ServerError);
            }
        }
    }
}
