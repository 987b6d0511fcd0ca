//! Errors. Each enum is `#[non_exhaustive]`, keeps its source, and says whether a retry can help.

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

/// An error talking to the broker (receive, settle, renew).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum BrokerError {
    /// The lock / receipt is no longer ours (Service Bus 404 on the lock URI, SQS invalid receipt handle, lease
    /// expired). The message will be (or was) redelivered; the inbox absorbs that redelivery.
    #[error("lock or receipt lost: {detail}")]
    LockLost {
        /// What the broker said.
        detail: String,
    },
    /// The queue or entity does not exist (Service Bus 410, SQS `QueueDoesNotExist`).
    #[error("entity not found: {detail}")]
    EntityNotFound {
        /// What the broker said.
        detail: String,
    },
    /// The broker throttles (429, 503, SQS throttling): retry later.
    #[error("throttled by the broker: {detail}")]
    Throttled {
        /// What the broker said.
        detail: String,
        /// The source error, if any.
        #[source]
        source: Option<BoxError>,
    },
    /// Authentication or authorization failed (401/403). A retry will not help.
    #[error("unauthorized: {detail}")]
    Unauthorized {
        /// What the broker said (never the credential).
        detail: String,
    },
    /// The request may or may not have taken effect (timeout, dropped connection).
    #[error("outcome unknown: {source}")]
    Unknown {
        /// The cause.
        #[source]
        source: BoxError,
    },
    /// Any other broker or transport error.
    #[error("broker error: {source}")]
    Other {
        /// The cause.
        #[source]
        source: BoxError,
        /// Whether a retry can help.
        retryable: bool,
    },
}

impl BrokerError {
    /// Whether the same call may succeed if retried.
    pub fn is_retryable(&self) -> bool {
        match self {
            BrokerError::Throttled { .. } | BrokerError::Unknown { .. } => true,
            BrokerError::Other { retryable, .. } => *retryable,
            _ => false,
        }
    }
}
