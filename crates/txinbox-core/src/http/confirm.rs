//! The confirmation: how to ask an HTTP destination whether an effect happened, and how to read its answer.

use std::fmt;
use std::sync::Arc;

use serde_json::Value;

use crate::effects::{ClaimedEffect, Confirmation};

use super::template::{self, Template};
use super::HttpConfigError;

/// A reader of a confirmation's answer: the status and the body, to what they say.
pub type ReadFn = dyn Fn(u16, &[u8]) -> Confirmation + Send + Sync;

/// How a confirmation's answer is read.
#[derive(Clone)]
pub(crate) enum Rule {
    /// One object by key or reference: 404 is "not found"; a 2xx is found only if the reference is at
    /// `found_at`, anything else (an empty list, a body without the reference) is unknown.
    Lookup { found_at: String },
    /// A list or a search: a 2xx whose pointer walks into an empty list (or whose count is 0) is "not found",
    /// unless it reports an error (a non-empty top-level `errors` or `error`) or says it is partial (`timed_out`,
    /// failed `_shards`): unknown;
    /// a 2xx with the reference at `found_at` is found; a 404 or a body of another shape is unknown.
    Search {
        found_at: String,
        count_at: Option<String>,
        /// A body without the list at all (Square answers `{}`) is an empty list.
        absent_is_empty: bool,
    },
    /// The user's reader.
    Custom(Arc<ReadFn>),
}

impl fmt::Debug for Rule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Rule::Lookup { found_at } => write!(f, "Lookup(found_at {found_at})"),
            Rule::Search {
                found_at,
                count_at,
                absent_is_empty,
            } => write!(
                f,
                "Search(found_at {found_at}, count_at {count_at:?}, absent_is_empty {absent_is_empty})"
            ),
            Rule::Custom(_) => f.write_str("Custom"),
        }
    }
}

/// The confirmation request of an HTTP destination and the rule that reads its answer. A confirmation says
/// how to read the answer (found, with the reference taken from a declared place; not found; or unknown),
/// never "any 2xx":
///
/// * [`Confirm::lookup`]: `GET` one object (`/tasks/{external_ref}`, `/tasks?idempotency_key={key}`): 404 is
///   not found; a 2xx is found when the reference is at [`found_at`](Confirm::found_at) (`/id` by default),
///   and **unknown** otherwise: an empty list or a body without the reference is never read as done.
/// * [`Confirm::search`]: `GET` a list (`/v1/tasks?external_ref={external_ref}` answering
///   `{"data": [...]}`): an empty list at the pointer's path is not found (`/data/0/id` by default); a count
///   ([`count_at`](Confirm::count_at), `/total`) of 0 is not found; a 404 or another shape is unknown, and so
///   is an empty list or a zero count beside a reported error (a non-empty top-level `errors`, as GraphQL
///   answers 200 with, or `error`) or in a partial answer (Elasticsearch's `"timed_out": true` or failed
///   `_shards`): the search did not run, or not all of it.
/// * [`Confirm::search_post`]: the same with a `POST` body (HubSpot's `POST /crm/v3/objects/tasks/search`).
/// * [`read_with`](Confirm::read_with): your own reader of the status and body.
///
/// `{key}` and `{external_ref}` in the URL are replaced, percent-encoded; in a body, as JSON string content.
/// A confirmation must name one of them; another `{name}` is refused as a typo (JSON's own braces are none; a
/// literal `{name}` in a body is written `\u007bname}`). Its `Debug` shows the URL without its password or query values.
#[derive(Clone)]
#[must_use = "a Confirm does nothing until given to HttpEffectBuilder::confirm"]
pub struct Confirm {
    pub(crate) method: reqwest::Method,
    pub(crate) url: String,
    pub(crate) body: Option<String>,
    pub(crate) rule: Rule,
    /// Where what was found carries the effect's external reference or key, checked before it counts.
    pub(crate) match_at: Option<String>,
}

impl fmt::Debug for Confirm {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Confirm")
            .field("method", &self.method)
            .field("url", &crate::error::redact_url(&self.url))
            .field("body", &self.body)
            .field("rule", &self.rule)
            .field("match_at", &self.match_at)
            .finish()
    }
}

impl Confirm {
    /// `GET url`, read as a lookup of one object (see the [type docs](Confirm)).
    pub fn lookup(url: impl Into<String>) -> Self {
        Self {
            method: reqwest::Method::GET,
            url: url.into(),
            body: None,
            rule: Rule::Lookup {
                found_at: "/id".into(),
            },
            match_at: None,
        }
    }

    /// `GET url`, read as a list or search (see the [type docs](Confirm)).
    pub fn search(url: impl Into<String>) -> Self {
        Self {
            rule: Rule::Search {
                found_at: "/data/0/id".into(),
                count_at: None,
                absent_is_empty: false,
            },
            ..Self::lookup(url)
        }
    }

    /// `POST url` with the JSON `body` (a template), read as a search: HubSpot's
    /// `POST /crm/v3/objects/tasks/search` with `.count_at("/total").found_at("/results/0/id")`.
    pub fn search_post(url: impl Into<String>, body: impl Into<String>) -> Self {
        Self {
            method: reqwest::Method::POST,
            body: Some(body.into()),
            ..Self::search(url)
        }
    }

    /// Where the reference of what was found is (a JSON pointer: `/id`, `/data/0/id`). It must not be empty:
    /// an empty pointer would read any answer as found.
    pub fn found_at(mut self, pointer: impl Into<String>) -> Self {
        let p = pointer.into();
        match &mut self.rule {
            Rule::Lookup { found_at } | Rule::Search { found_at, .. } => *found_at = p,
            Rule::Custom(_) => {
                self.rule = Rule::Search {
                    found_at: p,
                    count_at: None,
                    absent_is_empty: false,
                }
            }
        }
        self
    }

    /// Where what was found carries the effect's external reference or its key (`/data/0/external_ref`): a
    /// found answer counts as done only when the value there is one of them, and is unknown otherwise. A
    /// destination that ignores a filter it does not know (a misspelt query parameter, an API version
    /// without it) answers a search with other objects, the first of which would read as this effect. Without
    /// it, a search's found object (the one `found_at` points into) must hold the reference or the key as a
    /// string somewhere inside it; a lookup, whose URL names its object, is not checked.
    pub fn matches_at(mut self, pointer: impl Into<String>) -> Self {
        self.match_at = Some(pointer.into());
        self
    }

    /// Where a search's count of matches is (`/total`): 0 is not found. Turns a lookup into a search.
    pub fn count_at(mut self, pointer: impl Into<String>) -> Self {
        let (found_at, absent_is_empty) = match &self.rule {
            Rule::Lookup { found_at } => (found_at.clone(), false),
            Rule::Search {
                found_at,
                absent_is_empty,
                ..
            } => (found_at.clone(), *absent_is_empty),
            Rule::Custom(_) => ("/results/0/id".into(), false),
        };
        self.rule = Rule::Search {
            found_at,
            count_at: Some(pointer.into()),
            absent_is_empty,
        };
        self
    }

    /// A search whose answer leaves the list out when nothing matches (Square's `SearchCustomers` answers
    /// `{}`): a 2xx JSON object without the list [`found_at`](Self::found_at) walks into is not found. Any
    /// other shape without it stays unknown. Turns a lookup into a search.
    pub fn absent_list_is_empty(mut self) -> Self {
        let (found_at, count_at) = match &self.rule {
            Rule::Lookup { found_at } => (found_at.clone(), None),
            Rule::Search {
                found_at, count_at, ..
            } => (found_at.clone(), count_at.clone()),
            Rule::Custom(_) => ("/data/0/id".into(), None),
        };
        self.rule = Rule::Search {
            found_at,
            count_at,
            absent_is_empty: true,
        };
        self
    }

    /// Reads the answer with `read` instead: the status and the body to a [`Confirmation`]. Say
    /// [`Confirmation::Done`] only when the answer shows the effect, [`Confirmation::NotFound`] only when it
    /// shows its absence.
    pub fn read_with(
        mut self,
        read: impl Fn(u16, &[u8]) -> Confirmation + Send + Sync + 'static,
    ) -> Self {
        self.rule = Rule::Custom(Arc::new(read));
        self
    }

    /// Checks the confirmation can work: a URL (and body) naming `{key}` or `{external_ref}`, a body that is
    /// JSON once filled, pointers that are JSON pointers.
    pub(crate) fn validate(&self) -> Result<(), HttpConfigError> {
        let url = Template::parse("confirmation URL", &self.url)?;
        let body = self
            .body
            .as_deref()
            .map(|b| Template::parse("confirmation body", b))
            .transpose()?;
        if !url.names_effect() && !body.as_ref().is_some_and(Template::names_effect) {
            return Err(HttpConfigError::NoPlaceholder {
                what: "the confirmation",
                url: crate::error::redact_url(&self.url),
            });
        }
        template::check_url("confirmation URL", &url)?;
        if let Some(b) = &body {
            b.check_json("confirmation body")?;
        }
        if let Some(m) = &self.match_at {
            check_pointer("matches_at", m, false)?;
        }
        match &self.rule {
            Rule::Lookup { found_at } => check_pointer("found_at", found_at, false),
            Rule::Search {
                found_at, count_at, ..
            } => {
                check_pointer("found_at", found_at, false)?;
                count_at
                    .as_deref()
                    .map_or(Ok(()), |c| check_pointer("count_at", c, false))
            }
            Rule::Custom(_) => Ok(()),
        }
    }

    /// Whether the confirmation is a lookup of one object (read from the destination's store, not a search index).
    pub(crate) fn is_lookup(&self) -> bool {
        matches!(self.rule, Rule::Lookup { .. })
    }

    /// Whether the confirmation finds the effect by its external reference.
    pub(crate) fn uses_external_ref(&self) -> bool {
        self.url.contains(template::EXTERNAL_REF)
            || self
                .body
                .as_deref()
                .is_some_and(|b| b.contains(template::EXTERNAL_REF))
    }

    /// The request's URL and body for `effect`.
    pub(crate) fn request(&self, effect: &ClaimedEffect) -> (String, Option<String>) {
        (
            template::fill_url(&self.url, effect),
            self.body.as_deref().map(|b| template::fill_json(b, effect)),
        )
    }

    /// What the answer says of `effect`: [`read`](Self::read), and a found answer that
    /// [`matches_at`](Self::matches_at) shows to be another object is unknown.
    pub(crate) fn read_for(
        &self,
        effect: &ClaimedEffect,
        status: u16,
        body: &[u8],
    ) -> Confirmation {
        let answer = self.read(status, body);
        if !matches!(answer, Confirmation::Done { .. }) {
            return answer;
        }
        let at = match (&self.match_at, &self.rule) {
            (Some(at), _) => at,
            // A search told nothing of where its objects carry the reference: what it found must carry the
            // effect's reference or key somewhere, or it may be the first object of a list the destination
            // did not filter (a parameter it does not know), read as this effect.
            (None, Rule::Search { found_at, .. }) => {
                return if found_carries_effect(body, found_at, effect) {
                    answer
                } else {
                    unknown(format!(
                        "what the search found carries neither the effect's reference {:?} nor its key: the destination may have ignored the filter; declare where its objects carry them with matches_at",
                        effect.external_ref.chars().take(100).collect::<String>()
                    ))
                };
            }
            (None, _) => return answer,
        };
        let found = serde_json::from_slice::<Value>(body)
            .ok()
            .and_then(|v| v.pointer(at).and_then(Value::as_str).map(str::to_owned));
        match found {
            Some(r) if r == effect.external_ref || r == effect.key => answer,
            Some(r) => unknown(format!(
                "what the confirmation found is not this effect: {at} is {:?}, not its reference {:?} (does the destination know the filter?)",
                r.chars().take(100).collect::<String>(),
                effect.external_ref
            )),
            None => unknown(format!(
                "the confirmation found something without a reference at {at}"
            )),
        }
    }

    /// What the answer says.
    pub(crate) fn read(&self, status: u16, body: &[u8]) -> Confirmation {
        // A JSON-RPC failure answered 200 did not look anything up: its `id` is the request's own.
        if !matches!(self.rule, Rule::Custom(_)) && (200..=299).contains(&status) {
            if let Some(member) = serde_json::from_slice::<Value>(body)
                .ok()
                .as_ref()
                .and_then(json_rpc_failure)
            {
                return unknown(format!(
                    "the confirmation answered {status} with a JSON-RPC `{member}`: not read as found"
                ));
            }
        }
        match &self.rule {
            Rule::Lookup { found_at } => read_lookup(status, body, found_at),
            Rule::Search {
                found_at,
                count_at,
                absent_is_empty,
            } => read_search(
                status,
                body,
                found_at,
                count_at.as_deref(),
                *absent_is_empty,
            ),
            Rule::Custom(read) => read(status, body),
        }
    }
}

/// Whether the object a search found (the one `found_at` points into: `/data/0` for `/data/0/id`, the whole
/// document for `/id`) holds, as a string anywhere inside it, the effect's external reference or its key.
fn found_carries_effect(body: &[u8], found_at: &str, effect: &ClaimedEffect) -> bool {
    fn holds(v: &Value, wanted: &[&str], depth: usize) -> bool {
        match v {
            Value::String(s) => wanted.contains(&s.as_str()),
            Value::Array(a) if depth > 0 => a.iter().any(|x| holds(x, wanted, depth - 1)),
            Value::Object(o) if depth > 0 => o.values().any(|x| holds(x, wanted, depth - 1)),
            _ => false,
        }
    }
    let wanted: Vec<&str> = [effect.external_ref.as_str(), effect.key.as_str()]
        .into_iter()
        .filter(|w| !w.is_empty())
        .collect();
    let object = found_at.rsplit_once('/').map_or("", |(parent, _)| parent);
    serde_json::from_slice::<Value>(body)
        .ok()
        .and_then(|v| v.pointer(object).map(|o| holds(o, &wanted, 32)))
        .unwrap_or(false)
}

/// A JSON pointer's check: `""` or `/...`; `empty_ok` says whether the whole document may be meant.
pub(crate) fn check_pointer(
    what: &'static str,
    p: &str,
    empty_ok: bool,
) -> Result<(), HttpConfigError> {
    if (p.is_empty() && empty_ok) || p.starts_with('/') {
        Ok(())
    } else {
        Err(HttpConfigError::Pointer {
            what,
            pointer: p.to_owned(),
        })
    }
}

fn unknown(msg: String) -> Confirmation {
    Confirmation::Unknown { error: msg.into() }
}

/// A confirmation answered 202 Accepted was not answered yet: "the request has been accepted for processing, but
/// the processing has not been completed" (RFC 9110, 15.3.3). Whatever its body holds (an asynchronous search
/// job's id, an empty list of results to come) is neither the object nor its absence.
fn accepted(status: u16) -> Option<Confirmation> {
    (status == 202).then(|| {
        unknown(
            "the confirmation answered 202 Accepted (its processing has not been completed): not read as \
             found or not found"
                .to_owned(),
        )
    })
}

fn read_lookup(status: u16, body: &[u8], found_at: &str) -> Confirmation {
    if let Some(c) = accepted(status) {
        return c;
    }
    match status {
        200..=299 => match serde_json::from_slice::<Value>(body) {
            Ok(v) => match walk(&v, found_at) {
                Walk::Found(reference) => Confirmation::Done {
                    reference: Some(reference),
                },
                _ => unknown(format!(
                    "the confirmation answered {status} without a reference at {found_at}: not read as done"
                )),
            },
            Err(_) => unknown(format!(
                "the confirmation answered {status} with a body that is not JSON: not read as done"
            )),
        },
        404 => Confirmation::NotFound,
        _ => unknown(format!("the confirmation answered {status}")),
    }
}

fn read_search(
    status: u16,
    body: &[u8],
    found_at: &str,
    count_at: Option<&str>,
    absent_is_empty: bool,
) -> Confirmation {
    if let Some(c) = accepted(status) {
        return c;
    }
    if !(200..=299).contains(&status) {
        return unknown(format!("the search answered {status}"));
    }
    let Ok(v) = serde_json::from_slice::<Value>(body) else {
        return unknown(format!(
            "the search answered {status} with a body that is not JSON"
        ));
    };
    // An answer that reports an error beside an empty list or a zero count did not (fully) search: a GraphQL
    // field error leaves its list empty, a partial result (Elasticsearch's failed shards or timeout) counts only
    // what it reached. Not "not found", which would call again.
    let failed = |what: &str| {
        reported_error(&v).or_else(|| partial(&v)).map(|member| {
            unknown(format!(
                "the search answered {status} with {what} but with `{member}`: not read as not found"
            ))
        })
    };
    if let Some(count_at) = count_at {
        match v.pointer(count_at).and_then(Value::as_u64) {
            Some(0) => return failed("a count of 0").unwrap_or(Confirmation::NotFound),
            Some(n) => {
                if n > 1 {
                    tracing::warn!(
                        matches = n,
                        "the destination holds several matches for one effect"
                    );
                }
                return match walk(&v, found_at) {
                    Walk::Found(reference) => Confirmation::Done {
                        reference: Some(reference),
                    },
                    _ => unknown(format!(
                        "the search counts {n} at {count_at} but has no reference at {found_at}"
                    )),
                };
            }
            None => {
                return unknown(format!(
                    "the search answered {status} without a count at {count_at}"
                ))
            }
        }
    }
    match walk(&v, found_at) {
        Walk::Found(reference) => Confirmation::Done {
            reference: Some(reference),
        },
        Walk::EmptyList => failed("an empty list").unwrap_or(Confirmation::NotFound),
        Walk::Missing if absent_is_empty && list_absent(&v, found_at) => {
            failed("no list").unwrap_or(Confirmation::NotFound)
        }
        Walk::Missing => unknown(format!(
            "the search answered {status} without a list or a reference at {found_at}"
        )),
    }
}

/// The top-level member by which an answer reports an error, when it has one that is not empty: `errors` (Square,
/// GraphQL: a 200 can carry them) or `error` (Slack's `{"ok": false, "error": ...}`). A search that reports an
/// error beside an empty or missing list did not search (or not all of it): its list says nothing about the
/// call. A call's 2xx that reports one without its reference did not say it acted.
pub(crate) fn reported_error(v: &Value) -> Option<&'static str> {
    let o = v.as_object()?;
    ["errors", "error"].into_iter().find(|k| {
        o.get(*k).is_some_and(|e| match e {
            Value::Null | Value::Bool(false) => false,
            Value::Array(a) => !a.is_empty(),
            Value::Object(m) => !m.is_empty(),
            Value::String(t) => !t.is_empty(),
            _ => true,
        })
    })
}

/// The member by which a JSON-RPC 2.0 answer (`"jsonrpc": "2.0"`) says its call failed, though HTTP said 200: its
/// `error` ("This member is REQUIRED on error. This member MUST NOT exist if there was no error triggered during
/// invocation"), or the Model Context Protocol's `result.isError: true` (a tool call's own failure, "reported
/// inside the result object with IsError set to true, rather than as a JsonRpcError"). Such an answer's `id` is
/// the request's own ("It MUST be the same as the value of the id member in the Request Object"), never the
/// destination's reference: a call answered so is not done, and a confirmation answered so found nothing.
pub(crate) fn json_rpc_failure(v: &Value) -> Option<&'static str> {
    let o = v.as_object()?;
    if o.get("jsonrpc").and_then(Value::as_str) != Some("2.0") {
        return None;
    }
    if o.get("error").is_some_and(|e| !e.is_null()) {
        return Some("error");
    }
    (v.pointer("/result/isError").and_then(Value::as_bool) == Some(true))
        .then_some("result.isError")
}

/// The member by which a search answer says it is partial, when it does: Elasticsearch's and OpenSearch's
/// `"timed_out": true` (the search stopped at its `timeout` with what it had) or a non-zero `_shards.failed`
/// ("the search API will respond with partial results if one or more shards fail").
fn partial(v: &Value) -> Option<&'static str> {
    if v.get("timed_out").and_then(Value::as_bool) == Some(true) {
        return Some("timed_out");
    }
    v.pointer("/_shards/failed")
        .and_then(Value::as_u64)
        .is_some_and(|n| n > 0)
        .then_some("_shards.failed")
}

/// Whether `pointer` leads through an object member that is absent right where a list would be (the member
/// before the first array index): `{}` for `/customers/0/id`.
fn list_absent(v: &Value, pointer: &str) -> bool {
    let tokens: Vec<String> = pointer
        .split('/')
        .skip(1)
        .map(|t| t.replace("~1", "/").replace("~0", "~"))
        .collect();
    let Some(index) = tokens.iter().position(|t| t.parse::<usize>().is_ok()) else {
        return false;
    };
    if index == 0 {
        return false;
    }
    let mut at = v;
    for t in &tokens[..index - 1] {
        match at.get(t.as_str()) {
            Some(next) => at = next,
            None => return false,
        }
    }
    at.as_object()
        .is_some_and(|o| !o.contains_key(tokens[index - 1].as_str()))
}

/// Where a JSON pointer leads.
#[derive(Debug, PartialEq)]
pub(crate) enum Walk {
    /// To a reference (a non-empty string, or a number).
    Found(String),
    /// Into an empty array: nothing matched.
    EmptyList,
    /// Nowhere, or to a null, an empty string or a structure.
    Missing,
}

/// Follows `pointer` in `v`, telling an empty list (nothing matched) from a body of another shape. When the
/// pointer passes through an array of several items, the destination holds several matches (logged).
pub(crate) fn walk(v: &Value, pointer: &str) -> Walk {
    let mut at = v;
    if pointer.is_empty() {
        return Walk::Missing;
    }
    for raw in pointer.split('/').skip(1) {
        let token = raw.replace("~1", "/").replace("~0", "~");
        at = match at {
            Value::Object(o) => match o.get(&token) {
                Some(next) => next,
                None => return Walk::Missing,
            },
            Value::Array(a) => {
                let Ok(i) = token.parse::<usize>() else {
                    return Walk::Missing;
                };
                if a.is_empty() {
                    return Walk::EmptyList;
                }
                if a.len() > 1 {
                    tracing::warn!(
                        matches = a.len(),
                        "the destination holds several matches for one effect"
                    );
                }
                match a.get(i) {
                    Some(next) => next,
                    None => return Walk::Missing,
                }
            }
            _ => return Walk::Missing,
        };
    }
    match at {
        Value::String(s) if !s.is_empty() => Walk::Found(s.clone()),
        Value::Number(n) => Walk::Found(n.to_string()),
        _ => Walk::Missing,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn is_done(c: &Confirmation, r: &str) -> bool {
        matches!(c, Confirmation::Done { reference: Some(x) } if x == r)
    }
    fn is_not_found(c: &Confirmation) -> bool {
        matches!(c, Confirmation::NotFound)
    }
    fn is_unknown(c: &Confirmation) -> bool {
        matches!(c, Confirmation::Unknown { .. })
    }

    #[test]
    fn a_lookup_is_found_only_with_its_reference() {
        assert!(is_done(&read_lookup(200, br#"{"id":"t-1"}"#, "/id"), "t-1"));
        assert!(is_done(&read_lookup(200, br#"{"id":7}"#, "/id"), "7"));
        assert!(is_not_found(&read_lookup(404, b"", "/id")));
        // The shapes that were read as done: an empty list, a list without /id, a body without it, no body.
        for body in [
            &br#"{"data":[]}"#[..],
            br#"[]"#,
            br#"{"data":[{"id":"t-1"}]}"#,
            br#"{"id":null}"#,
            br#"{"id":""}"#,
            b"",
            b"<html>ok</html>",
        ] {
            assert!(is_unknown(&read_lookup(200, body, "/id")), "{body:?}");
        }
        for status in [301, 401, 429, 500, 502, 503] {
            assert!(is_unknown(&read_lookup(status, b"{}", "/id")), "{status}");
        }
    }

    /// RFC 9110, 15.3.3: "The 202 (Accepted) status code indicates that the request has been accepted for
    /// processing, but the processing has not been completed." A lookup answered 202 with a job's id was read
    /// as the object found (done), a search answered 202 with an empty list as not found (called again).
    #[test]
    fn a_confirmation_answered_202_is_neither_found_nor_not_found() {
        assert!(is_unknown(&read_lookup(202, br#"{"id":"job-1"}"#, "/id")));
        assert!(is_unknown(&read_search(
            202,
            br#"{"data":[]}"#,
            "/data/0/id",
            None,
            false
        )));
        assert!(is_unknown(&read_search(
            202,
            br#"{"data":[{"id":"job-1"}]}"#,
            "/data/0/id",
            None,
            false
        )));
        assert!(is_unknown(&read_search(
            202,
            br#"{"total":0,"results":[]}"#,
            "/results/0/id",
            Some("/total"),
            false
        )));
    }

    #[test]
    fn a_search_reads_an_empty_list_or_a_zero_count_as_not_found() {
        let f = "/data/0/id";
        assert!(is_not_found(&read_search(
            200,
            br#"{"data":[]}"#,
            f,
            None,
            false
        )));
        assert!(is_done(
            &read_search(200, br#"{"data":[{"id":"t-9"}]}"#, f, None, false),
            "t-9"
        ));
        assert!(is_unknown(&read_search(
            200,
            br#"{"data":[{"name":"x"}]}"#,
            f,
            None,
            false
        )));
        assert!(is_unknown(&read_search(
            200,
            br#"{"items":[]}"#,
            f,
            None,
            false
        )));
        assert!(is_unknown(&read_search(
            404,
            br#"{"data":[]}"#,
            f,
            None,
            false
        )));
        assert!(is_unknown(&read_search(502, b"", f, None, false)));
        let (f, c) = ("/results/0/id", Some("/total"));
        assert!(is_not_found(&read_search(
            200,
            br#"{"total":0,"results":[]}"#,
            f,
            c,
            false
        )));
        assert!(is_done(
            &read_search(200, br#"{"total":1,"results":[{"id":"42"}]}"#, f, c, false),
            "42"
        ));
        assert!(is_unknown(&read_search(
            200,
            br#"{"total":1,"results":[]}"#,
            f,
            c,
            false
        )));
        assert!(is_unknown(&read_search(
            200,
            br#"{"results":[]}"#,
            f,
            c,
            false
        )));
        // Square leaves the list out: not found only when declared, and only an object missing just the list.
        let f = "/customers/0/id";
        assert!(is_unknown(&read_search(200, b"{}", f, None, false)));
        assert!(is_not_found(&read_search(200, b"{}", f, None, true)));
        assert!(is_unknown(&read_search(200, b"[]", f, None, true)));
        assert!(is_unknown(&read_search(
            200,
            br#"{"errors":[]}"#,
            "/a/customers/0/id",
            None,
            true
        )));
        assert!(is_done(
            &read_search(200, br#"{"customers":[{"id":"C1"}]}"#, f, None, true),
            "C1"
        ));
        // An answer without its list that reports an error did not search (Square's responses carry `errors`,
        // "Any errors that occurred during the request"; GraphQL answers 200 with them): unknown, never
        // "not found", which would call again. An empty `errors` is no error.
        for body in [
            &br#"{"errors":[{"category":"API_ERROR","code":"INTERNAL_SERVER_ERROR"}]}"#[..],
            br#"{"error":"search unavailable"}"#,
            br#"{"error":{"message":"timeout"}}"#,
        ] {
            assert!(
                is_unknown(&read_search(200, body, f, None, true)),
                "{}",
                String::from_utf8_lossy(body)
            );
        }
        assert!(is_not_found(&read_search(
            200,
            br#"{"errors":[]}"#,
            f,
            None,
            true
        )));
        assert!(is_not_found(&read_search(
            200,
            br#"{"error":null}"#,
            f,
            None,
            true
        )));
        // A list at the top level.
        assert!(is_not_found(&read_search(200, b"[]", "/0/id", None, false)));
    }

    // GraphQL answers 200 with errors (Dgraph: "All responses, including errors, always return HTTP 200 OK status
    // codes"), beside what it could resolve: the spec's field error nulls or leaves out the field, and a list
    // resolved before the error is empty for a search that did not run. An empty list or a zero count beside a
    // reported error is no "not found" (which calls again an effect that may have happened): unknown. An empty
    // `errors` is no error.
    #[test]
    fn an_empty_search_that_reports_an_error_is_not_not_found() {
        for (body, count_at) in [
            (
                &br#"{"data":{"tasks":[]},"errors":[{"message":"search backend timed out"}]}"#[..],
                None,
            ),
            (br#"{"data":[],"error":"index unavailable"}"#, None),
            (
                br#"{"total":0,"results":[],"errors":[{"message":"Unknown property externalRef"}]}"#,
                Some("/total"),
            ),
        ] {
            let found_at = if count_at.is_some() {
                "/results/0/id"
            } else if body.starts_with(br#"{"data":{"#) {
                "/data/tasks/0/id"
            } else {
                "/data/0/id"
            };
            assert!(
                is_unknown(&read_search(200, body, found_at, count_at, false)),
                "{}",
                String::from_utf8_lossy(body)
            );
        }
        assert!(is_not_found(&read_search(
            200,
            br#"{"data":{"tasks":[]},"errors":[]}"#,
            "/data/tasks/0/id",
            None,
            false
        )));
        assert!(is_not_found(&read_search(
            200,
            br#"{"total":0,"results":[],"error":null}"#,
            "/results/0/id",
            Some("/total"),
            false
        )));
    }

    // Elasticsearch and OpenSearch answer a search 200 with what the shards that answered found: "the search API
    // will respond with partial results if one or more shards fail", and a search past its `timeout` returns what
    // it had (`"timed_out": true`). An empty or zero-count partial answer says nothing of the shards that did not
    // answer: unknown, never "not found". A complete one (`"timed_out": false`, no failed shard) is not found.
    #[test]
    fn a_partial_search_that_found_nothing_is_not_not_found() {
        let (found_at, count_at) = ("/hits/hits/0/_id", Some("/hits/total/value"));
        for body in [
            &br#"{"timed_out":true,"_shards":{"total":5,"successful":5,"failed":0},"hits":{"total":{"value":0},"hits":[]}}"#[..],
            br#"{"timed_out":false,"_shards":{"total":5,"successful":3,"failed":2},"hits":{"total":{"value":0},"hits":[]}}"#,
        ] {
            let text = String::from_utf8_lossy(body);
            assert!(
                is_unknown(&read_search(200, body, found_at, count_at, false)),
                "{text}"
            );
            assert!(
                is_unknown(&read_search(200, body, found_at, None, false)),
                "{text}"
            );
        }
        let complete = br#"{"timed_out":false,"_shards":{"total":5,"successful":5,"failed":0},"hits":{"total":{"value":0},"hits":[]}}"#;
        assert!(is_not_found(&read_search(
            200, complete, found_at, count_at, false
        )));
        // What a partial answer found is found.
        let partial_hit = br#"{"timed_out":true,"_shards":{"failed":2},"hits":{"total":{"value":1},"hits":[{"_id":"t-1"}]}}"#;
        assert!(is_done(
            &read_search(200, partial_hit, found_at, count_at, false),
            "t-1"
        ));
    }

    // A search the destination did not filter (a parameter it does not know: `?externl_ref=`, an API version
    // without it) answers its whole list, and the first object read as this effect, done, though the effect
    // may never have happened. Without `matches_at`, what a search found must carry the effect's reference or
    // key somewhere in it: Stripe's list (`data`), HubSpot's search (`results`, the value under `properties`),
    // Elasticsearch's hits (under `_source`) all do when they are this effect's.
    #[test]
    fn a_search_without_matches_at_finds_only_an_object_that_carries_the_effect() {
        let e = crate::http::wire_tests::effect();
        let read = |c: &Confirm, body: &str| c.read_for(&e, 200, body.as_bytes());
        let stripe = Confirm::search("http://d/v1/tasks?external_ref={external_ref}");
        assert!(is_unknown(&read(
            &stripe,
            r#"{"data":[{"id":"t-other","external_ref":"other"}]}"#
        )));
        assert!(is_done(
            &read(&stripe, r#"{"data":[{"id":"t-1","external_ref":"ref-1"}]}"#),
            "t-1"
        ));
        let by_key = Confirm::search("http://d/v1/tasks?idempotency_key={key}");
        assert!(is_done(
            &read(
                &by_key,
                r#"{"data":[{"id":"t-2","idempotency_key":"0123456789abcdef0123456789abcdef"}]}"#
            ),
            "t-2"
        ));
        let hubspot = Confirm::search_post("http://d/search", r#"{"q":"{external_ref}"}"#)
            .count_at("/total")
            .found_at("/results/0/id");
        assert!(is_done(
            &read(
                &hubspot,
                r#"{"total":1,"results":[{"id":"51","properties":{"external_ref":"ref-1"}}]}"#
            ),
            "51"
        ));
        assert!(is_unknown(&read(
            &hubspot,
            r#"{"total":9,"results":[{"id":"50","properties":{"external_ref":"ref-0"}}]}"#
        )));
        let elastic =
            Confirm::search("http://d/_search?q={external_ref}").found_at("/hits/hits/0/_id");
        assert!(is_done(
            &read(
                &elastic,
                r#"{"hits":{"hits":[{"_id":"h-1","_source":{"tags":["x","ref-1"]}}]}}"#
            ),
            "h-1"
        ));
        // A lookup names its object in the URL: no filter to ignore, nothing more asked.
        let lookup = Confirm::lookup("http://d/tasks/{external_ref}");
        assert!(is_done(&read(&lookup, r#"{"id":"t-9"}"#), "t-9"));
    }

    #[test]
    fn pointers_unescape_and_refuse_to_read_the_whole_document() {
        let v: Value = serde_json::from_str(r#"{"a/b":{"~c":"x"}}"#).unwrap();
        assert_eq!(walk(&v, "/a~1b/~0c"), Walk::Found("x".into()));
        assert_eq!(walk(&v, ""), Walk::Missing);
        assert!(check_pointer("found_at", "", false).is_err());
        assert!(check_pointer("found_at", "id", false).is_err());
        assert!(check_pointer("found_at", "/id", false).is_ok());
    }
}
