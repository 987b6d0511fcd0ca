//! The data-plane handlers: authentication, faults, send, receive with long polling, lock operations.

use std::sync::Arc;
use std::time::Duration;

use http_body_util::Full;
use hyper::body::Incoming;
use hyper::header::{self, HeaderName, HeaderValue};
use hyper::{Request, Response, StatusCode};
use tokio::time::Instant;

use super::response::{data_error_response, fault_response, read_body};
use super::{
    empty_response, error_response, parse_batch, parse_route, single_message, timeout_from_query,
    Body, DropConnection, Route, Shared,
};
use crate::auth::Target;
use crate::broker::{LockOperation, ReceiveMode, ReceiveOutcome};
use crate::faults::{self, FaultKind};
use crate::LocationStyle;

/// The most a request body may hold; larger sends answer 403 "message too large" [doc SEND].
const MAX_REQUEST_BODY: usize = 64 * 1024 * 1024;

/// The batch content type [doc BATCH].
const BATCH_CONTENT_TYPE: &str = "application/vnd.microsoft.servicebus.yml";

pub(super) async fn data_plane(
    shared: Arc<Shared>,
    req: Request<Incoming>,
    path: String,
) -> Result<Response<Body>, DropConnection> {
    let method = req.method().clone();
    let request_host = req
        .headers()
        .get(header::HOST)
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    let target = Target {
        namespace: &shared.namespace,
        namespace_host: &shared.namespace_host,
        request_host: request_host.as_deref(),
        path: &path,
    };
    let authorization = req
        .headers()
        .get(header::AUTHORIZATION)
        .map(HeaderValue::as_bytes);
    // 401 for a missing, malformed, expired or wrongly signed token [doc SEND, PEEK, SAS].
    if let Err(error) = shared
        .auth
        .check(authorization, &target, chrono::Utc::now().timestamp())
    {
        tracing::info!(%method, %path, reason = %error, "refused: 401");
        return Ok(error_response(StatusCode::UNAUTHORIZED, &error.to_string()));
    }
    let route = match parse_route(&method, &path) {
        Ok(route) => route,
        Err((status, detail)) => return Ok(error_response(status, detail)),
    };
    shared.counters.count(&route);
    let fault = faults::take_fault(&mut shared.broker().faults, method.as_str(), &path);
    let mut drop_response = false;
    let mut answer_instead = None;
    if let Some(fault) = fault {
        tracing::info!(%method, %path, kind = ?fault.kind, status = fault.status, "injected fault");
        match fault.kind {
            FaultKind::Status => return Ok(fault_response(&fault)),
            FaultKind::Delay => {
                let waited = crate::timer::wait(Duration::from_millis(fault.delay_ms)).await;
                shared.counters.delayed(waited);
            }
            FaultKind::DropResponse => drop_response = true,
            FaultKind::ApplyThenStatus => answer_instead = Some(fault),
        }
    }
    let query = req.uri().query().map(str::to_owned);
    let response = match route {
        Route::Send { entity } => send(&shared, req, &entity).await,
        Route::Receive { entity, mode } => {
            receive(
                &shared,
                &entity,
                mode,
                query.as_deref(),
                request_host.as_deref(),
            )
            .await
        }
        Route::Lock {
            entity,
            id,
            token,
            operation,
        } => {
            let result =
                shared
                    .broker()
                    .lock_operation(&entity, &id, &token, operation, Instant::now());
            match result {
                Ok(()) => {
                    if operation == LockOperation::Abandon {
                        shared.notify.notify_waiters();
                    }
                    // 200 with no body [doc DEL, UNLOCK, RENEW].
                    empty_response(StatusCode::OK)
                }
                Err(error) => data_error_response(&error),
            }
        }
    };
    tracing::debug!(%method, %path, status = response.status().as_u16(), "handled");
    if drop_response {
        return Err(DropConnection);
    }
    if let Some(fault) = answer_instead {
        return Ok(fault_response(&fault));
    }
    Ok(response)
}

async fn send(shared: &Shared, req: Request<Incoming>, entity: &str) -> Response<Body> {
    let (parts, body) = req.into_parts();
    let body = match read_body(body, MAX_REQUEST_BODY).await {
        Ok(body) => body,
        Err((status, detail)) => return error_response(status, detail),
    };
    let content_type = parts
        .headers
        .get(header::CONTENT_TYPE)
        .map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned());
    let is_batch = content_type.as_deref().is_some_and(|ct| {
        ct.trim()
            .to_ascii_lowercase()
            .starts_with(BATCH_CONTENT_TYPE)
    });
    let messages = if is_batch {
        parse_batch(&body)
    } else {
        single_message(&parts.headers, body, content_type)
    };
    let messages = match messages {
        Ok(messages) => messages,
        Err(detail) => return error_response(StatusCode::BAD_REQUEST, &detail),
    };
    let result = shared.broker().send(entity, messages, Instant::now());
    match result {
        Ok(()) => {
            shared.notify.notify_waiters();
            // 201 Created [doc SEND, BATCH].
            empty_response(StatusCode::CREATED)
        }
        Err(error) => data_error_response(&error),
    }
}

/// Peek-lock or receive-and-delete with long polling: the request is held until a message arrives
/// or `timeout` seconds pass, then 204 [doc PEEK, RAD; the parameter is undocumented, I-SPEC].
async fn receive(
    shared: &Shared,
    entity: &str,
    mode: ReceiveMode,
    query: Option<&str>,
    request_host: Option<&str>,
) -> Response<Body> {
    let timeout = match receive_timeout(shared, query) {
        Ok(timeout) => timeout,
        Err(detail) => return error_response(StatusCode::BAD_REQUEST, &detail),
    };
    // Capped so a huge configured maximum cannot overflow the clock.
    let deadline = Instant::now() + timeout.min(Duration::from_secs(24 * 60 * 60));
    loop {
        // Registered before looking, so a send between the look and the wait still wakes us.
        let notified = shared.notify.notified();
        tokio::pin!(notified);
        notified.as_mut().enable();
        let now = Instant::now();
        let outcome = shared.broker().receive(entity, mode, now);
        match outcome {
            Err(error) => return data_error_response(&error),
            Ok(ReceiveOutcome::Delivered(delivery)) => {
                return delivery_response(shared, *delivery, mode, request_host);
            }
            Ok(ReceiveOutcome::Empty { next_event }) => {
                if now >= deadline {
                    // No message within the timeout: 204 [doc PEEK, RAD].
                    return empty_response(StatusCode::NO_CONTENT);
                }
                let wake = next_event
                    .map_or(deadline, |at| at.min(deadline))
                    .max(now + Duration::from_millis(1));
                tokio::select! {
                    _ = &mut notified => {}
                    _ = tokio::time::sleep_until(wake) => {}
                }
            }
        }
    }
}

fn receive_timeout(shared: &Shared, query: Option<&str>) -> Result<Duration, String> {
    timeout_from_query(
        query,
        shared.default_receive_timeout,
        shared.max_receive_timeout,
    )
}

/// 201 (peek-lock) or 200 (receive-and-delete, not 201) with the body, `BrokerProperties`, the
/// sender's Content-Type, custom properties as headers and, for peek-lock, the absolute lock URI in
/// `Location` [doc PEEK, RAD, PROPS].
fn delivery_response(
    shared: &Shared,
    delivery: crate::broker::Delivery,
    mode: ReceiveMode,
    request_host: Option<&str>,
) -> Response<Body> {
    let status = match mode {
        ReceiveMode::PeekLock => StatusCode::CREATED,
        ReceiveMode::ReceiveAndDelete => StatusCode::OK,
    };
    let mut response = Response::new(Full::new(delivery.body));
    *response.status_mut() = status;
    let headers = response.headers_mut();
    if let Ok(value) = HeaderValue::from_str(&delivery.broker_properties) {
        headers.insert(HeaderName::from_static("brokerproperties"), value);
    }
    if let Some(content_type) = delivery.content_type {
        if let Ok(value) = HeaderValue::from_bytes(content_type.as_bytes()) {
            headers.insert(header::CONTENT_TYPE, value);
        }
    }
    if let Some(lock_path) = delivery.lock_path {
        let base = match shared.location_style {
            LocationStyle::Namespace => format!("https://{}", shared.namespace_host),
            LocationStyle::RequestHost => {
                format!(
                    "http://{}",
                    request_host.map_or_else(|| shared.local_addr.to_string(), str::to_owned)
                )
            }
        };
        if let Ok(value) = HeaderValue::from_str(&format!("{base}{lock_path}")) {
            headers.insert(header::LOCATION, value);
        }
    }
    for (name, value) in delivery.properties {
        let Ok(name) = HeaderName::from_bytes(name.as_bytes()) else {
            continue;
        };
        let cleaned: Vec<u8> = value
            .bytes()
            .map(|b| if b < 0x20 || b == 0x7f { b' ' } else { b })
            .collect();
        if let Ok(value) = HeaderValue::from_bytes(&cleaned) {
            headers.append(name, value);
        }
    }
    response
}
