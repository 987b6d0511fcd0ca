//! The effect runner's settings and its HTTP destinations (`[effects]`).

use std::collections::BTreeMap;
use std::time::Duration;

use serde::Deserialize;

use crate::effects::EffectOptions;

/// The effect runner and its HTTP destinations (`[effects]`, `[effects.destinations.NAME]`). The rules are
/// checked when the runner is built from them (`txinbox_core::http::runner_from_settings`, what the worker
/// and `txinbox effects run --config` call): a rule that cannot work stops the runner at start with one line
/// naming the destination and the rule.
///
/// ```toml
/// [effects]
/// claim_seconds = 60
///
/// [effects.destinations.crm]
/// url = "https://crm.example/v1/tasks"
/// key = "header:Idempotency-Key"          # or "body:idempotency_key", "none"
/// key_kept_seconds = 86400
/// reference = "/id"
/// headers = { Authorization = "env:CRM_TOKEN" }   # env:VAR reads the value from the environment
/// answers = { "409" = "in_progress" }
///
/// [effects.destinations.crm.confirm]
/// url = "https://crm.example/v1/tasks?external_ref={external_ref}"
/// rule = "search"                         # or "lookup" (404 = not found)
/// found_at = "/data/0/id"
/// matches_at = "/data/0/external_ref"     # what was found must carry the effect's reference
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(default, deny_unknown_fields)]
#[non_exhaustive]
pub struct EffectsSettings {
    /// Effects claimed per pass (32; at least 1).
    pub batch: i64,
    /// How long a claim lasts before another runner may reconcile the effect, in seconds (60; longer than any
    /// call; at least 1).
    pub claim_seconds: u64,
    /// Calls before an effect that never reached its destination is failed (10; at least 1).
    pub max_attempts: i32,
    /// Reconciliations without an answer before an effect needs attention (10; at least 1).
    pub max_reconciliations: i32,
    /// First backoff in milliseconds, doubled each attempt (1000).
    pub backoff_ms: u64,
    /// Longest backoff in seconds (300; at least the first backoff).
    pub max_backoff_seconds: u64,
    /// How long done effects are kept, in seconds (7 days).
    pub done_retention_seconds: u64,
    /// Pause when nothing is due, in milliseconds (500).
    pub idle_poll_ms: u64,
    /// The HTTP destinations, by the name effects are recorded for.
    pub destinations: BTreeMap<String, HttpDestinationSettings>,
}

impl Default for EffectsSettings {
    fn default() -> Self {
        let o = EffectOptions::default();
        Self {
            batch: o.batch,
            claim_seconds: o.claim_for.as_secs(),
            max_attempts: o.max_attempts,
            max_reconciliations: o.max_reconciliations,
            backoff_ms: o.backoff.as_millis() as u64,
            max_backoff_seconds: o.max_backoff.as_secs(),
            done_retention_seconds: o.done_retention.as_secs(),
            idle_poll_ms: o.idle_poll.as_millis() as u64,
            destinations: BTreeMap::new(),
        }
    }
}

impl EffectsSettings {
    /// The runner's options.
    pub fn options(&self) -> EffectOptions {
        EffectOptions::default()
            .batch(self.batch)
            .claim_for(Duration::from_secs(self.claim_seconds.max(1)))
            .max_attempts(self.max_attempts)
            .max_reconciliations(self.max_reconciliations)
            .backoff(
                Duration::from_millis(self.backoff_ms),
                Duration::from_secs(self.max_backoff_seconds),
            )
            .done_retention(Duration::from_secs(self.done_retention_seconds))
            .idle_poll(Duration::from_millis(self.idle_poll_ms))
    }
}

/// One HTTP destination (`[effects.destinations.NAME]`): the call, where its key goes, how its answers and
/// its confirmation are read. Every key but `url` is optional.
#[derive(Clone, PartialEq, Eq, Default, Deserialize)]
#[serde(default, deny_unknown_fields)]
#[non_exhaustive]
pub struct HttpDestinationSettings {
    /// The call's URL (`{key}` and `{external_ref}` are replaced, percent-encoded).
    pub url: String,
    /// `POST` (the default), or `PUT`/`PATCH`.
    pub method: Option<String>,
    /// The call is an upsert by URL (`PUT .../tasks/{external_ref}`): idempotent by itself, no confirmation.
    pub upsert: bool,
    /// Where the key goes and that the destination honours it: `header:NAME`, `body:FIELD` or `none` (unset:
    /// `Idempotency-Key` sent, not relied on).
    pub key: Option<String>,
    /// How long the destination keeps a key, in seconds (86400).
    pub key_kept_seconds: Option<u64>,
    /// Where the reference is in a 2xx answer (a JSON pointer, `/id`).
    pub reference: Option<String>,
    /// A 2xx may carry no reference (done without reference).
    pub reference_optional: bool,
    /// The destination's own API answers 2xx with HTML pages (a form endpoint): such a page is read as its
    /// answer, not as a captive portal's, a proxy's or a firewall's (uncertain), which it would then be taken
    /// for too. Only with `reference_optional`, `upsert` or `compensate_url`, where it changes something.
    pub html_answers: bool,
    /// Each request's timeout in seconds (10).
    pub timeout_seconds: Option<u64>,
    /// Seconds to wait after an uncertain call before the first confirmation. Unset: 60 for a confirmation
    /// that may read a search (`rule = "search"`) at a destination that keeps no key (`key = "none"`, or no
    /// `key`), whose search may not show yet what a lost call created (HubSpot: "It may take a few moments for
    /// newly created or updated CRM objects to appear in search results") and a "not found" would call again;
    /// 0 otherwise. A value set stands, 0 included.
    pub reconcile_after_seconds: Option<u64>,
    /// Headers sent with every request; a value `env:VAR` is read from the environment at start.
    pub headers: BTreeMap<String, String>,
    /// Overrides of the answer table: `"409" = "in_progress"`, `"4xx" = "rejected"` (answers: `done`,
    /// `not_sent`, `retry_after`, `in_progress`, `uncertain`, `rejected`, `key_reused`).
    pub answers: BTreeMap<String, String>,
    /// The confirmation.
    pub confirm: Option<ConfirmSettings>,
    /// The compensation request (a DELETE; `{reference}`, `{key}`, `{external_ref}`).
    pub compensate_url: Option<String>,
}

/// A destination's confirmation (`[effects.destinations.NAME.confirm]`).
#[derive(Clone, PartialEq, Eq, Default, Deserialize)]
#[serde(default, deny_unknown_fields)]
#[non_exhaustive]
pub struct ConfirmSettings {
    /// The request's URL, naming `{key}` or `{external_ref}`.
    pub url: String,
    /// `GET` (the default) or `POST` (a search by body, with `body`).
    pub method: Option<String>,
    /// The JSON body of a `POST` search (`{key}`, `{external_ref}` replaced as JSON string content).
    pub body: Option<String>,
    /// `lookup` (the default: 404 = not found, a 2xx must carry the reference) or `search` (an empty list or a
    /// zero count = not found).
    pub rule: Option<String>,
    /// Where the reference is (`/id` for a lookup, `/data/0/id` for a search).
    pub found_at: Option<String>,
    /// Where a search's count is (`/total`): 0 is not found.
    pub count_at: Option<String>,
    /// A search answer that leaves the list out when nothing matches (Square's `{}`) is not found.
    pub absent_list_is_empty: bool,
    /// Where what was found carries the effect's external reference or key (`/data/0/external_ref`): a found
    /// answer counts only when it is one of them.
    pub matches_at: Option<String>,
}

// Debug for a log line: URLs without user info or query values, headers without their values (an API key
// or a token may be any of them).
impl std::fmt::Debug for HttpDestinationSettings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HttpDestinationSettings")
            .field("url", &crate::error::redact_url(&self.url))
            .field("method", &self.method)
            .field("upsert", &self.upsert)
            .field("key", &self.key)
            .field("key_kept_seconds", &self.key_kept_seconds)
            .field("reference", &self.reference)
            .field("reference_optional", &self.reference_optional)
            .field("html_answers", &self.html_answers)
            .field("timeout_seconds", &self.timeout_seconds)
            .field("reconcile_after_seconds", &self.reconcile_after_seconds)
            .field("headers", &self.headers.keys().collect::<Vec<_>>())
            .field("answers", &self.answers)
            .field("confirm", &self.confirm)
            .field(
                "compensate_url",
                &self.compensate_url.as_deref().map(crate::error::redact_url),
            )
            .finish()
    }
}

impl std::fmt::Debug for ConfirmSettings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ConfirmSettings")
            .field("url", &crate::error::redact_url(&self.url))
            .field("method", &self.method)
            .field("body", &self.body)
            .field("rule", &self.rule)
            .field("found_at", &self.found_at)
            .field("count_at", &self.count_at)
            .field("absent_list_is_empty", &self.absent_list_is_empty)
            .field("matches_at", &self.matches_at)
            .finish()
    }
}
