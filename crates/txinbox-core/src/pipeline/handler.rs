//! The user's handler: it gets the open transaction and the message (typed, parsed once), and never commits.
//!
//! A handler is a plain `async` closure or `async fn`
//!
//! ```text
//! inbox.bind(|tx, msg: Message<Meeting>| async move {
//!     sqlx::query("INSERT INTO tasks (opportunity) VALUES ($1)").bind(&msg.body.opportunity).execute(&tx).await?;
//!     Ok(())
//! })
//! ```
//!
//! or a type implementing [`Handler`]. It returns `Ok(())`, `Ok(Handled::reference(..))` (stored on the marker
//! and handed back to every later duplicate) or an error: any error converts with `?` into a
//! [`HandlerError`], which the store classifies (a transient database error is retried, another database
//! error is permanent); an error from elsewhere is retried, unless it is wrapped in
//! [`HandlerError::permanent`].

use std::fmt;
use std::future::Future;
use std::time::Duration;

use crate::broker::message::ReceivedMessage;
use crate::effects::outbox::OutboxMessage;
use crate::effects::Effect;
use crate::error::{BadInput, BoxError};
use crate::pipeline::identity::Identity;
use crate::store::InboxStore;

/// One delivery as the handler sees it: the typed body, its identity and the raw message.
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct Message<T = Raw> {
    /// The body, parsed once (any serde `Deserialize` type; [`Raw`] parses nothing).
    pub body: T,
    /// The resolved identity.
    pub identity: Identity,
    /// The message as received (attributes, broker metadata, raw body).
    pub raw: ReceivedMessage,
}

impl<T> Message<T> {
    /// The message id (shorthand for `identity.message_id`).
    pub fn id(&self) -> &str {
        &self.identity.message_id
    }
}

/// No parsed body: a handler that takes `Message<Raw>` reads the bytes from `msg.raw.body` (and
/// `msg.raw.body_str()`), and the inbox parses nothing.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Raw;

/// How a body type is made from a delivery. Implemented for [`Raw`] (no parsing) and for every
/// `serde::de::DeserializeOwned` type (parsed from JSON once; a body that does not deserialize is the
/// bad-input outcome `invalid_json`, dead-lettered with the parser's message).
pub trait Payload: Sized + Send + Sync + 'static {
    /// Whether the body must be JSON (the inbox parses it once, fingerprints the parsed value and builds the
    /// body from it).
    const JSON: bool;

    /// Builds the body: from `json` (the parsed document, or its `data` member for a structured CloudEvent)
    /// when [`Payload::JSON`], else from the raw bytes.
    fn from_delivery(
        raw: &ReceivedMessage,
        json: Option<&serde_json::Value>,
    ) -> Result<Self, BadInput>;
}

impl Payload for Raw {
    const JSON: bool = false;
    fn from_delivery(_: &ReceivedMessage, _: Option<&serde_json::Value>) -> Result<Self, BadInput> {
        Ok(Raw)
    }
}

impl<T: serde::de::DeserializeOwned + Send + Sync + 'static> Payload for T {
    const JSON: bool = true;
    fn from_delivery(
        raw: &ReceivedMessage,
        json: Option<&serde_json::Value>,
    ) -> Result<Self, BadInput> {
        match json {
            Some(v) => T::deserialize(v).map_err(BadInput::InvalidJson),
            None => serde_json::from_slice(&raw.body).map_err(BadInput::InvalidJson),
        }
    }
}

/// What a handler returns on success.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Handled {
    /// A reference to the effect (e.g. the created task's id), stored on the inbox row and returned with every
    /// later duplicate of this message.
    pub result_reference: Option<String>,
    /// External effects to run after COMMIT (HTTP calls, messages to publish), written in the same
    /// transaction.
    pub effects: Vec<Effect>,
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
            effects: Vec::new(),
        }
    }
    /// Adds a message to publish after COMMIT (an effect for the message's destination).
    pub fn publish(mut self, m: OutboxMessage) -> Self {
        self.effects.push(m.into_effect());
        self
    }
    /// Adds an external effect to run after COMMIT, with its idempotency key.
    pub fn effect(mut self, e: Effect) -> Self {
        self.effects.push(e);
        self
    }
}

impl From<()> for Handled {
    fn from(_: ()) -> Self {
        Handled::done()
    }
}

/// Whether a retry can help a failed handler.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Retry {
    /// A retry can help: release for redelivery (after the delay, else the inbox's backoff).
    Yes {
        /// Requested delay before the redelivery.
        after: Option<Duration>,
    },
    /// No retry can help: dead-letter with the reason `handler_permanent`.
    No,
    /// Not said: the store classifies errors of its driver; anything else is retried.
    Unclassified,
}

/// What a handler returns on failure. The inbox rolls the transaction back in every case.
///
/// Any `std::error::Error` converts into it with `?` (like `anyhow::Error`, it is not an `Error` itself so
/// that the conversion can exist); say what a retry can do with [`HandlerError::retry`],
/// [`HandlerError::retry_after`] or [`HandlerError::permanent`].
pub struct HandlerError {
    source: BoxError,
    retry: Retry,
}

impl HandlerError {
    /// A retryable error.
    pub fn retry(e: impl Into<BoxError>) -> Self {
        Self {
            source: e.into(),
            retry: Retry::Yes { after: None },
        }
    }

    /// A retryable error with a requested delay.
    pub fn retry_after(e: impl Into<BoxError>, after: Duration) -> Self {
        Self {
            source: e.into(),
            retry: Retry::Yes { after: Some(after) },
        }
    }

    /// A permanent error.
    pub fn permanent(e: impl Into<BoxError>) -> Self {
        Self {
            source: e.into(),
            retry: Retry::No,
        }
    }

    /// An error whose retryability the store decides (what `?` gives).
    pub fn unclassified(e: impl Into<BoxError>) -> Self {
        Self {
            source: e.into(),
            retry: Retry::Unclassified,
        }
    }

    /// What the handler said about a retry.
    pub fn retry_kind(&self) -> Retry {
        self.retry
    }

    /// Whether the handler said a retry can help.
    pub fn is_retryable(&self) -> bool {
        matches!(self.retry, Retry::Yes { .. })
    }

    /// The cause.
    pub fn source(&self) -> &(dyn std::error::Error + Send + Sync + 'static) {
        &*self.source
    }

    /// The cause, owned.
    pub fn into_source(self) -> BoxError {
        self.source
    }
}

impl fmt::Debug for HandlerError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("HandlerError")
            .field("retry", &self.retry)
            .field("source", &self.source)
            .finish()
    }
}

impl fmt::Display for HandlerError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&self.source, f)
    }
}

impl<E: std::error::Error + Send + Sync + 'static> From<E> for HandlerError {
    fn from(e: E) -> Self {
        HandlerError::unclassified(e)
    }
}

/// A handler: applies the business change of one message on the inbox's transaction.
///
/// It gets a clone of the open transaction (`S::Tx`) and never commits (the inbox does, then settles the
/// delivery it never sees). Closures and `async fn`s of the shape
/// `Fn(S::Tx, Message<T>) -> impl Future<Output = Result<R, HandlerError>>` (with `R` = `()` or [`Handled`])
/// are handlers; a type with its own state implements this trait.
pub trait Handler<S: InboxStore, T: Payload>: Send + Sync + 'static {
    /// What the handler returns on success: `()` or [`Handled`].
    type Output: Into<Handled> + Send;

    /// Apply the effect of `msg` on `tx`.
    fn handle(
        &self,
        tx: S::Tx,
        msg: Message<T>,
    ) -> impl Future<Output = Result<Self::Output, HandlerError>> + Send;
}

impl<S, T, F, Fut, R> Handler<S, T> for F
where
    S: InboxStore,
    T: Payload,
    F: Fn(S::Tx, Message<T>) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<R, HandlerError>> + Send,
    R: Into<Handled> + Send,
{
    type Output = R;
    fn handle(
        &self,
        tx: S::Tx,
        msg: Message<T>,
    ) -> impl Future<Output = Result<R, HandlerError>> + Send {
        self(tx, msg)
    }
}
