//! The HTTP/1.1 server: routing, the data-plane handlers and long polling.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use http_body_util::{BodyExt, Full, Limited};
use hyper::body::{Bytes, Incoming};
use hyper::header::{self, HeaderMap, HeaderName, HeaderValue};
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use percent_encoding::percent_decode_str;
use serde_json::Value;
use tokio::net::TcpListener;
use tokio::sync::{watch, Notify};
use tokio::time::Instant;

use crate::admin;
use crate::auth::{AuthConfig, Target};
use crate::broker::{Broker, IncomingMessage, LockOperation, ReceiveMode, ReceiveOutcome};
use crate::faults::{self, FaultKind, FaultRule};
use crate::wire::{self, PropertyValue, SenderProperties};
use crate::LocationStyle;

/// The response body type.
pub(crate) type Body = Full<Bytes>;

/// The path prefix of the control API. Entity names cannot contain `$`, so it cannot clash.
pub(crate) const ADMIN_PREFIX: &str = "/$emulator";

/// The most a request body may hold; larger sends answer 403 "message too large" [doc SEND].
const MAX_REQUEST_BODY: usize = 64 * 1024 * 1024;

/// The batch content type [doc BATCH].
const BATCH_CONTENT_TYPE: &str = "application/vnd.microsoft.servicebus.yml";

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
    data_plane(shared, req, path).await
}

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

/// A refusal: status and detail.
type Refusal = (StatusCode, &'static str);

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

async fn data_plane(
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
    if let Some(fault) = fault {
        tracing::info!(%method, %path, kind = ?fault.kind, status = fault.status, "injected fault");
        match fault.kind {
            FaultKind::Status => return Ok(fault_response(&fault)),
            FaultKind::Delay => {
                let waited = crate::timer::wait(Duration::from_millis(fault.delay_ms)).await;
                shared.counters.delayed(waited);
            }
            FaultKind::DropResponse => drop_response = true,
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

/// One message: body as-is (no conversion [doc PROPS]), Content-Type kept for the receiver
/// [doc PROPS "Message body"], system properties from `BrokerProperties` and one custom property
/// per other header [doc SEND, PROPS]. Header values are read as bytes, since the crate sends raw
/// UTF-8.
pub(crate) fn single_message(
    headers: &HeaderMap,
    body: Bytes,
    content_type: Option<String>,
) -> Result<Vec<IncomingMessage>, String> {
    let sender = match headers.get("brokerproperties") {
        Some(raw) => wire::parse_broker_properties(raw.as_bytes())?,
        None => SenderProperties::default(),
    };
    let mut properties: Vec<(String, PropertyValue)> = Vec::new();
    for (name, value) in headers {
        let name = name.as_str();
        if wire::is_reserved_header(name) || properties.iter().any(|(n, _)| n == name) {
            continue;
        }
        properties.push((
            name.to_string(),
            PropertyValue::from_header(value.as_bytes()),
        ));
    }
    Ok(vec![IncomingMessage {
        body,
        content_type,
        sender,
        properties,
    }])
}

/// A batch: a JSON array of `{"Body", "BrokerProperties", "UserProperties"}` [doc BATCH].
pub(crate) fn parse_batch(body: &[u8]) -> Result<Vec<IncomingMessage>, String> {
    let items: Vec<Value> = serde_json::from_slice(body)
        .map_err(|e| format!("The batch body is not a JSON array: {e}"))?;
    if items.is_empty() {
        return Err("The batch holds no message.".into());
    }
    let mut messages = Vec::with_capacity(items.len());
    for (index, item) in items.iter().enumerate() {
        let Value::Object(item) = item else {
            return Err(format!("Batch item {index} is not a JSON object."));
        };
        let body = match item.get("Body") {
            None | Some(Value::Null) => Bytes::new(),
            Some(Value::String(s)) => Bytes::from(s.clone()),
            Some(_) => return Err(format!("Batch item {index}: Body must be a string.")),
        };
        let sender = match item.get("BrokerProperties") {
            None | Some(Value::Null) => SenderProperties::default(),
            Some(Value::Object(map)) => wire::sender_properties_from_map(map)
                .map_err(|e| format!("Batch item {index}: {e}"))?,
            Some(_) => {
                return Err(format!(
                    "Batch item {index}: BrokerProperties must be an object."
                ))
            }
        };
        let mut properties = Vec::new();
        match item.get("UserProperties") {
            None | Some(Value::Null) => {}
            Some(Value::Object(map)) => {
                for (name, value) in map {
                    if HeaderName::from_bytes(name.as_bytes()).is_err() {
                        return Err(format!(
                            "Batch item {index}: {name:?} is not a valid property name."
                        ));
                    }
                    let value = PropertyValue::from_json(value)
                        .map_err(|e| format!("Batch item {index}: {e}"))?;
                    properties.push((name.clone(), value));
                }
            }
            Some(_) => {
                return Err(format!(
                    "Batch item {index}: UserProperties must be an object."
                ))
            }
        }
        messages.push(IncomingMessage {
            body,
            content_type: None,
            sender,
            properties,
        });
    }
    Ok(messages)
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

/// The long-poll wait a receive asks for with `?timeout=` (seconds, fractional allowed), capped at `max`;
/// `default` (capped) when absent. A value that is not a finite non-negative number is refused (→ 400).
pub(crate) fn timeout_from_query(
    query: Option<&str>,
    default: Duration,
    max: Duration,
) -> Result<Duration, String> {
    let Some(query) = query else {
        return Ok(default.min(max));
    };
    for pair in query.split('&') {
        let (name, value) = pair.split_once('=').unwrap_or((pair, ""));
        if name.eq_ignore_ascii_case("timeout") {
            let value = percent_decode_str(value).decode_utf8_lossy();
            let seconds: f64 = value
                .trim()
                .parse()
                .ok()
                .filter(|s: &f64| s.is_finite() && *s >= 0.0)
                .ok_or_else(|| format!("timeout={value} is not a number of seconds"))?;
            let requested = Duration::try_from_secs_f64(seconds).unwrap_or(max);
            return Ok(requested.min(max));
        }
    }
    Ok(default.min(max))
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

async fn read_body(body: Incoming, limit: usize) -> Result<Bytes, Refusal> {
    match Limited::new(body, limit).collect().await {
        Ok(collected) => Ok(collected.to_bytes()),
        Err(error) if error.is::<http_body_util::LengthLimitError>() => Err((
            StatusCode::FORBIDDEN,
            "The request body is larger than the emulator accepts.",
        )),
        Err(_) => Err((
            StatusCode::BAD_REQUEST,
            "The request body could not be read.",
        )),
    }
}

pub(crate) fn empty_response(status: StatusCode) -> Response<Body> {
    let mut response = Response::new(Full::new(Bytes::new()));
    *response.status_mut() = status;
    response
}

/// An error with an XML body like the service's [inference].
pub(crate) fn error_response(status: StatusCode, detail: &str) -> Response<Body> {
    let mut response = Response::new(Full::new(Bytes::from(wire::error_xml(
        status.as_u16(),
        detail,
    ))));
    *response.status_mut() = status;
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/xml; charset=utf-8"),
    );
    response
}

fn data_error_response(error: &crate::broker::DataError) -> Response<Body> {
    let status = StatusCode::from_u16(error.status()).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    error_response(status, &error.detail())
}

/// An injected status fault. 429 and 503 carry the service's throttling text [doc THROT]; the REST
/// status for throttling is undocumented, so both are offered.
fn fault_response(fault: &FaultRule) -> Response<Body> {
    let status = StatusCode::from_u16(fault.status).unwrap_or(StatusCode::SERVICE_UNAVAILABLE);
    let detail = match fault.status {
        429 | 503 => "The request was terminated because the entity is being throttled. Error code: 50009. Please wait 2 seconds and try again.",
        500 => "The service was unable to process the request; please retry the operation.",
        _ => "Injected fault.",
    };
    let mut response = error_response(status, detail);
    if let Some(seconds) = fault.retry_after_seconds {
        response
            .headers_mut()
            .insert(header::RETRY_AFTER, HeaderValue::from(seconds));
    }
    response
}

/// Used by the admin module for its JSON answers.
pub(crate) fn json_response(status: StatusCode, value: &impl serde::Serialize) -> Response<Body> {
    let body = serde_json::to_vec(value).unwrap_or_else(|_| b"{}".to_vec());
    let mut response = Response::new(Full::new(Bytes::from(body)));
    *response.status_mut() = status;
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    response
}

/// Reads a small JSON body for the admin API.
/// `None` when it cannot be read or is larger than 1 MiB.
pub(crate) async fn read_admin_body(body: Incoming) -> Option<Bytes> {
    read_body(body, 1024 * 1024).await.ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn routes_split_on_the_messages_segment() {
        let route = parse_route(&Method::POST, "/a/b/messages").unwrap();
        assert!(matches!(route, Route::Send { entity } if entity == "a/b"));
        let route = parse_route(&Method::DELETE, "/q/$DeadLetterQueue/messages/head").unwrap();
        assert!(
            matches!(route, Route::Receive { entity, mode: ReceiveMode::ReceiveAndDelete } if entity == "q/$DeadLetterQueue")
        );
        let route = parse_route(&Method::PUT, "/t/subscriptions/s/messages/7/abc").unwrap();
        assert!(
            matches!(route, Route::Lock { entity, id, token, operation: LockOperation::Abandon }
            if entity == "t/subscriptions/s" && id == "7" && token == "abc")
        );
        assert_eq!(parse_route(&Method::GET, "/q/messages").unwrap_err().0, 405);
        assert_eq!(parse_route(&Method::POST, "/q").unwrap_err().0, 400);
        assert_eq!(parse_route(&Method::POST, "/messages").unwrap_err().0, 400);
    }

    #[test]
    fn admin_prefix_is_recognised() {
        assert_eq!(strip_admin_prefix("/$emulator/queues/x"), Some("/queues/x"));
        assert_eq!(strip_admin_prefix("/$EMULATOR"), Some(""));
        assert_eq!(strip_admin_prefix("/$emulatorx"), None);
        assert_eq!(strip_admin_prefix("/q/messages"), None);
    }

    #[test]
    fn batch_bodies_are_validated() {
        let ok = parse_batch(
            br#"[{"Body":"This is the first message","UserProperties":{"Priority":"Low"}},
                 {"Body":"This is the second message","BrokerProperties":{"Label":"M2","TimeToLiveTimeSpan":"0.00:00:40"}}]"#,
        )
        .unwrap();
        assert_eq!(ok.len(), 2);
        assert!(parse_batch(b"{}").is_err());
        assert!(parse_batch(b"[]").is_err());
        assert!(parse_batch(br#"[{"Body":1}]"#).is_err());
        assert!(parse_batch(br#"[{"UserProperties":{"bad name":1}}]"#).is_err());
        assert!(parse_batch(br#"[{"UserProperties":{"p":[1]}}]"#).is_err());
    }
}
