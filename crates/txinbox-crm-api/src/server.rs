//! The HTTP/1.1 server: accept loop, routing and handlers.

use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use http_body_util::{BodyExt, Full, Limited};
use hyper::body::{Bytes, Incoming};
use hyper::header::{self, HeaderValue};
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use percent_encoding::percent_decode_str;
use serde_json::json;
use tokio::net::TcpListener;
use tokio::sync::watch;

use crate::create::{self, parse_new_task, Create};
use crate::faults::ArmFaults;
use crate::state::{task_json, Route, State};
use crate::v1;

/// The response body type.
pub(crate) type Body = Full<Bytes>;

/// The largest request body accepted; larger ones answer 413.
const MAX_REQUEST_BODY: usize = 1024 * 1024;

/// State shared by every connection and every handle.
#[derive(Debug)]
pub(crate) struct Shared {
    state: Mutex<State>,
    /// How long a create waits after performing and before answering: widens the window in which a
    /// caller can die between the call and its record (for chaos runs).
    pub(crate) latency: Duration,
    /// How long a create takes before the task exists (its key in progress meanwhile).
    pub(crate) processing: Duration,
    /// Creates held before their processing until released ([`crate::CrmApi::hold_next`]).
    pub(crate) holds: Holds,
}

/// The creates to hold, the ones held now, and their release: a generation each held create waits past.
#[derive(Debug)]
pub(crate) struct Holds {
    next: Mutex<u64>,
    held: Mutex<u64>,
    released: watch::Sender<u64>,
}

impl Holds {
    fn new() -> Self {
        Self {
            next: Mutex::new(0),
            held: Mutex::new(0),
            released: watch::channel(0).0,
        }
    }

    /// Whether the next create that goes on to its processing is to be held.
    pub(crate) fn armed(&self) -> bool {
        *self.next.lock().unwrap_or_else(PoisonError::into_inner) > 0
    }

    /// Holds one create if armed: the release it waits for, `None` when it goes on at once.
    pub(crate) fn take(&self) -> Option<watch::Receiver<u64>> {
        let mut next = self.next.lock().unwrap_or_else(PoisonError::into_inner);
        if *next == 0 {
            return None;
        }
        *next -= 1;
        *self.held.lock().unwrap_or_else(PoisonError::into_inner) += 1;
        let mut rx = self.released.subscribe();
        rx.mark_unchanged();
        Some(rx)
    }

    /// Waits until the creates held when `rx` was taken are released (or the API stops).
    pub(crate) async fn wait(&self, mut rx: watch::Receiver<u64>) {
        let _ = rx.changed().await;
        let mut held = self.held.lock().unwrap_or_else(PoisonError::into_inner);
        *held = held.saturating_sub(1);
    }

    pub(crate) fn arm(&self, n: u64) {
        *self.next.lock().unwrap_or_else(PoisonError::into_inner) = n;
    }

    pub(crate) fn held(&self) -> u64 {
        *self.held.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Releases every create held now.
    pub(crate) fn release(&self) {
        self.released.send_modify(|g| *g += 1);
    }
}

impl Shared {
    pub(crate) fn new(state: State, latency: Duration, processing: Duration) -> Self {
        Self {
            state: Mutex::new(state),
            latency,
            processing,
            holds: Holds::new(),
        }
    }

    /// The state; a panic elsewhere never makes it unusable.
    pub(crate) fn state(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// Returned by the service to make hyper close the connection without answering (the
/// `drop_answer` fault).
#[derive(Debug)]
pub(crate) struct DropConnection;

impl std::fmt::Display for DropConnection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("answer dropped by an injected fault")
    }
}

impl std::error::Error for DropConnection {}

/// Accepts connections until `shutdown` changes or its sender is dropped; open connections are
/// closed at the same moment.
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
                        let connection =
                            http1::Builder::new().serve_connection(TokioIo::new(stream), service);
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

/// A refusal: status and message for the `{"error": ...}` body.
pub(crate) type Refusal = (StatusCode, String);

pub(crate) fn refusal(status: StatusCode, message: impl Into<String>) -> Refusal {
    (status, message.into())
}

async fn handle(
    shared: Arc<Shared>,
    req: Request<Incoming>,
) -> Result<Response<Body>, DropConnection> {
    let method = req.method().clone();
    let path = req.uri().path().to_string();
    tracing::debug!(%method, %path, "request");
    let asks = (method == Method::GET && (path == "/tasks" || path.starts_with("/v1/tasks")))
        || (method == Method::POST && path == "/v1/tasks/search");
    if asks {
        let mut state = shared.state();
        if state.faults.searches_rate_limited > 0 {
            state.faults.searches_rate_limited -= 1;
            tracing::info!(%method, %path, "search rate limited (injected fault)");
            return Ok(crate::create::fault_response(
                crate::faults::Fault::RateLimited,
                &state.faults,
            ));
        }
    }
    let response = match path.as_str() {
        "/v1/tasks" => match method {
            Method::POST => return v1::post(&shared, req).await,
            Method::GET => v1::list(&shared, req.uri().query()),
            _ => method_not_allowed("GET, POST"),
        },
        "/v1/tasks/search" => match method {
            Method::POST => v1::search(&shared, req).await,
            _ => method_not_allowed("POST"),
        },
        p if p.starts_with(v1::BY_REF) => match method {
            Method::PUT => return v1::upsert(&shared, &p[v1::BY_REF.len()..], req).await,
            _ => method_not_allowed("PUT"),
        },
        p if p.starts_with("/v1/tasks/") => match method {
            Method::GET => v1::get(&shared, &p["/v1/tasks/".len()..]),
            _ => method_not_allowed("GET"),
        },
        "/tasks" => match method {
            Method::POST => return post_task(&shared, req).await,
            Method::GET => get_tasks(&shared, req.uri().query()),
            _ => method_not_allowed("GET, POST"),
        },
        p if p.starts_with("/tasks/") => match method {
            Method::DELETE => {
                let id = &p["/tasks/".len()..];
                if shared.state().delete(id) {
                    tracing::info!(%id, "task deleted");
                    Response::builder()
                        .status(StatusCode::NO_CONTENT)
                        .body(Body::default())
                        .unwrap_or_default()
                } else {
                    error_response(StatusCode::NOT_FOUND, "not found")
                }
            }
            _ => method_not_allowed("DELETE"),
        },
        "/_faults" => match method {
            Method::POST => post_faults(&shared, req).await,
            Method::GET => json_response(StatusCode::OK, &shared.state().faults.view()),
            _ => method_not_allowed("GET, POST"),
        },
        "/_health" => match method {
            Method::GET | Method::HEAD => json_response(StatusCode::OK, &json!({"status": "ok"})),
            _ => method_not_allowed("GET"),
        },
        _ => error_response(StatusCode::NOT_FOUND, "not found"),
    };
    Ok(response)
}

/// `GET /tasks`: the listing, or the lookup shape (`404` when nothing matches). Both see a task only
/// `search_lag` after its creation.
fn get_tasks(shared: &Shared, query: Option<&str>) -> Response<Body> {
    let params = match parse_query(query.unwrap_or("")) {
        Ok(params) => params,
        Err((status, message)) => return error_response(status, &message),
    };
    let state = shared.state();
    let visible: Vec<_> = state.searchable(Instant::now()).collect();
    if params.key.is_none() && params.external_ref.is_none() {
        return json_response(StatusCode::OK, &json!({"tasks": visible}));
    }
    let by_key = params.key.as_deref().map(|k| {
        state
            .task_with_key(k)
            .filter(|t| visible.iter().any(|v| v.id == t.id))
    });
    let by_ref = params.external_ref.as_deref().map(|r| {
        visible
            .iter()
            .copied()
            .find(|t| t.external_ref.as_deref() == Some(r))
    });
    let found = match (by_key, by_ref) {
        (Some(a), Some(b)) => a.filter(|a| b.is_some_and(|b| a.id == b.id)),
        (Some(a), None) => a,
        (None, Some(b)) => b,
        (None, None) => None,
    };
    match found {
        Some(task) => raw_json_response(StatusCode::OK, task_json(task)),
        None => error_response(StatusCode::NOT_FOUND, "not found"),
    }
}

/// `POST /tasks`.
async fn post_task(
    shared: &Arc<Shared>,
    req: Request<Incoming>,
) -> Result<Response<Body>, DropConnection> {
    let (parts, body) = req.into_parts();
    let mode = shared.state().key_mode().clone();
    let create = match read_body(body).await {
        Ok(bytes) => match parse_new_task(&parts.headers, &bytes, &mode) {
            Ok(new) => Create::Post {
                route: Route::Legacy,
                new,
            },
            Err(refused) => Create::Refused(refused),
        },
        Err(refused) => Create::Refused(refused),
    };
    create::run(shared, create).await
}

/// The search parameters of `GET /tasks`.
#[derive(Debug, Default, PartialEq)]
pub(crate) struct Search {
    pub(crate) key: Option<String>,
    pub(crate) external_ref: Option<String>,
}

/// Parses `idempotency_key=K&external_ref=R` (form encoding: `%XX` and `+` for space). Unknown or
/// repeated parameters are refused so that a typo never turns a search into a listing.
pub(crate) fn parse_query(query: &str) -> Result<Search, Refusal> {
    let mut search = Search::default();
    for pair in query.split('&').filter(|p| !p.is_empty()) {
        let (name, value) = pair.split_once('=').unwrap_or((pair, ""));
        let name = decode_component(name)?;
        let value = decode_component(value)?;
        let slot = match name.as_str() {
            "idempotency_key" => &mut search.key,
            "external_ref" => &mut search.external_ref,
            _ => {
                return Err(refusal(
                    StatusCode::BAD_REQUEST,
                    format!("unknown query parameter {name:?}"),
                ))
            }
        };
        if slot.replace(value).is_some() {
            return Err(refusal(
                StatusCode::BAD_REQUEST,
                format!("query parameter {name:?} given twice"),
            ));
        }
    }
    Ok(search)
}

pub(crate) fn decode_component(raw: &str) -> Result<String, Refusal> {
    let spaced = raw.replace('+', " ");
    percent_decode_str(&spaced)
        .decode_utf8()
        .map(|s| s.into_owned())
        .map_err(|_| {
            refusal(
                StatusCode::BAD_REQUEST,
                "the query string is not valid UTF-8",
            )
        })
}

/// `POST /_faults`: arms faults (every field optional; absent ones left as they are).
async fn post_faults(shared: &Shared, req: Request<Incoming>) -> Response<Body> {
    let bytes = match read_body(req.into_body()).await {
        Ok(bytes) => bytes,
        Err((status, message)) => return error_response(status, &message),
    };
    let arm: ArmFaults = match serde_json::from_slice(&bytes) {
        Ok(arm) => arm,
        Err(e) => {
            return error_response(StatusCode::BAD_REQUEST, &format!("invalid faults: {e}"));
        }
    };
    let view = {
        let mut state = shared.state();
        if let Err(e) = arm.apply(&mut state.faults) {
            return error_response(StatusCode::BAD_REQUEST, &format!("invalid faults: {e}"));
        }
        state.faults.view()
    };
    tracing::info!(faults = ?view, "faults armed");
    json_response(StatusCode::OK, &view)
}

pub(crate) async fn read_body(body: Incoming) -> Result<Bytes, Refusal> {
    match Limited::new(body, MAX_REQUEST_BODY).collect().await {
        Ok(collected) => Ok(collected.to_bytes()),
        Err(error) if error.is::<http_body_util::LengthLimitError>() => Err(refusal(
            StatusCode::PAYLOAD_TOO_LARGE,
            format!("the body is larger than {MAX_REQUEST_BODY} bytes"),
        )),
        Err(_) => Err(refusal(
            StatusCode::BAD_REQUEST,
            "the body could not be read",
        )),
    }
}

pub(crate) fn raw_json_response(status: StatusCode, body: Vec<u8>) -> Response<Body> {
    let mut response = Response::new(Full::new(Bytes::from(body)));
    *response.status_mut() = status;
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    response
}

pub(crate) fn json_response(status: StatusCode, value: &impl serde::Serialize) -> Response<Body> {
    let body = serde_json::to_vec(value).unwrap_or_else(|_| b"{}".to_vec());
    raw_json_response(status, body)
}

/// `{"error": message}`.
pub(crate) fn error_response(status: StatusCode, message: &str) -> Response<Body> {
    json_response(status, &json!({ "error": message }))
}

pub(crate) fn method_not_allowed(allow: &'static str) -> Response<Body> {
    let mut response = error_response(StatusCode::METHOD_NOT_ALLOWED, "method not allowed");
    response
        .headers_mut()
        .insert(header::ALLOW, HeaderValue::from_static(allow));
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn queries_are_form_decoded_and_strict() {
        assert_eq!(parse_query("").unwrap(), Search::default());
        let search = parse_query("idempotency_key=a%2Fb+c&external_ref=r%C3%A9f").unwrap();
        assert_eq!(search.key.as_deref(), Some("a/b c"));
        assert_eq!(search.external_ref.as_deref(), Some("réf"));
        assert_eq!(
            parse_query("externalRef=x").unwrap_err().0,
            StatusCode::BAD_REQUEST
        );
        assert_eq!(
            parse_query("external_ref=a&external_ref=b").unwrap_err().0,
            StatusCode::BAD_REQUEST
        );
        assert_eq!(
            parse_query("external_ref=%FF").unwrap_err().0,
            StatusCode::BAD_REQUEST
        );
    }
}
