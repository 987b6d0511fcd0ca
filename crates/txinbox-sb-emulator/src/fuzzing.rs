//! Entry points for the fuzz targets and property tests (feature `fuzzing`, not part of the emulator's API):
//! the parsers of what a client sends, reachable without a server. Every function answers what the server
//! would: accepted, or refused with the HTTP status and the detail it would send.

use std::time::Duration;

use base64::Engine as _;
use hmac::{Hmac, Mac};
use hyper::body::Bytes;
use hyper::header::{HeaderMap, HeaderName, HeaderValue};
use hyper::Method;
use sha2::Sha256;

use crate::auth::{AuthConfig, Target};
use crate::server::{self, Route};
use crate::wire::{self, PropertyValue};

/// The namespace the entry points check tokens against.
pub const NAMESPACE: &str = "fuzz";
/// Its public host.
pub const NAMESPACE_HOST: &str = "fuzz.servicebus.windows.net";
/// The only bearer token the entry points accept.
pub const BEARER: &str = "fuzz-bearer-token";

/// A refusal: the HTTP status the server answers and its detail.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Refused {
    /// 400, 401, 405.
    pub status: u16,
    /// The detail the server sends (never a key or a signature).
    pub detail: String,
}

/// Checks an `Authorization` header for `path` as the server does, with one SAS rule (`key_name`, `key`)
/// and the bearer token [`BEARER`] configured.
pub fn check_authorization(
    header: &[u8],
    path: &str,
    request_host: Option<&str>,
    now_unix: i64,
    key_name: &str,
    key: &str,
) -> Result<(), Refused> {
    let auth = AuthConfig {
        sas_keys: vec![(key_name.to_owned(), key.to_owned())],
        bearer_tokens: vec![BEARER.to_owned()],
    };
    let target = Target {
        namespace: NAMESPACE,
        namespace_host: NAMESPACE_HOST,
        request_host,
        path,
    };
    auth.check(Some(header), &target, now_unix)
        .map_err(|e| Refused {
            status: 401,
            detail: e.to_string(),
        })
}

/// A SAS `Authorization` header value as a client builds it: `sr` form-urlencoded, signed with `key`.
pub fn sas_header(resource: &str, key_name: &str, key: &str, expiry: i64) -> String {
    let enc = |s: &str| {
        percent_encoding::utf8_percent_encode(s, percent_encoding::NON_ALPHANUMERIC).to_string()
    };
    let sr = enc(resource);
    // HMAC takes a key of any length: this never returns early.
    let Ok(mut mac) = Hmac::<Sha256>::new_from_slice(key.as_bytes()) else {
        return String::new();
    };
    mac.update(format!("{sr}\n{expiry}").as_bytes());
    let sig = base64::engine::general_purpose::STANDARD.encode(mac.finalize().into_bytes());
    format!(
        "SharedAccessSignature sr={sr}&sig={}&se={expiry}&skn={}",
        enc(&sig),
        enc(key_name)
    )
}

/// What a data-plane request was understood as.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Parsed {
    /// A send of this many messages to `entity`.
    Send {
        /// The entity path.
        entity: String,
        /// Messages in the request.
        messages: usize,
    },
    /// A receive on `entity` with this long-poll wait.
    Receive {
        /// The entity path.
        entity: String,
        /// The wait.
        timeout: Duration,
    },
    /// A settle or renewal of a lock.
    Lock {
        /// The entity path.
        entity: String,
    },
    /// A control-API path (`/$emulator/...`), not parsed further here.
    Admin,
}

/// Parses a data-plane request the way the server does before it touches a queue: the route from the method
/// and the percent-decoded path, then for a send the body (a batch when `content_type` says
/// `application/vnd.microsoft.servicebus.json`) or `BrokerProperties` and the custom-property headers, for a
/// receive the `timeout` query parameter (default and cap 60 s, the emulator's defaults).
/// `headers` that are not valid HTTP header names or values are skipped, as hyper would refuse them before.
pub fn parse_request(
    method: &str,
    raw_path: &str,
    query: Option<&str>,
    headers: &[(&[u8], &[u8])],
    content_type: Option<&str>,
    body: &[u8],
) -> Result<Parsed, Refused> {
    let bad = |detail: String| Refused {
        status: 400,
        detail,
    };
    let method =
        Method::from_bytes(method.as_bytes()).map_err(|_| bad("not an HTTP method".to_owned()))?;
    let path = percent_encoding::percent_decode_str(raw_path)
        .decode_utf8_lossy()
        .into_owned();
    if server::strip_admin_prefix(&path).is_some() {
        return Ok(Parsed::Admin);
    }
    let route = server::parse_route(&method, &path).map_err(|(status, detail)| Refused {
        status: status.as_u16(),
        detail: detail.to_owned(),
    })?;
    match route {
        Route::Send { entity } => {
            let batch = content_type
                .is_some_and(|c| c.starts_with("application/vnd.microsoft.servicebus.json"));
            let messages = if batch {
                server::parse_batch(body).map_err(bad)?
            } else {
                let mut map = HeaderMap::new();
                for (name, value) in headers {
                    if let (Ok(n), Ok(v)) =
                        (HeaderName::from_bytes(name), HeaderValue::from_bytes(value))
                    {
                        map.append(n, v);
                    }
                }
                server::single_message(
                    &map,
                    Bytes::copy_from_slice(body),
                    content_type.map(str::to_owned),
                )
                .map_err(bad)?
            };
            Ok(Parsed::Send {
                entity,
                messages: messages.len(),
            })
        }
        Route::Receive { entity, .. } => {
            let timeout =
                server::timeout_from_query(query, Duration::from_secs(60), Duration::from_secs(60))
                    .map_err(bad)?;
            Ok(Parsed::Receive { entity, timeout })
        }
        Route::Lock { entity, .. } => Ok(Parsed::Lock { entity }),
    }
}

/// A custom-property header value as the server types it, written back as the receive header.
pub fn property_round_trip(raw: &[u8]) -> String {
    PropertyValue::from_header(raw).to_header()
}

/// A .NET TimeSpan (`[d.]hh:mm:ss[.fffffff]`) as the server reads `TimeToLiveTimeSpan`.
pub fn parse_timespan(text: &str) -> Option<Duration> {
    wire::parse_timespan(text)
}

/// A send's `BrokerProperties` header as the server reads it: `Err` with the 400 detail when refused.
pub fn parse_broker_properties(raw: &[u8]) -> Result<(), Refused> {
    wire::parse_broker_properties(raw)
        .map(drop)
        .map_err(|detail| Refused {
            status: 400,
            detail,
        })
}
