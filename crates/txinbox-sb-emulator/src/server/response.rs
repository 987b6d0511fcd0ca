//! Building responses (empty, error, fault, JSON) and reading request bodies within a limit.

use http_body_util::{BodyExt, Full, Limited};
use hyper::body::{Bytes, Incoming};
use hyper::header::{self, HeaderValue};
use hyper::{Response, StatusCode};

use super::{Body, Refusal};
use crate::faults::FaultRule;
use crate::wire;

pub(super) async fn read_body(body: Incoming, limit: usize) -> Result<Bytes, Refusal> {
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

pub(super) fn data_error_response(error: &crate::broker::DataError) -> Response<Body> {
    let status = StatusCode::from_u16(error.status()).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    error_response(status, &error.detail())
}

/// An injected status fault. 429 and 503 carry the service's throttling text [doc THROT]; the REST
/// status for throttling is undocumented, so both are offered.
pub(super) fn fault_response(fault: &FaultRule) -> Response<Body> {
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
