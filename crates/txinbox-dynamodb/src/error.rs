//! The store's error.

use txinbox_core::BoxError;

/// What went wrong talking to DynamoDB, or with what a handler asked of it.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum DynamoError {
    /// A call to DynamoDB failed. `transient` says a retry may succeed (throttling, a transaction conflict,
    /// a 5xx, a timeout, a lost connection).
    #[error("DynamoDB {op} failed{}: {message}", if *.transient { " (transient)" } else { "" })]
    Call {
        /// The operation (`TransactWriteItems`, `GetItem`, ...).
        op: &'static str,
        /// Whether a retry may succeed.
        transient: bool,
        /// The service's error code and message (never credentials).
        message: String,
        /// The SDK's error.
        #[source]
        source: BoxError,
    },
    /// The transaction cannot be sent as asked: over a limit of `TransactWriteItems` (100 actions, 4 MB in
    /// all, 400 KB per item) or two actions on one item. Nothing was written; retrying cannot help.
    #[error("the transaction cannot be sent: {0}")]
    Limit(String),
    /// A condition of the handler's own actions failed (action `index` of the handler's, on `table`): nothing
    /// was written. A retry re-runs the handler on fresh reads, as for a serialization failure on PostgreSQL.
    #[error("the handler's condition failed on its action {index} (table {table}): {message}")]
    HandlerCondition {
        /// The action's position among the handler's actions, from 0.
        index: usize,
        /// The action's table.
        table: String,
        /// DynamoDB's reason.
        message: String,
    },
    /// DynamoDB refused an action of the handler's as invalid (an expression that does not parse, a key of
    /// the wrong type): nothing was written; retrying cannot help.
    #[error("DynamoDB refused the handler's action {index} (table {table}): {message}")]
    HandlerInvalid {
        /// The action's position among the handler's actions, from 0.
        index: usize,
        /// The action's table.
        table: String,
        /// DynamoDB's reason.
        message: String,
    },
    /// DynamoDB refused the transaction as a whole as invalid (a `ValidationException`, such as two actions
    /// on one item that the check before sending could not see, or a `ValidationError` on one of the
    /// store's own items): nothing was written; the same transaction would be refused again.
    #[error("DynamoDB refused the transaction as invalid: {message}")]
    Refused {
        /// DynamoDB's error code and reason.
        message: String,
        /// The SDK's error, when DynamoDB refused the whole call.
        #[source]
        source: Option<BoxError>,
    },
    /// The transaction was committed or rolled back: a clone of it kept past the handler cannot write.
    #[error("the transaction is over (committed or rolled back): nothing was added to it")]
    Closed,
    /// A result was recorded for a message whose marker this transaction does not hold (the caller skipped
    /// [`InboxStore::insert_marker`](txinbox_core::InboxStore::insert_marker), or the marker was refused).
    #[error("no marker of this message in the transaction: insert the marker before recording its result")]
    NoMarker,
    /// The table is not what the store needs (missing, another key schema, an index missing, TTL off).
    #[error("table {table}: {detail}")]
    Table {
        /// The table.
        table: String,
        /// What does not match, and how to fix it.
        detail: String,
    },
    /// A stored item could not be read back (an attribute missing or of another type).
    #[error("item {pk} cannot be read: {detail}")]
    Corrupt {
        /// The item's key.
        pk: String,
        /// What is wrong.
        detail: String,
    },
    /// An operator query no key of the table answers (the rejections of every consumer): the store never
    /// scans the table, so the query must name what the key needs.
    #[error("{0}: no key of the table answers it, and the store never scans the table")]
    NeedsKey(&'static str),
    /// The store URL is not `dynamodb://TABLE`.
    #[error("store URL {0:?} is not dynamodb://TABLE (a table name of 3 to 255 letters, digits, '_', '-' or '.')")]
    Url(String),
    /// A request could not be built (a bug: the store's own request is incomplete).
    #[error("request could not be built: {0}")]
    Build(#[source] aws_sdk_dynamodb::error::BuildError),
}

impl DynamoError {
    /// An SDK error of operation `op` (`"GetItem"`, `"Query"`, ...) as [`DynamoError::Call`], classified as the
    /// store classifies its own calls (throttling, conflicts, 5xx, timeouts and lost connections are transient).
    /// A handler's own reads through [`DynamoTx::client`](crate::DynamoTx::client) can use it, so that `?` keeps
    /// the classification.
    pub fn from_sdk<E, R>(op: &'static str, e: aws_sdk_dynamodb::error::SdkError<E, R>) -> Self
    where
        E: aws_sdk_dynamodb::error::ProvideErrorMetadata
            + std::error::Error
            + Send
            + Sync
            + 'static,
        R: std::fmt::Debug + Send + Sync + 'static,
    {
        call(op, e)
    }

    /// Whether a retry may succeed.
    pub fn is_transient(&self) -> bool {
        match self {
            DynamoError::Call { transient, .. } => *transient,
            DynamoError::HandlerCondition { .. } => true,
            _ => false,
        }
    }
}

impl From<aws_sdk_dynamodb::error::BuildError> for DynamoError {
    fn from(e: aws_sdk_dynamodb::error::BuildError) -> Self {
        DynamoError::Build(e)
    }
}

/// Error codes DynamoDB documents as retryable.
pub(crate) fn transient_code(code: &str) -> bool {
    matches!(
        code,
        "ProvisionedThroughputExceededException"
            | "ProvisionedThroughputExceeded"
            | "ThrottlingException"
            | "ThrottlingError"
            | "RequestLimitExceeded"
            | "TransactionConflict"
            | "TransactionConflictException"
            | "TransactionInProgressException"
            | "InternalServerError"
            | "InternalFailure"
            | "ServiceUnavailable"
            | "LimitExceededException"
    )
}

/// Turns an SDK error into [`DynamoError::Call`]: its code decides whether it is transient, and an error
/// without an answer (timeout, connection) is transient.
pub(crate) fn call<E, R>(
    op: &'static str,
    e: aws_sdk_dynamodb::error::SdkError<E, R>,
) -> DynamoError
where
    E: aws_sdk_dynamodb::error::ProvideErrorMetadata + std::error::Error + Send + Sync + 'static,
    R: std::fmt::Debug + Send + Sync + 'static,
{
    use aws_sdk_dynamodb::error::SdkError;
    let (transient, message) = match &e {
        SdkError::ServiceError(se) => {
            let err = se.err();
            // AWS, "Error handling with DynamoDB": "An HTTP 5xx status code indicates a problem that must be
            // resolved by AWS. This might be a transient error, in which case you can retry your request until
            // it succeeds." A 5xx is transient whatever its body says, also one that names no DynamoDB error
            // (a gateway's page), whose code is empty.
            let status = (se.raw() as &dyn std::any::Any)
                .downcast_ref::<aws_sdk_dynamodb::config::http::HttpResponse>()
                .map(|r| r.status().as_u16());
            let server = status.is_some_and(|s| (500..600).contains(&s));
            let code = match (err.code(), status) {
                (Some(code), _) => code.to_owned(),
                (None, Some(s)) => format!("HTTP {s}"),
                (None, None) => "no error code".to_owned(),
            };
            (
                server || transient_code(&code),
                format!("{code}: {}", err.message().unwrap_or("no message")),
            )
        }
        SdkError::TimeoutError(_) => (true, "timed out".to_owned()),
        SdkError::DispatchFailure(_) => (true, "the request could not be sent".to_owned()),
        SdkError::ResponseError(_) => (true, "the answer could not be read".to_owned()),
        _ => (false, "the request could not be built".to_owned()),
    };
    DynamoError::Call {
        op,
        transient,
        message,
        source: Box::new(e),
    }
}
