//! An HTTP destination for effects (feature `http`), reading answers as the destinations mean them.
//!
//! ```no_run
//! use std::time::Duration;
//! use txinbox_core::http::{Confirm, HttpEffect, Key};
//!
//! // A CRM that honours Idempotency-Key for 24 h, and lists tasks by external reference.
//! let crm = HttpEffect::post("https://crm.example/v1/tasks")
//!     .key(Key::header("Idempotency-Key").kept_for(Duration::from_secs(24 * 3600)))
//!     .reference("/id")
//!     .confirm(Confirm::search("https://crm.example/v1/tasks?external_ref={external_ref}").found_at("/data/0/id"))
//!     .build()?;
//! # Ok::<(), txinbox_core::http::HttpConfigError>(())
//! ```
//!
//! **A call's answer** is read through the destination's [`AnswerTable`] (the IETF httpapi Idempotency-Key
//! draft's defaults, overridable per status or class with [`HttpEffectBuilder::answer`]):
//!
//! | what happened | answer | next state |
//! |---|---|---|
//! | 2xx with the reference at [`reference`](HttpEffectBuilder::reference) (`/id`) | done | done, reference kept |
//! | 2xx without it | **uncertain** (unless [`reference_optional`](HttpEffectBuilder::reference_optional)) | reconciled |
//! | could not connect | not sent | pending, backoff |
//! | 408, 425, 429 | not sent | pending, no sooner than `Retry-After` |
//! | 503 with `Retry-After` (seconds or HTTP-date) | not sent | pending, no sooner than `Retry-After` |
//! | 503 without `Retry-After`, 502, 504, other 5xx, 3xx | uncertain | reconciled before any retry |
//! | 409 (the draft: a request with this key is still being processed) | in progress | uncertain, backoff, reconciled; never failed |
//! | 422 (the draft: the key was used with another body) | key reused | failed, both bodies' hashes kept |
//! | another 4xx | rejected | failed, the answer kept |
//! | a timeout, the connection dropped before the answer | uncertain | reconciled before any retry |
//!
//! An effect whose earlier call may have happened (an uncertain answer no confirmation ruled out) is never
//! failed: a refusal then needs attention. Redirects are not followed (a `POST` redirected as a `GET` could
//! read as done): a 3xx is uncertain.
//!
//! **Where the key goes** ([`Key`]): a header the destination names (`Idempotency-Key` by default), a body
//! field (Square's `idempotency_key`), nothing ([`Key::none`]), or the URL of an upsert
//! ([`HttpEffect::upsert`]: `PUT .../tasks/{external_ref}`), which needs no confirmation.
//!
//! **The confirmation** ([`Confirm`]) asks the destination when an answer was lost: a lookup (404 is not
//! found), a search (an empty list or a zero count is not found), or your own reader. A 2xx whose body lacks
//! the declared reference is unknown, never done. Without a confirmation, a destination that honours its key
//! ([`Key::header`], [`Key::body_field`]) is asked by repeating the call with the same key within the time it
//! keeps keys; any other lost answer needs attention.

mod answers;
mod confirm;
mod key;
mod settings;
mod template;

use std::time::Duration;

use chrono::Utc;
use futures::future::BoxFuture;
use reqwest::header::{HeaderName, HeaderValue};
use sha2::{Digest, Sha256};

pub use answers::{parse_retry_after, Answer, AnswerTable};
pub use confirm::{Confirm, ReadFn};
pub use key::{Key, DEFAULT_KEY_KEPT_FOR};
pub use settings::{runner_from_settings, EffectSettingsError};

/// The HTTP client the effect uses, for [`HttpEffectBuilder::client`]: build it with
/// `redirect(reqwest::redirect::Policy::none())`.
pub use reqwest;

use crate::effects::{ClaimedEffect, Confirmation, EffectExecutor, Execution};
use confirm::Walk;
use key::Placement;

/// Metadata keys the HTTP effect reads: `content-type`, and `header.<name>` for extra request headers.
pub mod meta {
    /// The request's content type (default `application/json`).
    pub const CONTENT_TYPE: &str = "content-type";
    /// Prefix of extra request headers (`header.X-Tenant`).
    pub const HEADER: &str = "header.";
}

/// The largest answer body read (a reference is near the top of any sane answer).
const MAX_ANSWER: usize = 1024 * 1024;

/// A configuration that cannot work. Every variant names what is wrong; none shows a secret (URLs are shown
/// without user info and query values).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum HttpConfigError {
    /// A URL that is not an http(s) URL once filled.
    #[error("the {what} {url} is not usable: {detail}")]
    Url {
        /// Which URL.
        what: &'static str,
        /// The URL, redacted.
        url: String,
        /// Why.
        detail: String,
    },
    /// A template without `{key}` or `{external_ref}`: it cannot find one effect.
    #[error(
        "{what} ({url}) names neither {{key}} nor {{external_ref}}: it cannot find one effect"
    )]
    NoPlaceholder {
        /// Which template.
        what: &'static str,
        /// The URL, redacted.
        url: String,
    },
    /// A placeholder the templates do not know (a typo).
    #[error("the {what} has an unknown placeholder {placeholder} (known: {{key}}, {{external_ref}}, {{reference}})")]
    Placeholder {
        /// Which template.
        what: &'static str,
        /// The placeholder.
        placeholder: String,
    },
    /// A body template that is not JSON once filled.
    #[error("the {what} is not JSON once filled: {detail}")]
    Body {
        /// Which template.
        what: &'static str,
        /// Why.
        detail: String,
    },
    /// A JSON pointer that is not one (`/id`, `/data/0/id`).
    #[error("{what} {pointer:?} is not a JSON pointer: it must start with '/' (\"/id\", \"/data/0/id\")")]
    Pointer {
        /// Which pointer.
        what: &'static str,
        /// The pointer.
        pointer: String,
    },
    /// A header name or value that HTTP does not allow.
    #[error("header {name:?}: {detail}")]
    Header {
        /// The header's name.
        name: String,
        /// Why (never the value).
        detail: String,
    },
    /// A method that is not one, or not one this effect can use.
    #[error("method {method:?}: {detail}")]
    Method {
        /// The method.
        method: String,
        /// Why.
        detail: String,
    },
    /// Two settings that cannot go together.
    #[error("{0}")]
    Conflict(String),
    /// The HTTP client could not be built.
    #[error("the HTTP client could not be built: {0}")]
    Client(#[source] reqwest::Error),
}

/// Calls an HTTP API for each effect of its destination. Built with [`HttpEffect::post`] or
/// [`HttpEffect::upsert`] and [`HttpEffectBuilder::build`]; see the [module docs](self).
#[derive(Clone, Debug)]
pub struct HttpEffect {
    client: reqwest::Client,
    method: reqwest::Method,
    url: String,
    upsert: bool,
    key: Key,
    reference: String,
    reference_optional: bool,
    confirm: Option<Confirm>,
    answers: AnswerTable,
    timeout: Duration,
    reconcile_after: Duration,
    headers: Vec<(HeaderName, HeaderValue)>,
    compensate: Option<String>,
}

/// Builds an [`HttpEffect`]; [`build`](Self::build) checks that every rule can work.
#[derive(Clone, Debug)]
#[must_use = "an HttpEffectBuilder does nothing until build() is called"]
pub struct HttpEffectBuilder {
    client: Option<reqwest::Client>,
    method: String,
    url: String,
    upsert: bool,
    key: Option<Key>,
    reference: String,
    reference_optional: bool,
    confirm: Option<Confirm>,
    answers: AnswerTable,
    timeout: Duration,
    reconcile_after: Duration,
    headers: Vec<(String, String)>,
    compensate: Option<String>,
}

impl HttpEffect {
    /// POSTs each effect's payload to `url` (a template: `{key}`, `{external_ref}`).
    pub fn post(url: impl Into<String>) -> HttpEffectBuilder {
        HttpEffectBuilder {
            client: None,
            method: "POST".into(),
            url: url.into(),
            upsert: false,
            key: None,
            reference: "/id".into(),
            reference_optional: false,
            confirm: None,
            answers: AnswerTable::default(),
            timeout: Duration::from_secs(10),
            reconcile_after: Duration::ZERO,
            headers: Vec::new(),
            compensate: None,
        }
    }

    /// PUTs each effect's payload to `url`, which names the effect (`.../tasks/{external_ref}`): an upsert by
    /// external id (Salesforce's, with `.method("PATCH")`) is idempotent by itself, so a lost answer is
    /// reconciled by sending it again and needs no confirmation. A 2xx without a reference is done, with the
    /// request's path as its reference.
    pub fn upsert(url: impl Into<String>) -> HttpEffectBuilder {
        HttpEffectBuilder {
            method: "PUT".into(),
            upsert: true,
            key: Some(Key::none()),
            ..Self::post(url)
        }
    }

    /// Whether a call whose answer was lost may be repeated as its own confirmation.
    fn repeatable(&self, e: &ClaimedEffect) -> bool {
        let age = (Utc::now() - e.created_at).to_std().unwrap_or_default();
        self.upsert || (self.key.honoured && age < self.key.kept_for)
    }

    /// The request body for `e`: its payload, with the key in its field when the key goes in the body.
    fn body(&self, e: &ClaimedEffect) -> Result<Vec<u8>, String> {
        let Placement::BodyField(field) = &self.key.placement else {
            return Ok(e.payload.clone());
        };
        let mut v: serde_json::Value = serde_json::from_slice(&e.payload).map_err(|_| {
            format!("the payload is not JSON: the key cannot go in its field {field:?}")
        })?;
        let Some(o) = v.as_object_mut() else {
            return Err(format!(
                "the payload is not a JSON object: the key cannot go in its field {field:?}"
            ));
        };
        o.insert(field.clone(), serde_json::Value::String(e.key.clone()));
        serde_json::to_vec(&v).map_err(|e| e.to_string())
    }

    fn request(&self, method: reqwest::Method, url: &str) -> reqwest::RequestBuilder {
        let mut req = self.client.request(method, url).timeout(self.timeout);
        for (k, v) in &self.headers {
            req = req.header(k, v);
        }
        req
    }

    /// Whether the payload carries the external reference (as is, JSON-escaped or percent-encoded, as a form
    /// body carries it), or the call's URL does, so a destination can be searched by it.
    fn payload_carries_ref(&self, e: &ClaimedEffect) -> bool {
        let needle = e.external_ref.as_bytes();
        let escaped = serde_json::Value::String(e.external_ref.clone()).to_string();
        let escaped = escaped.as_bytes();
        let has = |n: &[u8]| !n.is_empty() && e.payload.windows(n.len()).any(|w| w == n);
        has(needle)
            || has(&escaped[1..escaped.len() - 1])
            || self.url.contains(template::EXTERNAL_REF)
    }

    fn reference_of(&self, body: &[u8]) -> Option<String> {
        let v: serde_json::Value = serde_json::from_slice(body).ok()?;
        match confirm::walk(&v, &self.reference) {
            Walk::Found(r) => Some(r),
            _ => None,
        }
    }
}

/// Reads up to [`MAX_ANSWER`] bytes of an answer.
async fn read_body(resp: &mut reqwest::Response) -> Result<Vec<u8>, reqwest::Error> {
    let mut out = Vec::new();
    while let Some(chunk) = resp.chunk().await? {
        let room = MAX_ANSWER.saturating_sub(out.len());
        out.extend_from_slice(&chunk[..chunk.len().min(room)]);
        if out.len() >= MAX_ANSWER {
            break;
        }
    }
    Ok(out)
}

/// The first bytes of an answer, for evidence.
fn excerpt(body: &[u8]) -> String {
    let s = String::from_utf8_lossy(&body[..body.len().min(200)]);
    s.chars().filter(|c| !c.is_control()).collect()
}

fn sha256_hex(bytes: &[u8]) -> String {
    hex(&Sha256::digest(bytes))
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

impl EffectExecutor for HttpEffect {
    fn execute<'a>(&'a self, effect: &'a ClaimedEffect) -> BoxFuture<'a, Execution> {
        Box::pin(async move {
            let body = match self.body(effect) {
                Ok(b) => b,
                Err(error) => return Execution::rejected(error),
            };
            let url = template::fill_url(&self.url, effect);
            let shown = template::redact(&self.url);
            let content_type = effect
                .metadata
                .get(meta::CONTENT_TYPE)
                .map_or("application/json", String::as_str);
            let mut req = self
                .request(self.method.clone(), &url)
                .header(reqwest::header::CONTENT_TYPE, content_type);
            if let Placement::Header(name) = &self.key.placement {
                req = req.header(name.as_str(), &effect.key);
            }
            for (k, v) in &effect.metadata {
                if let Some(name) = k.strip_prefix(meta::HEADER) {
                    req = req.header(name, v);
                }
            }
            let hash = sha256_hex(&body);
            let mut resp = match req.body(body).send().await {
                Ok(r) => r,
                Err(e) if e.is_connect() => return Execution::not_sent(format!("{shown}: {e}")),
                // Nothing was sent: a header the metadata gave that HTTP does not allow.
                Err(e) if e.is_builder() => return Execution::rejected(format!("{shown}: {e}")),
                // A timeout, a reset or a connection closed before the answer: the request may have been
                // processed.
                Err(e) => return Execution::uncertain(format!("{shown}: {e}")),
            };
            let status = resp.status().as_u16();
            let retry_after = resp
                .headers()
                .get(reqwest::header::RETRY_AFTER)
                .and_then(|v| v.to_str().ok())
                .and_then(|v| parse_retry_after(v, Utc::now()));
            let answer = self.answers.get(status);
            let body = match read_body(&mut resp).await {
                Ok(b) => b,
                Err(e) if answer == Answer::Done => {
                    return Execution::uncertain(format!(
                        "{shown} answered {status} and its body was lost: {e}"
                    ))
                }
                Err(_) => Vec::new(),
            };
            let said = || format!("{shown} answered {status}: {}", excerpt(&body));
            match answer {
                Answer::Done => match self.reference_of(&body) {
                    Some(reference) => Execution::Done {
                        reference: Some(reference),
                    },
                    None if self.upsert => Execution::Done {
                        reference: Some(url_path(&url)),
                    },
                    None if self.reference_optional => Execution::Done { reference: None },
                    None => Execution::uncertain(format!(
                        "{shown} answered {status} without a reference at {}: not read as done (set where this \
                         destination puts its reference, or declare it optional)",
                        self.reference
                    )),
                },
                Answer::NotSent => Execution::NotSent {
                    error: said().into(),
                    retry_after,
                },
                Answer::RetryAfter if retry_after.is_some() => Execution::NotSent {
                    error: said().into(),
                    retry_after,
                },
                Answer::InProgress => Execution::InProgress {
                    error: said().into(),
                    retry_after,
                },
                Answer::Rejected => Execution::rejected(said()),
                Answer::KeyReused => {
                    let first = match effect.sent_hash.as_deref() {
                        Some(h) if h == hash => format!(
                            "the first call under this key sent the same body (sha256={h}): another sender uses \
                             this key"
                        ),
                        Some(h) => format!(
                            "the first call under this key sent another body (sha256={h}): the request changed \
                             between calls"
                        ),
                        None => "no earlier call under this key was recorded".to_owned(),
                    };
                    Execution::rejected(format!(
                        "{} (the key was used with another body): this body sha256={hash}; {first}",
                        said()
                    ))
                }
                Answer::RetryAfter | Answer::Uncertain => Execution::uncertain(said()),
            }
        })
    }

    fn compensate<'a>(
        &'a self,
        effect: &'a ClaimedEffect,
    ) -> BoxFuture<'a, Result<(), crate::BoxError>> {
        Box::pin(async move {
            let Some(template) = &self.compensate else {
                return Err("no compensation request is configured for this destination".into());
            };
            let url = template::fill_url(template, effect);
            let r = self
                .request(reqwest::Method::DELETE, &url)
                .header("Idempotency-Key", format!("{}-compensate", effect.key))
                .send()
                .await?;
            if r.status().is_success() || r.status() == reqwest::StatusCode::NOT_FOUND {
                Ok(())
            } else {
                Err(format!("the compensation request answered {}", r.status()).into())
            }
        })
    }

    fn confirm<'a>(&'a self, effect: &'a ClaimedEffect) -> BoxFuture<'a, Confirmation> {
        Box::pin(async move {
            if self.upsert {
                return Confirmation::Repeat;
            }
            let Some(c) = &self.confirm else {
                return if self.repeatable(effect) {
                    Confirmation::Repeat
                } else if self.key.honoured {
                    Confirmation::Unknown {
                        error: "the call is older than the destination keeps keys, and no confirmation is \
                                configured: a repeat could act twice"
                            .into(),
                    }
                } else {
                    Confirmation::Unknown {
                        error: "no confirmation is configured for this destination".into(),
                    }
                };
            };
            let answer = if c.uses_external_ref() && !self.payload_carries_ref(effect) {
                Confirmation::Unknown {
                    error: format!(
                        "the payload does not carry the external reference {:?}: the destination cannot be \
                         searched by it",
                        effect.external_ref
                    )
                    .into(),
                }
            } else {
                let (url, body) = c.request(effect);
                let mut req = self.request(c.method.clone(), &url);
                if let Some(b) = body {
                    req = req
                        .header(reqwest::header::CONTENT_TYPE, "application/json")
                        .body(b);
                }
                match req.send().await {
                    Ok(mut r) => {
                        let status = r.status().as_u16();
                        match read_body(&mut r).await {
                            Ok(b) => c.read(status, &b),
                            Err(e) => Confirmation::Unknown { error: e.into() },
                        }
                    }
                    Err(e) => Confirmation::Unknown {
                        error: format!("{}: {e}", template::redact(&c.url)).into(),
                    },
                }
            };
            match answer {
                // The destination keeps the key: repeating the call is as good an answer.
                Confirmation::Unknown { .. } if self.repeatable(effect) => Confirmation::Repeat,
                a => a,
            }
        })
    }

    fn reconcile_after(&self) -> Duration {
        self.reconcile_after
    }

    fn request_hash(&self, effect: &ClaimedEffect) -> Option<String> {
        self.body(effect).ok().map(|b| sha256_hex(&b))
    }
}

/// The path of `url` (a done upsert's reference).
fn url_path(url: &str) -> String {
    reqwest::Url::parse(url).map_or_else(|_| url.to_owned(), |u| u.path().to_owned())
}

impl HttpEffectBuilder {
    /// The method of the call (`POST`; an upsert's `PUT`, or `PATCH` for Salesforce's).
    pub fn method(mut self, method: impl Into<String>) -> Self {
        self.method = method.into();
        self
    }

    /// Where the key goes and whether the destination honours it (default: `Idempotency-Key` sent, not
    /// relied on). See [`Key`].
    pub fn key(mut self, key: Key) -> Self {
        self.key = Some(key);
        self
    }

    /// Where the destination's reference is in a 2xx answer (a JSON pointer, default `/id`). A 2xx without
    /// it is uncertain, never done, unless [`reference_optional`](Self::reference_optional).
    pub fn reference(mut self, pointer: impl Into<String>) -> Self {
        self.reference = pointer.into();
        self
    }

    /// The destination's 2xx may carry no reference (an e-mail API answering 202 without an id): done
    /// without reference, shown apart in `txinbox effects stats` and the metrics.
    pub fn reference_optional(mut self) -> Self {
        self.reference_optional = true;
        self
    }

    /// The confirmation asked when an answer was lost. See [`Confirm`].
    pub fn confirm(mut self, confirm: Confirm) -> Self {
        self.confirm = Some(confirm);
        self
    }

    /// `confirm(Confirm::lookup(url))`: a `GET` of one object where 404 is not found and a 2xx must carry the
    /// reference at `/id` (an empty list, or a body without it, is unknown, never done).
    pub fn confirm_url(self, url: impl Into<String>) -> Self {
        self.confirm(Confirm::lookup(url))
    }

    /// What `status` (100 to 599) means at this destination, over the [default table](AnswerTable).
    pub fn answer(mut self, status: u16, answer: Answer) -> Self {
        self.answers.set(status, answer);
        self
    }

    /// What a whole class (`4` for 4xx) means, replacing the defaults' exact codes of that class.
    pub fn answer_class(mut self, class: u8, answer: Answer) -> Self {
        self.answers.set_class(class, answer);
        self
    }

    /// Waits this long after an uncertain call before the first confirmation (default none): a search whose
    /// index lags behind the writes would not find a fresh object.
    pub fn reconcile_after(mut self, d: Duration) -> Self {
        self.reconcile_after = d;
        self
    }

    /// A header sent with every request of this destination (an `Authorization`): marked sensitive, never
    /// logged.
    pub fn header(mut self, name: impl Into<String>, value: impl Into<String>) -> Self {
        self.headers.push((name.into(), value.into()));
        self
    }

    /// The timeout of each request (default 10 s). A call past it is uncertain.
    pub fn timeout(mut self, d: Duration) -> Self {
        self.timeout = d;
        self
    }

    /// The compensation request an operator can trigger ([`crate::EffectRunner::compensate`]): a DELETE to
    /// this URL, where `{reference}`, `{key}` and `{external_ref}` are replaced (percent-encoded). A 2xx or a
    /// 404 (already gone) undoes the effect.
    pub fn compensate_url(mut self, template: impl Into<String>) -> Self {
        self.compensate = Some(template.into());
        self
    }

    /// Uses `client` (for its TLS roots, proxy or connection pool); build it without redirects
    /// (`reqwest::redirect::Policy::none()`), or a 3xx would be followed.
    pub fn client(mut self, client: reqwest::Client) -> Self {
        self.client = Some(client);
        self
    }

    /// Checks that every rule can work and builds the effect.
    ///
    /// # Errors
    /// An [`HttpConfigError`] naming the rule that cannot work: a URL that is not http(s), a template without
    /// `{key}` or `{external_ref}` where one effect must be found (a confirmation, an upsert's URL), an unknown
    /// placeholder, a body template that is not JSON, a JSON pointer that is not one, a header HTTP does not
    /// allow, a confirmation by `{key}` at a destination that keeps no key.
    pub fn build(self) -> Result<HttpEffect, HttpConfigError> {
        let url = template::Template::parse("call URL", &self.url)?;
        template::check_url("call URL", &url)?;
        let method = reqwest::Method::from_bytes(self.method.to_ascii_uppercase().as_bytes())
            .map_err(|e| HttpConfigError::Method {
                method: self.method.clone(),
                detail: e.to_string(),
            })?;
        if matches!(method, reqwest::Method::GET | reqwest::Method::HEAD) {
            return Err(HttpConfigError::Method {
                method: self.method,
                detail: "an effect's call sends a body: use POST, PUT or PATCH".into(),
            });
        }
        if self.upsert && !url.names_effect() {
            return Err(HttpConfigError::NoPlaceholder {
                what: "the upsert URL",
                url: template::redact(&self.url),
            });
        }
        confirm::check_pointer("reference", &self.reference, false)?;
        let key = self.key.unwrap_or_default();
        if let Placement::Header(name) = &key.placement {
            HeaderName::from_bytes(name.as_bytes()).map_err(|e| HttpConfigError::Header {
                name: name.clone(),
                detail: e.to_string(),
            })?;
        }
        if let Some(c) = &self.confirm {
            c.validate()?;
            if key.placement == Placement::None && !c.uses_external_ref() {
                return Err(HttpConfigError::Conflict(
                    "the confirmation finds effects by {key}, but the destination keeps no key (Key::none()): \
                     it would never find one, and every lost answer would be sent again; search by \
                     {external_ref}"
                        .into(),
                ));
            }
            if self.upsert {
                return Err(HttpConfigError::Conflict(
                    "an upsert is confirmed by sending it again: it takes no confirmation".into(),
                ));
            }
        }
        if let Some(c) = &self.compensate {
            let t = template::Template::parse("compensation URL", c)?;
            template::check_url("compensation URL", &t)?;
        }
        let mut headers = Vec::with_capacity(self.headers.len());
        for (name, value) in self.headers {
            let n =
                HeaderName::from_bytes(name.as_bytes()).map_err(|e| HttpConfigError::Header {
                    name: name.clone(),
                    detail: e.to_string(),
                })?;
            let mut v = HeaderValue::from_str(&value).map_err(|_| HttpConfigError::Header {
                name: name.clone(),
                detail: "the value is not visible ASCII".into(),
            })?;
            v.set_sensitive(true);
            headers.push((n, v));
        }
        let client = match self.client {
            Some(c) => c,
            None => reqwest::Client::builder()
                .redirect(reqwest::redirect::Policy::none())
                .build()
                .map_err(HttpConfigError::Client)?,
        };
        Ok(HttpEffect {
            client,
            method,
            url: self.url,
            upsert: self.upsert,
            key,
            reference: self.reference,
            reference_optional: self.reference_optional,
            confirm: self.confirm,
            answers: self.answers,
            timeout: self.timeout,
            reconcile_after: self.reconcile_after,
            headers,
            compensate: self.compensate,
        })
    }
}

#[cfg(test)]
mod tests;
