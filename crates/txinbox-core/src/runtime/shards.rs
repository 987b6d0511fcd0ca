//! Shards: one worker, several stores. Each delivery is applied in the store that holds its tenant's business
//! data, so the marker still commits in the same transaction as the business change: the inbox scales by
//! sharding **with** the business data, never by a transaction across databases.
//!
//! ```text
//! receive ─► route (ShardRouter: the tenant, or your function of the message)
//!              ├─ a shard claims the key ......... that shard's processor: BEGIN, marker, handler, COMMIT, settle
//!              ├─ that shard is unavailable ...... released with ShardOptions::unavailable_backoff, the others flow
//!              └─ no shard claims it ............. dead-lettered, reason `no_shard` (nothing was written)
//! ```
//!
//! Each [`Shard`] is a name, a [`Processor`] (an [`InboxProcessor`](crate::InboxProcessor) on that shard's
//! store: [`InboxProcessor::on_store`](crate::InboxProcessor::on_store) binds the same handler to another
//! store), the tenants it claims, and a [`HealthCheck`] (the stores implement it). A tenant claimed twice, or two
//! shards taking the rest, is refused when the [`Shards`] are built, with one line; a message whose tenant no
//! shard claims can only be known from the message, so it is dead-lettered with a reason that names the tenant.
//!
//! **A shard that is down delays only its own messages.** The shards' checks are probed every
//! [`ShardOptions::probe_interval`] while the worker runs (and at once after a delivery of a shard ended in a
//! retry); while a shard's last probe failed, its deliveries are released without touching its store, so they
//! neither wait for a connection nor hold a worker slot, and the other shards' deliveries keep every slot.
//! Readiness names the shard ([`Shards::health`]), the gauge `txinbox_shard_up` says which is down, and
//! `txinbox_shard_unavailable_total` counts the deliveries it released.
//!
//! A batch ([`WorkerOptions::batch_commit`](crate::WorkerOptions::batch_commit)) is split by shard: each shard's
//! deliveries are applied as one batch in that shard's transaction, the shards' batches concurrently.
//!
//! The effects runner and the maintenance run per shard: give the [`Monitor`](crate::Monitor) one of each per
//! store ([`Monitor::effects`](crate::Monitor::effects) and [`Monitor::maintenance`](crate::Monitor::maintenance)
//! add beside the ones already there).

use std::collections::HashMap;
use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::future::join_all;
use futures::FutureExt;

use crate::broker::{DeadLetter, Delivery};
use crate::metrics as m;
use crate::pipeline::identity::ce;
use crate::pipeline::outcome::Outcome;
use crate::runtime::health::{Health, HealthCheck};
use crate::runtime::worker::Processor;
use crate::{CancellationToken, ReceivedMessage};

/// The dead-letter reason of a delivery no shard takes.
pub const NO_SHARD: &str = "no_shard";

type KeyFn = dyn Fn(&ReceivedMessage) -> Option<String> + Send + Sync;

/// How a delivery names its shard: a key read from the message (the tenant by default), which a [`Shard`]
/// claims. The key is read before any transaction opens, from the message alone, so every copy of a message
/// goes to the same shard.
#[derive(Clone)]
#[must_use = "a ShardRouter does nothing until given to Shards::new"]
pub struct ShardRouter {
    key: Arc<KeyFn>,
    what: Arc<str>,
}

impl std::fmt::Debug for ShardRouter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ShardRouter")
            .field("key", &self.what)
            .finish()
    }
}

impl ShardRouter {
    /// Routes by tenant: the CloudEvents `tenantid` extension, from the `ce-tenantid` attribute (binary mode)
    /// or the `tenantid` member of a structured CloudEvent body (JSON with `specversion`), as the inbox reads
    /// the tenant of a message's identity.
    pub fn tenant() -> Self {
        Self {
            key: Arc::new(tenant_of),
            what: "tenant (ce-tenantid)".into(),
        }
    }

    /// Routes by your function of the message (`None`: the message has no key; it goes to the shard that
    /// takes the rest, or is dead-lettered). `what` names the key in logs and dead-letter details.
    pub fn by(
        what: impl Into<String>,
        f: impl Fn(&ReceivedMessage) -> Option<String> + Send + Sync + 'static,
    ) -> Self {
        Self {
            key: Arc::new(f),
            what: what.into().into(),
        }
    }

    /// The key of `msg`.
    pub fn key(&self, msg: &ReceivedMessage) -> Option<String> {
        (self.key)(msg)
    }
}

impl Default for ShardRouter {
    fn default() -> Self {
        Self::tenant()
    }
}

/// The tenant of a message: the `ce-tenantid` attribute, else a structured CloudEvent's `tenantid`.
fn tenant_of(msg: &ReceivedMessage) -> Option<String> {
    if let Some(t) = msg.attribute(ce::TENANT_ID) {
        return Some(t.to_owned());
    }
    #[derive(serde::Deserialize)]
    struct Structured {
        specversion: Option<serde::de::IgnoredAny>,
        tenantid: Option<String>,
    }
    // Only a JSON object can be a structured CloudEvent; anything else has no tenant.
    if msg
        .body
        .iter()
        .find(|b| !b.is_ascii_whitespace())
        .is_none_or(|b| *b != b'{')
    {
        return None;
    }
    let s: Structured = serde_json::from_slice(&msg.body).ok()?;
    s.specversion.and(s.tenantid)
}

/// One shard: a name, the processor that applies its deliveries (an inbox on its store), the keys it claims.
#[must_use = "a Shard does nothing until given to Shards::new"]
pub struct Shard<P> {
    name: String,
    processor: P,
    claims: Vec<String>,
    rest: bool,
    check: Option<Arc<dyn HealthCheck>>,
}

impl<P> std::fmt::Debug for Shard<P> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Shard")
            .field("name", &self.name)
            .field("claims", &self.claims)
            .field("rest", &self.rest)
            .field("check", &self.check.is_some())
            .finish()
    }
}

impl<P> Shard<P> {
    /// A shard named `name` (letters, digits, `-`, `_`, `.`: it is a metric label) applying its deliveries
    /// with `processor`.
    pub fn new(name: impl Into<String>, processor: P) -> Self {
        Self {
            name: name.into(),
            processor,
            claims: Vec::new(),
            rest: false,
            check: None,
        }
    }

    /// The keys (tenants) this shard holds.
    pub fn claims<I, K>(mut self, keys: I) -> Self
    where
        I: IntoIterator<Item = K>,
        K: Into<String>,
    {
        self.claims.extend(keys.into_iter().map(Into::into));
        self
    }

    /// This shard also takes every key no shard claims, and the messages without a key (at most one shard).
    pub fn rest(mut self) -> Self {
        self.rest = true;
        self
    }

    /// Whether the shard's store is reachable (the stores implement [`HealthCheck`]): probed while the worker
    /// runs, shown in readiness. A shard without a check is always taken as up.
    pub fn check(mut self, check: impl HealthCheck) -> Self {
        self.check = Some(Arc::new(check));
        self
    }

    /// The shard's name.
    pub fn name(&self) -> &str {
        &self.name
    }
}

/// Why a set of shards was refused.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[non_exhaustive]
pub enum ShardConfigError {
    /// No shard at all.
    #[error("no shard is configured")]
    NoShards,
    /// A shard's name is empty or has a character a metric label cannot carry.
    #[error("shard name {0:?} is not valid: use letters, digits, '-', '_' and '.'")]
    InvalidName(String),
    /// Two shards have one name.
    #[error("two shards are named {0:?}")]
    DuplicateName(String),
    /// A key is claimed by two shards: its messages would have two inboxes.
    #[error("tenant {key:?} is claimed by shard {first:?} and by shard {second:?}")]
    ClaimedTwice {
        /// The key.
        key: String,
        /// The first shard claiming it.
        first: String,
        /// The second.
        second: String,
    },
    /// Two shards take the rest.
    #[error("shards {first:?} and {second:?} both take the unclaimed tenants; at most one may")]
    TwoRests {
        /// The first.
        first: String,
        /// The second.
        second: String,
    },
    /// A shard claims nothing and does not take the rest: it would never receive a delivery.
    #[error("shard {0:?} claims no tenant and does not take the rest")]
    ClaimsNothing(String),
}

/// How the shards are watched.
#[derive(Clone, Debug)]
#[non_exhaustive]
#[must_use = "ShardOptions do nothing until given to Shards::options"]
pub struct ShardOptions {
    /// How often each shard's check is probed while the worker runs (default 2 s; at least 100 ms).
    pub probe_interval: Duration,
    /// How long one probe may take before the shard counts as down (default 2 s).
    pub probe_timeout: Duration,
    /// The delay with which a delivery of an unavailable shard is released the first time (default 5 s); it
    /// doubles with each delivery of the same message, up to [`unavailable_backoff_max`](Self::unavailable_backoff_max),
    /// so that an outage spends the queue's receive count (SQS `maxReceiveCount`, Service Bus
    /// `MaxDeliveryCount`) slowly: with 5 s, 5 min and a count of 10 a message rides out about 20 minutes of
    /// outage before the broker dead-letters it.
    pub unavailable_backoff: Duration,
    /// The longest such delay (default 5 min).
    pub unavailable_backoff_max: Duration,
    /// Whether every shard is required (default false): readiness then fails while any shard is unavailable,
    /// and a worker built from settings refuses to start without all of them. When false, readiness reports an
    /// unavailable shard as `degraded shard NAME: why` and fails only while every shard is unavailable.
    pub require_all: bool,
}

impl Default for ShardOptions {
    fn default() -> Self {
        Self {
            probe_interval: Duration::from_secs(2),
            probe_timeout: Duration::from_secs(2),
            unavailable_backoff: Duration::from_secs(5),
            unavailable_backoff_max: Duration::from_secs(300),
            require_all: false,
        }
    }
}

impl ShardOptions {
    /// The defaults.
    pub fn new() -> Self {
        Self::default()
    }
    /// Sets how often the checks are probed (at least 100 ms).
    pub fn probe_interval(mut self, d: Duration) -> Self {
        self.probe_interval = d.max(Duration::from_millis(100));
        self
    }
    /// Sets how long a probe may take (at least 10 ms).
    pub fn probe_timeout(mut self, d: Duration) -> Self {
        self.probe_timeout = d.max(Duration::from_millis(10));
        self
    }
    /// Sets the release delay of an unavailable shard's deliveries.
    pub fn unavailable_backoff(mut self, d: Duration) -> Self {
        self.unavailable_backoff = d;
        self
    }
    /// Sets the longest release delay of an unavailable shard's deliveries.
    pub fn unavailable_backoff_max(mut self, d: Duration) -> Self {
        self.unavailable_backoff_max = d;
        self
    }

    /// The release delay of the `delivery_count`-th delivery (1 = first) of an unavailable shard's message.
    pub fn unavailable_delay(&self, delivery_count: u32) -> Duration {
        let doublings = delivery_count.saturating_sub(1).min(20);
        self.unavailable_backoff
            .saturating_mul(1u32 << doublings)
            .min(self.unavailable_backoff_max.max(self.unavailable_backoff))
    }

    /// Sets whether every shard is required.
    pub fn require_all(mut self, all: bool) -> Self {
        self.require_all = all;
        self
    }
}

/// A shard's state as the last probe left it.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct ShardStatus {
    /// The shard's name.
    pub name: String,
    /// `None` while it is up (or has no check); the probe's error while it is down.
    pub down: Option<String>,
}

/// What the probe loop needs, apart from the processors (so that it never keeps them alive).
struct Watch {
    name: Arc<str>,
    check: Option<Arc<dyn HealthCheck>>,
    down: Mutex<Option<String>>,
    probing: AtomicBool,
}

struct Inner<P> {
    processors: Vec<P>,
    watch: Arc<[Watch]>,
    by_key: HashMap<String, usize>,
    rest: Option<usize>,
    router: ShardRouter,
    opts: Mutex<ShardOptions>,
    started: AtomicBool,
    /// The consumer label, known once the worker started the processor.
    consumer: std::sync::OnceLock<String>,
    stop: CancellationToken,
}

impl<P> Drop for Inner<P> {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

/// Several shards behind one [`Processor`]: see the [module docs](self).
///
/// ```no_run
/// # async fn demo<S: txinbox_core::InboxStore + txinbox_core::runtime::health::HealthCheck + Clone>(
/// #     eu: S, us: S, queue: txinbox_core::broker::mem::MemoryQueue,
/// # ) -> Result<(), Box<dyn std::error::Error>> {
/// use txinbox_core::runtime::shards::{Shard, ShardRouter, Shards};
/// use txinbox_core::{ConsumerName, IdentityPolicy, Inbox, Message, Worker};
///
/// let base = Inbox::new(eu.clone(), IdentityPolicy::new(ConsumerName::new("crm-followup")?))
///     .bind(|_tx, _msg: Message<serde_json::Value>| async move { Ok(()) });
/// let shards = Shards::new(
///     ShardRouter::tenant(),
///     [
///         Shard::new("eu-1", base.on_store(eu.clone())).claims(["acme", "globex"]).check(eu),
///         Shard::new("us-1", base.on_store(us.clone())).claims(["initech"]).rest().check(us),
///     ],
/// )?;
/// Worker::new(queue.receiver(), shards).run_until(txinbox_core::shutdown_signal()).await;
/// # Ok(()) }
/// ```
pub struct Shards<P> {
    inner: Arc<Inner<P>>,
}

impl<P> Clone for Shards<P> {
    fn clone(&self) -> Self {
        Self {
            inner: self.inner.clone(),
        }
    }
}

impl<P> std::fmt::Debug for Shards<P> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Shards")
            .field("shards", &self.names())
            .field("router", &self.inner.router)
            .field("options", &self.opts())
            .finish()
    }
}

/// Where one delivery goes.
enum Route {
    Shard(usize),
    Down(usize, String),
    Nowhere(String),
}

/// Which shard holds each key, and which takes the rest.
struct Claims {
    by_key: HashMap<String, usize>,
    rest: Option<usize>,
}

/// Checks a set of shards given as (name, keys claimed, takes the rest), in order: every name valid and unique,
/// every key claimed once, at most one shard taking the rest, no shard that would never receive a delivery, at
/// least one shard. What [`Shards::new`] and the settings file's `[store.shards]` both check.
pub fn check_shards<'a, K: AsRef<str> + 'a>(
    shards: impl IntoIterator<Item = (&'a str, &'a [K], bool)>,
) -> Result<(), ShardConfigError> {
    check_claims(shards).map(|_| ())
}

fn check_claims<'a, K: AsRef<str> + 'a>(
    shards: impl IntoIterator<Item = (&'a str, &'a [K], bool)>,
) -> Result<Claims, ShardConfigError> {
    let mut names: Vec<&str> = Vec::new();
    let mut by_key: HashMap<String, usize> = HashMap::new();
    let mut rest: Option<usize> = None;
    for (i, (name, claims, takes_rest)) in shards.into_iter().enumerate() {
        if !valid_name(name) {
            return Err(ShardConfigError::InvalidName(name.to_owned()));
        }
        if names.contains(&name) {
            return Err(ShardConfigError::DuplicateName(name.to_owned()));
        }
        if claims.is_empty() && !takes_rest {
            return Err(ShardConfigError::ClaimsNothing(name.to_owned()));
        }
        for key in claims {
            let key = key.as_ref();
            if let Some(&first) = by_key.get(key) {
                return Err(ShardConfigError::ClaimedTwice {
                    key: key.to_owned(),
                    first: names[first].to_owned(),
                    second: name.to_owned(),
                });
            }
            by_key.insert(key.to_owned(), i);
        }
        if takes_rest {
            if let Some(first) = rest {
                return Err(ShardConfigError::TwoRests {
                    first: names[first].to_owned(),
                    second: name.to_owned(),
                });
            }
            rest = Some(i);
        }
        names.push(name);
    }
    if names.is_empty() {
        return Err(ShardConfigError::NoShards);
    }
    Ok(Claims { by_key, rest })
}

fn valid_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 64
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
}

impl<P> Shards<P> {
    /// The shards, checked: every name valid and unique, every key claimed once, at most one shard taking the
    /// rest, no shard that would never receive a delivery.
    pub fn new(
        router: ShardRouter,
        shards: impl IntoIterator<Item = Shard<P>>,
    ) -> Result<Self, ShardConfigError> {
        let shards: Vec<Shard<P>> = shards.into_iter().collect();
        let claims = check_claims(
            shards
                .iter()
                .map(|s| (s.name.as_str(), s.claims.as_slice(), s.rest)),
        )?;
        let mut processors = Vec::with_capacity(shards.len());
        let mut watch = Vec::with_capacity(shards.len());
        for s in shards {
            watch.push(Watch {
                name: s.name.into(),
                check: s.check,
                down: Mutex::new(None),
                probing: AtomicBool::new(false),
            });
            processors.push(s.processor);
        }
        let Claims { by_key, rest } = claims;
        Ok(Self {
            inner: Arc::new(Inner {
                processors,
                watch: watch.into(),
                by_key,
                rest,
                router,
                opts: Mutex::new(ShardOptions::default()),
                started: AtomicBool::new(false),
                consumer: std::sync::OnceLock::new(),
                stop: CancellationToken::new(),
            }),
        })
    }

    /// Sets how the shards are watched (for every clone). Set it before the worker starts and before
    /// [`Shards::health`]: the probe loop reads its cadence when it starts, readiness `require_all` when the
    /// checks are added.
    pub fn options(self, opts: ShardOptions) -> Self {
        *lock(&self.inner.opts) = opts;
        self
    }

    fn opts(&self) -> ShardOptions {
        lock(&self.inner.opts).clone()
    }

    /// The shards' names, in the order given.
    pub fn names(&self) -> Vec<&str> {
        self.inner.watch.iter().map(|w| &*w.name).collect()
    }

    /// The processor of the shard named `name`.
    pub fn processor(&self, name: &str) -> Option<&P> {
        let i = self.inner.watch.iter().position(|w| &*w.name == name)?;
        self.inner.processors.get(i)
    }

    /// The shard `msg` goes to: its name, or why no shard takes it (the dead-letter detail).
    pub fn shard_of(&self, msg: &ReceivedMessage) -> Result<&str, String> {
        self.index_of(msg).map(|i| &*self.inner.watch[i].name)
    }

    fn index_of(&self, msg: &ReceivedMessage) -> Result<usize, String> {
        let inner = &self.inner;
        match inner.router.key(msg) {
            Some(key) => match inner.by_key.get(&key).copied().or(inner.rest) {
                Some(i) => Ok(i),
                None => Err(format!(
                    "{} {key:?} is claimed by no shard and no shard takes the rest",
                    inner.router.what
                )),
            },
            None => inner.rest.ok_or_else(|| {
                format!(
                    "the message has no {} and no shard takes the rest",
                    inner.router.what
                )
            }),
        }
    }

    fn route(&self, msg: &ReceivedMessage) -> Route {
        match self.index_of(msg) {
            Err(why) => Route::Nowhere(why),
            Ok(i) => match lock(&self.inner.watch[i].down).clone() {
                Some(why) => Route::Down(i, why),
                None => Route::Shard(i),
            },
        }
    }

    /// Each shard's state as the last probe left it.
    pub fn status(&self) -> Vec<ShardStatus> {
        self.inner
            .watch
            .iter()
            .map(|w| ShardStatus {
                name: w.name.to_string(),
                down: lock(&w.down).clone(),
            })
            .collect()
    }

    /// Probes every shard once now (each within [`ShardOptions::probe_timeout`]) and returns the ones that
    /// failed, with why. A worker calls it at start: it starts for the reachable shards (the others' deliveries
    /// are released until they answer), or refuses to start when every shard is required.
    pub async fn probe(&self) -> Vec<ShardStatus> {
        probe_all(
            &self.inner.watch,
            self.opts().probe_timeout,
            self.inner.consumer.get().map(String::as_str),
        )
        .await;
        self.status()
            .into_iter()
            .filter(|s| s.down.is_some())
            .collect()
    }

    /// Adds the shards to `health`'s readiness, one check per shard named `shard <name>` (a `SELECT 1` on its
    /// store, run at each probe of readiness). By default an unavailable shard shows as `degraded shard NAME:
    /// why` and readiness stays true while another shard answers (the worker goes on for the others); with
    /// [`ShardOptions::require_all`] each shard is a required check.
    pub fn health(&self, mut health: Health) -> Health {
        let checked: Vec<usize> = (0..self.inner.watch.len())
            .filter(|&i| self.inner.watch[i].check.is_some())
            .collect();
        for &i in &checked {
            let watch = self.inner.watch.clone();
            let name = format!("shard {}", watch[i].name);
            let check = move || {
                let watch = watch.clone();
                async move {
                    match &watch[i].check {
                        Some(c) => c.check().await,
                        None => Ok(()),
                    }
                }
            };
            health = if self.opts().require_all {
                health.check(name, check)
            } else {
                health.check_degraded(name, check)
            };
        }
        if !self.opts().require_all && !checked.is_empty() {
            let watch = self.inner.watch.clone();
            let timeout = self.opts().probe_timeout;
            let checked: Arc<[usize]> = checked.into();
            health = health.check("shards", move || {
                let (watch, checked) = (watch.clone(), checked.clone());
                async move {
                    let answers = join_all(checked.iter().map(|&i| {
                        let w = &watch[i];
                        async move {
                            match &w.check {
                                Some(c) => matches!(
                                    tokio::time::timeout(timeout, c.check()).await,
                                    Ok(Ok(()))
                                ),
                                None => true,
                            }
                        }
                    }))
                    .await;
                    if answers.iter().any(|up| *up) || watch.iter().any(|w| w.check.is_none()) {
                        Ok(())
                    } else {
                        Err("every shard is unavailable".into())
                    }
                }
            });
        }
        health
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Probes one shard and records the result (logging and counting a change).
async fn probe_one(w: &Watch, timeout: Duration, consumer: Option<&str>) {
    let Some(check) = &w.check else { return };
    let result = match tokio::time::timeout(timeout, check.check()).await {
        Ok(r) => r,
        Err(_) => Err(format!("no answer within {} ms", timeout.as_millis())),
    };
    let mut down = lock(&w.down);
    match (&*down, result) {
        (None, Err(why)) => {
            tracing::warn!(shard = %w.name, error = %why, "shard unavailable: its deliveries are released until it answers");
            *down = Some(why);
        }
        (Some(_), Err(why)) => *down = Some(why),
        (Some(_), Ok(())) => {
            tracing::info!(shard = %w.name, "shard available again");
            *down = None;
        }
        (None, Ok(())) => {}
    }
    // Before the worker started the processor its consumer label is not known: no gauge yet.
    if let Some(consumer) = consumer {
        let up = if down.is_none() { 1.0 } else { 0.0 };
        metrics::gauge!(m::SHARD_UP, "consumer" => consumer.to_owned(), "shard" => w.name.to_string())
            .set(up);
    }
}

async fn probe_all(watch: &[Watch], timeout: Duration, consumer: Option<&str>) {
    join_all(watch.iter().map(|w| probe_one(w, timeout, consumer))).await;
}

impl<P> Shards<P> {
    /// Starts the probe loop (once), if a tokio runtime is there to run it.
    fn start_probes(&self, consumer: &str) {
        if self.inner.started.swap(true, Ordering::SeqCst) {
            return;
        }
        let Ok(rt) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let watch = self.inner.watch.clone();
        let stop = self.inner.stop.clone();
        let opts = self.opts();
        let (every, timeout) = (opts.probe_interval, opts.probe_timeout);
        let consumer = consumer.to_owned();
        rt.spawn(async move {
            loop {
                probe_all(&watch, timeout, Some(&consumer)).await;
                tokio::select! {
                    () = stop.cancelled() => return,
                    () = tokio::time::sleep(every) => {}
                }
            }
        });
    }

    /// A delivery of shard `i` ended in a retry: probe that shard now (once at a time), so that a store that
    /// went away is seen before the next tick.
    fn probe_soon(&self, i: usize, consumer: &str) {
        let w = &self.inner.watch[i];
        if w.check.is_none() || w.probing.swap(true, Ordering::SeqCst) {
            return;
        }
        let Ok(rt) = tokio::runtime::Handle::try_current() else {
            w.probing.store(false, Ordering::SeqCst);
            return;
        };
        let watch = self.inner.watch.clone();
        let timeout = self.opts().probe_timeout;
        let consumer = consumer.to_owned();
        rt.spawn(async move {
            probe_one(&watch[i], timeout, Some(&consumer)).await;
            watch[i].probing.store(false, Ordering::SeqCst);
        });
    }
}

impl<P, D> Processor<D> for Shards<P>
where
    P: Processor<D>,
    D: Delivery,
{
    fn consumer(&self) -> &str {
        self.inner.processors[0].consumer()
    }

    fn started(&self) {
        let consumer = self.inner.processors[0].consumer().to_owned();
        let _ = self.inner.consumer.set(consumer.clone());
        for p in &self.inner.processors {
            p.started();
        }
        for w in self.inner.watch.iter() {
            let labels = [
                ("consumer", consumer.clone()),
                ("shard", w.name.to_string()),
            ];
            metrics::counter!(m::SHARD_UNAVAILABLE, &labels).increment(0);
            metrics::gauge!(m::SHARD_UP, &labels).set(if lock(&w.down).is_none() {
                1.0
            } else {
                0.0
            });
        }
        metrics::counter!(m::DEAD_LETTERS, "consumer" => consumer.clone(), "reason" => NO_SHARD)
            .increment(0);
        self.start_probes(&consumer);
    }

    fn process(
        &self,
        delivery: D,
        stop: CancellationToken,
    ) -> impl Future<Output = Outcome> + Send {
        let this = self.clone();
        async move {
            match this.route(delivery.message()) {
                Route::Shard(i) => {
                    let outcome = this.inner.processors[i].process(delivery, stop).await;
                    if matches!(outcome, Outcome::Retry { .. }) {
                        this.probe_soon(i, this.inner.processors[0].consumer());
                    }
                    outcome
                }
                Route::Down(i, why) => this.unavailable(delivery, i, &why).await,
                Route::Nowhere(why) => this.nowhere(delivery, why).await,
            }
        }
        .boxed()
    }

    fn process_batch(
        &self,
        deliveries: Vec<D>,
        stop: CancellationToken,
    ) -> impl Future<Output = Vec<Outcome>> + Send {
        let this = self.clone();
        async move {
            let n = deliveries.len();
            let mut groups: Vec<(Vec<usize>, Vec<D>)> = (0..this.inner.processors.len())
                .map(|_| Default::default())
                .collect();
            let mut elsewhere = Vec::new();
            for (at, d) in deliveries.into_iter().enumerate() {
                match this.route(d.message()) {
                    Route::Shard(i) => {
                        groups[i].0.push(at);
                        groups[i].1.push(d);
                    }
                    other => elsewhere.push((at, d, other)),
                }
            }
            let mut out: Vec<Option<Outcome>> = (0..n).map(|_| None).collect();
            let batches = groups
                .into_iter()
                .enumerate()
                .filter(|(_, g)| !g.1.is_empty())
                .map(|(i, (at, ds))| {
                    let this = this.clone();
                    let stop = stop.clone();
                    async move {
                        let outcomes = this.inner.processors[i].process_batch(ds, stop).await;
                        if outcomes.iter().any(|o| matches!(o, Outcome::Retry { .. })) {
                            this.probe_soon(i, this.inner.processors[0].consumer());
                        }
                        (at, outcomes)
                    }
                });
            let others = elsewhere.into_iter().map(|(at, d, route)| {
                let this = this.clone();
                async move {
                    let o = match route {
                        Route::Down(i, why) => this.unavailable(d, i, &why).await,
                        Route::Nowhere(why) => this.nowhere(d, why).await,
                        Route::Shard(_) => unreachable_route(),
                    };
                    (at, o)
                }
            });
            let (batches, others) = futures::join!(join_all(batches), join_all(others));
            for (at, outcomes) in batches {
                for (a, o) in at.into_iter().zip(outcomes) {
                    out[a] = Some(o);
                }
            }
            for (a, o) in others {
                out[a] = Some(o);
            }
            out.into_iter()
                .map(|o| {
                    o.unwrap_or_else(|| Outcome::Retry {
                        reason: "a shard answered fewer outcomes than it was given deliveries"
                            .into(),
                    })
                })
                .collect()
        }
        .boxed()
    }
}

/// Deliveries routed to a shard are batched, never decided here.
fn unreachable_route() -> Outcome {
    Outcome::Retry {
        reason: "internal: a routed delivery was decided outside its shard".into(),
    }
}

impl<P> Shards<P> {
    fn consumer_of<D: Delivery>(&self) -> String
    where
        P: Processor<D>,
    {
        self.inner.processors[0].consumer().to_owned()
    }

    async fn unavailable<D: Delivery>(&self, delivery: D, i: usize, why: &str) -> Outcome
    where
        P: Processor<D>,
    {
        let consumer = self.consumer_of::<D>();
        let shard = self.inner.watch[i].name.to_string();
        metrics::counter!(m::SHARD_UNAVAILABLE, "consumer" => consumer.clone(), "shard" => shard.clone())
            .increment(1);
        metrics::counter!(m::RETRIES, "consumer" => consumer.clone(), "reason" => "shard_unavailable")
            .increment(1);
        let delay = self
            .opts()
            .unavailable_delay(delivery.message().delivery_count);
        if let Err(e) = delivery.release(delay).await {
            metrics::counter!(m::SETTLE_FAILURES, "consumer" => consumer, "op" => "release")
                .increment(1);
            tracing::warn!(op = "release", error = %e, "settle failed; the broker will redeliver");
        }
        Outcome::Retry {
            reason: format!("shard {shard} is unavailable: {why}"),
        }
    }

    async fn nowhere<D: Delivery>(&self, delivery: D, why: String) -> Outcome
    where
        P: Processor<D>,
    {
        let consumer = self.consumer_of::<D>();
        tracing::warn!(reason = NO_SHARD, detail = %why, "no shard takes this delivery: dead-lettering");
        metrics::counter!(m::DEAD_LETTERS, "consumer" => consumer.clone(), "reason" => NO_SHARD)
            .increment(1);
        if let Err(e) = delivery
            .dead_letter(DeadLetter::new(NO_SHARD, why.clone()))
            .await
        {
            metrics::counter!(m::SETTLE_FAILURES, "consumer" => consumer, "op" => "dead_letter")
                .increment(1);
            tracing::warn!(op = "dead_letter", error = %e, "settle failed; the broker will redeliver");
        }
        Outcome::DeadLettered {
            reason: NO_SHARD.into(),
            detail: why,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn msg(body: &str, tenant: Option<&str>) -> ReceivedMessage {
        let mut m = ReceivedMessage::new(body.as_bytes().to_vec());
        if let Some(t) = tenant {
            m.attributes.insert(ce::TENANT_ID.into(), t.into());
        }
        m
    }

    #[test]
    fn the_tenant_comes_from_the_attribute_or_a_structured_cloudevent() {
        let r = ShardRouter::tenant();
        assert_eq!(r.key(&msg("{}", Some("acme"))).as_deref(), Some("acme"));
        let structured =
            r#" {"specversion":"1.0","id":"e1","source":"crm","tenantid":"globex","data":{}}"#;
        assert_eq!(r.key(&msg(structured, None)).as_deref(), Some("globex"));
        // The attribute wins over the body, as in the identity.
        assert_eq!(
            r.key(&msg(structured, Some("acme"))).as_deref(),
            Some("acme")
        );
        // A JSON body that is not a CloudEvent names no tenant, nor does a body that is not JSON.
        assert_eq!(r.key(&msg(r#"{"tenantid":"globex"}"#, None)), None);
        assert_eq!(r.key(&msg("tenantid=globex", None)), None);
        assert_eq!(r.key(&msg("{not json", None)), None);
    }

    #[test]
    fn an_unavailable_shard_s_release_delay_doubles_up_to_its_cap() {
        let o = ShardOptions::new()
            .unavailable_backoff(Duration::from_secs(5))
            .unavailable_backoff_max(Duration::from_secs(300));
        let delays: Vec<u64> = (1..=9).map(|n| o.unavailable_delay(n).as_secs()).collect();
        assert_eq!(delays, [5, 10, 20, 40, 80, 160, 300, 300, 300]);
        assert_eq!(o.unavailable_delay(0).as_secs(), 5);
        assert_eq!(o.unavailable_delay(u32::MAX).as_secs(), 300);
        // Ten deliveries ride out the sum of the first nine delays.
        let rides_out: u64 = delays.iter().sum();
        assert_eq!(rides_out, 1_215);
    }

    #[test]
    fn every_key_goes_to_its_claimant_and_the_rest_to_the_rest() {
        let shards = Shards::new(
            ShardRouter::tenant(),
            [
                Shard::new("eu-1", ()).claims(["acme", "globex"]),
                Shard::new("us-1", ()).claims(["initech"]).rest(),
            ],
        )
        .unwrap();
        assert_eq!(shards.names(), ["eu-1", "us-1"]);
        assert_eq!(shards.shard_of(&msg("{}", Some("globex"))), Ok("eu-1"));
        assert_eq!(shards.shard_of(&msg("{}", Some("initech"))), Ok("us-1"));
        assert_eq!(shards.shard_of(&msg("{}", Some("umbrella"))), Ok("us-1"));
        assert_eq!(shards.shard_of(&msg("{}", None)), Ok("us-1"));
        let strict = Shards::new(
            ShardRouter::tenant(),
            [Shard::new("eu-1", ()).claims(["acme"])],
        )
        .unwrap();
        let why = strict.shard_of(&msg("{}", Some("umbrella"))).unwrap_err();
        assert!(
            why.contains(r#""umbrella" is claimed by no shard"#),
            "{why}"
        );
        let why = strict.shard_of(&msg("{}", None)).unwrap_err();
        assert!(why.contains("has no tenant"), "{why}");
        let by_region = Shards::new(
            ShardRouter::by("region", |m| m.attribute("region").map(str::to_owned)),
            [Shard::new("eu", ()).claims(["eu"]).rest()],
        )
        .unwrap();
        let mut m = msg("{}", Some("acme"));
        m.attributes.insert("region".into(), "eu".into());
        assert_eq!(by_region.shard_of(&m), Ok("eu"));
    }
}
