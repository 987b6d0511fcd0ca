//! Injected faults: the next N data-plane requests that match answer with an error, are delayed,
//! or are performed with their response dropped.

use serde::{Deserialize, Serialize};

/// What an injected fault does.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum FaultKind {
    /// Answer with `status` (e.g. 429, 503, 500) without performing the operation.
    Status,
    /// Perform the operation, then close the connection without answering.
    DropResponse,
    /// Wait `delay_ms`, then handle the request normally.
    Delay,
    /// Perform the operation, then answer with `status` instead of its own answer (a server error after the
    /// change was made: the client cannot tell whether it applied).
    ApplyThenStatus,
}

/// A fault rule, also the JSON body of `POST /$emulator/faults`.
///
/// ```json
/// {"kind": "status", "status": 503, "method": "POST", "path_suffix": "/messages/head", "count": 2}
/// {"kind": "drop_response", "method": "DELETE", "path_suffix": "/orders/messages/head"}
/// ```
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
#[non_exhaustive]
pub struct FaultRule {
    /// What to do; default `status`.
    #[serde(default = "default_kind")]
    pub kind: FaultKind,
    /// The status for `kind = status` and `kind = apply_then_status`; default 503.
    #[serde(default = "default_status")]
    pub status: u16,
    /// Sent as `Retry-After` (seconds) with a status fault, when set.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retry_after_seconds: Option<u32>,
    /// Delay for `kind = delay`, in milliseconds.
    #[serde(default)]
    pub delay_ms: u64,
    /// HTTP method to match (any case); any method when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub method: Option<String>,
    /// Suffix of the request path (without query, percent-decoded, any case) to match, e.g.
    /// `/messages/head` or `orders/messages`; any path when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub path_suffix: Option<String>,
    /// How many matching requests the rule still affects; default 1.
    #[serde(default = "default_count")]
    pub count: u32,
}

fn default_kind() -> FaultKind {
    FaultKind::Status
}
fn default_status() -> u16 {
    503
}
fn default_count() -> u32 {
    1
}

impl FaultRule {
    /// A rule answering `status` to the next matching request.
    pub fn status(status: u16) -> Self {
        Self {
            kind: FaultKind::Status,
            status,
            retry_after_seconds: None,
            delay_ms: 0,
            method: None,
            path_suffix: None,
            count: 1,
        }
    }

    /// A rule that performs the next matching request and drops its response.
    pub fn drop_response() -> Self {
        Self {
            kind: FaultKind::DropResponse,
            ..Self::status(503)
        }
    }

    /// A rule that performs the next matching request, then answers it with `status`.
    pub fn apply_then_status(status: u16) -> Self {
        Self {
            kind: FaultKind::ApplyThenStatus,
            ..Self::status(status)
        }
    }

    /// A rule that delays the next matching request.
    pub fn delay(delay_ms: u64) -> Self {
        Self {
            kind: FaultKind::Delay,
            delay_ms,
            ..Self::status(503)
        }
    }

    /// Restricts the rule to one HTTP method.
    pub fn method(mut self, method: impl Into<String>) -> Self {
        self.method = Some(method.into());
        self
    }

    /// Restricts the rule to paths ending with `suffix`.
    pub fn path_suffix(mut self, suffix: impl Into<String>) -> Self {
        self.path_suffix = Some(suffix.into());
        self
    }

    /// Sets how many matching requests the rule affects.
    pub fn count(mut self, count: u32) -> Self {
        self.count = count;
        self
    }

    /// Adds a `Retry-After` header to a status fault.
    pub fn retry_after_seconds(mut self, seconds: u32) -> Self {
        self.retry_after_seconds = Some(seconds);
        self
    }

    pub(crate) fn validate(&self) -> Result<(), String> {
        if matches!(self.kind, FaultKind::Status | FaultKind::ApplyThenStatus)
            && !(400..=599).contains(&self.status)
        {
            return Err("status must be between 400 and 599".into());
        }
        if self.count == 0 {
            return Err("count must be at least 1".into());
        }
        Ok(())
    }

    fn matches(&self, method: &str, path: &str) -> bool {
        self.method
            .as_deref()
            .is_none_or(|m| m.eq_ignore_ascii_case(method))
            && self.path_suffix.as_deref().is_none_or(|suffix| {
                path.to_ascii_lowercase()
                    .ends_with(&suffix.to_ascii_lowercase())
            })
    }
}

/// Takes one use of the first rule matching the request, dropping rules that are used up.
pub(crate) fn take_fault(
    rules: &mut Vec<FaultRule>,
    method: &str,
    path: &str,
) -> Option<FaultRule> {
    let index = rules
        .iter()
        .position(|r| r.count > 0 && r.matches(method, path))?;
    let rule = &mut rules[index];
    rule.count -= 1;
    let taken = rule.clone();
    if rule.count == 0 {
        rules.remove(index);
    }
    Some(taken)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rules_are_used_up_in_order() {
        let mut rules = vec![
            FaultRule::status(429)
                .method("post")
                .path_suffix("/MESSAGES")
                .count(2),
            FaultRule::status(500),
        ];
        assert_eq!(
            take_fault(&mut rules, "POST", "/orders/messages").map(|r| r.status),
            Some(429)
        );
        assert_eq!(
            take_fault(&mut rules, "DELETE", "/orders/messages").map(|r| r.status),
            Some(500)
        );
        assert_eq!(
            take_fault(&mut rules, "POST", "/orders/messages").map(|r| r.status),
            Some(429)
        );
        assert!(take_fault(&mut rules, "POST", "/orders/messages").is_none());
        assert!(rules.is_empty());
    }

    #[test]
    fn parses_json_with_defaults() {
        let rule: FaultRule =
            serde_json::from_str(r#"{"kind":"drop_response","path_suffix":"/messages/head"}"#)
                .unwrap();
        assert_eq!(rule.kind, FaultKind::DropResponse);
        assert_eq!(rule.count, 1);
        let rule: FaultRule = serde_json::from_str(r#"{"status":429,"count":3}"#).unwrap();
        assert_eq!(
            (rule.kind, rule.status, rule.count),
            (FaultKind::Status, 429, 3)
        );
        assert!(serde_json::from_str::<FaultRule>(r#"{"stat":429}"#).is_err());
        assert!(FaultRule::status(200).validate().is_err());
        let rule: FaultRule =
            serde_json::from_str(r#"{"kind":"apply_then_status","status":500}"#).unwrap();
        assert_eq!(rule, FaultRule::apply_then_status(500));
        assert!(FaultRule::apply_then_status(200).validate().is_err());
    }
}
