//! URL and body templates: `{key}`, `{external_ref}` (and `{reference}` for a compensation), filled per
//! effect; URLs shown in errors and logs without their user info or query values.

use crate::effects::ClaimedEffect;

use super::HttpConfigError;

/// The effect's idempotency key.
pub(crate) const KEY: &str = "{key}";
/// The effect's external reference.
pub(crate) const EXTERNAL_REF: &str = "{external_ref}";
/// The destination's reference of a done effect (compensations only).
pub(crate) const REFERENCE: &str = "{reference}";

/// A checked template.
pub(crate) struct Template<'a> {
    text: &'a str,
}

impl<'a> Template<'a> {
    /// Checks a template's placeholders: in a URL, any `{...}` other than the known ones is a typo; in a body,
    /// any `{name}` ([`placeholders`]: no quote, colon or space inside, so JSON's own braces are none) other than
    /// the known ones is. `{reference}` (known once the effect is done) is for a compensation only: anywhere else
    /// it would be filled with nothing, or left as is in a body.
    pub(crate) fn parse(what: &'static str, text: &'a str) -> Result<Self, HttpConfigError> {
        if what != "compensation URL" && text.contains(REFERENCE) {
            return Err(HttpConfigError::Reference { what });
        }
        if what.ends_with("URL") {
            let mut rest = text;
            while let Some(open) = rest.find('{') {
                let Some(close) = rest[open..].find('}') else {
                    break;
                };
                let name = &rest[open..open + close + 1];
                if ![KEY, EXTERNAL_REF, REFERENCE].contains(&name) {
                    return Err(HttpConfigError::Placeholder {
                        what,
                        placeholder: name.to_owned(),
                    });
                }
                rest = &rest[open + close + 1..];
            }
        } else if let Some(name) = placeholders(text).find(|p| ![KEY, EXTERNAL_REF].contains(p)) {
            return Err(HttpConfigError::Placeholder {
                what,
                placeholder: name.to_owned(),
            });
        }
        Ok(Self { text })
    }

    /// Whether the template names the effect (`{key}` or `{external_ref}`).
    pub(crate) fn names_effect(&self) -> bool {
        self.text.contains(KEY) || self.text.contains(EXTERNAL_REF)
    }

    /// The template's text.
    pub(crate) fn text(&self) -> &str {
        self.text
    }

    /// A body template must be JSON once filled.
    pub(crate) fn check_json(&self, what: &'static str) -> Result<(), HttpConfigError> {
        let sample = self
            .text
            .replace(KEY, "k")
            .replace(EXTERNAL_REF, "r")
            .replace(REFERENCE, "x");
        serde_json::from_str::<serde_json::Value>(&sample)
            .map(|_| ())
            .map_err(|e| HttpConfigError::Body {
                what,
                detail: e.to_string(),
            })
    }
}

/// The `{name}` forms in `text` that read as placeholders: a name of letters, digits, `_`, `-` or `.` between
/// braces. JSON's own braces (`{"a":1}`, `{}`) and a GraphQL selection (`{ id }`) are none; a literal `{name}` in a
/// JSON string is written `\u007bname}`.
pub(crate) fn placeholders(text: &str) -> impl Iterator<Item = &str> {
    text.match_indices('{').filter_map(move |(open, _)| {
        let rest = &text[open + 1..];
        let len = rest
            .bytes()
            .take_while(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b'.'))
            .count();
        (len > 0 && rest.as_bytes().get(len) == Some(&b'}')).then(|| &text[open..open + len + 2])
    })
}

/// A URL template must be an http(s) URL once filled.
pub(crate) fn check_url(what: &'static str, t: &Template<'_>) -> Result<(), HttpConfigError> {
    let sample = t
        .text()
        .replace(KEY, "k")
        .replace(EXTERNAL_REF, "r")
        .replace(REFERENCE, "x");
    match reqwest::Url::parse(&sample) {
        Ok(u) if matches!(u.scheme(), "http" | "https") && u.host().is_some() => Ok(()),
        Ok(u) => Err(HttpConfigError::Url {
            what,
            url: crate::error::redact_url(t.text()),
            detail: format!("the scheme must be http or https, not {:?}", u.scheme()),
        }),
        Err(e) => Err(HttpConfigError::Url {
            what,
            url: crate::error::redact_url(t.text()),
            detail: e.to_string(),
        }),
    }
}

/// `template` with the effect's key and external reference, percent-encoded.
pub(crate) fn fill_url(template: &str, e: &ClaimedEffect) -> String {
    template
        .replace(KEY, &encode(&e.key))
        .replace(EXTERNAL_REF, &encode(&e.external_ref))
        .replace(
            REFERENCE,
            &encode(e.reference.as_deref().unwrap_or_default()),
        )
}

/// `template` (JSON) with the effect's key and external reference as JSON string content.
pub(crate) fn fill_json(template: &str, e: &ClaimedEffect) -> String {
    template
        .replace(KEY, &json_content(&e.key))
        .replace(EXTERNAL_REF, &json_content(&e.external_ref))
}

/// `s` as the inside of a JSON string.
fn json_content(s: &str) -> String {
    let quoted = serde_json::Value::String(s.to_owned()).to_string();
    quoted[1..quoted.len() - 1].to_owned()
}

/// Percent-encodes everything but unreserved characters.
pub(crate) fn encode(s: &str) -> String {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_are_shown_without_secrets() {
        assert_eq!(
            crate::error::redact_url(
                "https://user:pw@crm.example/v1/tasks?external_ref={external_ref}&api_key=s3cret"
            ),
            "https://***@crm.example/v1/***?external_ref={external_ref}&api_key=***"
        );
        assert_eq!(
            crate::error::redact_url("http://h:8080/a/{key}"),
            "http://h:8080/a/{key}"
        );
    }

    #[test]
    fn a_url_template_names_only_known_placeholders() {
        assert!(Template::parse("confirmation URL", "http://h/t/{externalref}").is_err());
        assert!(Template::parse("confirmation URL", "http://h/t/{external_ref}").is_ok());
        // A body's braces are JSON, not placeholders.
        assert!(Template::parse("confirmation body", r#"{"a":{"b":"{key}"}}"#).is_ok());
        let t = Template::parse("confirmation body", r#"{"v":"{external_ref}"}"#).unwrap();
        assert!(t.names_effect());
        assert!(t.check_json("confirmation body").is_ok());
        let t = Template::parse("confirmation body", r#"{"v":{external_ref}}"#).unwrap();
        assert!(t.check_json("confirmation body").is_err());
        let t = Template::parse("confirmation URL", "ftp://h/{key}").unwrap();
        assert!(check_url("confirmation URL", &t).is_err());
        let t = Template::parse("confirmation URL", "not a url {key}").unwrap();
        assert!(check_url("confirmation URL", &t).is_err());
    }

    #[test]
    fn json_content_escapes_quotes() {
        assert_eq!(json_content(r#"a"b\c"#), r#"a\"b\\c"#);
        assert_eq!(encode("a b/ç"), "a%20b%2F%C3%A7");
    }
}
