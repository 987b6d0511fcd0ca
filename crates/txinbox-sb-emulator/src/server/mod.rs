//! The HTTP/1.1 server: routing, the data-plane handlers and long polling.

mod handlers;
mod incoming;
mod response;
mod route;
#[cfg(test)]
mod tests;

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use http_body_util::Full;
use hyper::body::{Bytes, Incoming};
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use percent_encoding::percent_decode_str;
use tokio::net::TcpListener;
use tokio::sync::{watch, Notify};

use crate::admin;
use crate::auth::AuthConfig;
use crate::broker::{Broker, LockOperation, ReceiveMode};
use crate::LocationStyle;

pub(crate) use incoming::{parse_batch, single_message, timeout_from_query};
pub(crate) use response::{empty_response, error_response, json_response, read_admin_body};
pub(crate) use route::{parse_route, strip_admin_prefix, Route};

/// The response body type.
pub(crate) type Body = Full<Bytes>;

/// A refusal: status and detail.
type Refusal = (StatusCode, &'static str);

/// The path prefix of the control API. Entity names cannot contain `$`, so it cannot clash.
pub(crate) const ADMIN_PREFIX: &str = "/$emulator";

/// State shared by every connection.
pub(crate) struct Shared {
    broker: Mutex<Broker>,
    /// Woken whenever a message may have become receivable.
    pub notify: Notify,
    pub auth: AuthConfig,
    pub namespace: String,
    pub namespace_host: String,
    pub location_style: LocationStyle,
    pub local_addr: SocketAddr,
    pub default_receive_timeout: Duration,
    pub max_receive_timeout: Duration,
    /// Data-plane requests served, by operation.
    pub counters: Counters,
}

/// Data-plane requests that passed authentication and named an operation, counted before faults.
#[derive(Default)]
pub(crate) struct Counters {
    sends: AtomicU64,
    peek_locks: AtomicU64,
    receive_and_deletes: AtomicU64,
    completes: AtomicU64,
    abandons: AtomicU64,
    renewals: AtomicU64,
    delays: AtomicU64,
    delay_micros: AtomicU64,
}

impl Counters {
    fn count(&self, route: &Route) {
        let counter = match route {
            Route::Send { .. } => &self.sends,
            Route::Receive {
                mode: ReceiveMode::PeekLock,
                ..
            } => &self.peek_locks,
            Route::Receive {
                mode: ReceiveMode::ReceiveAndDelete,
                ..
            } => &self.receive_and_deletes,
            Route::Lock { operation, .. } => match operation {
                LockOperation::Complete => &self.completes,
                LockOperation::Abandon => &self.abandons,
                LockOperation::Renew => &self.renewals,
            },
        };
        counter.fetch_add(1, Ordering::Relaxed);
    }

    /// A request held back by a delay fault for `waited`.
    fn delayed(&self, waited: Duration) {
        let micros = u64::try_from(waited.as_micros()).unwrap_or(u64::MAX);
        self.delays.fetch_add(1, Ordering::Relaxed);
        self.delay_micros.fetch_add(micros, Ordering::Relaxed);
    }

    pub(crate) fn snapshot(&self) -> crate::RequestCounts {
        let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
        crate::RequestCounts {
            sends: get(&self.sends),
            peek_locks: get(&self.peek_locks),
            receive_and_deletes: get(&self.receive_and_deletes),
            completes: get(&self.completes),
            abandons: get(&self.abandons),
            renewals: get(&self.renewals),
            delays: get(&self.delays),
            delay_micros: get(&self.delay_micros),
        }
    }
}

/// Settings the server needs besides the broker.
pub(crate) struct ServerSettings {
    pub auth: AuthConfig,
    pub namespace: String,
    pub location_style: LocationStyle,
    pub default_receive_timeout: Duration,
    pub max_receive_timeout: Duration,
}

impl Shared {
    pub(crate) fn new(broker: Broker, settings: ServerSettings, local_addr: SocketAddr) -> Self {
        Self {
            broker: Mutex::new(broker),
            notify: Notify::new(),
            auth: settings.auth,
            namespace_host: format!(
                "{}.servicebus.windows.net",
                settings.namespace.to_ascii_lowercase()
            ),
            namespace: settings.namespace,
            location_style: settings.location_style,
            local_addr,
            default_receive_timeout: settings.default_receive_timeout,
            max_receive_timeout: settings.max_receive_timeout,
            counters: Counters::default(),
        }
    }

    /// The broker; a panic elsewhere never makes the state unusable.
    pub(crate) fn broker(&self) -> MutexGuard<'_, Broker> {
        self.broker.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// Returned by the service to make hyper close the connection without answering (the
/// `drop_response` fault).
#[derive(Debug)]
struct DropConnection;

impl std::fmt::Display for DropConnection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("response dropped by an injected fault")
    }
}

impl std::error::Error for DropConnection {}

/// Accepts connections until `shutdown` changes or its sender is dropped.
pub(crate) async fn serve(
    listener: TcpListener,
    shared: Arc<Shared>,
    mut shutdown: watch::Receiver<bool>,
) {
    loop {
        tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((stream, _peer)) => {
                    let shared = shared.clone();
                    let mut connection_shutdown = shutdown.clone();
                    tokio::spawn(async move {
                        let service = service_fn(move |req| handle(shared.clone(), req));
                        let connection = http1::Builder::new().serve_connection(TokioIo::new(stream), service);
                        tokio::select! {
                            result = connection => {
                                if let Err(error) = result {
                                    tracing::debug!(%error, "connection ended with an error");
                                }
                            }
                            _ = connection_shutdown.changed() => {}
                        }
                    });
                }
                Err(error) => {
                    tracing::warn!(%error, "accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            },
            _ = shutdown.changed() => break,
        }
    }
}

async fn handle(
    shared: Arc<Shared>,
    req: Request<Incoming>,
) -> Result<Response<Body>, DropConnection> {
    let path = percent_decode_str(req.uri().path())
        .decode_utf8_lossy()
        .into_owned();
    if let Some(rest) = strip_admin_prefix(&path) {
        let rest = rest.to_string();
        return Ok(admin::handle(&shared, req, &rest).await);
    }
    handlers::data_plane(shared, req, path).await
}
