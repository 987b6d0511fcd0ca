#![doc = include_str!("../README.md")]
#![forbid(unsafe_code)]
#![warn(missing_docs)]

mod create;
mod faults;
mod server;
mod state;
mod v1;

use std::net::{Ipv4Addr, SocketAddr};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::task::JoinHandle;

pub use faults::FaultRates;
pub use state::Task;

use server::Shared;
use state::State;

/// Errors of the CRM API's Rust API.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The address is not a loopback address: the CRM API never listens beyond this machine.
    #[error("refusing to listen on {0}: the CRM API binds loopback addresses only")]
    NotLoopback(SocketAddr),
    /// The listening socket could not be bound.
    #[error("could not listen on {addr}: {source}")]
    Bind {
        /// The address asked for.
        addr: SocketAddr,
        /// Why binding failed.
        #[source]
        source: std::io::Error,
    },
    /// The key mode names an invalid header or an empty body field.
    #[error("invalid key mode: {0}")]
    InvalidKeyMode(String),
    /// Random fault rates outside `[0, 1]` or adding up to more than 1.
    #[error("invalid fault rates: {0}")]
    InvalidFaultRates(String),
}

/// Where a create request carries its idempotency key.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum KeyMode {
    /// A request header, matched case-insensitively: `Idempotency-Key` (the IETF httpapi draft,
    /// Stripe; the default), `PayPal-Request-Id`, ...
    Header(String),
    /// The top-level string field of that name in the JSON body (Square's `idempotency_key`); a
    /// body without it creates without a key.
    BodyField(String),
    /// No idempotency support: every create creates.
    None,
}

impl Default for KeyMode {
    fn default() -> Self {
        KeyMode::Header("Idempotency-Key".to_string())
    }
}

impl KeyMode {
    fn validate(&self) -> Result<(), Error> {
        match self {
            KeyMode::Header(name) => hyper::header::HeaderName::from_bytes(name.as_bytes())
                .map(|_| ())
                .map_err(|_| Error::InvalidKeyMode(format!("{name:?} is not a header name"))),
            KeyMode::BodyField(field) if field.is_empty() => Err(Error::InvalidKeyMode(
                "an empty body field name".to_string(),
            )),
            KeyMode::BodyField(_) | KeyMode::None => Ok(()),
        }
    }
}

impl std::fmt::Display for KeyMode {
    /// `header:NAME`, `body:FIELD` or `none`, as [`KeyMode::from_str`](std::str::FromStr) reads it.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            KeyMode::Header(name) => write!(f, "header:{name}"),
            KeyMode::BodyField(field) => write!(f, "body:{field}"),
            KeyMode::None => f.write_str("none"),
        }
    }
}

impl std::str::FromStr for KeyMode {
    type Err = String;

    /// `header:NAME`, `body:FIELD` or `none`.
    fn from_str(s: &str) -> Result<Self, String> {
        let mode = match s.split_once(':') {
            Some(("header", name)) => KeyMode::Header(name.to_string()),
            Some(("body", field)) => KeyMode::BodyField(field.to_string()),
            None if s == "none" => KeyMode::None,
            _ => {
                return Err(format!(
                    "expected header:NAME, body:FIELD or none, got {s:?}"
                ))
            }
        };
        mode.validate().map_err(|e| e.to_string())?;
        Ok(mode)
    }
}

/// Configures and starts a [`CrmApi`]: `CrmApi::builder().idempotency(true).start().await?`.
#[derive(Debug, Clone)]
pub struct CrmApiBuilder {
    key_mode: KeyMode,
    listen: SocketAddr,
    latency: Duration,
    processing: Duration,
    search_lag: Duration,
    random_faults: (FaultRates, u64),
    retry_after: (u64, bool),
}

impl Default for CrmApiBuilder {
    fn default() -> Self {
        Self {
            key_mode: KeyMode::default(),
            listen: SocketAddr::from((Ipv4Addr::LOCALHOST, 0)),
            latency: Duration::ZERO,
            processing: Duration::ZERO,
            search_lag: Duration::ZERO,
            random_faults: (FaultRates::default(), 0),
            retry_after: (1, false),
        }
    }
}

impl CrmApiBuilder {
    /// Whether the API honours `Idempotency-Key` (default `true`). With `false` the header is
    /// ignored and every `POST /tasks` creates a task: a destination without idempotency support.
    /// Shorthand for [`CrmApiBuilder::key_mode`] with the default header (`true`) or
    /// [`KeyMode::None`] (`false`); the last call wins.
    pub fn idempotency(mut self, enabled: bool) -> Self {
        self.key_mode = if enabled {
            KeyMode::default()
        } else {
            KeyMode::None
        };
        self
    }

    /// Where creates (`POST /tasks`, `POST /v1/tasks`) carry their idempotency key (default
    /// `KeyMode::Header("Idempotency-Key")`). [`CrmApiBuilder::start`] refuses an invalid header
    /// name or an empty field name.
    pub fn key_mode(mut self, mode: KeyMode) -> Self {
        self.key_mode = mode;
        self
    }

    /// Waits this long after performing a create and before answering (default none): a caller killed
    /// meanwhile leaves a task whose answer it never read, the window chaos runs aim at.
    pub fn latency(mut self, d: Duration) -> Self {
        self.latency = d;
        self
    }

    /// Each create takes this long *before* the task exists (default none). Meanwhile its key is
    /// in progress (another create with it answers `409`) and the searches do not find the task.
    /// The processing completes even when the client goes away.
    pub fn processing(mut self, d: Duration) -> Self {
        self.processing = d;
        self
    }

    /// A task appears in the listings and searches (not in `GET /v1/tasks/{id}`) only this long
    /// after its creation, like an eventually consistent search index (default none).
    pub fn search_lag(mut self, d: Duration) -> Self {
        self.search_lag = d;
        self
    }

    /// Random faults: each create request with no counted fault armed draws one with these
    /// probabilities, from a PRNG seeded with `seed` (the same requests in the same order draw
    /// the same faults). [`CrmApiBuilder::start`] refuses invalid rates.
    pub fn random_faults(mut self, rates: FaultRates, seed: u64) -> Self {
        self.random_faults = (rates, seed);
        self
    }

    /// The `Retry-After` of the `unavailable` and `rate_limited` faults: `secs` delta-seconds
    /// (default 1), or with `as_date` the HTTP-date of now + `secs`, rounded up to the next whole
    /// second.
    pub fn retry_after(mut self, secs: u64, as_date: bool) -> Self {
        self.retry_after = (secs, as_date);
        self
    }

    /// The address to listen on (default `127.0.0.1:0`, any free port). It must be a loopback
    /// address; [`CrmApiBuilder::start`] refuses any other.
    pub fn listen(mut self, addr: SocketAddr) -> Self {
        self.listen = addr;
        self
    }

    /// Binds the address and starts serving in the background (on the current Tokio runtime).
    pub async fn start(self) -> Result<CrmApi, Error> {
        if !self.listen.ip().is_loopback() {
            return Err(Error::NotLoopback(self.listen));
        }
        self.key_mode.validate()?;
        let (rates, seed) = self.random_faults;
        rates.validate().map_err(Error::InvalidFaultRates)?;
        let mut state = State::new(self.key_mode.clone(), self.search_lag);
        state.faults.set_random(rates, seed);
        (state.faults.retry_after_secs, state.faults.retry_after_date) = self.retry_after;
        let bind_error = |source| Error::Bind {
            addr: self.listen,
            source,
        };
        let listener = TcpListener::bind(self.listen).await.map_err(bind_error)?;
        let addr = listener.local_addr().map_err(bind_error)?;
        let shared = Arc::new(Shared::new(state, self.latency, self.processing));
        let (shutdown, shutdown_rx) = watch::channel(false);
        let task = tokio::spawn(server::serve(listener, shared.clone(), shutdown_rx));
        tracing::info!(%addr, key_mode = %self.key_mode, "CRM API listening");
        Ok(CrmApi {
            addr,
            shared,
            server: Arc::new(Server {
                shutdown,
                task: Mutex::new(Some(task)),
            }),
        })
    }
}

/// Stops the server when the last [`CrmApi`] clone is dropped.
#[derive(Debug)]
struct Server {
    shutdown: watch::Sender<bool>,
    task: Mutex<Option<JoinHandle<()>>>,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.shutdown.send(true);
    }
}

/// A running CRM API: a handle on its state, cheap to clone (every clone sees the same API).
/// The server stops on [`CrmApi::shutdown`] or when the last clone is dropped.
#[derive(Debug, Clone)]
pub struct CrmApi {
    addr: SocketAddr,
    shared: Arc<Shared>,
    server: Arc<Server>,
}

impl CrmApi {
    /// A builder: idempotency on, listening on `127.0.0.1:0`.
    pub fn builder() -> CrmApiBuilder {
        CrmApiBuilder::default()
    }

    /// The bound address.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// `http://127.0.0.1:PORT`, without a trailing slash.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Whether the API honours idempotency keys (any [`KeyMode`] but [`KeyMode::None`]).
    pub fn idempotency(&self) -> bool {
        *self.shared.state().key_mode() != KeyMode::None
    }

    /// Where creates carry their idempotency key.
    pub fn key_mode(&self) -> KeyMode {
        self.shared.state().key_mode().clone()
    }

    /// Every task, in creation order.
    pub fn tasks(&self) -> Vec<Task> {
        self.shared.state().tasks()
    }

    /// The task created under an idempotency key (always `None` without idempotency support).
    pub fn task_with_key(&self, key: &str) -> Option<Task> {
        self.shared.state().task_with_key(key).cloned()
    }

    /// The first task whose body had `"external_ref": reference`.
    pub fn task_with_external_ref(&self, reference: &str) -> Option<Task> {
        self.shared
            .state()
            .task_with_external_ref(reference)
            .cloned()
    }

    /// How many tasks were created under an idempotency key: 0 or 1 with idempotency support,
    /// always 0 without (the key is not stored there).
    pub fn count_with_key(&self, key: &str) -> usize {
        self.shared.state().count_with_key(key)
    }

    /// How many tasks had `"external_ref": reference` in their body.
    pub fn count_with_external_ref(&self, reference: &str) -> usize {
        self.shared.state().count_with_external_ref(reference)
    }

    /// How many create requests (`POST /tasks`, `POST /v1/tasks`, `PUT /v1/tasks/by_ref/..`) were
    /// received: creations, replays, refusals and faulted ones.
    pub fn calls(&self) -> u64 {
        self.shared.state().calls()
    }

    /// The same as [`CrmApi::calls`]: create requests received, faulted ones included.
    pub fn attempts(&self) -> u64 {
        self.calls()
    }

    /// How many tasks were ever created, deleted ones included (a replay or an upsert that
    /// replaces creates none).
    pub fn creates(&self) -> usize {
        self.shared.state().creates()
    }

    /// How many tasks were ever created with that `external_ref`, deleted ones included: a
    /// duplicate effect shows as 2.
    pub fn creates_for_ref(&self, reference: &str) -> usize {
        self.shared.state().creates_for_ref(reference)
    }

    /// How many tasks were ever created under that idempotency key, deleted ones included
    /// (always 0 without idempotency support).
    pub fn creates_for_key(&self, key: &str) -> usize {
        self.shared.state().creates_for_key(key)
    }

    /// Arms the "answer lost" window: the next `n` create requests are performed (task created, key
    /// recorded, or replay) and then the connection is closed without any response. Replaces the
    /// previous count; 0 disarms.
    pub fn drop_next_answers(&self, n: u64) {
        self.shared.state().faults.drop_answer = n;
    }

    /// Arms the "failed before" window: the next `n` create requests answer 503 (without
    /// `Retry-After`) without performing anything. Replaces the previous count; 0 disarms.
    /// Consumed first when several faults are armed.
    pub fn fail_next(&self, n: u64) {
        self.shared.state().faults.fail_before = n;
    }

    /// The next `n` create requests answer `503` with `Retry-After`, nothing performed.
    pub fn unavailable_next(&self, n: u64) {
        self.shared.state().faults.unavailable = n;
    }

    /// The next `n` create requests answer `429` with `Retry-After`, nothing performed.
    pub fn rate_limit_next(&self, n: u64) {
        self.shared.state().faults.rate_limited = n;
    }

    /// The next `n` searches and lookups (`GET /tasks`, `GET /v1/tasks...`, `POST /v1/tasks/search`) answer
    /// `429` with `Retry-After`, nothing searched. Replaces the previous count; 0 disarms.
    pub fn rate_limit_next_searches(&self, n: u64) {
        self.shared.state().faults.searches_rate_limited = n;
    }

    /// The next `n` create requests answer `502` as a gateway would, without being forwarded:
    /// nothing performed, the key not recorded.
    pub fn gateway_502_next(&self, n: u64) {
        self.shared.state().faults.gateway_502 = n;
    }

    /// The next `n` create requests are performed, then answered `504` (the answer lost at the
    /// gateway).
    pub fn gateway_504_next(&self, n: u64) {
        self.shared.state().faults.gateway_504 = n;
    }

    /// The `Retry-After` of the `429`/`503` faults: see [`CrmApiBuilder::retry_after`].
    pub fn set_retry_after(&self, secs: u64, as_date: bool) {
        let mut state = self.shared.state();
        state.faults.retry_after_secs = secs;
        state.faults.retry_after_date = as_date;
    }

    /// Sets the random faults and restarts their PRNG from `seed` (see
    /// [`CrmApiBuilder::random_faults`]); `FaultRates::default()` disables them.
    pub fn set_random_faults(&self, rates: FaultRates, seed: u64) -> Result<(), Error> {
        rates.validate().map_err(Error::InvalidFaultRates)?;
        self.shared.state().faults.set_random(rates, seed);
        Ok(())
    }

    /// Holds the next `n` creates that go on to their processing (a key reserved as in progress, the
    /// task not there yet) before it, until [`CrmApi::release_held`]: meanwhile another create with the
    /// key answers `409` and the searches do not find the task, however long the callers take. A create
    /// answered at once (a replay, a `409`, a refusal, a fault before it) is not held. Replaces the
    /// previous count; 0 disarms. Held creates complete even when their caller has gone away.
    pub fn hold_next(&self, n: u64) {
        self.shared.holds.arm(n);
    }

    /// How many creates are held now ([`CrmApi::hold_next`]).
    pub fn held(&self) -> u64 {
        self.shared.holds.held()
    }

    /// Lets every create held now go on: its processing time, then the task (and the answer, to a
    /// caller still waiting).
    pub fn release_held(&self) {
        self.shared.holds.release();
    }

    /// Stops accepting connections, closes open ones (for every clone of this handle) and waits
    /// for the accept loop to end. Creates still held are released.
    pub async fn shutdown(self) {
        self.shared.holds.release();
        let _ = self.server.shutdown.send(true);
        let task = self
            .server
            .task
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take();
        if let Some(task) = task {
            let _ = task.await;
        }
    }
}
