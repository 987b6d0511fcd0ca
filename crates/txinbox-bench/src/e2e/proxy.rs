//! A latency-injecting HTTP proxy of our own, for a broker emulator that answers at once: every request waits
//! half the round trip before it is forwarded and its answer half the round trip before it is returned, as a link
//! of that round trip would. Requests are counted by their `X-Amz-Target` (the action of the SQS JSON protocol),
//! and the messages deleted are read from the answers: what the benchmark divides by the messages it moved, and
//! how it knows a run is over.

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use http_body_util::{BodyExt, Full};
use hyper::body::{Bytes, Incoming};
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use txinbox_lab::lab::LabError;

/// Requests seen, by action, and messages the upstream answered as deleted.
#[derive(Default)]
pub(crate) struct Counts {
    actions: Mutex<BTreeMap<String, u64>>,
    deleted: AtomicU64,
}

impl Counts {
    fn count(&self, action: &str) {
        let mut actions = self.actions.lock().unwrap_or_else(|p| p.into_inner());
        *actions.entry(action.to_owned()).or_default() += 1;
    }

    /// Requests of each action so far.
    pub(crate) fn actions(&self) -> BTreeMap<String, u64> {
        self.actions
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// Messages deleted so far (entries of `DeleteMessageBatch` answered as successful, `DeleteMessage`
    /// answered 200).
    pub(crate) fn deleted(&self) -> u64 {
        self.deleted.load(Ordering::Relaxed)
    }
}

struct State {
    upstream: String,
    one_way: Duration,
    client: reqwest::Client,
    counts: Arc<Counts>,
}

/// The running proxy; stops when dropped.
pub(crate) struct LatencyProxy {
    pub(crate) url: String,
    pub(crate) counts: Arc<Counts>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for LatencyProxy {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl LatencyProxy {
    /// A proxy on a loopback port in front of `upstream` (`http://host:port`), adding `round_trip` to every
    /// request and its answer (half each way).
    pub(crate) async fn start(upstream: &str, round_trip: Duration) -> Result<Self, LabError> {
        let (listener, addr) = super::loopback_listener("the latency proxy").await?;
        let client = reqwest::Client::builder()
            .timeout(Duration::from_secs(60))
            .build()
            .map_err(|e| LabError::Usage(format!("the latency proxy's client: {e}")))?;
        let counts = Arc::new(Counts::default());
        let state = Arc::new(State {
            upstream: upstream.trim_end_matches('/').to_owned(),
            one_way: round_trip / 2,
            client,
            counts: counts.clone(),
        });
        let task = tokio::spawn(async move {
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    continue;
                };
                let state = state.clone();
                tokio::spawn(async move {
                    let service = service_fn(move |req| forward(req, state.clone()));
                    let _ = http1::Builder::new()
                        .serve_connection(TokioIo::new(stream), service)
                        .await;
                });
            }
        });
        Ok(Self {
            url: format!("http://{addr}"),
            counts,
            task,
        })
    }
}

/// Forwards one request after half the round trip, and answers after the other half.
async fn forward(
    req: Request<Incoming>,
    state: Arc<State>,
) -> Result<Response<Full<Bytes>>, Infallible> {
    let (parts, body) = req.into_parts();
    let Ok(body) = body.collect().await.map(|b| b.to_bytes()) else {
        return Ok(status(StatusCode::BAD_REQUEST));
    };
    let action = parts
        .headers
        .get("x-amz-target")
        .and_then(|v| v.to_str().ok())
        .map_or("other", |t| t.rsplit('.').next().unwrap_or(t))
        .to_owned();
    state.counts.count(&action);
    txinbox_sb_emulator::wait_exactly(state.one_way).await;
    let path = parts.uri.path_and_query().map_or("/", |p| p.as_str());
    let mut request = state
        .client
        .request(parts.method, format!("{}{path}", state.upstream))
        .body(body);
    for (name, value) in &parts.headers {
        if !matches!(
            name.as_str(),
            "host" | "content-length" | "connection" | "transfer-encoding"
        ) {
            request = request.header(name, value);
        }
    }
    let answer = match request.send().await {
        Ok(a) => a,
        Err(_) => return Ok(status(StatusCode::BAD_GATEWAY)),
    };
    let code = answer.status();
    let headers = answer.headers().clone();
    let Ok(bytes) = answer.bytes().await else {
        return Ok(status(StatusCode::BAD_GATEWAY));
    };
    if code.is_success() {
        let deleted = match action.as_str() {
            "DeleteMessage" => 1,
            "DeleteMessageBatch" => serde_json::from_slice::<serde_json::Value>(&bytes)
                .ok()
                .and_then(|v| v.get("Successful")?.as_array().map(|a| a.len() as u64))
                .unwrap_or(0),
            _ => 0,
        };
        state.counts.deleted.fetch_add(deleted, Ordering::Relaxed);
    }
    txinbox_sb_emulator::wait_exactly(state.one_way).await;
    let mut response = Response::new(Full::new(bytes));
    *response.status_mut() = code;
    for (name, value) in &headers {
        if !matches!(
            name.as_str(),
            "content-length" | "connection" | "transfer-encoding"
        ) {
            response.headers_mut().append(name, value.clone());
        }
    }
    Ok(response)
}

fn status(code: StatusCode) -> Response<Full<Bytes>> {
    let mut r = Response::new(Full::new(Bytes::new()));
    *r.status_mut() = code;
    r
}
