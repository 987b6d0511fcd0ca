//! Routing: recognising the control API's path prefix, and the data-plane operation a method and path name.

use hyper::{Method, StatusCode};

use super::{Refusal, ADMIN_PREFIX};
use crate::broker::{LockOperation, ReceiveMode};

pub(crate) fn strip_admin_prefix(path: &str) -> Option<&str> {
    let head = path.get(..ADMIN_PREFIX.len())?;
    if !head.eq_ignore_ascii_case(ADMIN_PREFIX) {
        return None;
    }
    let rest = &path[ADMIN_PREFIX.len()..];
    (rest.is_empty() || rest.starts_with('/')).then_some(rest)
}

/// A data-plane operation, found by splitting on the `messages` segment: entity paths can have
/// several segments [doc ADDR], so nothing assumes the entity is one segment.
#[derive(Debug)]
pub(crate) enum Route {
    Send {
        entity: String,
    },
    Receive {
        entity: String,
        mode: ReceiveMode,
    },
    Lock {
        entity: String,
        id: String,
        token: String,
        operation: LockOperation,
    },
}

pub(crate) fn parse_route(method: &Method, path: &str) -> Result<Route, Refusal> {
    let trimmed = path.trim_matches('/');
    let segments: Vec<&str> = trimmed.split('/').collect();
    let n = segments.len();
    let is_messages = |i: usize| segments[i].eq_ignore_ascii_case("messages");
    let entity = |end: usize| segments[..end].join("/");
    let not_allowed = || {
        (
            StatusCode::METHOD_NOT_ALLOWED,
            "The method is not allowed on this URI.",
        )
    };
    if n >= 2 && is_messages(n - 1) {
        // POST {entity}/messages [doc SEND, BATCH].
        return match *method {
            Method::POST => Ok(Route::Send {
                entity: entity(n - 1),
            }),
            _ => Err(not_allowed()),
        };
    }
    if n >= 3 && is_messages(n - 2) && segments[n - 1].eq_ignore_ascii_case("head") {
        let mode = match *method {
            // POST {entity}/messages/head: peek-lock [doc PEEK].
            Method::POST => ReceiveMode::PeekLock,
            // DELETE {entity}/messages/head: receive and delete [doc RAD].
            Method::DELETE => ReceiveMode::ReceiveAndDelete,
            _ => return Err(not_allowed()),
        };
        return Ok(Route::Receive {
            entity: entity(n - 2),
            mode,
        });
    }
    if n >= 4 && is_messages(n - 3) {
        let operation = match *method {
            // DELETE: complete ("Delete Message") [doc DEL].
            Method::DELETE => LockOperation::Complete,
            // PUT: abandon ("Unlock Message") [doc UNLOCK].
            Method::PUT => LockOperation::Abandon,
            // POST: renew lock [doc RENEW].
            Method::POST => LockOperation::Renew,
            _ => return Err(not_allowed()),
        };
        return Ok(Route::Lock {
            entity: entity(n - 3),
            id: segments[n - 2].to_string(),
            token: segments[n - 1].to_string(),
            operation,
        });
    }
    Err((
        StatusCode::BAD_REQUEST,
        "The request URI is not a Service Bus REST data-plane operation.",
    ))
}
