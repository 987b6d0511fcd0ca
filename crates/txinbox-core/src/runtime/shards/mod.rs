//! Shards: one worker, several stores. Each delivery is applied in the store that holds its tenant's business
//! data, so the marker still commits in the same transaction as the business change: the inbox scales by
//! sharding **with** the business data, never by a transaction across databases.
//!
//! ```text
//! receive ─► a body larger than every shard accepts: unread, to the shard with the largest limit (below)
//!         ─► route (ShardRouter: the tenant, or your function of the message)
//!              ├─ a shard claims the key ......... that shard's processor: BEGIN, marker, handler, COMMIT, settle
//!              ├─ that shard is unavailable ...... released with ShardOptions::unavailable_backoff, the others flow
//!              └─ no shard claims it ............. dead-lettered, reason `no_shard` (nothing was written)
//! ```
//!
//! Each [`Shard`] is a name, a [`Processor`](crate::runtime::worker::Processor) (an
//! [`InboxProcessor`](crate::InboxProcessor) on that shard's store:
//! [`InboxProcessor::on_store`](crate::InboxProcessor::on_store) binds the same handler to another store), the
//! tenants it claims, and a [`HealthCheck`] (the stores implement it). A tenant claimed twice (or by two
//! shards in two forms equal in Unicode NFC or but for case), or two shards taking the rest, is refused when
//! the [`Shards`] are built, with one line; a message whose tenant no shard claims can only be known from the
//! message, so it is dead-lettered with a reason that names the tenant.
//!
//! **The size limit comes before the router.** When every shard's processor has a body limit
//! ([`Processor::max_payload_bytes`](crate::runtime::worker::Processor::max_payload_bytes): an inbox's
//! [`InputRules::max_payload_bytes`](crate::InputRules)), a larger body is never read by the router (a
//! structured CloudEvent's tenant is in its JSON body): it goes unread to the shard whose limit is largest,
//! whose inbox dead-letters it `payload_too_large` before any transaction, as a worker on one store does.
//!
//! **A shard that is down delays only its own messages.** The shards' checks are probed every
//! [`ShardOptions::probe_interval`] while the worker runs (and at once after a delivery of a shard ended in a
//! retry); while a shard's last probe failed, its deliveries are released without touching its store, so they
//! never wait for a connection, and where the broker releases with a delay at once (SQS) they do not hold a
//! worker slot, so the other shards' deliveries keep every slot. (Service Bus serves a release's delay by
//! holding the lock, and the slot, up to `max_release_delay`: see `docs/shards.md`.)
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
use std::sync::atomic::{AtomicBool, AtomicU64};
use std::sync::{Arc, Mutex};

use futures::stream::{FuturesUnordered, StreamExt};

use crate::runtime::health::{Health, HealthCheck};
use crate::{CancellationToken, ReceivedMessage};

mod config;
mod probe;
mod process;
mod router;
#[cfg(test)]
mod tests;

use config::{check_claims, Claims};
pub use config::{check_shards, Shard, ShardConfigError, ShardOptions, ShardStatus};
use probe::probe_all;
pub use router::ShardRouter;

/// The dead-letter reason of a delivery no shard takes.
pub const NO_SHARD: &str = "no_shard";

/// How many releases of a down shard's deliveries may wait out their delay in the background at once, on a
/// broker whose release holds its caller ([`crate::Delivery::release_holds`]: Service Bus over REST holds the
/// lock up to its `max_release_delay`, 10 s): each would otherwise keep a worker slot for that long, and a
/// shard that is down would take the slots of the shards that are up. Past this many, a release waits in its
/// slot, as on one store (the bound keeps the locks a worker holds finite).
pub const MAX_BACKGROUND_RELEASES: usize = 1024;

/// What the probe loop needs, apart from the processors (so that it never keeps them alive).
struct Watch {
    name: Arc<str>,
    check: Option<Arc<dyn HealthCheck>>,
    down: Mutex<Option<String>>,
    probing: AtomicBool,
    /// The probes begun (each one's ticket) and the ticket of the last one whose answer was recorded: a probe
    /// that began before it answers an older question, and is not recorded.
    begun: AtomicU64,
    recorded: AtomicU64,
}

struct Inner<P> {
    processors: Vec<P>,
    watch: Arc<[Watch]>,
    by_key: HashMap<String, usize>,
    /// Each claim's case-folded NFC form: a key claimed in another form is not given to the rest.
    by_form: HashMap<String, (usize, String)>,
    rest: Option<usize>,
    router: ShardRouter,
    opts: Mutex<ShardOptions>,
    started: AtomicBool,
    /// The consumer label, known once the worker started the processor.
    consumer: std::sync::OnceLock<String>,
    stop: CancellationToken,
    /// Permits for the releases waiting out their delay in the background ([`MAX_BACKGROUND_RELEASES`]).
    releasing: Arc<tokio::sync::Semaphore>,
    /// Why the worker must refuse to start, found when the checks were added to a readiness ([`Shards::health`]).
    refused: Mutex<Option<String>>,
}

impl<P> Drop for Inner<P> {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

/// Several shards behind one [`Processor`](crate::runtime::worker::Processor): see the [module docs](self).
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
    /// Larger than every shard accepts: to this shard's processor, which refuses it unread.
    TooLarge(usize),
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
                begun: AtomicU64::new(0),
                recorded: AtomicU64::new(0),
            });
            processors.push(s.processor);
        }
        let Claims {
            by_key,
            by_form,
            rest,
        } = claims;
        Ok(Self {
            inner: Arc::new(Inner {
                processors,
                watch: watch.into(),
                by_key,
                by_form,
                rest,
                router,
                opts: Mutex::new(ShardOptions::default()),
                started: AtomicBool::new(false),
                consumer: std::sync::OnceLock::new(),
                stop: CancellationToken::new(),
                releasing: Arc::new(tokio::sync::Semaphore::new(MAX_BACKGROUND_RELEASES)),
                refused: Mutex::new(None),
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
        // The router's function is the user's code on an outside message: a panic (an index past the end of a
        // hostile body) is this message's, which no shard can take, not its whole batch's, left unsettled.
        let key = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| inner.router.key(msg)))
            .map_err(|payload| {
                let why = payload
                    .downcast_ref::<&str>()
                    .map(|s| (*s).to_owned())
                    .or_else(|| payload.downcast_ref::<String>().cloned())
                    .unwrap_or_default();
                format!(
                    "the shard router's function ({}) panicked on this message: {}",
                    inner.router.what,
                    shown(&why)
                )
            })?;
        match key {
            Some(key) => {
                if let Some(&i) = inner.by_key.get(&key) {
                    return Ok(i);
                }
                let Some(rest) = inner.rest else {
                    return Err(format!(
                        "{} {} is claimed by no shard and no shard takes the rest",
                        inner.router.what,
                        shown(&key)
                    ));
                };
                // A claimed tenant written in another form (case, Unicode form) is the claiming shard's tenant,
                // not one for the rest, where its data and markers would be apart from the tenant's.
                let other_form = (key.len() <= MAX_FOLDED_KEY)
                    .then(|| inner.by_form.get(&config::case_folded(&key)))
                    .flatten();
                match other_form {
                    Some((i, claim)) => Err(format!(
                        "{} {} is claimed by no shard as written, but shard {:?} claims {}, the same in another form (case or Unicode form): not given to the rest, where its data would be apart from the tenant's; list this form on shard {:?}",
                        inner.router.what,
                        shown(&key),
                        &*inner.watch[*i].name,
                        shown(claim),
                        &*inner.watch[*i].name,
                    )),
                    None => Ok(rest),
                }
            }
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

    /// Adds the shards to `health`'s readiness, one check per shard named `shard <name>` (its store's
    /// [`HealthCheck`]: a ping, and on PostgreSQL whether the inbox can write its markers there; run at each
    /// probe of readiness). By default an unavailable shard shows as `degraded shard NAME: why` and readiness
    /// stays true while another shard answers (the worker goes on for the others); with
    /// [`ShardOptions::require_all`] each shard is a required check.
    ///
    /// A readiness that already has a check of one of these names (another consumer's shards named alike, or
    /// these shards added twice) gets none of these checks, and the worker of these shards refuses to start
    /// with one line naming the check ([`Processor::refused`](crate::runtime::worker::Processor::refused)):
    /// two lines `shard eu-1` could not be told apart. Give each consumer's worker its own [`Health`].
    pub fn health(&self, mut health: Health) -> Health {
        let checked: Vec<usize> = (0..self.inner.watch.len())
            .filter(|&i| self.inner.watch[i].check.is_some())
            .collect();
        let names = checked
            .iter()
            .map(|&i| format!("shard {}", self.inner.watch[i].name))
            .chain((!self.opts().require_all && !checked.is_empty()).then(|| "shards".to_owned()));
        for name in names {
            if health.has_check(&name) {
                *lock(&self.inner.refused) = Some(format!(
                    "readiness already has a check named {name:?} (the shards of another consumer, or these shards added twice, on one Health): give each consumer's worker its own Health"
                ));
                return health;
            }
        }
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
                    if watch.iter().any(|w| w.check.is_none()) {
                        return Ok(());
                    }
                    // Ready on the first shard that answers: a shard whose check never answers (a host that
                    // drops packets) must not hold this line past the readiness check's own timeout, which
                    // would fail it, and readiness with it, while another shard serves.
                    let mut answers: FuturesUnordered<_> = checked
                        .iter()
                        .filter_map(|&i| watch[i].check.clone())
                        .map(|c| async move {
                            matches!(tokio::time::timeout(timeout, c.check()).await, Ok(Ok(())))
                        })
                        .collect();
                    while let Some(up) = answers.next().await {
                        if up {
                            return Ok(());
                        }
                    }
                    Err("every shard is unavailable".into())
                }
            });
        }
        health
    }
}

/// The longest key compared with the claims in another form: a claim is at most 512 bytes, and its NFD form
/// and case changes make one at most a few times longer; a longer key is no claim's other form.
const MAX_FOLDED_KEY: usize = 8 * crate::pipeline::identity::MAX_ID_LEN;

/// The most of a message's key (or of a router's panic) a dead-letter detail and its log line quote: a key is
/// the sender's text, as long as the broker lets an attribute be.
const SHOWN_KEY: usize = 128;

/// `key` quoted for a detail: whole when short, else its first [`SHOWN_KEY`] bytes (on a character boundary)
/// and its length.
fn shown(key: &str) -> String {
    if key.len() <= SHOWN_KEY {
        return format!("{key:?}");
    }
    let mut end = SHOWN_KEY;
    while !key.is_char_boundary(end) {
        end -= 1;
    }
    format!("{:?}... ({} bytes)", &key[..end], key.len())
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}
