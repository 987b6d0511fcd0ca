//! The create pipeline shared by `POST /tasks`, `POST /v1/tasks` and
//! `PUT /v1/tasks/by_ref/{external_ref}`: the request's fault, the processing time (in a spawned
//! task, so a client that goes away never cancels it), the latency and the answer.

use std::sync::Arc;

use hyper::header::{HeaderMap, HeaderName, HeaderValue, RETRY_AFTER};
use hyper::{Response, StatusCode};
use serde_json::{json, Map, Value};

use crate::faults::{Fault, Faults};
use crate::server::{
    error_response, json_response, raw_json_response, refusal, Body, DropConnection, Refusal,
    Shared,
};
use crate::state::{PostOutcome, Route, State};
use crate::KeyMode;

/// Set on a response replayed for a known idempotency key.
const IDEMPOTENT_REPLAYED: &str = "idempotent-replayed";

/// A well-formed `POST /tasks` or `POST /v1/tasks`.
#[derive(Debug)]
pub(crate) struct NewTask {
    pub(crate) key: Option<String>,
    pub(crate) body: Value,
    pub(crate) external_ref: Option<String>,
}

/// One create request, as parsed.
#[derive(Debug)]
pub(crate) enum Create {
    /// Malformed: answered with this refusal (after its fault, which it still consumes).
    Refused(Refusal),
    /// `POST /tasks` or `POST /v1/tasks`.
    Post { route: Route, new: NewTask },
    /// `PUT /v1/tasks/by_ref/{external_ref}`.
    Upsert { external_ref: String, body: Value },
}

impl Create {
    fn label(&self) -> &'static str {
        match self {
            Create::Post {
                route: Route::Legacy,
                ..
            } => "POST /tasks",
            Create::Post {
                route: Route::V1, ..
            } => "POST /v1/tasks",
            Create::Upsert { .. } | Create::Refused(_) => "create",
        }
    }
}

/// Work left for after the processing time.
#[derive(Debug)]
enum Job {
    /// A create whose key (if any) is reserved as in progress.
    Post {
        route: Route,
        new: NewTask,
    },
    Upsert {
        external_ref: String,
        body: Value,
    },
}

/// Runs one create request through its fault, its processing and the latency.
pub(crate) async fn run(
    shared: &Arc<Shared>,
    create: Create,
) -> Result<Response<Body>, DropConnection> {
    let label = create.label();
    let processing = shared.processing;
    let (fault, now_or_later, hold) = {
        let mut state = shared.state();
        let fault = state.begin_post();
        let step = if fault.before() {
            Ok(fault_response(fault, &state.faults))
        } else {
            // A create to hold goes the way of one that takes processing time: its key reserved first.
            let at_once = processing.is_zero() && !shared.holds.armed();
            first_step(&mut state, create, at_once)
        };
        // Only a create left for later is held; one answered at once (a replay, a 409) is not.
        let hold = match step {
            Err(_) => shared.holds.take(),
            Ok(_) => None,
        };
        (fault, step, hold)
    };
    if fault != Fault::None {
        tracing::warn!(fault = fault.name(), "{label}: injected fault");
    }
    let response = match now_or_later {
        Ok(response) => response,
        Err(job) => {
            // Spawned: the processing completes even if the client goes away meanwhile.
            let shared = shared.clone();
            let finished = tokio::spawn(async move {
                if let Some(release) = hold {
                    tracing::info!("{label}: held until released");
                    shared.holds.wait(release).await;
                }
                tokio::time::sleep(processing).await;
                let mut state = shared.state();
                finish(&mut state, job)
            });
            finished.await.unwrap_or_else(|_| {
                error_response(StatusCode::INTERNAL_SERVER_ERROR, "the create task failed")
            })
        }
    };
    if !shared.latency.is_zero() {
        tokio::time::sleep(shared.latency).await;
    }
    match fault {
        Fault::DropAnswer => {
            tracing::warn!(
                status = response.status().as_u16(),
                "{label} performed; answer dropped by an injected fault"
            );
            Err(DropConnection)
        }
        Fault::Gateway504 => {
            let state = shared.state();
            Ok(fault_response(fault, &state.faults))
        }
        _ => Ok(response),
    }
}

/// Answers at once, or leaves a job for after the processing time (`Err`).
fn first_step(state: &mut State, create: Create, at_once: bool) -> Result<Response<Body>, Job> {
    match create {
        Create::Refused((status, message)) => Ok(error_response(status, &message)),
        Create::Post { route, new } if at_once => {
            let key = new.key.clone().unwrap_or_default();
            let outcome = state.post(route, new.key, new.body, new.external_ref);
            Ok(outcome_response(&key, outcome))
        }
        Create::Post { route, new } => match state.reserve(route, new.key.as_deref(), &new.body) {
            Some(outcome) => Ok(outcome_response(
                new.key.as_deref().unwrap_or_default(),
                outcome,
            )),
            None => Err(Job::Post { route, new }),
        },
        Create::Upsert { external_ref, body } if at_once => {
            Ok(finish(state, Job::Upsert { external_ref, body }))
        }
        Create::Upsert { external_ref, body } => Err(Job::Upsert { external_ref, body }),
    }
}

fn finish(state: &mut State, job: Job) -> Response<Body> {
    match job {
        Job::Post { route, new } => {
            let key = new.key.clone().unwrap_or_default();
            let outcome = state.create(route, new.key, new.body, new.external_ref);
            outcome_response(&key, outcome)
        }
        Job::Upsert { external_ref, body } => {
            let (id, created) = state.upsert(&external_ref, body);
            tracing::info!(%external_ref, %id, created, "task upserted");
            let status = if created {
                StatusCode::CREATED
            } else {
                StatusCode::OK
            };
            json_response(status, &json!({"id": id, "created": created}))
        }
    }
}

fn outcome_response(key: &str, outcome: PostOutcome) -> Response<Body> {
    match outcome {
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
        PostOutcome::KeyUsedElsewhere => {
            tracing::info!(%key, "idempotency key reused on another endpoint");
            error_response(
                StatusCode::UNPROCESSABLE_ENTITY,
                "idempotency key reused on another endpoint",
            )
        }
        PostOutcome::InProgress => {
            tracing::info!(%key, "idempotency key still in progress");
            error_response(
                StatusCode::CONFLICT,
                "idempotency key in use: a request with this key is still being processed",
            )
        }
    }
}

/// The answer of a fault that answers (every one but `drop_answer`).
pub(crate) fn fault_response(fault: Fault, faults: &Faults) -> Response<Body> {
    let (status, message, retry_after) = match fault {
        Fault::FailBefore => (
            StatusCode::SERVICE_UNAVAILABLE,
            "service unavailable (injected fault)",
            false,
        ),
        Fault::Unavailable => (
            StatusCode::SERVICE_UNAVAILABLE,
            "service unavailable, retry later (injected fault)",
            true,
        ),
        Fault::RateLimited => (
            StatusCode::TOO_MANY_REQUESTS,
            "too many requests, retry later (injected fault)",
            true,
        ),
        Fault::Gateway502 => (
            StatusCode::BAD_GATEWAY,
            "bad gateway: the request was not forwarded (injected fault)",
            false,
        ),
        Fault::Gateway504 | Fault::None | Fault::DropAnswer => (
            StatusCode::GATEWAY_TIMEOUT,
            "gateway timeout: no answer from the upstream (injected fault)",
            false,
        ),
    };
    let mut response = error_response(status, message);
    if retry_after {
        if let Ok(value) = HeaderValue::from_str(&faults.retry_after()) {
            response.headers_mut().insert(RETRY_AFTER, value);
        }
    }
    response
}

/// Parses a `POST /tasks` or `POST /v1/tasks`: a JSON object, an optional string `external_ref`,
/// the key where the key mode says.
pub(crate) fn parse_new_task(
    headers: &HeaderMap,
    bytes: &[u8],
    mode: &KeyMode,
) -> Result<NewTask, Refusal> {
    let header_key = match mode {
        KeyMode::Header(name) => header_key(headers, name)?,
        _ => None,
    };
    let object = parse_object(bytes)?;
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
    let key = match mode {
        KeyMode::BodyField(field) => match object.get(field) {
            None | Some(Value::Null) => None,
            Some(Value::String(s)) if !s.is_empty() => Some(s.clone()),
            Some(_) => {
                return Err(refusal(
                    StatusCode::BAD_REQUEST,
                    format!("{field} must be a non-empty string"),
                ))
            }
        },
        _ => header_key,
    };
    Ok(NewTask {
        key,
        body: Value::Object(object),
        external_ref,
    })
}

/// A JSON object body.
pub(crate) fn parse_object(bytes: &[u8]) -> Result<Map<String, Value>, Refusal> {
    match serde_json::from_slice(bytes) {
        Ok(Value::Object(object)) => Ok(object),
        Ok(_) => Err(refusal(
            StatusCode::BAD_REQUEST,
            "the body must be a JSON object",
        )),
        Err(e) => Err(refusal(
            StatusCode::BAD_REQUEST,
            format!("malformed JSON: {e}"),
        )),
    }
}

/// The key header, taken as-is: one non-empty value of visible ASCII. `name` is matched
/// case-insensitively.
fn header_key(headers: &HeaderMap, name: &str) -> Result<Option<String>, Refusal> {
    let Ok(header) = HeaderName::from_bytes(name.as_bytes()) else {
        return Ok(None); // refused when the API starts
    };
    let mut values = headers.get_all(&header).iter();
    let Some(value) = values.next() else {
        return Ok(None);
    };
    if values.next().is_some() {
        return Err(refusal(
            StatusCode::BAD_REQUEST,
            format!("more than one {name} header"),
        ));
    }
    match value.to_str() {
        Ok(key) if !key.trim().is_empty() => Ok(Some(key.to_string())),
        _ => Err(refusal(
            StatusCode::BAD_REQUEST,
            format!("the {name} header must be non-empty visible ASCII"),
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn task_bodies_are_validated() {
        let mode = KeyMode::default();
        let headers = HeaderMap::new();
        assert!(parse_new_task(&headers, br#"{"a":1}"#, &mode).is_ok());
        for bad in [&b"{"[..], b"[1]", b"\"x\"", br#"{"external_ref":1}"#, b""] {
            assert_eq!(
                parse_new_task(&headers, bad, &mode).unwrap_err().0,
                StatusCode::BAD_REQUEST,
                "{bad:?}"
            );
        }
        let mut headers = HeaderMap::new();
        headers.append("idempotency-key", HeaderValue::from_static("k1"));
        headers.append("idempotency-key", HeaderValue::from_static("k2"));
        assert!(parse_new_task(&headers, b"{}", &mode).is_err());
        // Without idempotency support the header is ignored, however odd it is.
        let new = parse_new_task(&headers, b"{}", &KeyMode::None).unwrap();
        assert_eq!(new.key, None);
    }

    #[test]
    fn keys_come_from_the_configured_header_or_body_field() {
        let mut headers = HeaderMap::new();
        headers.insert("paypal-request-id", HeaderValue::from_static("p-1"));
        let paypal = KeyMode::Header("PayPal-Request-Id".into());
        let new = parse_new_task(&headers, b"{}", &paypal).unwrap();
        assert_eq!(new.key.as_deref(), Some("p-1"));
        assert_eq!(
            parse_new_task(&headers, b"{}", &KeyMode::default())
                .unwrap()
                .key,
            None
        );

        let square = KeyMode::BodyField("idempotency_key".into());
        let new = parse_new_task(&headers, br#"{"idempotency_key": "s-1"}"#, &square).unwrap();
        assert_eq!(new.key.as_deref(), Some("s-1"));
        assert_eq!(parse_new_task(&headers, b"{}", &square).unwrap().key, None);
        for bad in [
            &br#"{"idempotency_key": 3}"#[..],
            br#"{"idempotency_key": ""}"#,
        ] {
            assert!(parse_new_task(&headers, bad, &square).is_err());
        }
    }
}
