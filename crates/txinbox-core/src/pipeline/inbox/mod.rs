//! The inbox: what a consumer accepts, the pipeline of one delivery (its [decisions](decide)), and the
//! [`InboxProcessor`] a worker runs.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use futures::FutureExt;

use crate::broker::Delivery;
use crate::metrics as m;
use crate::pipeline::fingerprint::FingerprintSpec;
use crate::pipeline::handler::{Handled, Handler, HandlerError, Message, Payload};
use crate::pipeline::identity::IdentityPolicy;
use crate::pipeline::outcome::Outcome;
use crate::pipeline::retention::RetentionPolicy;
use crate::runtime::worker::Processor;
use crate::store::InboxStore;
use crate::CancellationToken;

mod batch;
mod decide;
mod ending;
#[cfg(test)]
mod tests;

/// What bodies a consumer accepts (beyond what its handler's [`Payload`] type requires).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum BodyFormat {
    /// Any bytes.
    #[default]
    Any,
    /// UTF-8 text.
    Utf8,
    /// A JSON document (a typed handler implies it).
    Json,
}

/// Validation applied before the transaction opens. A violation dead-letters the message with a reason.
#[derive(Clone, Debug)]
#[non_exhaustive]
#[must_use = "InputRules do nothing until given to Inbox::input_rules"]
pub struct InputRules {
    /// Largest body accepted (default 256 KiB, the SQS and Service Bus Standard limit).
    pub max_payload_bytes: usize,
    /// Body format (default any bytes).
    pub body: BodyFormat,
    /// Contract versions accepted; empty accepts any (default).
    pub contract_versions: Vec<String>,
    /// Whether a message without a contract version is refused when `contract_versions` is set (default true).
    pub require_contract_version: bool,
}

impl Default for InputRules {
    fn default() -> Self {
        Self {
            max_payload_bytes: 256 * 1024,
            body: BodyFormat::Any,
            contract_versions: Vec::new(),
            require_contract_version: true,
        }
    }
}

impl InputRules {
    /// Sets the largest body accepted.
    pub fn max_payload_bytes(mut self, n: usize) -> Self {
        self.max_payload_bytes = n;
        self
    }
    /// Sets the body format.
    pub fn body(mut self, f: BodyFormat) -> Self {
        self.body = f;
        self
    }
    /// Accept only these contract versions.
    pub fn contract_versions<I, S>(mut self, v: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        self.contract_versions = v.into_iter().map(Into::into).collect();
        self
    }
    /// Whether a message without a contract version is refused when versions are set (default true).
    pub fn require_contract_version(mut self, require: bool) -> Self {
        self.require_contract_version = require;
        self
    }
}

/// The inbox of one consumer on one store.
///
/// ```no_run
/// # async fn demo<S: txinbox_core::InboxStore>(store: S, queue: txinbox_core::broker::mem::MemoryQueue) -> Result<(), Box<dyn std::error::Error>> {
/// use txinbox_core::{ConsumerName, IdentityPolicy, Inbox, Message, Worker};
///
/// #[derive(serde::Deserialize)]
/// struct Meeting { opportunity: String, meeting: String }
///
/// let inbox = Inbox::new(store, IdentityPolicy::new(ConsumerName::new("crm-followup")?));
/// let processor = inbox
///     .bind(|_tx, msg: Message<Meeting>| async move {
///         // write the follow-up task through `_tx` (for a sqlx store: `.execute(&tx)`)
///         let _ = (&msg.body.opportunity, &msg.body.meeting);
///         Ok(())
///     })
///     .business_key(|m: &Meeting| Some(format!("followup:{}:{}", m.opportunity, m.meeting)));
/// Worker::new(queue.receiver(), processor).run_until(txinbox_core::shutdown_signal()).await;
/// # Ok(()) }
/// ```
#[must_use = "an Inbox does nothing until bound to a handler and run by a Worker"]
pub struct Inbox<S: InboxStore> {
    store: S,
    policy: IdentityPolicy,
    fingerprint: FingerprintSpec,
    retention: RetentionPolicy,
    rules: InputRules,
    retry_backoff: Duration,
    consumer: Arc<str>,
}

impl<S: InboxStore> Clone for Inbox<S> {
    fn clone(&self) -> Self {
        Self {
            store: self.store.clone(),
            policy: self.policy.clone(),
            fingerprint: self.fingerprint.clone(),
            retention: self.retention.clone(),
            rules: self.rules.clone(),
            retry_backoff: self.retry_backoff,
            consumer: self.consumer.clone(),
        }
    }
}

impl<S: InboxStore> std::fmt::Debug for Inbox<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Inbox")
            .field("store", &self.store.name())
            .field("policy", &self.policy)
            .field("retention", &self.retention)
            .field("rules", &self.rules)
            .field("retry_backoff", &self.retry_backoff)
            .finish()
    }
}

/// A business key computed from the typed body.
pub type TypedKeyFn<T> = Arc<dyn Fn(&T) -> Option<String> + Send + Sync>;

impl<S: InboxStore> Inbox<S> {
    /// An inbox on `store` resolving identities with `policy`.
    pub fn new(store: S, policy: IdentityPolicy) -> Self {
        let consumer: Arc<str> = policy.consumer().as_str().into();
        Self {
            store,
            policy,
            fingerprint: FingerprintSpec::default(),
            retention: RetentionPolicy::default(),
            rules: InputRules::default(),
            retry_backoff: Duration::from_secs(5),
            consumer,
        }
    }

    /// Sets the payload fingerprint (volatile fields to exclude).
    pub fn fingerprint(mut self, spec: FingerprintSpec) -> Self {
        self.fingerprint = spec;
        self
    }
    /// Sets the retention policy.
    pub fn retention(mut self, r: RetentionPolicy) -> Self {
        self.retention = r;
        self
    }
    /// Sets the input rules.
    pub fn input_rules(mut self, r: InputRules) -> Self {
        self.rules = r;
        self
    }
    /// Sets the delay before a retryable failure is redelivered (default 5 s). It reaches the broker through
    /// the release of the delivery (SQS visibility, Service Bus abandon then a scheduled redelivery).
    pub fn retry_backoff(mut self, d: Duration) -> Self {
        self.retry_backoff = d;
        self
    }
    /// The store.
    pub fn store(&self) -> &S {
        &self.store
    }
    /// The consumer name.
    pub fn consumer(&self) -> &str {
        &self.consumer
    }
    /// The retention policy.
    pub fn retention_policy(&self) -> &RetentionPolicy {
        &self.retention
    }

    /// Binds a handler (a closure or `async fn` taking the transaction and the typed message), giving the
    /// [`Processor`] a [`crate::Worker`] runs. The body type is the handler's `Message<T>`.
    pub fn bind<T, F, Fut, R>(self, f: F) -> InboxProcessor<S, T, F>
    where
        T: Payload,
        F: Fn(S::Tx, Message<T>) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<R, HandlerError>> + Send,
        R: Into<Handled> + Send,
    {
        self.bind_handler(f)
    }

    /// Binds a [`Handler`] value (a type with its own state).
    pub fn bind_handler<T: Payload, H: Handler<S, T>>(self, handler: H) -> InboxProcessor<S, T, H> {
        InboxProcessor {
            inbox: self,
            handler: Arc::new(handler),
            business_key: None,
        }
    }

    /// Processes one delivery to a known outcome and settles it: ack after COMMIT (applied, duplicate,
    /// business duplicate), release (retry), dead-letter (bad input, collision, permanent error).
    pub async fn process<D, T, H>(&self, delivery: D, handler: &H) -> Outcome
    where
        D: Delivery,
        T: Payload,
        H: Handler<S, T>,
    {
        self.run(delivery, handler, None, &CancellationToken::new())
            .await
    }

    /// Like [`Inbox::process`]; when `stop` is cancelled before COMMIT the transaction rolls back, the delivery
    /// is released and the outcome is [`Outcome::Interrupted`].
    pub async fn process_until<D, T, H>(
        &self,
        delivery: D,
        handler: &H,
        stop: &CancellationToken,
    ) -> Outcome
    where
        D: Delivery,
        T: Payload,
        H: Handler<S, T>,
    {
        self.run(delivery, handler, None, stop).await
    }

    fn label(&self) -> metrics::SharedString {
        metrics::SharedString::from_shared(self.consumer.clone())
    }
}

/// An [`Inbox`] bound to a handler: the [`Processor`] a [`crate::Worker`] runs.
pub struct InboxProcessor<S: InboxStore, T, H> {
    inbox: Inbox<S>,
    handler: Arc<H>,
    business_key: Option<TypedKeyFn<T>>,
}

impl<S: InboxStore, T, H> Clone for InboxProcessor<S, T, H> {
    fn clone(&self) -> Self {
        Self {
            inbox: self.inbox.clone(),
            handler: self.handler.clone(),
            business_key: self.business_key.clone(),
        }
    }
}

impl<S: InboxStore, T: Payload, H: Handler<S, T>> InboxProcessor<S, T, H> {
    /// The inbox.
    pub fn inbox(&self) -> &Inbox<S> {
        &self.inbox
    }

    /// The same handler, identity policy, retention, rules and business key, on another store of the same
    /// kind: one processor per shard ([`crate::runtime::shards`]).
    pub fn on_store(&self, store: S) -> Self {
        let mut inbox = self.inbox.clone();
        inbox.store = store;
        Self {
            inbox,
            handler: self.handler.clone(),
            business_key: self.business_key.clone(),
        }
    }

    /// Computes the business key from the typed body (it replaces a key from the message's attributes or the
    /// identity policy). `None` means the message has none; a panic dead-letters the message as bad input
    /// (`invalid_business_key`). The key must never hold free text from a model,
    /// a timestamp, an attempt number or a consumer-generated id.
    pub fn business_key(
        mut self,
        f: impl Fn(&T) -> Option<String> + Send + Sync + 'static,
    ) -> Self {
        self.business_key = Some(Arc::new(f));
        self
    }

    /// Applies the deliveries of one receive in one transaction (see [`Inbox::process_batch`]).
    pub async fn process_batch<D: Delivery>(
        &self,
        deliveries: Vec<D>,
        stop: &CancellationToken,
    ) -> Vec<Outcome> {
        self.inbox
            .run_batch(deliveries, &*self.handler, self.business_key.as_ref(), stop)
            .await
    }

    /// Processes one delivery (see [`Inbox::process`]).
    pub async fn process_one<D: Delivery>(&self, delivery: D) -> Outcome {
        self.process_one_until(delivery, &CancellationToken::new())
            .await
    }

    /// Processes one delivery, stopping before COMMIT when `stop` is cancelled (see
    /// [`Inbox::process_until`]).
    pub async fn process_one_until<D: Delivery>(
        &self,
        delivery: D,
        stop: &CancellationToken,
    ) -> Outcome {
        self.inbox
            .run(delivery, &*self.handler, self.business_key.as_ref(), stop)
            .await
    }
}

impl<S, T, H, D> Processor<D> for InboxProcessor<S, T, H>
where
    S: InboxStore,
    T: Payload,
    H: Handler<S, T>,
    D: Delivery,
{
    fn consumer(&self) -> &str {
        self.inbox.consumer()
    }

    fn max_payload_bytes(&self) -> Option<usize> {
        Some(self.inbox.rules.max_payload_bytes)
    }

    fn started(&self) {
        let c = self.inbox.label();
        for name in [
            m::RECEIVED,
            m::APPLIED,
            m::APPLIED_AFTER_REDELIVERY,
            m::DUPLICATES,
            m::PAYLOAD_COLLISIONS,
            m::BUSINESS_DUPLICATES,
            m::CONCURRENT_CONFLICTS,
            m::RETENTION_EXPIRED,
            m::UNKNOWN_IDENTITY,
            m::CONTRACT_VERSION_FAILURES,
            m::IDENTITY_BROKER_FALLBACK,
            m::INTERRUPTED,
            m::REDRIVEN,
            m::LEASE_LOST,
            m::LEASE_RENEWALS,
        ] {
            metrics::counter!(name, "consumer" => c.clone()).increment(0);
        }
    }

    fn process(
        &self,
        delivery: D,
        stop: CancellationToken,
    ) -> impl std::future::Future<Output = Outcome> + Send {
        let this = self.clone();
        async move { this.process_one_until(delivery, &stop).await }.boxed()
    }

    fn process_batch(
        &self,
        deliveries: Vec<D>,
        stop: CancellationToken,
    ) -> impl std::future::Future<Output = Vec<Outcome>> + Send {
        let this = self.clone();
        async move {
            this.inbox
                .run_batch(
                    deliveries,
                    &*this.handler,
                    this.business_key.as_ref(),
                    &stop,
                )
                .await
        }
        .boxed()
    }
}
