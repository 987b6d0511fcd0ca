#![doc = include_str!("../README.md")]
#![forbid(unsafe_code)]
#![warn(missing_docs)]

mod admin;
mod auth;
mod broker;
mod config;
mod faults;
#[cfg(feature = "fuzzing")]
#[doc(hidden)]
pub mod fuzzing;
mod server;
mod timer;
mod wire;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio::net::{TcpListener, ToSocketAddrs};
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio::time::Instant;

pub use broker::{MessageView, QueueState};
pub use config::{format_iso8601, parse_iso8601, QueueProperties, QueuePropertiesOutput};
pub use faults::{FaultKind, FaultRule};
/// The exact wait behind the `delay` fault (to within the kernel's timer slack, where tokio's timer rounds up
/// to the next whole millisecond), for other simulated round trips that must last what they say.
pub use timer::wait as wait_exactly;

use auth::AuthConfig;
use broker::Broker;
use server::{ServerSettings, Shared};

/// Errors of the emulator's Rust API.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The listening socket could not be bound.
    #[error("could not listen: {0}")]
    Bind(#[source] std::io::Error),
    /// A queue path or queue properties were refused.
    #[error("invalid queue: {0}")]
    InvalidQueue(String),
    /// A fault rule was refused.
    #[error("invalid fault rule: {0}")]
    InvalidFault(String),
    /// The broker refused an operation asked through this API (the queue does not exist, the message is
    /// too large, ...).
    #[error("refused: {0}")]
    Refused(String),
}

/// Data-plane requests the emulator has served, by operation: those that passed authentication and named an
/// operation, counted as they arrive (an injected fault does not uncount one). What a benchmark divides by the
/// messages it moved to tell receives, settles and renewals per message.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "camelCase")]
#[non_exhaustive]
pub struct RequestCounts {
    /// Sends and batch sends (`POST {entity}/messages`).
    pub sends: u64,
    /// Peek-lock receives (`POST {entity}/messages/head`), answered 201 or 204.
    pub peek_locks: u64,
    /// Receive-and-delete receives (`DELETE {entity}/messages/head`).
    pub receive_and_deletes: u64,
    /// Completes (`DELETE` on a lock URI).
    pub completes: u64,
    /// Abandons (`PUT` on a lock URI).
    pub abandons: u64,
    /// Lock renewals (`POST` on a lock URI).
    pub renewals: u64,
    /// Requests an injected `delay` fault held back.
    pub delays: u64,
    /// How long they were held back in all, in microseconds, as measured (the simulated round trip's real
    /// length: `delay_micros / delays`).
    pub delay_micros: u64,
}

/// Which host the absolute lock URI in the peek-lock `Location` header names.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum LocationStyle {
    /// `https://{namespace}.servicebus.windows.net/...`, as the real service answers [doc PEEK].
    /// A client that rewrites the namespace URL to the emulator rewrites this too.
    #[default]
    Namespace,
    /// `http://{the request's Host header}/...`: usable as-is by a plain HTTP client.
    RequestHost,
}

/// Entry point: `Emulator::builder()`.
#[derive(Debug)]
pub struct Emulator;

impl Emulator {
    /// A builder with no credentials (every request accepted), namespace `emulator`, no queues.
    pub fn builder() -> EmulatorBuilder {
        EmulatorBuilder::default()
    }
}

/// Configures and starts an emulator.
#[derive(Debug, Clone)]
pub struct EmulatorBuilder {
    namespace: String,
    auth: AuthConfig,
    queues: Vec<(String, QueueProperties)>,
    location_style: LocationStyle,
    default_receive_timeout: Duration,
    max_receive_timeout: Duration,
}

impl Default for EmulatorBuilder {
    fn default() -> Self {
        Self {
            namespace: "emulator".into(),
            auth: AuthConfig::default(),
            queues: Vec::new(),
            location_style: LocationStyle::default(),
            default_receive_timeout: Duration::from_secs(60),
            max_receive_timeout: Duration::from_secs(60),
        }
    }
}

impl EmulatorBuilder {
    /// The namespace name: SAS tokens may name `https://{namespace}.servicebus.windows.net/...`.
    pub fn namespace(mut self, namespace: impl Into<String>) -> Self {
        self.namespace = namespace.into();
        self
    }

    /// Adds a shared access rule (key name and key). Once any credential is configured, every
    /// data-plane request needs a valid token.
    pub fn sas_key(mut self, key_name: impl Into<String>, key: impl Into<String>) -> Self {
        self.auth.sas_keys.push((key_name.into(), key.into()));
        self
    }

    /// Accepts `Authorization: Bearer {token}` for this exact token.
    pub fn accept_bearer(mut self, token: impl Into<String>) -> Self {
        self.auth.bearer_tokens.push(token.into());
        self
    }

    /// Creates a queue at start-up (and again, empty, on every reset).
    pub fn queue(mut self, path: impl Into<String>, properties: QueueProperties) -> Self {
        self.queues.push((path.into(), properties));
        self
    }

    /// Which host the `Location` lock URI names; default [`LocationStyle::Namespace`].
    pub fn location_style(mut self, style: LocationStyle) -> Self {
        self.location_style = style;
        self
    }

    /// How long a receive without `?timeout=` waits; default 60 s (the service's default is
    /// undocumented).
    pub fn default_receive_timeout(mut self, timeout: Duration) -> Self {
        self.default_receive_timeout = timeout;
        self
    }

    /// The cap on `?timeout=`; default 60 s.
    pub fn max_receive_timeout(mut self, timeout: Duration) -> Self {
        self.max_receive_timeout = timeout;
        self
    }

    /// Binds `addr` (use port 0 for any free port) and starts serving in the background.
    pub async fn start(self, addr: impl ToSocketAddrs) -> Result<EmulatorHandle, Error> {
        for (path, props) in &self.queues {
            broker::validate_queue_path(path)
                .and_then(|()| props.validate())
                .map_err(|e| Error::InvalidQueue(format!("{path}: {e}")))?;
        }
        let broker = Broker::new(self.queues.clone());
        let listener = TcpListener::bind(addr).await.map_err(Error::Bind)?;
        let local_addr = listener.local_addr().map_err(Error::Bind)?;
        let settings = ServerSettings {
            auth: self.auth,
            namespace: self.namespace,
            location_style: self.location_style,
            default_receive_timeout: self.default_receive_timeout,
            max_receive_timeout: self.max_receive_timeout,
        };
        let shared = Arc::new(Shared::new(broker, settings, local_addr));
        let (shutdown, shutdown_rx) = watch::channel(false);
        let task = tokio::spawn(server::serve(listener, shared.clone(), shutdown_rx));
        tracing::info!(addr = %local_addr, "Service Bus emulator listening");
        Ok(EmulatorHandle {
            addr: local_addr,
            shared,
            shutdown,
            task,
        })
    }
}

/// A running emulator. Dropping it stops the server.
#[derive(Debug)]
pub struct EmulatorHandle {
    addr: SocketAddr,
    shared: Arc<Shared>,
    shutdown: watch::Sender<bool>,
    task: JoinHandle<()>,
}

impl std::fmt::Debug for Shared {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Shared")
            .field("namespace", &self.namespace)
            .finish_non_exhaustive()
    }
}

impl EmulatorHandle {
    /// The bound address.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// `http://{addr}`.
    pub fn base_url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// The namespace name.
    pub fn namespace(&self) -> &str {
        &self.shared.namespace
    }

    /// `{namespace}.servicebus.windows.net`: the host clients sign for and Location names.
    pub fn namespace_host(&self) -> &str {
        &self.shared.namespace_host
    }

    /// Creates a queue, or replaces an existing queue's properties (keeping its messages).
    pub fn create_queue(&self, path: &str, properties: QueueProperties) -> Result<(), Error> {
        self.shared
            .broker()
            .put_queue(path, properties)
            .map_err(Error::InvalidQueue)?;
        self.shared.notify.notify_waiters();
        Ok(())
    }

    /// Deletes a queue; returns whether it existed.
    pub fn delete_queue(&self, path: &str) -> bool {
        let deleted = self.shared.broker().delete_queue(path);
        self.shared.notify.notify_waiters();
        deleted
    }

    /// The queue's counts, properties and messages (dead-lettered ones included).
    pub fn queue_state(&self, path: &str) -> Option<QueueState> {
        self.shared.broker().queue_state(path, Instant::now())
    }

    /// The properties of a queue.
    pub fn queue_properties(&self, path: &str) -> Option<QueueProperties> {
        self.shared.broker().queue_properties(path)
    }

    /// Data-plane requests served so far, by operation.
    pub fn request_counts(&self) -> RequestCounts {
        self.shared.counters.snapshot()
    }

    /// Puts one message in a queue from this process, without a request (what a benchmark or a test preloads a
    /// queue with): `MessageId` and body as given, content type `application/json`, no custom properties. The
    /// queue's checks apply as for a send.
    pub fn send_message(
        &self,
        path: &str,
        message_id: &str,
        body: impl Into<hyper::body::Bytes>,
    ) -> Result<(), Error> {
        let message = broker::IncomingMessage {
            body: body.into(),
            content_type: Some("application/json".to_owned()),
            sender: wire::SenderProperties {
                message_id: Some(message_id.to_owned()),
                ..Default::default()
            },
            properties: Vec::new(),
        };
        self.shared
            .broker()
            .send(path, vec![message], Instant::now())
            .map_err(|e| Error::Refused(e.detail()))?;
        self.shared.notify.notify_waiters();
        Ok(())
    }

    /// Adds a fault rule.
    pub fn inject_fault(&self, rule: FaultRule) -> Result<(), Error> {
        rule.validate().map_err(Error::InvalidFault)?;
        self.shared.broker().faults.push(rule);
        Ok(())
    }

    /// Removes every fault rule.
    pub fn clear_faults(&self) {
        self.shared.broker().faults.clear();
    }

    /// Back to the start-up state: configured queues, empty; no faults.
    pub fn reset(&self) {
        self.shared.broker().reset();
        self.shared.notify.notify_waiters();
    }

    /// Stops accepting connections, closes open ones and waits for the server task.
    pub async fn shutdown(self) {
        let _ = self.shutdown.send(true);
        let _ = self.task.await;
    }
}
