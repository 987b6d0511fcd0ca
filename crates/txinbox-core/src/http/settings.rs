//! HTTP destinations from the settings file: the same rules as the builder, checked at start.

use std::time::Duration;

use crate::effects::{EffectRunner, EffectStore};
use crate::settings::{EffectsSettings, HttpDestinationSettings};

use super::answers::StatusMatch;
use super::{Answer, Confirm, HttpConfigError, HttpEffect, HttpEffectBuilder, Key};

/// A destination of the settings that cannot work: names the destination and the rule, never a secret.
#[derive(Debug, thiserror::Error)]
#[error("effects destination {destination:?}: {detail}")]
#[non_exhaustive]
pub struct EffectSettingsError {
    /// The destination's name.
    pub destination: String,
    /// What is wrong.
    pub detail: String,
    /// The builder's error, when it is one.
    #[source]
    pub source: Option<HttpConfigError>,
}

impl EffectSettingsError {
    fn new(destination: &str, detail: impl Into<String>) -> Self {
        Self {
            destination: destination.to_owned(),
            detail: detail.into(),
            source: None,
        }
    }
}

impl HttpEffect {
    /// The destination `name` as the settings describe it, header values `env:VAR` read through `env`.
    ///
    /// # Errors
    /// [`EffectSettingsError`] naming the destination and the rule that cannot work (every check of
    /// [`HttpEffectBuilder::build`], plus an unknown key placement, answer or rule, a missing variable).
    pub fn from_settings(
        name: &str,
        s: &HttpDestinationSettings,
        env: impl Fn(&str) -> Option<String>,
    ) -> Result<HttpEffect, EffectSettingsError> {
        let err = |d: String| EffectSettingsError::new(name, d);
        if s.url.is_empty() {
            return Err(err("url is required".into()));
        }
        let mut b: HttpEffectBuilder = if s.upsert {
            HttpEffect::upsert(&s.url)
        } else {
            HttpEffect::post(&s.url)
        };
        if let Some(m) = &s.method {
            b = b.method(m);
        }
        if let Some(k) = &s.key {
            let mut key = Key::parse(k).map_err(|d| err(format!("key {d}")))?;
            if let Some(secs) = s.key_kept_seconds {
                key = key.kept_for(Duration::from_secs(secs));
            }
            b = b.key(key);
        } else if s.key_kept_seconds.is_some() {
            return Err(err(
                "key_kept_seconds without key: say where the destination takes its key".into(),
            ));
        }
        if let Some(r) = &s.reference {
            b = b.reference(r);
        }
        if s.reference_optional {
            b = b.reference_optional();
        }
        if s.html_answers {
            b = b.html_answers();
        }
        if let Some(t) = s.timeout_seconds {
            if t == 0 {
                return Err(err("timeout_seconds must be at least 1".into()));
            }
            b = b.timeout(Duration::from_secs(t));
        }
        // Unset: the builder's default, a minute for a search where no key is kept (see
        // HttpEffectBuilder::reconcile_after); a value set stands, 0 included.
        if let Some(secs) = s.reconcile_after_seconds {
            b = b.reconcile_after(Duration::from_secs(secs));
        }
        for (h, v) in &s.headers {
            let value = match v.strip_prefix("env:") {
                Some(var) => env(var).ok_or_else(|| {
                    err(format!(
                        "header {h}: the environment variable {var} is not set"
                    ))
                })?,
                None => v.clone(),
            };
            b = b.header(h, value);
        }
        for (status, answer) in &s.answers {
            let a: Answer = answer
                .parse()
                .map_err(|d| err(format!("answers.{status}: {d}")))?;
            b = match status
                .parse::<StatusMatch>()
                .map_err(|d| err(format!("answers: {d}")))?
            {
                StatusMatch::Exact(n) => b.answer(n, a),
                StatusMatch::Class(c) => b.answer_class(c, a),
            };
        }
        if let Some(c) = &s.confirm {
            b = b.confirm(confirm_from(c).map_err(err)?);
        }
        if let Some(c) = &s.compensate_url {
            b = b.compensate_url(c);
        }
        b.build().map_err(|e| EffectSettingsError {
            destination: name.to_owned(),
            detail: e.to_string(),
            source: Some(e),
        })
    }
}

fn confirm_from(c: &crate::settings::ConfirmSettings) -> Result<Confirm, String> {
    if c.url.is_empty() {
        return Err("confirm.url is required".into());
    }
    let method = c.method.as_deref().unwrap_or("GET").to_ascii_uppercase();
    let rule = c.rule.as_deref().unwrap_or("lookup");
    let mut confirm = match (rule, method.as_str(), &c.body) {
        ("lookup", "GET", None) => Confirm::lookup(&c.url),
        ("search", "GET", None) => Confirm::search(&c.url),
        ("search", "POST", Some(body)) => Confirm::search_post(&c.url, body),
        ("lookup" | "search", "GET", Some(_)) => {
            return Err("confirm.body is only for method = \"POST\"".into())
        }
        ("search", "POST", None) => return Err("confirm: a POST search needs a body".into()),
        ("lookup", "POST", _) => {
            return Err("confirm: a lookup is a GET; a POST search is rule = \"search\"".into())
        }
        ("lookup" | "search", m, _) => return Err(format!("confirm.method {m:?}: GET or POST")),
        (r, _, _) => return Err(format!("confirm.rule {r:?}: lookup or search")),
    };
    if let Some(f) = &c.found_at {
        confirm = confirm.found_at(f);
    }
    if let Some(n) = &c.count_at {
        if rule != "search" {
            return Err("confirm.count_at is for rule = \"search\"".into());
        }
        confirm = confirm.count_at(n);
    }
    if c.absent_list_is_empty {
        if rule != "search" {
            return Err("confirm.absent_list_is_empty is for rule = \"search\"".into());
        }
        confirm = confirm.absent_list_is_empty();
    }
    if let Some(m) = &c.matches_at {
        confirm = confirm.matches_at(m);
    }
    Ok(confirm)
}

/// A runner on `store` with every destination of `settings` and its options; header values `env:VAR` are
/// read from the process's environment.
///
/// # Errors
/// The first destination that cannot work ([`HttpEffect::from_settings`]).
pub fn runner_from_settings<S: EffectStore>(
    store: S,
    settings: &EffectsSettings,
) -> Result<EffectRunner<S>, EffectSettingsError> {
    let mut runner = EffectRunner::new(store).options(settings.options());
    for (name, d) in &settings.destinations {
        let effect = HttpEffect::from_settings(name, d, |v| std::env::var(v).ok())?;
        if effect.key.placement == super::key::Placement::None
            && effect.confirm.is_none()
            && !effect.upsert
        {
            tracing::warn!(
                destination = %name,
                "destination without idempotency and without a confirmation: a lost answer can only end in needs attention"
            );
        }
        if d.reconcile_after_seconds.is_none() && !effect.reconcile_after.is_zero() {
            tracing::info!(
                destination = %name,
                reconcile_after_seconds = effect.reconcile_after.as_secs(),
                "a search confirmation where no key is kept: a lost answer is first confirmed this long after the \
                 call, once the search can show it (set reconcile_after_seconds to change it)"
            );
        }
        runner = runner.executor(name.clone(), effect);
    }
    Ok(runner)
}
