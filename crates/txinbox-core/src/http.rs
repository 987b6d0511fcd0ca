//! An HTTP destination for effects (feature `http`), following the conventions destinations already use: the
//! idempotency key in the `Idempotency-Key` request header (the IETF httpapi draft; Stripe and others), a
//! confirmation request by key or external reference, a timeout, rustls.
//!
//! ```no_run
//! use txinbox_core::http::HttpEffect;
//! let crm = HttpEffect::post("https://crm.example/api/tasks")
//!     .confirm_url("https://crm.example/api/tasks?idempotency_key={key}")
//!     .reference_pointer("/id");
//! ```
//!
//! How a call's result maps to the effect's next state:
//!
//! | what happened | execution |
//! |---|---|
//! | 2xx | done (reference from the body's JSON pointer) |
//! | could not connect; 408, 425, 429 | not sent: retried with backoff |
//! | another 4xx | rejected: failed, not retried |
//! | 5xx, a timeout, the connection dropped before the answer | **uncertain**: reconciled before any retry |
//!
//! The confirmation request answers 2xx (done, with the reference), 404 (not found: run again with the same key)
//! or anything else (unknown: still uncertain).

use std::time::Duration;

use futures::future::BoxFuture;

use crate::effects::{ClaimedEffect, Confirmation, EffectExecutor, Execution};

/// Metadata keys the HTTP effect reads: `content-type`, and `header.<name>` for extra request headers.
pub mod meta {
    /// The request's content type (default `application/json`).
    pub const CONTENT_TYPE: &str = "content-type";
    /// Prefix of extra request headers (`header.X-Tenant`).
    pub const HEADER: &str = "header.";
}

/// Calls an HTTP API for each effect of its destination. See the [module docs](self).
#[derive(Clone, Debug)]
pub struct HttpEffect {
    client: reqwest::Client,
    url: String,
    confirm: Option<String>,
    compensate: Option<String>,
    reference_pointer: String,
    send_key: bool,
    timeout: Duration,
}

impl HttpEffect {
    /// POSTs each effect's payload to `url` with its `Idempotency-Key`.
    pub fn post(url: impl Into<String>) -> Self {
        Self {
            client: reqwest::Client::new(),
            url: url.into(),
            confirm: None,
            compensate: None,
            reference_pointer: "/id".into(),
            send_key: true,
            timeout: Duration::from_secs(10),
        }
    }

    /// The confirmation request: a GET to this URL, where `{key}` and `{external_ref}` are replaced by the
    /// effect's idempotency key and external reference (percent-encoded). Without one, an uncertain effect
    /// cannot be reconciled and ends in needs attention.
    pub fn confirm_url(mut self, template: impl Into<String>) -> Self {
        self.confirm = Some(template.into());
        self
    }

    /// The compensation request an operator can trigger ([`crate::EffectRunner::compensate`]): a DELETE to
    /// this URL, where `{reference}`, `{key}` and `{external_ref}` are replaced (percent-encoded). A 2xx or a
    /// 404 (already gone) undoes the effect.
    pub fn compensate_url(mut self, template: impl Into<String>) -> Self {
        self.compensate = Some(template.into());
        self
    }

    /// Where the destination's reference is in a JSON answer (default `/id`).
    pub fn reference_pointer(mut self, pointer: impl Into<String>) -> Self {
        self.reference_pointer = pointer.into();
        self
    }

    /// Whether to send the `Idempotency-Key` header (default true; a destination without idempotency support
    /// ignores it, and only the confirmation request prevents a repeat).
    pub fn send_idempotency_key(mut self, send: bool) -> Self {
        self.send_key = send;
        self
    }

    /// The timeout of each request (default 10 s). A call past it is uncertain.
    pub fn timeout(mut self, d: Duration) -> Self {
        self.timeout = d;
        self
    }

    /// Uses `client` (for its TLS roots, proxy or connection pool).
    pub fn client(mut self, client: reqwest::Client) -> Self {
        self.client = client;
        self
    }

    fn reference(&self, body: &[u8]) -> Option<String> {
        let v: serde_json::Value = serde_json::from_slice(body).ok()?;
        match v.pointer(&self.reference_pointer)? {
            serde_json::Value::String(s) => Some(s.clone()),
            serde_json::Value::Null => None,
            other => Some(other.to_string()),
        }
    }
}

fn encode(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b'~') {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

impl EffectExecutor for HttpEffect {
    fn execute<'a>(&'a self, effect: &'a ClaimedEffect) -> BoxFuture<'a, Execution> {
        Box::pin(async move {
            let content_type = effect
                .metadata
                .get(meta::CONTENT_TYPE)
                .map_or("application/json", String::as_str);
            let mut req = self
                .client
                .post(&self.url)
                .timeout(self.timeout)
                .header(reqwest::header::CONTENT_TYPE, content_type)
                .body(effect.payload.clone());
            if self.send_key {
                req = req.header("Idempotency-Key", &effect.key);
            }
            for (k, v) in &effect.metadata {
                if let Some(name) = k.strip_prefix(meta::HEADER) {
                    req = req.header(name, v);
                }
            }
            let resp = match req.send().await {
                Ok(r) => r,
                Err(e) if e.is_connect() => return Execution::NotSent { error: e.into() },
                Err(e) if e.is_builder() => return Execution::Rejected { error: e.into() },
                // A timeout, a reset or a connection closed before the answer: the request may have been
                // processed.
                Err(e) => return Execution::Uncertain { error: e.into() },
            };
            let status = resp.status();
            let body = match resp.bytes().await {
                Ok(b) => b,
                Err(e) if status.is_success() => return Execution::Uncertain { error: e.into() },
                Err(_) => Default::default(),
            };
            let error = || format!("{} answered {status}", self.url);
            match status.as_u16() {
                200..=299 => Execution::Done {
                    reference: self.reference(&body),
                },
                408 | 425 | 429 => Execution::NotSent {
                    error: error().into(),
                },
                400..=499 => Execution::Rejected {
                    error: error().into(),
                },
                _ => Execution::Uncertain {
                    error: error().into(),
                },
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
            let url = template
                .replace(
                    "{reference}",
                    &encode(effect.reference.as_deref().unwrap_or_default()),
                )
                .replace("{key}", &encode(&effect.key))
                .replace("{external_ref}", &encode(&effect.external_ref));
            let r = self
                .client
                .delete(&url)
                .header("Idempotency-Key", format!("{}-compensate", effect.key))
                .timeout(self.timeout)
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
            let Some(template) = &self.confirm else {
                return Confirmation::Unknown {
                    error: "no confirmation request is configured for this destination".into(),
                };
            };
            let url = template
                .replace("{key}", &encode(&effect.key))
                .replace("{external_ref}", &encode(&effect.external_ref));
            match self.client.get(&url).timeout(self.timeout).send().await {
                Ok(r) if r.status().is_success() => match r.bytes().await {
                    Ok(body) => Confirmation::Done {
                        reference: self.reference(&body),
                    },
                    Err(e) => Confirmation::Unknown { error: e.into() },
                },
                Ok(r) if r.status() == reqwest::StatusCode::NOT_FOUND => Confirmation::NotFound,
                Ok(r) => Confirmation::Unknown {
                    error: format!("the confirmation request answered {}", r.status()).into(),
                },
                Err(e) => Confirmation::Unknown { error: e.into() },
            }
        })
    }
}
