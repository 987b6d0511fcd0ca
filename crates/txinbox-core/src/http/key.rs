//! Where an effect's idempotency key goes, and whether the destination honours it.

use std::time::Duration;

/// How long a destination keeps a key unless told otherwise (Stripe's documented minimum).
pub const DEFAULT_KEY_KEPT_FOR: Duration = Duration::from_secs(24 * 3600);

/// Where the key goes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Placement {
    Header(String),
    BodyField(String),
    None,
}

/// Where an effect's idempotency key goes, and what the destination does with it.
///
/// * [`Key::header`]: the destination honours the key in this request header (`Idempotency-Key`: the IETF
///   httpapi draft, Stripe, Adyen; `PayPal-Request-Id`).
/// * [`Key::body_field`]: the destination honours the key in this top-level field of the JSON body (Square's
///   `idempotency_key`).
/// * [`Key::none`]: the destination has no idempotency: nothing is sent; only the confirmation (a search by
///   the effect's external reference) can tell a lost answer's effect.
///
/// Declare a header or a field only when the destination documents that it deduplicates by it, for how long
/// ([`Key::kept_for`], 24 h by default): within that time a call whose answer was lost may be repeated with
/// the same key when no confirmation can tell ([`Confirmation::Repeat`](crate::effects::Confirmation::Repeat)).
/// Without a declaration the key is still sent in `Idempotency-Key` (harmless to a destination that ignores it)
/// but never relied on: a lost answer without a confirmation needs attention.
#[derive(Clone, Debug, PartialEq, Eq)]
#[must_use = "a Key does nothing until given to HttpEffectBuilder::key"]
pub struct Key {
    pub(crate) placement: Placement,
    pub(crate) honoured: bool,
    pub(crate) kept_for: Duration,
}

impl Key {
    /// The destination honours the key in request header `name`.
    pub fn header(name: impl Into<String>) -> Self {
        Self {
            placement: Placement::Header(name.into()),
            honoured: true,
            kept_for: DEFAULT_KEY_KEPT_FOR,
        }
    }

    /// The destination honours the key in the JSON body's top-level field `name`.
    pub fn body_field(name: impl Into<String>) -> Self {
        Self {
            placement: Placement::BodyField(name.into()),
            honoured: true,
            kept_for: DEFAULT_KEY_KEPT_FOR,
        }
    }

    /// The destination has no idempotency: nothing is sent.
    pub fn none() -> Self {
        Self {
            placement: Placement::None,
            honoured: false,
            kept_for: Duration::ZERO,
        }
    }

    /// How long the destination keeps a key (default 24 h): past it, a repeat could act twice, so it is never
    /// repeated blindly.
    pub fn kept_for(mut self, d: Duration) -> Self {
        self.kept_for = d;
        self
    }

    /// The default: `Idempotency-Key` sent, not relied on.
    pub(crate) fn unverified() -> Self {
        Self {
            honoured: false,
            kept_for: Duration::ZERO,
            ..Self::header("Idempotency-Key")
        }
    }

    /// Parses the settings file's form: `header:NAME`, `body:FIELD` or `none`.
    pub(crate) fn parse(s: &str) -> Result<Self, String> {
        match s.split_once(':') {
            Some(("header", name)) if !name.is_empty() => Ok(Self::header(name)),
            Some(("body", field)) if !field.is_empty() => Ok(Self::body_field(field)),
            None if s == "none" => Ok(Self::none()),
            _ => Err(format!(
                "{s:?}: expected header:NAME (header:Idempotency-Key), body:FIELD (body:idempotency_key) or none"
            )),
        }
    }

    /// Whether the destination is said to keep keys.
    pub fn is_honoured(&self) -> bool {
        self.honoured
    }
}

impl Default for Key {
    fn default() -> Self {
        Self::unverified()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_settings_form_parses() {
        assert_eq!(
            Key::parse("header:PayPal-Request-Id"),
            Ok(Key::header("PayPal-Request-Id"))
        );
        assert_eq!(
            Key::parse("body:idempotency_key"),
            Ok(Key::body_field("idempotency_key"))
        );
        assert_eq!(Key::parse("none"), Ok(Key::none()));
        for bad in ["header:", "body", "Idempotency-Key", "", "query:k"] {
            assert!(Key::parse(bad).is_err(), "{bad}");
        }
        assert!(!Key::default().is_honoured());
    }
}
