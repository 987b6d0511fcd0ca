//! Liveness and readiness for an orchestrator (Kubernetes probes, ECS health checks, Azure Container Apps
//! probes).
//!
//! A [`Health`] handle is given to the [`Worker`](crate::Worker) ([`Worker::health`](crate::Worker::health)),
//! which reports on it, and to whatever answers the probes: `serve` (feature `health-server`, a tiny HTTP
//! server: `GET /livez`, `GET /readyz`), or your own web framework through [`Health::liveness`] and
//! [`Health::readiness`].
//!
//! * **Liveness** (`/livez`): the worker's loop is running and has turned within
//!   [`live_timeout`](Health::live_timeout) (default 2 min; a long poll lasts at most 20 s, so a loop silent for
//!   longer is stuck). A loop waiting for a place out of the queue, every one held by a delivery in progress,
//!   is busy, not stuck: live however long the handlers take. A loop pausing after a failed receive (the
//!   back-off, up to [`WorkerOptions::receive_error_backoff_max`](crate::WorkerOptions::receive_error_backoff_max),
//!   which may be longer than the live timeout) waits on purpose: live until the pause ends and for the live
//!   timeout after it, since a restart would not bring the broker back (readiness says the queue fails). Map it
//!   to the liveness probe: failing, the orchestrator restarts the process. A loop that ended (shutdown, or gave
//!   up on persistent errors) is not live.
//! * **Readiness** (`/readyz`): the worker has started, is not stopping, its last receive succeeded (the queue is
//!   reachable and the worker is receiving), and every registered check passes, each within
//!   [`check_timeout`](Health::check_timeout) (default 2 s): add the database with
//!   [`Health::check`] (the stores implement [`HealthCheck`]: a ping, and on PostgreSQL whether the inbox's table is there,
//!   granted and writable). Map it to the readiness probe
//!   (Kubernetes, Container Apps) or to the load balancer's health check. It turns false while the database or
//!   the queue cannot be reached and true again once they can, without a restart.
//!
//! Both answer `200` with a body of one line per check (`ok database`, `fail queue: HTTP 401 ...`), or `503`. A
//! check added with [`Health::check_degraded`] (each shard of several) shows `degraded NAME: why` when it fails
//! and leaves the answer `200`.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU8, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

// Tokio's clock (the system's outside a paused test runtime), so that the liveness follows a paused clock.
use tokio::time::Instant;

/// A boxed future, as a [`HealthCheck`] returns it.
pub type CheckFuture<'a> = Pin<Box<dyn Future<Output = Result<(), String>> + Send + 'a>>;

/// Something readiness depends on: the database, a downstream API. `Err` carries a short reason for the probe's
/// body; it must not contain a secret.
pub trait HealthCheck: Send + Sync + 'static {
    /// Checks once.
    fn check(&self) -> CheckFuture<'_>;
}

impl<F, Fut> HealthCheck for F
where
    F: Fn() -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<(), String>> + Send + 'static,
{
    fn check(&self) -> CheckFuture<'_> {
        Box::pin(self())
    }
}

const NOT_STARTED: u8 = 0;
const RUNNING: u8 = 1;
const STOPPING: u8 = 2;
const STOPPED: u8 = 3;

/// A registered check: its name, the check, and whether readiness fails with it.
type Registered = (String, Arc<dyn HealthCheck>, bool);

struct Inner {
    state: AtomicU8,
    /// When the loop last turned, or, while it pauses on purpose after a failed receive, when that pause ends
    /// (a time to come): the live timeout counts from there.
    last_turn: Mutex<Instant>,
    receive_ok: AtomicBool,
    /// The loop waits for a place out of the queue: every place holds a delivery in progress.
    waiting_for_place: AtomicBool,
    receive_error: Mutex<Option<String>>,
    checks: Mutex<Vec<Registered>>,
    live_timeout: Mutex<Duration>,
    check_timeout: Mutex<Duration>,
}

/// The health of one worker (cheap to clone: clones share the state). See the [module docs](self).
#[derive(Clone)]
pub struct Health {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for Health {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Health")
            .field("state", &self.inner.state.load(Ordering::SeqCst))
            .field("receive_ok", &self.inner.receive_ok.load(Ordering::SeqCst))
            .finish_non_exhaustive()
    }
}

impl Default for Health {
    fn default() -> Self {
        Self::new()
    }
}

/// One line of a probe's answer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CheckResult {
    /// `worker`, `queue`, or the name given to [`Health::check`].
    pub name: String,
    /// Whether it passed.
    pub ok: bool,
    /// Why not (empty when ok).
    pub detail: String,
    /// Whether readiness fails with it (false for a check added with [`Health::check_degraded`]: its failure
    /// is shown as `degraded NAME: ...` and readiness stays true).
    pub required: bool,
}

/// A probe's answer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HealthStatus {
    /// Whether every check passed.
    pub ok: bool,
    /// Each check.
    pub checks: Vec<CheckResult>,
}

impl std::fmt::Display for HealthStatus {
    /// One line per check: `ok NAME` or `fail NAME: DETAIL`.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        for c in &self.checks {
            if c.ok {
                writeln!(f, "ok {}", c.name)?;
            } else if !c.required {
                writeln!(f, "degraded {}: {}", c.name, c.detail)?;
            } else {
                writeln!(f, "fail {}: {}", c.name, c.detail)?;
            }
        }
        Ok(())
    }
}

fn result(name: &str, ok: bool, detail: impl Into<String>) -> CheckResult {
    CheckResult {
        name: name.into(),
        ok,
        detail: if ok { String::new() } else { detail.into() },
        required: true,
    }
}

impl Health {
    /// A handle for a worker that has not started.
    pub fn new() -> Self {
        Self {
            inner: Arc::new(Inner {
                state: AtomicU8::new(NOT_STARTED),
                last_turn: Mutex::new(Instant::now()),
                receive_ok: AtomicBool::new(true),
                waiting_for_place: AtomicBool::new(false),
                receive_error: Mutex::new(None),
                checks: Mutex::new(Vec::new()),
                live_timeout: Mutex::new(Duration::from_secs(120)),
                check_timeout: Mutex::new(Duration::from_secs(2)),
            }),
        }
    }

    /// Sets how long the worker's loop may stay silent and still be live (default 2 min).
    pub fn live_timeout(self, d: Duration) -> Self {
        *lock(&self.inner.live_timeout) = d;
        self
    }

    /// Sets how long one readiness check may take before it counts as failed (default 2 s).
    pub fn check_timeout(self, d: Duration) -> Self {
        *lock(&self.inner.check_timeout) = d;
        self
    }

    /// Adds a readiness check named `name` (`database`, ...).
    pub fn check(self, name: impl Into<String>, check: impl HealthCheck) -> Self {
        lock(&self.inner.checks).push((name.into(), Arc::new(check), true));
        self
    }

    /// Adds a check whose failure readiness reports (`degraded NAME: why`) without failing: a part the worker
    /// can run without for a while, such as one shard of several ([`crate::runtime::shards`]).
    pub fn check_degraded(self, name: impl Into<String>, check: impl HealthCheck) -> Self {
        lock(&self.inner.checks).push((name.into(), Arc::new(check), false));
        self
    }

    /// Whether a check named `name` was added.
    pub(crate) fn has_check(&self, name: &str) -> bool {
        lock(&self.inner.checks).iter().any(|(n, _, _)| n == name)
    }

    /// The worker started its loop.
    pub fn worker_started(&self) {
        *lock(&self.inner.last_turn) = Instant::now();
        self.inner.state.store(RUNNING, Ordering::SeqCst);
    }

    /// The worker's loop turned (it is about to receive, or has just received).
    pub fn worker_turned(&self) {
        self.turn_by(Instant::now());
    }

    /// The loop pauses on purpose for `pause` after a failed receive (the back-off): live until the pause ends
    /// and for the live timeout after it, however long the pause (up to
    /// [`WorkerOptions::receive_error_backoff_max`](crate::WorkerOptions::receive_error_backoff_max)).
    pub(crate) fn worker_backing_off(&self, pause: Duration) {
        let now = Instant::now();
        self.turn_by(now.checked_add(pause).unwrap_or(now));
    }

    /// The loop turned, or will have by `at`: never moves the promise back (several loops share it, and one
    /// turning does not cut another's pause short).
    fn turn_by(&self, at: Instant) {
        let mut last = lock(&self.inner.last_turn);
        *last = (*last).max(at);
    }

    /// The loop waits for a place out of the queue (`true`: every place holds a delivery being applied,
    /// settled or waiting for its slot), or has one (`false`, a turn). Busy, not stuck: live meanwhile, however
    /// long the handlers take.
    pub(crate) fn worker_waiting_for_place(&self, waiting: bool) {
        if !waiting {
            self.worker_turned();
        }
        self.inner
            .waiting_for_place
            .store(waiting, Ordering::SeqCst);
    }

    /// A receive succeeded (even when it brought nothing).
    pub fn receive_succeeded(&self) {
        self.worker_turned();
        self.inner.receive_ok.store(true, Ordering::SeqCst);
        *lock(&self.inner.receive_error) = None;
    }

    /// A receive failed with `error` (its `Display`, which never holds a secret for the adapters here; what it
    /// quotes all the same is masked: [`redact_secrets`](crate::error::redact_secrets)).
    pub fn receive_failed(&self, error: &dyn std::fmt::Display) {
        self.worker_turned();
        self.inner.receive_ok.store(false, Ordering::SeqCst);
        *lock(&self.inner.receive_error) = Some(crate::error::redact_secrets(&error.to_string()));
    }

    /// The worker stopped receiving and drains.
    pub fn worker_stopping(&self) {
        self.inner.state.store(STOPPING, Ordering::SeqCst);
    }

    /// The worker's run returned.
    pub fn worker_stopped(&self) {
        self.inner.state.store(STOPPED, Ordering::SeqCst);
    }

    /// Liveness: the loop runs (or drains) and turned within the live timeout, counted from the end of its
    /// back-off pause while it backs off after a failed receive.
    pub fn liveness(&self) -> HealthStatus {
        let state = self.inner.state.load(Ordering::SeqCst);
        let silent = Instant::now().saturating_duration_since(*lock(&self.inner.last_turn));
        let limit = *lock(&self.inner.live_timeout);
        let c = match state {
            NOT_STARTED => result("worker", true, ""), // starting: give it time (a startup probe's job)
            STOPPED => result("worker", false, "the worker's loop has ended"),
            _ if state == RUNNING
                && silent > limit
                && !self.inner.waiting_for_place.load(Ordering::SeqCst) =>
            {
                result(
                    "worker",
                    false,
                    format!(
                        "the worker's loop has not turned for {} s (limit {} s)",
                        silent.as_secs(),
                        limit.as_secs()
                    ),
                )
            }
            _ => result("worker", true, ""),
        };
        HealthStatus {
            ok: c.ok,
            checks: vec![c],
        }
    }

    /// Readiness: started, not stopping, the last receive succeeded, and every check passes (run now, each
    /// within the check timeout, all at once).
    pub async fn readiness(&self) -> HealthStatus {
        let state = self.inner.state.load(Ordering::SeqCst);
        let mut checks = vec![match state {
            NOT_STARTED => result("worker", false, "not started"),
            RUNNING => result("worker", true, ""),
            STOPPING => result("worker", false, "stopping"),
            _ => result("worker", false, "stopped"),
        }];
        let receive_ok = self.inner.receive_ok.load(Ordering::SeqCst);
        checks.push(result(
            "queue",
            receive_ok,
            lock(&self.inner.receive_error)
                .clone()
                .unwrap_or_else(|| "the last receive failed".into()),
        ));
        let registered: Vec<_> = lock(&self.inner.checks).clone();
        let timeout = *lock(&self.inner.check_timeout);
        let results =
            futures::future::join_all(registered.iter().map(|(name, c, required)| async move {
                let mut r = match tokio::time::timeout(timeout, c.check()).await {
                    Ok(Ok(())) => result(name, true, ""),
                    // Answered to whoever asks: a credential the reason quotes anyway is masked.
                    Ok(Err(e)) => result(name, false, crate::error::redact_secrets(&e)),
                    Err(_) => result(
                        name,
                        false,
                        format!("no answer within {} ms", timeout.as_millis()),
                    ),
                };
                r.required = *required;
                r
            }))
            .await;
        checks.extend(results);
        HealthStatus {
            ok: checks.iter().all(|c| c.ok || !c.required),
            checks,
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// Serves `GET /livez` and `GET /readyz` for `health` on `listener` until `shutdown` resolves (feature
/// `health-server`). Any other path is `404`; any other method `405`. Each answer is `200` or `503` with the
/// status's lines as `text/plain`.
///
/// ```no_run
/// # async fn run(health: txinbox_core::runtime::health::Health) -> std::io::Result<()> {
/// let listener = tokio::net::TcpListener::bind("0.0.0.0:8080").await?;
/// tokio::spawn(txinbox_core::runtime::health::serve(listener, health, std::future::pending()));
/// # Ok(()) }
/// ```
#[cfg(feature = "health-server")]
pub async fn serve(
    listener: tokio::net::TcpListener,
    health: Health,
    shutdown: impl Future<Output = ()> + Send,
) {
    use http_body_util::Full;
    use hyper::body::Bytes;
    use hyper::{Method, Response, StatusCode};

    tokio::pin!(shutdown);
    loop {
        let (stream, _) = tokio::select! {
            _ = &mut shutdown => return,
            a = listener.accept() => match a {
                Ok(a) => a,
                Err(e) => {
                    tracing::warn!(error = %e, "health endpoint: accept failed");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            },
        };
        let health = health.clone();
        tokio::spawn(async move {
            let svc =
                hyper::service::service_fn(move |req: hyper::Request<hyper::body::Incoming>| {
                    let health = health.clone();
                    async move {
                        let status = match (req.method(), req.uri().path()) {
                            (&Method::GET, "/livez") => Some(health.liveness()),
                            (&Method::GET, "/readyz") => Some(health.readiness().await),
                            _ => None,
                        };
                        let (code, body) = match (status, req.method() == Method::GET) {
                            (Some(s), _) if s.ok => (StatusCode::OK, s.to_string()),
                            (Some(s), _) => (StatusCode::SERVICE_UNAVAILABLE, s.to_string()),
                            (None, true) => (StatusCode::NOT_FOUND, "not found\n".into()),
                            (None, false) => (StatusCode::METHOD_NOT_ALLOWED, "GET only\n".into()),
                        };
                        Ok::<_, std::convert::Infallible>(
                            Response::builder()
                                .status(code)
                                .header("content-type", "text/plain; charset=utf-8")
                                .header("cache-control", "no-store")
                                .body(Full::new(Bytes::from(body)))
                                .unwrap_or_default(),
                        )
                    }
                });
            let io = hyper_util::rt::TokioIo::new(stream);
            let conn = hyper::server::conn::http1::Builder::new()
                .timer(hyper_util::rt::TokioTimer::new())
                .header_read_timeout(Duration::from_secs(5))
                .serve_connection(io, svc);
            if let Err(e) = conn.await {
                tracing::debug!(error = %e, "health endpoint: connection ended with an error");
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn readiness_follows_the_worker_the_queue_and_the_checks() {
        let db_up = Arc::new(AtomicBool::new(true));
        let flag = db_up.clone();
        let h = Health::new().check("database", move || {
            let up = flag.load(Ordering::SeqCst);
            async move {
                if up {
                    Ok(())
                } else {
                    Err("connection refused".to_string())
                }
            }
        });
        assert!(!h.readiness().await.ok, "not started");
        assert!(h.liveness().ok, "starting counts as live");
        h.worker_started();
        assert!(h.readiness().await.ok);
        h.receive_failed(&"HTTP 401 (Unauthorized)");
        let r = h.readiness().await;
        assert!(!r.ok);
        assert!(r.to_string().contains("fail queue: HTTP 401"), "{r}");
        h.receive_succeeded();
        assert!(h.readiness().await.ok);
        db_up.store(false, Ordering::SeqCst);
        let r = h.readiness().await;
        assert_eq!(
            r.to_string(),
            "ok worker\nok queue\nfail database: connection refused\n"
        );
        db_up.store(true, Ordering::SeqCst);
        assert!(h.readiness().await.ok);
        h.worker_stopping();
        assert!(!h.readiness().await.ok);
        assert!(h.liveness().ok, "draining is alive");
        h.worker_stopped();
        assert!(!h.liveness().ok);
    }

    /// Readiness is answered to whoever asks the health port: a check's reason or a receive's error that
    /// quotes a credential (a URL's password, a SAS `sig=`) is answered masked.
    #[tokio::test]
    async fn readiness_masks_a_secret_its_reasons_quote() {
        let h = Health::new().check("crm", || async {
            Err(
                "https://crm.example/v1/ping?api=1 via postgres://crm:SECRETpw1@db/crm, \
                 https://hooks.slack.com/services/T0/B0/SECRETtoken3"
                    .to_string(),
            )
        });
        h.worker_started();
        h.receive_failed(&"HTTP 401 from https://ns.servicebus.windows.net/q?sig=SECRETsig2&se=1");
        let r = h.readiness().await.to_string();
        for secret in ["SECRETpw1", "SECRETsig2", "SECRETtoken3"] {
            assert!(!r.contains(secret), "{secret} in {r}");
        }
        assert!(
            r.contains("fail crm: https://crm.example/v1/***?api=***"),
            "{r}"
        );
        assert!(r.contains("fail queue: HTTP 401"), "{r}");
    }

    /// One HTTP/1.1 request over a raw socket; the status line and the body.
    #[cfg(feature = "health-server")]
    async fn get(addr: std::net::SocketAddr, req: &str) -> (String, String) {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
        s.write_all(req.as_bytes()).await.unwrap();
        let mut out = String::new();
        s.read_to_string(&mut out).await.unwrap();
        let status = out.lines().next().unwrap_or_default().to_owned();
        let body = out.split("\r\n\r\n").nth(1).unwrap_or_default().to_owned();
        (status, body)
    }

    #[cfg(feature = "health-server")]
    #[tokio::test]
    async fn the_server_answers_the_probes() {
        let h = Health::new();
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = l.local_addr().unwrap();
        let stop = tokio_util::sync::CancellationToken::new();
        let server = tokio::spawn(serve(l, h.clone(), stop.clone().cancelled_owned()));
        let get_path =
            |p: &str| format!("GET {p} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
        let (status, body) = get(addr, &get_path("/readyz")).await;
        assert!(status.contains("503"), "{status}");
        assert_eq!(body, "fail worker: not started\nok queue\n");
        h.worker_started();
        let (status, body) = get(addr, &get_path("/readyz")).await;
        assert!(status.contains("200"), "{status}");
        assert_eq!(body, "ok worker\nok queue\n");
        assert!(get(addr, &get_path("/livez")).await.0.contains("200"));
        assert!(get(addr, &get_path("/metrics")).await.0.contains("404"));
        let post =
            "POST /readyz HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\nConnection: close\r\n\r\n";
        assert!(get(addr, post).await.0.contains("405"));
        // Garbage is answered (400) or dropped, never a panic; the server keeps serving.
        let _ = get(addr, "\u{0}\u{1}NOT HTTP\r\n\r\n").await;
        assert!(get(addr, &get_path("/livez")).await.0.contains("200"));
        stop.cancel();
        server.await.unwrap();
    }

    #[tokio::test]
    async fn a_silent_loop_is_not_live_and_a_hung_check_is_not_ready() {
        let h = Health::new()
            .live_timeout(Duration::from_millis(20))
            .check_timeout(Duration::from_millis(20))
            .check("database", std::future::pending::<Result<(), String>>);
        h.worker_started();
        tokio::time::sleep(Duration::from_millis(40)).await;
        assert!(!h.liveness().ok);
        h.worker_turned();
        assert!(h.liveness().ok);
        let r = h.readiness().await;
        assert!(
            r.to_string()
                .contains("fail database: no answer within 20 ms"),
            "{r}"
        );
    }
}
