//! The control API under `/$emulator`: not part of Service Bus. Entity names cannot contain `$`,
//! so these paths never clash with an entity.

use hyper::body::Incoming;
use hyper::{Method, Request, Response, StatusCode};
use serde_json::{json, Value};
use tokio::time::Instant;

use crate::config::{QueueProperties, QueuePropertiesInput};
use crate::faults::FaultRule;
use crate::server::{json_response, read_admin_body, Body, Shared};

fn json_error(status: StatusCode, message: impl Into<String>) -> Response<Body> {
    json_response(status, &json!({ "error": message.into() }))
}

/// Handles `/$emulator{rest}`.
pub(crate) async fn handle(shared: &Shared, req: Request<Incoming>, rest: &str) -> Response<Body> {
    let method = req.method().clone();
    let rest = rest.trim_end_matches('/');
    if rest.eq_ignore_ascii_case("/health") {
        return match method {
            Method::GET => json_response(StatusCode::OK, &json!({"status": "ok"})),
            _ => json_error(StatusCode::METHOD_NOT_ALLOWED, "use GET"),
        };
    }
    if rest.eq_ignore_ascii_case("/reset") {
        return match method {
            Method::POST => {
                shared.broker().reset();
                shared.notify.notify_waiters();
                json_response(StatusCode::OK, &json!({"reset": true}))
            }
            _ => json_error(StatusCode::METHOD_NOT_ALLOWED, "use POST"),
        };
    }
    if rest.eq_ignore_ascii_case("/faults") {
        return faults(shared, req).await;
    }
    if rest.eq_ignore_ascii_case("/queues") {
        return match method {
            Method::GET => {
                let states = shared.broker().all_queue_states(Instant::now());
                json_response(StatusCode::OK, &states)
            }
            _ => json_error(
                StatusCode::METHOD_NOT_ALLOWED,
                "use GET, or PUT /$emulator/queues/{path}",
            ),
        };
    }
    if let Some(path) = strip_prefix_ignore_case(rest, "/queues/") {
        let path = path.to_string();
        return queue(shared, req, &path).await;
    }
    json_error(
        StatusCode::NOT_FOUND,
        format!("no control-API resource at /$emulator{rest}"),
    )
}

fn strip_prefix_ignore_case<'a>(text: &'a str, prefix: &str) -> Option<&'a str> {
    let head = text.get(..prefix.len())?;
    head.eq_ignore_ascii_case(prefix)
        .then(|| &text[prefix.len()..])
}

async fn queue(shared: &Shared, req: Request<Incoming>, path: &str) -> Response<Body> {
    match *req.method() {
        Method::PUT => {
            let Some(body) = read_admin_body(req.into_body()).await else {
                return json_error(
                    StatusCode::BAD_REQUEST,
                    "the body could not be read or is larger than 1 MiB",
                );
            };
            let input: QueuePropertiesInput = if body.iter().all(u8::is_ascii_whitespace) {
                QueuePropertiesInput::default()
            } else {
                match serde_json::from_slice(&body) {
                    Ok(input) => input,
                    Err(e) => {
                        return json_error(
                            StatusCode::BAD_REQUEST,
                            format!("invalid queue properties: {e}"),
                        )
                    }
                }
            };
            let props = match QueueProperties::default().apply(input) {
                Ok(props) => props,
                Err(e) => return json_error(StatusCode::BAD_REQUEST, e),
            };
            let mut broker = shared.broker();
            let created = match broker.put_queue(path, props) {
                Ok(created) => created,
                Err(e) => return json_error(StatusCode::BAD_REQUEST, e),
            };
            let state = broker.queue_state(path, Instant::now());
            drop(broker);
            shared.notify.notify_waiters();
            let status = if created {
                StatusCode::CREATED
            } else {
                StatusCode::OK
            };
            json_response(status, &state)
        }
        Method::GET => match shared.broker().queue_state(path, Instant::now()) {
            Some(state) => json_response(StatusCode::OK, &state),
            None => json_error(StatusCode::NOT_FOUND, format!("no queue {path:?}")),
        },
        Method::DELETE => {
            let deleted = shared.broker().delete_queue(path);
            if deleted {
                // Waiting receivers now answer 410.
                shared.notify.notify_waiters();
                json_response(StatusCode::OK, &json!({"deleted": path}))
            } else {
                json_error(StatusCode::NOT_FOUND, format!("no queue {path:?}"))
            }
        }
        _ => json_error(StatusCode::METHOD_NOT_ALLOWED, "use PUT, GET or DELETE"),
    }
}

async fn faults(shared: &Shared, req: Request<Incoming>) -> Response<Body> {
    match *req.method() {
        Method::GET => {
            let rules = shared.broker().faults.clone();
            json_response(StatusCode::OK, &rules)
        }
        Method::DELETE => {
            shared.broker().faults.clear();
            json_response(StatusCode::OK, &Vec::<FaultRule>::new())
        }
        Method::POST => {
            let Some(body) = read_admin_body(req.into_body()).await else {
                return json_error(
                    StatusCode::BAD_REQUEST,
                    "the body could not be read or is larger than 1 MiB",
                );
            };
            // One rule or an array of rules.
            let rules: Result<Vec<FaultRule>, _> = match serde_json::from_slice::<Value>(&body) {
                Ok(Value::Array(items)) => items.into_iter().map(serde_json::from_value).collect(),
                Ok(item) => serde_json::from_value(item).map(|rule| vec![rule]),
                Err(e) => Err(e),
            };
            let rules = match rules {
                Ok(rules) => rules,
                Err(e) => {
                    return json_error(StatusCode::BAD_REQUEST, format!("invalid fault rule: {e}"))
                }
            };
            if let Some(e) = rules.iter().find_map(|r| r.validate().err()) {
                return json_error(StatusCode::BAD_REQUEST, e);
            }
            let mut broker = shared.broker();
            broker.faults.extend(rules);
            let all = broker.faults.clone();
            json_response(StatusCode::CREATED, &all)
        }
        _ => json_error(StatusCode::METHOD_NOT_ALLOWED, "use GET, POST or DELETE"),
    }
}
