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
//! | 2xx without it whose body is an HTML page (`text/html` markup, or an `<html>` document: a captive portal's, a proxy's or a web application firewall's page answered in place of the API) | uncertain, even optional or an upsert, unless the destination's own API answers so ([`html_answers`](HttpEffectBuilder::html_answers)) | reconciled |
//! | 202 Accepted (RFC 9110: "the processing has not been completed. The request might or might not eventually be acted upon"), reference or not | **uncertain**, unless declared done (`.answer(202, Answer::Done)`) | reconciled |
//! | 2xx without it whose body reports an error (a non-empty top-level `errors` or `error`: GraphQL, Slack) | uncertain, even optional or an upsert | reconciled |
//! | could not connect | not sent | pending, backoff |
//! | 408, 425, 429 | not sent | pending, no sooner than `Retry-After` |
//! | 503 with `Retry-After` (seconds or HTTP-date) | not sent | pending, no sooner than `Retry-After` |
//! | 503 without `Retry-After`, 502, 504, other 5xx, 3xx | uncertain | reconciled before any retry |
//! | 409 (the draft: a request with this key is still being processed) | in progress | uncertain, backoff, reconciled; never failed |
//! | 422 (the draft: the key was used with another body) where the key is kept ([`Key::header`], [`Key::body_field`]) | key reused | failed, both bodies' hashes kept |
//! | another 4xx that is a rate limit ([`rate_limited`]: a valid `Retry-After`; GitHub's 403 with `x-ratelimit-remaining: 0` or a "secondary rate limit" message; Salesforce's `REQUEST_LIMIT_EXCEEDED`; Google's `rateLimitExceeded`, `userRateLimitExceeded`), unless you set that status's or class's answer yourself | not sent | pending, no sooner than `Retry-After` |
//! | another 4xx | rejected | failed, the answer kept |
//! | a timeout, the connection dropped before the answer | uncertain | reconciled before any retry |
//!
//! An effect whose earlier call may have happened (an uncertain answer no confirmation ruled out) is never
//! failed: a refusal then needs attention. Redirects are not followed (a `POST` redirected as a `GET` could
//! read as done): a 3xx is uncertain, and so is an answer from another URL (a client of the user's that
//! followed a redirect).
//!
//! **Where the key goes** ([`Key`]): a header the destination names (`Idempotency-Key` by default), a body
//! field (Square's `idempotency_key`), nothing ([`Key::none`]), or the URL of an upsert
//! ([`HttpEffect::upsert`]: `PUT .../tasks/{external_ref}`), which needs no confirmation.
//!
//! **The confirmation** ([`Confirm`]) asks the destination when an answer was lost: a lookup (404 is not
//! found), a search (an empty list or a zero count is not found, unless the answer reports an error), or your
//! own reader. A 2xx whose body lacks the declared reference is unknown, never done, and so is a 202 (its
//! processing not completed), whatever its body. A 429, a 503 with `Retry-After` or a 4xx that is a rate limit
//! did not search: not answered, before any rule reads it. Without a
//! confirmation, a destination that honours its key ([`Key::header`], [`Key::body_field`]) is asked by
//! repeating the call with the same key within the time it keeps keys; any other lost answer needs attention.
//!
//! **A search that lags behind the writes** (HubSpot's CRM search: "It may take a few moments for newly created
//! or updated CRM objects to appear in search results") answers "not found" for what a lost call created a moment
//! ago; where no key is kept, "not found" calls again and creates twice. So the first confirmation waits
//! [`reconcile_after`](HttpEffectBuilder::reconcile_after):
//!
//! | confirmation | key | default `reconcile_after` |
//! |---|---|---|
//! | a search ([`Confirm::search`], [`Confirm::search_post`]) or your own reader ([`Confirm::read_with`]) | not kept ([`Key::none`], or none declared) | [`DEFAULT_SEARCH_RECONCILE_AFTER`] (60 s) |
//! | a search or a reader | kept ([`Key::header`], [`Key::body_field`]): the repeat is deduplicated | none |
//! | a lookup ([`Confirm::lookup`]), or none; an upsert | any | none |
//!
//! A wait you set stands (zero included), in the builder and in the settings file (`reconcile_after_seconds`).
//!
//! **A compensation** ([`HttpEffectBuilder::compensate_url`]) is undone on a 2xx (that reports no error) or a
//! 404 (already gone); a 4xx that is a rate limit undid nothing, even as a 404: ask again later. A 202 ("the
//! action will likely succeed but has not yet been enacted", RFC 9110 of a DELETE) and an HTML page undid
//! nothing yet: ask again (a 404 then says it is gone).

mod answers;
mod builder;
mod confirm;
mod key;
mod settings;
mod template;

use std::time::Duration;

use chrono::Utc;
use futures::future::BoxFuture;
use reqwest::header::{HeaderName, HeaderValue};
use sha2::{Digest, Sha256};

pub use answers::{parse_retry_after, rate_limited, Answer, AnswerTable, MAX_RETRY_AFTER};
pub use builder::{HttpConfigError, HttpEffectBuilder, DEFAULT_SEARCH_RECONCILE_AFTER};
pub use confirm::{Confirm, ReadFn};
pub use key::{Key, DEFAULT_KEY_KEPT_FOR};
pub use settings::{runner_from_settings, EffectSettingsError};

/// The HTTP client the effect uses, for [`HttpEffectBuilder::client`]: build it with
/// `redirect(reqwest::redirect::Policy::none())`.
pub use reqwest;

use crate::effects::{ClaimedEffect, Confirmation, EffectExecutor, Execution};
use confirm::Walk;
use key::Placement;

/// Metadata keys the HTTP effect reads: `content-type`, and `header.<name>` for extra request headers. A name or
/// a value HTTP does not allow (message data with a CR or LF) refuses the effect before any call, naming the
/// header, never its value.
pub mod meta {
    /// The request's content type (default `application/json`).
    pub const CONTENT_TYPE: &str = "content-type";
    /// Prefix of extra request headers (`header.X-Tenant`).
    pub const HEADER: &str = "header.";
}

/// The largest answer body read (a reference is near the top of any sane answer).
const MAX_ANSWER: usize = 1024 * 1024;

/// Calls an HTTP API for each effect of its destination. Built with [`HttpEffect::post`] or
/// [`HttpEffect::upsert`] and [`HttpEffectBuilder::build`]; see the [module docs](self). Its `Debug` shows the
/// URLs without their password or query values (the headers' values are marked sensitive).
#[derive(Clone)]
pub struct HttpEffect {
    client: reqwest::Client,
    method: reqwest::Method,
    url: String,
    upsert: bool,
    key: Key,
    reference: String,
    reference_optional: bool,
    /// The destination's own API answers HTML pages ([`HttpEffectBuilder::html_answers`]).
    html_answers: bool,
    confirm: Option<Confirm>,
    answers: AnswerTable,
    timeout: Duration,
    reconcile_after: Duration,
    headers: Vec<(HeaderName, HeaderValue)>,
    compensate: Option<String>,
}

impl std::fmt::Debug for HttpEffect {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HttpEffect")
            .field("client", &self.client)
            .field("method", &self.method)
            .field("url", &crate::error::redact_url(&self.url))
            .field("upsert", &self.upsert)
            .field("key", &self.key)
            .field("reference", &self.reference)
            .field("reference_optional", &self.reference_optional)
            .field("html_answers", &self.html_answers)
            .field("confirm", &self.confirm)
            .field("answers", &self.answers)
            .field("timeout", &self.timeout)
            .field("reconcile_after", &self.reconcile_after)
            .field("headers", &self.headers)
            .field(
                "compensate",
                &self.compensate.as_deref().map(crate::error::redact_url),
            )
            .finish()
    }
}

impl HttpEffect {
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

    /// Whether the payload carries the external reference (as is, JSON-escaped, or form-encoded in a body sent
    /// as `application/x-www-form-urlencoded`), or the call's URL does, so a destination can be searched by it.
    fn payload_carries_ref(&self, e: &ClaimedEffect) -> bool {
        let escaped = serde_json::Value::String(e.external_ref.clone()).to_string();
        carries_token(&e.payload, e.external_ref.as_bytes())
            || carries_token(&e.payload, &escaped.as_bytes()[1..escaped.len() - 1])
            || (is_form(e) && carries_token(&form_decode(&e.payload), e.external_ref.as_bytes()))
            || self.url.contains(template::EXTERNAL_REF)
    }

    /// What of a request to `url_template` with the extra `headers` its answer must not be kept showing.
    fn secrets(&self, url_template: &str, headers: &[(HeaderName, HeaderValue)]) -> Secrets {
        let mut s = Secrets::default();
        for (_, v) in &self.headers {
            s.add_header(v);
        }
        for (n, v) in headers {
            if names_a_credential(n.as_str()) {
                s.add_header(v);
            }
        }
        s.add_url(url_template);
        s
    }

    fn reference_of(&self, body: &[u8]) -> Option<String> {
        let v: serde_json::Value = serde_json::from_slice(body).ok()?;
        match confirm::walk(&v, &self.reference) {
            Walk::Found(r) => Some(r),
            _ => None,
        }
    }
}

/// Whether `payload` holds `needle` as a whole token: not inside a longer run of letters and digits, so
/// that a short reference (`12`) is not found in unrelated text (`"amount":120`) that a search by it would
/// never match.
fn carries_token(payload: &[u8], needle: &[u8]) -> bool {
    if needle.is_empty() || needle.len() > payload.len() {
        return false;
    }
    let word = |b: Option<&u8>| b.is_some_and(|b| b.is_ascii_alphanumeric());
    payload.windows(needle.len()).enumerate().any(|(i, w)| {
        w == needle
            && !(word(needle.first()) && i > 0 && word(payload.get(i - 1)))
            && !(word(needle.last()) && word(payload.get(i + needle.len())))
    })
}

/// Whether the effect's body is a form (`content-type` `application/x-www-form-urlencoded`, as Stripe takes it).
fn is_form(e: &ClaimedEffect) -> bool {
    e.metadata.get(meta::CONTENT_TYPE).is_some_and(|t| {
        t.split(';')
            .next()
            .unwrap_or_default()
            .trim()
            .eq_ignore_ascii_case("application/x-www-form-urlencoded")
    })
}

/// `payload` decoded as a form body (`application/x-www-form-urlencoded`: `+` is a space, `%3A` or `%3a` a
/// byte); a `%` not followed by two hex digits is kept as it is.
fn form_decode(payload: &[u8]) -> Vec<u8> {
    let hex = |b: u8| (b as char).to_digit(16);
    let mut out = Vec::with_capacity(payload.len());
    let mut i = 0;
    while i < payload.len() {
        let b = payload[i];
        let escaped = (b == b'%')
            .then(|| Some(hex(*payload.get(i + 1)?)? * 16 + hex(*payload.get(i + 2)?)?))
            .flatten();
        match (b, escaped) {
            (_, Some(v)) => {
                out.push(v as u8);
                i += 3;
            }
            (b'+', None) => {
                out.push(b' ');
                i += 1;
            }
            _ => {
                out.push(b);
                i += 1;
            }
        }
    }
    out
}

/// Reads up to [`MAX_ANSWER`] bytes of an answer (an error without the URL, which may carry a secret in its
/// query string).
async fn read_body(resp: &mut reqwest::Response) -> Result<Vec<u8>, reqwest::Error> {
    let mut out = Vec::new();
    while let Some(chunk) = resp.chunk().await.map_err(reqwest::Error::without_url)? {
        let room = MAX_ANSWER.saturating_sub(out.len());
        out.extend_from_slice(&chunk[..chunk.len().min(room)]);
        if out.len() >= MAX_ANSWER {
            break;
        }
    }
    Ok(out)
}

/// An error with its causes (`error sending request: ...: connection closed before message completed`): reqwest's
/// own words alone do not tell a timeout from a reset. The error is one `without_url` made (no query string).
fn chain(e: &reqwest::Error) -> String {
    let mut out = e.to_string();
    let mut source = std::error::Error::source(e);
    while let Some(s) = source {
        let said = s.to_string();
        if !out.ends_with(&said) {
            out.push_str(": ");
            out.push_str(&said);
        }
        source = s.source();
    }
    out
}

/// Whether an answer is an HTML page (a captive portal's sign-in page, a proxy's error page, a web application
/// firewall's challenge), which stands where the destination's API should have answered: its body, past white
/// space and a byte order mark, opens with markup, and the answer says it is HTML (`Content-Type` `text/html` or
/// `application/xhtml+xml`) or the markup is a document's (`<!DOCTYPE html`, `<html`). A short answer that is not
/// markup (`ok`), whatever its label, and XML that is not a page are not pages.
fn html_page(headers: &reqwest::header::HeaderMap, body: &[u8]) -> bool {
    let body = body.strip_prefix(b"\xEF\xBB\xBF").unwrap_or(body);
    let start = body
        .iter()
        .position(|b| !b.is_ascii_whitespace())
        .unwrap_or(body.len());
    let text = &body[start..];
    if text.first() != Some(&b'<') {
        return false;
    }
    let labelled = headers
        .get(reqwest::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|t| {
            let t = t.split(';').next().unwrap_or_default().trim();
            t.eq_ignore_ascii_case("text/html") || t.eq_ignore_ascii_case("application/xhtml+xml")
        });
    let head = String::from_utf8_lossy(&text[..text.len().min(1024)]).to_ascii_lowercase();
    labelled || head.contains("<!doctype html") || head.contains("<html")
}

/// The member by which a JSON-RPC answer reports its call failed (see [`confirm::json_rpc_failure`]).
fn json_rpc_failure_in(body: &[u8]) -> Option<&'static str> {
    serde_json::from_slice::<serde_json::Value>(body)
        .ok()
        .as_ref()
        .and_then(confirm::json_rpc_failure)
}

/// The top-level member by which a JSON answer reports an error (see [`confirm::reported_error`]).
fn reported_error_in(body: &[u8]) -> Option<&'static str> {
    serde_json::from_slice::<serde_json::Value>(body)
        .ok()
        .as_ref()
        .and_then(confirm::reported_error)
}

/// The first bytes of an answer (at most 200), for evidence, with the request's `secrets` masked: a destination
/// may echo the request on an error (the headers it received, the URL it was called at). They are masked before
/// the answer is cut, so that none is shown in part.
fn excerpt(body: &[u8], secrets: &Secrets) -> String {
    const SHOWN: usize = 200;
    let read = String::from_utf8_lossy(&body[..body.len().min(64 * 1024)]);
    let text: String = read.chars().filter(|c| !c.is_control()).collect();
    let mut text = secrets.mask(&text);
    if text.len() > SHOWN {
        let cut = (0..=SHOWN)
            .rev()
            .find(|&i| text.is_char_boundary(i))
            .unwrap_or(0);
        text.truncate(cut);
    }
    text
}

/// What of a request an answer that quotes it must not be kept showing ([`excerpt`]): the values of the
/// destination's headers (each one sensitive: an `Authorization`, an API key) and of the effect's metadata headers
/// whose name reads as a credential ([`names_a_credential`]), and a `Scheme credential` value's credential alone;
/// the URL template's user info, literal query values and literal path segments of 16 characters or more (a
/// webhook's token). Each is masked as written, JSON-escaped (`/` escaped or not) and percent-encoded. Values
/// shorter than 6 characters are left: masking them would mask words and numbers of the answer. No `Debug`: it
/// holds the secrets themselves.
#[derive(Default)]
struct Secrets(Vec<String>);

impl Secrets {
    /// The shortest value masked.
    const SHORTEST: usize = 6;

    fn add(&mut self, value: &str) {
        let value = value.trim();
        if value.chars().count() < Self::SHORTEST {
            return;
        }
        let json = serde_json::Value::String(value.to_owned()).to_string();
        let json = &json[1..json.len() - 1];
        for form in [
            value.to_owned(),
            json.to_owned(),
            json.replace('/', "\\/"),
            template::encode(value),
        ] {
            if !self.0.contains(&form) {
                self.0.push(form);
            }
        }
        // Longest first: a whole `Bearer TOKEN` before its `TOKEN`.
        self.0.sort_by_key(|f| std::cmp::Reverse(f.len()));
    }

    fn add_header(&mut self, value: &HeaderValue) {
        if let Ok(v) = value.to_str() {
            self.add(v);
            if let Some((_, credential)) = v.trim().split_once(' ') {
                self.add(credential);
            }
        }
    }

    /// The secrets a URL template writes out: its user info, its literal query values and its long literal path
    /// segments (a `{placeholder}`, filled with the effect's key or reference, is none).
    fn add_url(&mut self, template: &str) {
        let Some((_, rest)) = template.split_once("://") else {
            return;
        };
        let rest = rest.split('#').next().unwrap_or_default();
        let (before, query) = rest.split_once('?').unwrap_or((rest, ""));
        let (authority, path) = before.split_at(before.find('/').unwrap_or(before.len()));
        if let Some((userinfo, _)) = authority.rsplit_once('@') {
            userinfo.split(':').for_each(|part| self.add(part));
        }
        for segment in path.split('/') {
            if segment.len() >= 16 && !segment.contains('{') {
                self.add(segment);
            }
        }
        for part in query.split('&') {
            let value = part.split_once('=').map_or(part, |(_, v)| v);
            if !value.contains('{') {
                self.add(value);
            }
        }
    }

    fn mask(&self, text: &str) -> String {
        let mut out = text.to_owned();
        for form in &self.0 {
            if out.contains(form.as_str()) {
                out = out.replace(form.as_str(), "***");
            }
        }
        out
    }
}

/// Whether a header's name reads as a credential's (`Authorization`, `X-Api-Key`, `X-Auth-Token`, `Cookie`).
fn names_a_credential(name: &str) -> bool {
    let name = name.to_ascii_lowercase();
    [
        "auth",
        "key",
        "token",
        "secret",
        "signature",
        "password",
        "cookie",
        "session",
    ]
    .iter()
    .any(|w| name.contains(w))
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
            let shown = crate::error::redact_url(&self.url);
            let headers = match metadata_headers(effect) {
                Ok(h) => h,
                Err(error) => return Execution::rejected(format!("{shown}: {error}")),
            };
            let secrets = self.secrets(&self.url, &headers);
            let mut req = self.request(self.method.clone(), &url);
            if let Placement::Header(name) = &self.key.placement {
                req = req.header(name.as_str(), &effect.key);
            }
            for (name, value) in headers {
                req = req.header(name, value);
            }
            let hash = sha256_hex(&body);
            // reqwest's error text ends with the URL, query string and all: the redacted one is `shown`.
            let mut resp = match req
                .body(body)
                .send()
                .await
                .map_err(reqwest::Error::without_url)
            {
                Ok(r) => r,
                Err(e) if e.is_connect() => {
                    return Execution::not_sent(format!("{shown}: {}", chain(&e)))
                }
                // Nothing was sent: a header the metadata gave that HTTP does not allow.
                Err(e) if e.is_builder() => {
                    return Execution::rejected(format!("{shown}: {}", chain(&e)))
                }
                // A timeout, a reset or a connection closed before the answer: the request may have been
                // processed.
                Err(e) => return Execution::uncertain(format!("{shown}: {}", chain(&e))),
            };
            if redirected(&resp, &url) {
                return Execution::uncertain(format!(
                    "{shown}: {REDIRECTED} (it may have acted before it redirected, or where it redirected to)"
                ));
            }
            let status = resp.status().as_u16();
            let retry_after = resp
                .headers()
                .get(reqwest::header::RETRY_AFTER)
                .and_then(|v| v.to_str().ok())
                .and_then(|v| parse_retry_after(v, Utc::now()));
            let answer = self.answers.get(status);
            let headers = resp.headers().clone();
            let body = match read_body(&mut resp).await {
                Ok(b) => b,
                Err(e) if answer == Answer::Done => {
                    return Execution::uncertain(format!(
                        "{shown} answered {status} and its body was lost: {}",
                        chain(&e)
                    ))
                }
                Err(_) => Vec::new(),
            };
            // A refusal that is a rate limit (Salesforce's, GitHub's, Google's 403) is not sent: see AnswerTable.
            let read = self.answers.read(status, &headers, &body);
            let said = || {
                let limit = if read != answer {
                    " (a rate limit: not sent, tried again later)"
                } else {
                    ""
                };
                format!(
                    "{shown} answered {status}{limit}: {}",
                    excerpt(&body, &secrets)
                )
            };
            match read {
                // A JSON-RPC failure answered 2xx (its `error`, MCP's `result.isError`) did not say it acted,
                // nor that it did not (an internal error, a tool's API failing midway); its `id` is the
                // request's own, never the destination's reference.
                Answer::Done if json_rpc_failure_in(&body).is_some() => Execution::uncertain(format!(
                    "{} (a JSON-RPC `{}`): not read as done",
                    said(),
                    json_rpc_failure_in(&body).unwrap_or_default()
                )),
                Answer::Done => match (self.reference_of(&body), reported_error_in(&body)) {
                    (Some(reference), _) => Execution::Done {
                        reference: Some(reference),
                    },
                    // A 2xx that reports an error and gives no reference did not say it acted (GraphQL's
                    // `{"data": null, "errors": [...]}`, Slack's `{"ok": false, "error": ...}`), nor that it
                    // did not (Slack's `internal_error`: "It's possible some aspect of the operation succeeded
                    // before the error was raised").
                    (None, Some(member)) => Execution::uncertain(format!(
                        "{} (reports `{member}` without a reference at {}): not read as done",
                        said(),
                        self.reference
                    )),
                    // An HTML page answered 2xx (a captive portal's sign-in page, a proxy's or a web application
                    // firewall's challenge) is not this destination's API answering: nothing says the call reached
                    // it, whatever reference_optional or an upsert would take; unless its own API answers so.
                    (None, None) if !self.html_answers && html_page(&headers, &body) => Execution::uncertain(format!(
                        "{} (an HTML page, not this destination's API: a proxy's, a captive portal's or a \
                         firewall's): not read as done",
                        said()
                    )),
                    (None, None) if self.upsert => Execution::Done {
                        reference: Some(url_path(&url)),
                    },
                    (None, None) if self.reference_optional => Execution::Done { reference: None },
                    (None, None) => Execution::uncertain(format!(
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
                // A destination not said to keep keys cannot mean the draft's "key in progress": its 409 is a
                // conflict of its own (an object that exists already, perhaps this call's), which a confirmation
                // decides.
                Answer::InProgress if !self.key.honoured => Execution::uncertain(said()),
                Answer::InProgress => Execution::InProgress {
                    error: said().into(),
                    retry_after,
                },
                // A destination not said to keep keys cannot mean the draft's "key reused": its 422 is its own
                // refusal (a validation error).
                Answer::Rejected | Answer::KeyReused if !self.key.honoured => {
                    Execution::rejected(said())
                }
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
                // RFC 9110: "accepted for processing, but the processing has not been completed. The request might
                // or might not eventually be acted upon": not done (see AnswerTable), unless declared.
                Answer::Uncertain if status == 202 && !self.answers.chosen(202) => {
                    Execution::uncertain(format!(
                        "{} (202 Accepted: taken for processing, not done; where this destination's 202 means \
                         done, declare .answer(202, Answer::Done))",
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
            // Filled with nothing, `{reference}` would name the collection (`DELETE /v1/tasks/`): a 404 there
            // would read as "already gone", and a destination might act on it.
            if template.contains(template::REFERENCE)
                && effect.reference.as_deref().unwrap_or_default().is_empty()
            {
                return Err(
                    "the compensation request names {reference}, and the destination gave this effect none: \
                     nothing sent (undo it at the destination by its key or external reference)"
                        .into(),
                );
            }
            let url = template::fill_url(template, effect);
            let secrets = self.secrets(template, &[]);
            let mut req = self.request(reqwest::Method::DELETE, &url);
            // The key goes where the destination takes one: its declared header (`Idempotency-Key` by default).
            // A destination keeping no key, or taking it in the body (a DELETE has none), gets none.
            if let Placement::Header(name) = &self.key.placement {
                req = req.header(name.as_str(), format!("{}-compensate", effect.key));
            }
            let mut r = match req.send().await.map_err(reqwest::Error::without_url) {
                Ok(r) => r,
                Err(e) if e.is_connect() => {
                    return Err(format!(
                        "the compensation request reached nobody (nothing undone): {}",
                        chain(&e)
                    )
                    .into())
                }
                Err(e) => {
                    return Err(format!(
                        "the compensation request's answer was lost: it may have undone the effect (asking again \
                         is safe: what is gone answers 404): {}",
                        chain(&e)
                    )
                    .into())
                }
            };
            if redirected(&r, &url) {
                return Err(format!("the compensation request: {REDIRECTED}").into());
            }
            let status = r.status();
            let headers = r.headers().clone();
            if status.is_client_error() {
                // A rate limit (Salesforce's, GitHub's, Google's 403; a 4xx with Retry-After: see AnswerTable)
                // undid nothing and gone is not what it says, even as a 404: ask again later.
                let body = read_body(&mut r).await.unwrap_or_default();
                if rate_limited(status.as_u16(), &headers, &body) {
                    let after = headers
                        .get(reqwest::header::RETRY_AFTER)
                        .and_then(|v| v.to_str().ok())
                        .and_then(|v| parse_retry_after(v, Utc::now()))
                        .map_or_else(String::new, |d| {
                            format!(" (Retry-After: {} s)", d.as_secs())
                        });
                    return Err(format!(
                        "the compensation request answered {status}, a rate limit: nothing undone, ask again \
                         later{after}: {}",
                        excerpt(&body, &secrets)
                    )
                    .into());
                }
            }
            if status == reqwest::StatusCode::NOT_FOUND {
                return Ok(());
            }
            if !status.is_success() {
                return Err(format!("the compensation request answered {status}").into());
            }
            // RFC 9110 (DELETE): "a 202 (Accepted) status code if the action will likely succeed but has not yet
            // been enacted": not undone yet.
            if status == reqwest::StatusCode::ACCEPTED {
                return Err(
                    "the compensation request answered 202 Accepted: taken, not yet enacted, so nothing is undone \
                     yet (asking again is safe: what is gone answers 404)"
                        .into(),
                );
            }
            // A 2xx that reports an error (GraphQL's `{"errors": [...]}`, Slack's `{"ok": false, "error": ...}`)
            // did not undo it; nor does a 2xx whose body was lost say it did.
            let body = read_body(&mut r).await.map_err(|e| {
                format!(
                    "the compensation request answered {status} and its body was lost: {}",
                    chain(&e)
                )
            })?;
            // An HTML page (a captive portal's, a proxy's or a firewall's) is not the destination answering,
            // unless its own API answers so.
            if !self.html_answers && html_page(&headers, &body) {
                return Err(format!(
                    "the compensation request answered {status} with an HTML page, not the destination's API: not \
                     read as undone: {}",
                    excerpt(&body, &secrets)
                )
                .into());
            }
            // A JSON-RPC failure (MCP's `result.isError: true` has no `error` member) did not undo it either.
            match reported_error_in(&body).or_else(|| json_rpc_failure_in(&body)) {
                None => Ok(()),
                Some(member) => Err(format!(
                    "the compensation request answered {status} with `{member}` in its body: not read as undone: {}",
                    excerpt(&body, &secrets)
                )
                .into()),
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
                match req.send().await.map_err(reqwest::Error::without_url) {
                    Ok(r) if redirected(&r, &url) => Confirmation::Unknown {
                        error: format!("{}: {REDIRECTED}", crate::error::redact_url(&c.url)).into(),
                    },
                    Ok(mut r) => {
                        let status = r.status().as_u16();
                        let headers = r.headers().clone();
                        let retry_after = headers
                            .get(reqwest::header::RETRY_AFTER)
                            .and_then(|v| v.to_str().ok())
                            .and_then(|v| parse_retry_after(v, Utc::now()));
                        let body = read_body(&mut r).await;
                        let limited =
                            rate_limited(status, &headers, body.as_deref().unwrap_or_default());
                        match body {
                            // Asked to come back (RFC 6585: "too many requests in a given amount of time";
                            // RFC 9110: a 503's Retry-After is "how long the service is expected to be
                            // unavailable"; a 4xx that is a rate limit, see AnswerTable): the destination did
                            // not search, whatever its body says, and is not asked again before it said.
                            _ if status == 429
                                || (status == 503 && retry_after.is_some())
                                || limited =>
                            {
                                Confirmation::NotAnswered {
                                    error: format!(
                                        "{} answered {status}: asked to come back later",
                                        crate::error::redact_url(&c.url)
                                    )
                                    .into(),
                                    retry_after,
                                }
                            }
                            Ok(b) => c.read_for(effect, status, &b),
                            Err(e) => Confirmation::Unknown {
                                error: chain(&e).into(),
                            },
                        }
                    }
                    // Nothing reached the destination.
                    Err(e) if e.is_connect() => Confirmation::NotAnswered {
                        error: format!("{}: {}", crate::error::redact_url(&c.url), chain(&e))
                            .into(),
                        retry_after: None,
                    },
                    Err(e) => Confirmation::Unknown {
                        error: format!("{}: {}", crate::error::redact_url(&c.url), chain(&e))
                            .into(),
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

/// The content type and the extra headers the effect's metadata asks for; a name or a value HTTP does not allow
/// (message data with a CR or LF) is named, never shown, and nothing is sent.
fn metadata_headers(e: &ClaimedEffect) -> Result<Vec<(HeaderName, HeaderValue)>, String> {
    let refused = |name: &str, what: &str| {
        format!("the effect's metadata asks for header {name:?} with {what} HTTP does not allow: nothing sent")
    };
    let content_type = e
        .metadata
        .get(meta::CONTENT_TYPE)
        .map_or("application/json", String::as_str);
    let mut out = vec![(
        reqwest::header::CONTENT_TYPE,
        HeaderValue::from_str(content_type).map_err(|_| refused("content-type", "a value"))?,
    )];
    for (k, v) in &e.metadata {
        if let Some(name) = k.strip_prefix(meta::HEADER) {
            let n = HeaderName::from_bytes(name.as_bytes()).map_err(|_| refused(name, "a name"))?;
            let v = HeaderValue::from_str(v).map_err(|_| refused(name, "a value"))?;
            out.push((n, v));
        }
    }
    Ok(out)
}

/// Why an answer from another URL than the one called is not read.
const REDIRECTED: &str =
    "the client followed a redirect, and the answer came from another URL: not read as this \
                          destination's (build the client with reqwest::redirect::Policy::none())";

/// Whether `resp` came from another URL than `url`: a client of the user's followed a redirect.
fn redirected(resp: &reqwest::Response, url: &str) -> bool {
    reqwest::Url::parse(url).map_or(true, |u| *resp.url() != u)
}

/// The path of `url` (a done upsert's reference).
fn url_path(url: &str) -> String {
    reqwest::Url::parse(url).map_or_else(|_| url.to_owned(), |u| u.path().to_owned())
}

#[cfg(test)]
mod compensate_tests;
#[cfg(test)]
mod echo_tests;
#[cfg(test)]
mod error_body_tests;
#[cfg(test)]
mod rate_limit_tests;
#[cfg(test)]
mod search_lag_tests;
#[cfg(test)]
mod tests;
#[cfg(test)]
mod vendor_shapes_tests;
#[cfg(test)]
mod wire_tests;
