//! The builder of an [`HttpEffect`], and the errors of a configuration that cannot work.

use std::time::Duration;

use reqwest::header::{HeaderName, HeaderValue};

use super::key::Placement;
use super::{confirm, template, Answer, AnswerTable, Confirm, HttpEffect, Key};

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
    /// An answer for a status HTTP has not (`.answer(4, ..)`, `.answer_class(42, ..)`): it would never apply.
    #[error("an answer for status {status}: statuses are 100 to 599, classes 1xx to 5xx")]
    Status {
        /// The status or class, as given (`4`, `42xx`).
        status: String,
    },
    /// `{reference}` outside a compensation URL: the destination's reference is known once the effect is done.
    #[error(
        "the {what} names {{reference}}, which only a compensation URL may name: the destination's reference is \
         known once the effect is done"
    )]
    Reference {
        /// Which template.
        what: &'static str,
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

/// Builds an [`HttpEffect`]; [`build`](Self::build) checks that every rule can work. Its `Debug` shows the URLs
/// without their password or query values, and the headers without their values.
#[derive(Clone)]
#[must_use = "an HttpEffectBuilder does nothing until build() is called"]
pub struct HttpEffectBuilder {
    client: Option<reqwest::Client>,
    method: String,
    url: String,
    upsert: bool,
    key: Option<Key>,
    reference: String,
    reference_optional: bool,
    html_answers: bool,
    confirm: Option<Confirm>,
    answers: AnswerTable,
    timeout: Duration,
    /// `None`: the default (see [`HttpEffectBuilder::reconcile_after`]).
    reconcile_after: Option<Duration>,
    headers: Vec<(String, String)>,
    compensate: Option<String>,
    /// The first status or class given an answer that HTTP has not: refused by `build`.
    bad_status: Option<String>,
}

impl std::fmt::Debug for HttpEffectBuilder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let headers: Vec<(&str, &str)> = self
            .headers
            .iter()
            .map(|(n, _)| (n.as_str(), "***"))
            .collect();
        f.debug_struct("HttpEffectBuilder")
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
            .field("headers", &headers)
            .field(
                "compensate",
                &self.compensate.as_deref().map(crate::error::redact_url),
            )
            .finish()
    }
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
            html_answers: false,
            confirm: None,
            answers: AnswerTable::default(),
            timeout: Duration::from_secs(10),
            reconcile_after: None,
            headers: Vec::new(),
            compensate: None,
            bad_status: None,
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

    /// The destination's 2xx may carry no reference (a 204, an empty body, JSON without an id): done without
    /// reference, shown apart in `txinbox effects stats` and the metrics. A 2xx whose JSON body reports an error
    /// (a non-empty top-level `errors` or `error`) is still uncertain, never done, and so is an HTML page (a
    /// captive portal's, a proxy's or a firewall's, answered in place of the API). A 202 is not done unless
    /// declared (an e-mail API that answers 202 to a send it takes for delivery:
    /// `.reference_optional().answer(202, Answer::Done)`; see [`AnswerTable`]).
    pub fn reference_optional(mut self) -> Self {
        self.reference_optional = true;
        self
    }

    /// This destination's own API answers with HTML pages (a form endpoint, a web hook of an older web
    /// application): a 2xx HTML page is read as its answer, like any other 2xx without a reference (done
    /// under [`reference_optional`](Self::reference_optional) or for an upsert), and a compensation answered
    /// 2xx with one is undone. Without it such a page is taken for what usually sends it, a captive portal's
    /// sign-in page, a proxy's or a web application firewall's challenge answered in place of the API, and is
    /// uncertain, never done.
    ///
    /// Set it only for a destination reached without such a middlebox: with it, a portal's page answered 200
    /// is read as the destination's, and an effect it stopped is reported done. [`build`](Self::build) refuses it
    /// where it would change nothing (neither a reference declared optional, nor an upsert, nor a
    /// compensation URL).
    pub fn html_answers(mut self) -> Self {
        self.html_answers = true;
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

    /// What `status` (100 to 599) means at this destination, over the [default table](AnswerTable). Another
    /// number is refused by [`build`](Self::build). It stands as set: a 4xx set to [`Answer::Rejected`] is
    /// rejected even when it is a [rate limit](super::rate_limited), which the default table reads as not sent.
    pub fn answer(mut self, status: u16, answer: Answer) -> Self {
        if (100..=599).contains(&status) {
            self.answers.set(status, answer);
        } else {
            self.bad_status.get_or_insert(status.to_string());
        }
        self
    }

    /// What a whole class (`4` for 4xx, 1 to 5) means, replacing the defaults' exact codes of that class. Another
    /// number is refused by [`build`](Self::build). It stands as set, as [`answer`](Self::answer)'s does.
    pub fn answer_class(mut self, class: u8, answer: Answer) -> Self {
        if (1..=5).contains(&class) {
            self.answers.set_class(class, answer);
        } else {
            self.bad_status.get_or_insert(format!("{class}xx"));
        }
        self
    }

    /// Waits this long after an uncertain call before the first confirmation: a search whose index lags behind
    /// the writes would not find a fresh object, and "not found" calls again.
    ///
    /// Default: [`DEFAULT_SEARCH_RECONCILE_AFTER`] (60 s) for a confirmation that is not a
    /// [`lookup`](Confirm::lookup) (a [`search`](Confirm::search), [`search_post`](Confirm::search_post), or your
    /// own [reader](Confirm::read_with), which may read one) at a destination not said to keep keys
    /// ([`Key::none`], or no key declared); none otherwise. There nothing else stops a second call: HubSpot's
    /// CRM objects take no key, and "It may take a few moments for newly created or updated CRM objects to
    /// appear in search results" (<https://developers.hubspot.com/docs/api/crm/search>); searched at once, a
    /// call whose answer was lost reads "not found" and is made again, creating a second record. Where a kept
    /// key dedupes the repeat ([`Key::header`], [`Key::body_field`]), a "not found" inside the lag is harmless.
    ///
    /// A wait you set stands, zero included: set `Duration::ZERO` only for a search the destination documents
    /// as reading its own writes at once. It lengthens the runner's claim by as much
    /// ([`EffectOptions::claim_for`](crate::effects::EffectOptions::claim_for)).
    pub fn reconcile_after(mut self, d: Duration) -> Self {
        self.reconcile_after = Some(d);
        self
    }

    /// A header sent with every request of this destination (an `Authorization`): marked sensitive, never
    /// logged. Its value is sent as it is: one with a placeholder (`{key}`) is refused by [`build`](Self::build).
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
    /// this URL, where `{reference}`, `{key}` and `{external_ref}` are replaced (percent-encoded), with
    /// `<key>-compensate` in the destination's key header ([`Key::header`]'s, `Idempotency-Key` when none is
    /// declared; none with [`Key::none`] or [`Key::body_field`]). A 2xx or a 404 (already gone) undoes the
    /// effect; a 2xx whose JSON body reports an error (a non-empty top-level `errors` or `error`), whose body
    /// was lost or is an HTML page, does not, nor does a 202 (RFC 9110: "the action will likely succeed but has
    /// not yet been enacted"), nor a 4xx that is a rate limit ([`rate_limited`](super::rate_limited)), even a
    /// 404. A URL naming `{reference}` refuses, unsent, an effect done without one (it would name the
    /// collection).
    pub fn compensate_url(mut self, template: impl Into<String>) -> Self {
        self.compensate = Some(template.into());
        self
    }

    /// Uses `client` (for its TLS roots, proxy or connection pool); build it without redirects
    /// (`reqwest::redirect::Policy::none()`), or a 3xx would be followed: the request sent again to the
    /// `Location`, with the headers the client forwards. An answer that comes from another URL than the one
    /// called is never read as the destination's (uncertain; unknown for a confirmation).
    pub fn client(mut self, client: reqwest::Client) -> Self {
        self.client = Some(client);
        self
    }

    /// Checks that every rule can work and builds the effect.
    ///
    /// # Errors
    /// An [`HttpConfigError`] naming the rule that cannot work: a URL that is not http(s), a template without
    /// `{key}` or `{external_ref}` where one effect must be found (a confirmation, an upsert's URL), an unknown
    /// placeholder in a URL or a body, a placeholder in a header's value (sent as it is), a body template that
    /// is not JSON, a JSON pointer that is not one, a header HTTP does not
    /// allow, a confirmation by `{key}` at a destination that keeps no key, [`html_answers`](Self::html_answers)
    /// where it would change nothing.
    pub fn build(self) -> Result<HttpEffect, HttpConfigError> {
        if let Some(status) = self.bad_status {
            return Err(HttpConfigError::Status { status });
        }
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
                url: crate::error::redact_url(&self.url),
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
        if self.html_answers
            && !self.reference_optional
            && !self.upsert
            && self.compensate.is_none()
        {
            return Err(HttpConfigError::Conflict(
                "html_answers reads a 2xx HTML page as the destination's answer, but this destination needs a \
                 reference from a JSON answer and has no compensation URL: it would change nothing (declare the \
                 reference optional, or drop html_answers)"
                    .into(),
            ));
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
            // A header's value is sent as it is: a placeholder there (`{key}`, `Bearer {token}`) would go out
            // literally. Named by the header, never shown: the value may be a secret.
            if template::placeholders(&value).next().is_some() {
                return Err(HttpConfigError::Header {
                    name,
                    detail: "the value has a placeholder ({name}), and header values are sent as they are, \
                             never filled (the key goes in a header with .key(Key::header(NAME)))"
                        .into(),
                });
            }
            v.set_sensitive(true);
            headers.push((n, v));
        }
        let reconcile_after = self
            .reconcile_after
            .unwrap_or_else(|| default_reconcile_after(self.confirm.as_ref(), &key, self.upsert));
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
            html_answers: self.html_answers,
            confirm: self.confirm,
            answers: self.answers,
            timeout: self.timeout,
            reconcile_after,
            headers,
            compensate: self.compensate,
        })
    }
}

/// The wait before the first confirmation of a search at a destination that keeps no key, unless one is set:
/// a minute. HubSpot: "It may take a few moments for newly created or updated CRM objects to appear in search
/// results"; Stripe's search: "Under normal operating conditions, data is searchable in under 1 minute".
pub const DEFAULT_SEARCH_RECONCILE_AFTER: Duration = Duration::from_secs(60);

/// The wait before the first confirmation when none is set: [`DEFAULT_SEARCH_RECONCILE_AFTER`] for a
/// confirmation that may read a search (any but a lookup) at a destination not said to keep keys, where a "not
/// found" inside the search's lag would call again with nothing to dedupe the second call; none otherwise.
pub(crate) fn default_reconcile_after(
    confirm: Option<&Confirm>,
    key: &Key,
    upsert: bool,
) -> Duration {
    match confirm {
        Some(c) if !upsert && !key.honoured && !c.is_lookup() => DEFAULT_SEARCH_RECONCILE_AFTER,
        _ => Duration::ZERO,
    }
}
