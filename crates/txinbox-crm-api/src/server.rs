//! The HTTP/1.1 server: accept loop, routing and handlers.

use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use http_body_util::{BodyExt, Full, Limited};
use hyper::body::{Bytes, Incoming};
use hyper::header::{self, HeaderMap, HeaderValue};
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use percent_encoding::percent_decode_str;
use serde_json::{json, Value};
use tokio::net::TcpListener;
use tokio::sync::watch;

use crate::state::{task_json, Fault, Faults, PostOutcome, State};

/// The response body type.
type Body = Full<Bytes>;

/// The largest request body accepted; larger ones answer 413.
const MAX_REQUEST_BODY: usize = 1024 * 1024;

/// The header of the IETF httpapi idempotency-key draft (Stripe's convention).
const IDEMPOTENCY_KEY: &str = "idempotency-key";

/// Set on a response replayed for a known idempotency key.
const IDEMPOTENT_REPLAYED: &str = "idempotent-replayed";

/// State shared by every connection and every handle.
#[derive(Debug)]
pub(crate) struct Shared {
    state: Mutex<State>,
    /// How long a `POST /tasks` waits after performing and before answering: widens the window in which a
    /// caller can die between the call and its record (for chaos runs).
    latency: std::time::Duration,
}

impl Shared {
    pub(crate) fn new(idempotency: bool, latency: std::time::Duration) -> Self {
        Self {
            state: Mutex::new(State::new(idempotency)),
            latency,
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
struct DropConnection;

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
type Refusal = (StatusCode, String);

fn refusal(status: StatusCode, message: impl Into<String>) -> Refusal {
    (status, message.into())
}

async fn handle(
    shared: Arc<Shared>,
    req: Request<Incoming>,
) -> Result<Response<Body>, DropConnection> {
    let method = req.method().clone();
    let path = req.uri().path().to_string();
    tracing::debug!(%method, %path, "request");
    let response = match path.as_str() {
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
            Method::GET => json_response(StatusCode::OK, &shared.state().faults()),
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

/// A well-formed `POST /tasks`.
#[derive(Debug)]
struct NewTask {
    key: Option<String>,
    body: Value,
    external_ref: Option<String>,
}

async fn post_task(
    shared: &Shared,
    req: Request<Incoming>,
) -> Result<Response<Body>, DropConnection> {
    let (parts, body) = req.into_parts();
    let idempotency = shared.state().idempotency();
    let parsed = match read_body(body).await {
        Ok(bytes) => parse_new_task(&parts.headers, &bytes, idempotency),
        Err(refused) => Err(refused),
    };
    let (fault, response) = {
        let mut state = shared.state();
        let fault = state.begin_post();
        let response = match (fault, parsed) {
            (Fault::FailBefore, _) => {
                tracing::warn!("POST /tasks refused with 503 by an injected fault");
                error_response(
                    StatusCode::SERVICE_UNAVAILABLE,
                    "service unavailable (injected fault)",
                )
            }
            (_, Err((status, message))) => error_response(status, &message),
            (_, Ok(new)) => {
                let key = new.key.clone().unwrap_or_default();
                match state.post(new.key, new.body, new.external_ref) {
                    PostOutcome::Created(body) => {
                        tracing::info!(%key, "task created");
                        raw_json_response(StatusCode::CREATED, body)
                    }
                    PostOutcome::Replayed(body) => {
                        tracing::info!(%key, "idempotent replay");
                        let mut response = raw_json_response(StatusCode::OK, body);
                        response
                            .headers_mut()
                            .insert(IDEMPOTENT_REPLAYED, HeaderValue::from_static("true"));
                        response
                    }
                    PostOutcome::KeyReused => {
                        tracing::info!(%key, "idempotency key reused with another body");
                        error_response(
                            StatusCode::UNPROCESSABLE_ENTITY,
                            "idempotency key reused with another body",
                        )
                    }
                }
            }
        };
        (fault, response)
    };
    if !shared.latency.is_zero() {
        tokio::time::sleep(shared.latency).await;
    }
    if fault == Fault::DropAnswer {
        tracing::warn!(
            status = response.status().as_u16(),
            "POST /tasks performed; answer dropped by an injected fault"
        );
        return Err(DropConnection);
    }
    Ok(response)
}

fn parse_new_task(
    headers: &HeaderMap,
    bytes: &[u8],
    idempotency: bool,
) -> Result<NewTask, Refusal> {
    let key = if idempotency {
        idempotency_key(headers)?
    } else {
        None
    };
    let body: Value = serde_json::from_slice(bytes)
        .map_err(|e| refusal(StatusCode::BAD_REQUEST, format!("malformed JSON: {e}")))?;
    let Value::Object(object) = &body else {
        return Err(refusal(
            StatusCode::BAD_REQUEST,
            "the body must be a JSON object",
        ));
    };
    let external_ref = match object.get("external_ref") {
        None | Some(Value::Null) => None,
        Some(Value::String(s)) => Some(s.clone()),
        Some(_) => {
            return Err(refusal(
                StatusCode::BAD_REQUEST,
                "external_ref must be a string",
            ))
        }
    };
    Ok(NewTask {
        key,
        body,
        external_ref,
    })
}

/// The `Idempotency-Key` header, taken as-is: one non-empty value of visible ASCII.
fn idempotency_key(headers: &HeaderMap) -> Result<Option<String>, Refusal> {
    let mut values = headers.get_all(IDEMPOTENCY_KEY).iter();
    let Some(value) = values.next() else {
        return Ok(None);
    };
    if values.next().is_some() {
        return Err(refusal(
            StatusCode::BAD_REQUEST,
            "more than one Idempotency-Key header",
        ));
    }
    match value.to_str() {
        Ok(key) if !key.trim().is_empty() => Ok(Some(key.to_string())),
        _ => Err(refusal(
            StatusCode::BAD_REQUEST,
            "the Idempotency-Key header must be non-empty visible ASCII",
        )),
    }
}

fn get_tasks(shared: &Shared, query: Option<&str>) -> Response<Body> {
    let params = match parse_query(query.unwrap_or("")) {
        Ok(params) => params,
        Err((status, message)) => return error_response(status, &message),
    };
    let state = shared.state();
    if params.key.is_none() && params.external_ref.is_none() {
        return json_response(StatusCode::OK, &json!({"tasks": state.tasks()}));
    }
    let by_key = params.key.as_deref().map(|k| state.task_with_key(k));
    let by_ref = params
        .external_ref
        .as_deref()
        .map(|r| state.task_with_external_ref(r));
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

/// The search parameters of `GET /tasks`.
#[derive(Debug, Default, PartialEq)]
struct Search {
    key: Option<String>,
    external_ref: Option<String>,
}

/// Parses `idempotency_key=K&external_ref=R` (form encoding: `%XX` and `+` for space). Unknown or
/// repeated parameters are refused so that a typo never turns a search into a listing.
fn parse_query(query: &str) -> Result<Search, Refusal> {
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

fn decode_component(raw: &str) -> Result<String, Refusal> {
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

async fn post_faults(shared: &Shared, req: Request<Incoming>) -> Response<Body> {
    /// Both fields optional: an absent one is left as it is.
    #[derive(Debug, serde::Deserialize)]
    #[serde(deny_unknown_fields)]
    struct ArmFaults {
        drop_answer: Option<u64>,
        fail_before: Option<u64>,
    }
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
    let faults: Faults = {
        let mut state = shared.state();
        if let Some(n) = arm.drop_answer {
            state.set_drop_answer(n);
        }
        if let Some(n) = arm.fail_before {
            state.set_fail_before(n);
        }
        state.faults()
    };
    tracing::info!(
        drop_answer = faults.drop_answer,
        fail_before = faults.fail_before,
        "faults armed"
    );
    json_response(StatusCode::OK, &faults)
}

async fn read_body(body: Incoming) -> Result<Bytes, Refusal> {
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

fn raw_json_response(status: StatusCode, body: Vec<u8>) -> Response<Body> {
    let mut response = Response::new(Full::new(Bytes::from(body)));
    *response.status_mut() = status;
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    response
}

fn json_response(status: StatusCode, value: &impl serde::Serialize) -> Response<Body> {
    let body = serde_json::to_vec(value).unwrap_or_else(|_| b"{}".to_vec());
    raw_json_response(status, body)
}

/// `{"error": message}`.
fn error_response(status: StatusCode, message: &str) -> Response<Body> {
    json_response(status, &json!({ "error": message }))
}

fn method_not_allowed(allow: &'static str) -> Response<Body> {
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

    #[test]
    fn task_bodies_are_validated() {
        let headers = HeaderMap::new();
        assert!(parse_new_task(&headers, br#"{"a":1}"#, true).is_ok());
        for bad in [&b"{"[..], b"[1]", b"\"x\"", br#"{"external_ref":1}"#, b""] {
            assert_eq!(
                parse_new_task(&headers, bad, true).unwrap_err().0,
                StatusCode::BAD_REQUEST,
                "{bad:?}"
            );
        }
        let mut headers = HeaderMap::new();
        headers.append(IDEMPOTENCY_KEY, HeaderValue::from_static("k1"));
        headers.append(IDEMPOTENCY_KEY, HeaderValue::from_static("k2"));
        assert!(parse_new_task(&headers, b"{}", true).is_err());
        // Without idempotency support the header is ignored, however odd it is.
        let new = parse_new_task(&headers, b"{}", false).unwrap();
        assert_eq!(new.key, None);
    }
}
