//! The store's error.

use txinbox_core::BoxError;

/// What went wrong talking to DynamoDB, or with what a handler asked of it.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum DynamoError {
    /// A call to DynamoDB failed. `transient` says a retry may succeed (throttling, a transaction conflict,
    /// a 5xx, a timeout, a lost or refused connection); a client that cannot make the request at all (no
    /// credentials, no region, an endpoint that is not a URL) is not transient, and the message says why.
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

/// Error codes DynamoDB documents as retryable (AWS, "Error handling with DynamoDB": "OK to retry? Yes"), the
/// cancellation reasons of the same kinds, and a conflict with a transaction in progress.
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
            // A write on a global table of multi-Region strong consistency that met one of another Region
            // ("being modified by a request in another Region"): retryable in the service's model.
            | "ReplicatedWriteConflictException"
            | "InternalServerError"
            | "InternalFailure"
            | "ServiceUnavailable"
            | "LimitExceededException"
            // An item collection over its 10 GB (a table with a local secondary index): retryable once items
            // of the collection are deleted.
            | "ItemCollectionSizeLimitExceededException"
            // An access key or security token DynamoDB does not know: credentials the SDK refreshes (a
            // rotated key, an expired session) are accepted again.
            | "UnrecognizedClientException"
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
    // DynamoDB refuses a signature with a message that quotes the canonical request it expected, signed
    // headers and all: `x-amz-security-token`, the session token of temporary credentials, among them. Such an
    // answer's text is masked, and the SDK's error, which holds it (its message, the answer's body), is
    // replaced by the masked text.
    let quoted = match &e {
        SdkError::ServiceError(se) => {
            se.err().message().is_some_and(quotes_session_token)
                || (se.raw() as &dyn std::any::Any)
                    .downcast_ref::<aws_sdk_dynamodb::config::http::HttpResponse>()
                    .and_then(|r| r.body().bytes())
                    .is_some_and(|b| quotes_session_token(&String::from_utf8_lossy(b)))
        }
        _ => false,
    };
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
        // As the SDK's own retry classifier (`TransientErrorClassifier`) takes a connector's error: a timeout or
        // an I/O error (connection refused or reset, a name that does not resolve, TLS) is transient, and so
        // is an error the connector marked with a kind. The rest never reached the network: the client cannot
        // make the request (no credentials, no region, an endpoint that is not a URL), which only a change of
        // its configuration mends; its reason is in the message, on the one line of a start that fails.
        SdkError::DispatchFailure(d) if d.is_io() || d.is_timeout() || d.as_other().is_some() => {
            (true, "the request could not be sent".to_owned())
        }
        SdkError::DispatchFailure(_) => (
            false,
            format!(
                "the client cannot make the request (check its endpoint, region and credentials): {}",
                reason(&e)
            ),
        ),
        SdkError::ResponseError(_) => (true, "the answer could not be read".to_owned()),
        _ => (false, format!("the request could not be built: {}", reason(&e))),
    };
    let message = mask_session_token(&message);
    let source: BoxError = if quoted {
        Box::new(Masked(message.clone()))
    } else {
        Box::new(e)
    };
    DynamoError::Call {
        op,
        transient,
        message,
        source,
    }
}

/// The innermost reason of an error that never reached the service, on one line.
fn reason(e: &(dyn std::error::Error + 'static)) -> String {
    let mut last = e;
    while let Some(next) = last.source() {
        last = next;
    }
    last.to_string()
        .split_whitespace()
        .collect::<Vec<_>>()
        .join(" ")
}

const SESSION_TOKEN: &str = "x-amz-security-token";

/// Whether `text` names the session token's header or parameter (any case).
fn quotes_session_token(text: &str) -> bool {
    text.to_ascii_lowercase().contains(SESSION_TOKEN)
}

/// `text` with the value after every `x-amz-security-token:` or `x-amz-security-token=` (any case) masked, up
/// to the end of its line, a quote, a space or a `&`.
pub(crate) fn mask_session_token(text: &str) -> String {
    // ASCII lowercasing keeps every byte where it is, so positions in `lower` are positions in `text`.
    let lower = text.to_ascii_lowercase();
    let mut out = String::with_capacity(text.len());
    let mut at = 0;
    while let Some(found) = lower[at..].find(SESSION_TOKEN) {
        let name_end = at + found + SESSION_TOKEN.len();
        out.push_str(&text[at..name_end]);
        at = name_end;
        let rest = &text[at..];
        if let Some(sep) = rest.chars().next().filter(|c| matches!(c, ':' | '=')) {
            out.push(sep);
            let value = &rest[1..];
            let end = value
                .find(['\n', '\r', '\'', '"', '&', ' ', '\\'])
                .unwrap_or(value.len());
            out.push_str("***");
            at += 1 + end;
        }
    }
    out.push_str(&text[at..]);
    out
}

/// An SDK error whose text quoted the session token, as its masked text.
#[derive(Debug)]
struct Masked(String);

impl std::fmt::Display for Masked {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for Masked {}

#[cfg(test)]
mod tests {
    use super::{mask_session_token, transient_code};

    /// AWS, "Error handling with DynamoDB", its list of exceptions: "If OK to retry? is Yes, you can submit the
    /// same request again. If OK to retry? is No, you need to fix the problem on the client side before you
    /// submit a new request." Every code of the list, as the list says.
    #[test]
    fn error_codes_are_transient_as_aws_lists_them() {
        for code in [
            "ItemCollectionSizeLimitExceededException",
            "LimitExceededException",
            "ProvisionedThroughputExceededException",
            "RequestLimitExceeded",
            "ThrottlingException",
            "UnrecognizedClientException",
            "InternalServerError",
            "ServiceUnavailable",
        ] {
            assert!(transient_code(code), "{code}: OK to retry? Yes");
        }
        for code in [
            "AccessDeniedException",
            "ConditionalCheckFailedException",
            "IncompleteSignatureException",
            "MissingAuthenticationTokenException",
            "ResourceInUseException",
            "ResourceNotFoundException",
            "ValidationException",
        ] {
            assert!(!transient_code(code), "{code}: OK to retry? No");
        }
    }

    /// AWS, `ReplicatedWriteConflictException` (`PutItem`, `UpdateItem`, `DeleteItem` on a global table of
    /// multi-Region strong consistency): "The request was rejected because one or more items in the request
    /// are being modified by a request in another Region." The service model marks it retryable (the SDKs
    /// retry it themselves); once their retries are spent it is still a conflict that a retry resolves, as
    /// a `TransactionConflict` is, never a refusal for good: a handler's own write mapped through
    /// `DynamoError::from_sdk` must not dead-letter its message for it.
    #[test]
    fn a_write_conflict_with_another_region_is_transient() {
        assert!(transient_code("ReplicatedWriteConflictException"));
    }

    #[test]
    fn the_session_token_is_masked_wherever_it_is_quoted() {
        assert_eq!(
            mask_session_token("host:x\nX-Amz-Security-Token:IQo/ab+c=\nx-amz-target:T"),
            "host:x\nX-Amz-Security-Token:***\nx-amz-target:T"
        );
        assert_eq!(
            mask_session_token("a?X-Amz-Security-Token=IQo%2F&b=1 'x-amz-security-token:z'"),
            "a?X-Amz-Security-Token=***&b=1 'x-amz-security-token:***'"
        );
        // The header's name alone (a list of signed headers) is kept; no other text changes.
        assert_eq!(
            mask_session_token("host;x-amz-security-token;x-amz-target é"),
            "host;x-amz-security-token;x-amz-target é"
        );
        assert_eq!(
            mask_session_token("x-amz-security-token:"),
            "x-amz-security-token:***"
        );
    }
}
