//! The user's handler: it receives the open transaction and the message, and never commits.

use futures::future::BoxFuture;
use txinbox_core::{HandlerError, Identity, OutboxMessage, ReceivedMessage};

use crate::backend::Backend;

/// What the handler sees of one delivery.
#[derive(Debug)]
pub struct Inbound<'a> {
    /// The message.
    pub message: &'a ReceivedMessage,
    /// Its resolved identity.
    pub identity: &'a Identity,
    /// The body parsed as JSON, when the inbox is configured to require JSON.
    pub json: Option<&'a serde_json::Value>,
}

/// What a handler returns on success.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Handled {
    /// A reference to the effect (e.g. the created task's id), stored in the inbox row.
    pub result_reference: Option<String>,
    /// Messages to publish, written to the outbox in the same transaction.
    pub outbox: Vec<OutboxMessage>,
}

impl Handled {
    /// Success with nothing to record.
    pub fn done() -> Self {
        Self::default()
    }
    /// Success with a result reference.
    pub fn reference(r: impl Into<String>) -> Self {
        Self {
            result_reference: Some(r.into()),
            outbox: Vec::new(),
        }
    }
    /// Adds an outbox message.
    pub fn publish(mut self, m: OutboxMessage) -> Self {
        self.outbox.push(m);
        self
    }
}

/// A handler: applies the business change on the inbox's transaction.
///
/// It must not commit or roll back (it only gets the connection of the open transaction; the inbox commits)
/// and must not settle the delivery (it never sees it). Return [`HandlerError::retry`] when a retry can help,
/// [`HandlerError::permanent`] when it cannot.
pub trait Handler<DB: Backend>: Send + Sync + 'static {
    /// Apply the effect of `msg` on `tx`.
    fn handle<'a>(
        &'a self,
        tx: &'a mut DB::Connection,
        msg: &'a Inbound<'a>,
    ) -> BoxFuture<'a, Result<Handled, HandlerError>>;
}

/// A handler from a closure: `handler_fn(|tx, msg| Box::pin(async move { ... }))`.
pub fn handler_fn<DB, F>(f: F) -> FnHandler<F>
where
    DB: Backend,
    F: for<'a> Fn(
            &'a mut DB::Connection,
            &'a Inbound<'a>,
        ) -> BoxFuture<'a, Result<Handled, HandlerError>>
        + Send
        + Sync
        + 'static,
{
    FnHandler(f)
}

/// See [`handler_fn`].
#[derive(Clone, Debug)]
pub struct FnHandler<F>(F);

impl<DB, F> Handler<DB> for FnHandler<F>
where
    DB: Backend,
    F: for<'a> Fn(
            &'a mut DB::Connection,
            &'a Inbound<'a>,
        ) -> BoxFuture<'a, Result<Handled, HandlerError>>
        + Send
        + Sync
        + 'static,
{
    fn handle<'a>(
        &'a self,
        tx: &'a mut DB::Connection,
        msg: &'a Inbound<'a>,
    ) -> BoxFuture<'a, Result<Handled, HandlerError>> {
        (self.0)(tx, msg)
    }
}

/// Classifies a database error raised inside a handler: transient errors (connection trouble, deadlock,
/// serialization failure, busy SQLite) are retryable, anything else is permanent.
///
/// Use it as `.map_err(txinbox_store::db_error)?` in a handler.
pub fn db_error(e: sqlx::Error) -> HandlerError {
    if crate::error::is_transient(&e) {
        HandlerError::retry(e)
    } else {
        HandlerError::permanent(e)
    }
}
