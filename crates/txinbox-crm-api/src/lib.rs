#![doc = include_str!("../README.md")]
#![forbid(unsafe_code)]
#![warn(missing_docs)]

mod server;
mod state;

use std::net::{Ipv4Addr, SocketAddr};
use std::sync::{Arc, Mutex, PoisonError};

use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::task::JoinHandle;

pub use state::Task;

use server::Shared;

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
}

/// Configures and starts a [`CrmApi`]: `CrmApi::builder().idempotency(true).start().await?`.
#[derive(Debug, Clone)]
pub struct CrmApiBuilder {
    idempotency: bool,
    listen: SocketAddr,
    latency: std::time::Duration,
}

impl Default for CrmApiBuilder {
    fn default() -> Self {
        Self {
            idempotency: true,
            listen: SocketAddr::from((Ipv4Addr::LOCALHOST, 0)),
            latency: std::time::Duration::ZERO,
        }
    }
}

impl CrmApiBuilder {
    /// Whether the API honours `Idempotency-Key` (default `true`). With `false` the header is
    /// ignored and every `POST /tasks` creates a task: a destination without idempotency support.
    pub fn idempotency(mut self, enabled: bool) -> Self {
        self.idempotency = enabled;
        self
    }

    /// Waits this long after performing a `POST /tasks` and before answering (default none): a caller killed
    /// meanwhile leaves a task whose answer it never read, the window chaos runs aim at.
    pub fn latency(mut self, d: std::time::Duration) -> Self {
        self.latency = d;
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
        let bind_error = |source| Error::Bind {
            addr: self.listen,
            source,
        };
        let listener = TcpListener::bind(self.listen).await.map_err(bind_error)?;
        let addr = listener.local_addr().map_err(bind_error)?;
        let shared = Arc::new(Shared::new(self.idempotency, self.latency));
        let (shutdown, shutdown_rx) = watch::channel(false);
        let task = tokio::spawn(server::serve(listener, shared.clone(), shutdown_rx));
        tracing::info!(%addr, idempotency = self.idempotency, "CRM API listening");
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

    /// Whether the API honours `Idempotency-Key`.
    pub fn idempotency(&self) -> bool {
        self.shared.state().idempotency()
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

    /// How many `POST /tasks` were received: creations, replays, refusals and faulted ones.
    pub fn calls(&self) -> u64 {
        self.shared.state().calls()
    }

    /// Arms the "answer lost" window: the next `n` `POST /tasks` are performed (task created, key
    /// recorded, or replay) and then the connection is closed without any response. Replaces the
    /// previous count; 0 disarms.
    pub fn drop_next_answers(&self, n: u64) {
        self.shared.state().set_drop_answer(n);
    }

    /// Arms the "failed before" window: the next `n` `POST /tasks` answer 503 without performing
    /// anything. Replaces the previous count; 0 disarms. Consumed before
    /// [`CrmApi::drop_next_answers`] when both are armed.
    pub fn fail_next(&self, n: u64) {
        self.shared.state().set_fail_before(n);
    }

    /// Stops accepting connections, closes open ones (for every clone of this handle) and waits
    /// for the accept loop to end.
    pub async fn shutdown(self) {
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
