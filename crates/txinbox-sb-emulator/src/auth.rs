//! `Authorization` checking: SAS tokens [doc SAS] and configured bearer tokens [doc AUTHN].
//!
//! Nothing here logs or returns a key, a signature or a token.

use base64::Engine as _;
use hmac::{Hmac, Mac};
use percent_encoding::percent_decode_str;
use sha2::Sha256;

/// Credentials the emulator accepts. With none configured every request is accepted. Its `Debug` shows the
/// key names only.
#[derive(Clone, Default)]
pub(crate) struct AuthConfig {
    /// (key name, key) pairs: shared access authorization rules.
    pub sas_keys: Vec<(String, String)>,
    /// Bearer tokens accepted as-is.
    pub bearer_tokens: Vec<String>,
}

impl std::fmt::Debug for AuthConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let names: Vec<&str> = self.sas_keys.iter().map(|(n, _)| n.as_str()).collect();
        f.debug_struct("AuthConfig")
            .field("sas_key_names", &names)
            .field("bearer_tokens", &self.bearer_tokens.len())
            .finish()
    }
}

/// Why a request was refused; every variant answers 401 [doc SEND, PEEK: 401 Authorization failure].
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub(crate) enum AuthError {
    #[error("MissingToken: the request carries no Authorization header")]
    Missing,
    #[error("InvalidToken: the Authorization header is not a well-formed SharedAccessSignature or Bearer token")]
    Malformed,
    #[error("InvalidSignature: the token has expired")]
    Expired,
    #[error("InvalidSignature: the key name in the token is not known")]
    UnknownKeyName,
    #[error("InvalidSignature: the token's signature does not match")]
    BadSignature,
    #[error("InvalidAudience: the token's resource (sr) does not cover the requested entity")]
    WrongResource,
    #[error("InvalidToken: the bearer token is not accepted")]
    BearerRejected,
}

/// What is being accessed, for the `sr` check.
pub(crate) struct Target<'a> {
    /// The namespace name (`your-namespace`).
    pub namespace: &'a str,
    /// `{namespace}.servicebus.windows.net`, lower case.
    pub namespace_host: &'a str,
    /// The request's `Host` header, if any (the emulator's own loopback address).
    pub request_host: Option<&'a str>,
    /// The percent-decoded request path, without the query.
    pub path: &'a str,
}

impl AuthConfig {
    pub(crate) fn is_open(&self) -> bool {
        self.sas_keys.is_empty() && self.bearer_tokens.is_empty()
    }

    /// Checks an `Authorization` header value against the configured credentials.
    pub(crate) fn check(
        &self,
        header: Option<&[u8]>,
        target: &Target<'_>,
        now_unix: i64,
    ) -> Result<(), AuthError> {
        if self.is_open() {
            return Ok(());
        }
        let header = header.ok_or(AuthError::Missing)?;
        let header = std::str::from_utf8(header)
            .map_err(|_| AuthError::Malformed)?
            .trim();
        if let Some(token) = strip_prefix_ignore_case(header, "Bearer ") {
            // Azure AD bearer tokens [doc SEND/RENEW 2020 versions, AUTHN]; the emulator cannot
            // validate a JWT, so it accepts exactly the tokens it was configured with.
            let token = token.trim();
            return if self
                .bearer_tokens
                .iter()
                .any(|t| constant_time_eq(t.as_bytes(), token.as_bytes()))
            {
                Ok(())
            } else {
                Err(AuthError::BearerRejected)
            };
        }
        let token = strip_prefix_ignore_case(header, "SharedAccessSignature ")
            .ok_or(AuthError::Malformed)?;
        self.check_sas(token.trim(), target, now_unix)
    }

    /// Verifies `sr={URL-encoded resource}&sig={URL-encoded base64}&se={unix seconds}&skn={key name}`,
    /// fields in any order [doc SAS].
    fn check_sas(&self, token: &str, target: &Target<'_>, now_unix: i64) -> Result<(), AuthError> {
        let (mut sr, mut sig, mut se, mut skn) = (None, None, None, None);
        for pair in token.split('&') {
            let (name, value) = pair.split_once('=').ok_or(AuthError::Malformed)?;
            let slot = match name {
                "sr" => &mut sr,
                "sig" => &mut sig,
                "se" => &mut se,
                "skn" => &mut skn,
                _ => continue,
            };
            if slot.replace(value).is_some() {
                return Err(AuthError::Malformed);
            }
        }
        let (Some(raw_sr), Some(raw_sig), Some(raw_se), Some(raw_skn)) = (sr, sig, se, skn) else {
            return Err(AuthError::Malformed);
        };
        let expiry: i64 = decode(raw_se)
            .trim()
            .parse()
            .map_err(|_| AuthError::Malformed)?;
        // A token whose expiry lies in the past is refused [doc SAS].
        if expiry < now_unix {
            return Err(AuthError::Expired);
        }
        let key_name = decode(raw_skn);
        let key = self
            .sas_keys
            .iter()
            .find(|(name, _)| *name == key_name)
            .map(|(_, key)| key)
            .ok_or(AuthError::UnknownKeyName)?;
        let signature = base64::engine::general_purpose::STANDARD
            .decode(decode(raw_sig).trim())
            .map_err(|_| AuthError::BadSignature)?;
        // sig = base64(HMAC-SHA256(key, urlencode(resourceURI) + "\n" + se)), keyed with the UTF-8
        // bytes of the key string [doc SAS]. The MAC is computed over `sr` exactly as it appears in
        // the token: clients differ in the case of their percent-encoding, so re-encoding would
        // break the match.
        let mut mac =
            Hmac::<Sha256>::new_from_slice(key.as_bytes()).map_err(|_| AuthError::BadSignature)?;
        mac.update(raw_sr.as_bytes());
        mac.update(b"\n");
        mac.update(raw_se.as_bytes());
        mac.verify_slice(&signature)
            .map_err(|_| AuthError::BadSignature)?;
        // "The token is valid for the resource URI and everything beneath it" [doc SAS].
        if resource_covers(&decode(raw_sr), target) {
            Ok(())
        } else {
            Err(AuthError::WrongResource)
        }
    }
}

fn decode(raw: &str) -> String {
    percent_decode_str(raw).decode_utf8_lossy().into_owned()
}

fn strip_prefix_ignore_case<'a>(text: &'a str, prefix: &str) -> Option<&'a str> {
    let head = text.get(..prefix.len())?;
    head.eq_ignore_ascii_case(prefix)
        .then(|| &text[prefix.len()..])
}

fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// Whether the decoded `sr` covers the request. The comparison ignores case and the scheme
/// (`http`, `https`, `sb`), and drops any query, because azure_messaging_servicebus signs the full
/// request URL including `?timeout=`. The host may be the namespace's public
/// host (what a client signs before its URL is rewritten to loopback) or the request's own host.
/// The bare namespace name, as in the REST doc examples (`sr=your-namespace`), covers the whole
/// namespace [doc SEND/PEEK examples].
fn resource_covers(sr: &str, target: &Target<'_>) -> bool {
    let sr = sr.trim().to_ascii_lowercase();
    let sr = sr.split(['?', '#']).next().unwrap_or_default();
    let without_scheme = sr.split_once("://").map_or(sr, |(_, rest)| rest);
    let (host, path) = match without_scheme.split_once('/') {
        Some((host, path)) => (host, path),
        None => (without_scheme, ""),
    };
    let host_ok = host == target.namespace_host
        || host == target.namespace.to_ascii_lowercase()
        || target
            .request_host
            .is_some_and(|h| h.eq_ignore_ascii_case(host));
    if !host_ok {
        return false;
    }
    let scope = path.trim_matches('/');
    let requested = target.path.to_ascii_lowercase();
    let requested = requested.trim_matches('/');
    scope.is_empty() || requested == scope || requested.starts_with(&format!("{scope}/"))
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    #[test]
    fn debug_of_the_config_masks_keys_and_tokens() {
        let config = AuthConfig {
            sas_keys: vec![("Root".into(), "s3cretkey".into())],
            bearer_tokens: vec!["s3cretbearer".into()],
        };
        let shown = format!("{config:?}");
        assert!(!shown.contains("s3cret"), "{shown}");
        assert!(shown.contains("Root"), "{shown}");
    }

    /// Builds a token the way the crate does: sr form-urlencoded with upper-case hex.
    pub(crate) fn sas_token(resource: &str, key_name: &str, key: &str, expiry: i64) -> String {
        let sr: String =
            percent_encoding::utf8_percent_encode(resource, percent_encoding::NON_ALPHANUMERIC)
                .to_string();
        let mut mac = Hmac::<Sha256>::new_from_slice(key.as_bytes()).unwrap();
        mac.update(format!("{sr}\n{expiry}").as_bytes());
        let sig = base64::engine::general_purpose::STANDARD.encode(mac.finalize().into_bytes());
        let sig: String =
            percent_encoding::utf8_percent_encode(&sig, percent_encoding::NON_ALPHANUMERIC)
                .to_string();
        format!("SharedAccessSignature sr={sr}&sig={sig}&se={expiry}&skn={key_name}")
    }

    fn config() -> AuthConfig {
        AuthConfig {
            sas_keys: vec![("RootManageSharedAccessKey".into(), "c2VjcmV0a2V5".into())],
            bearer_tokens: vec!["good-token".into()],
        }
    }

    fn target(path: &str) -> Target<'_> {
        Target {
            namespace: "ns",
            namespace_host: "ns.servicebus.windows.net",
            request_host: Some("127.0.0.1:9999"),
            path,
        }
    }

    const NOW: i64 = 1_700_000_000;

    #[test]
    fn accepts_a_valid_token_signed_over_the_full_url() {
        let token = sas_token(
            "https://ns.servicebus.windows.net/orders/messages/head?timeout=5",
            "RootManageSharedAccessKey",
            "c2VjcmV0a2V5",
            NOW + 3600,
        );
        assert_eq!(
            config().check(
                Some(token.as_bytes()),
                &target("/orders/messages/head"),
                NOW
            ),
            Ok(())
        );
    }

    #[test]
    fn accepts_namespace_scope_and_loopback_host() {
        let cfg = config();
        for resource in [
            "ns",
            "https://ns.servicebus.windows.net/",
            "http://127.0.0.1:9999/orders",
        ] {
            let token = sas_token(
                resource,
                "RootManageSharedAccessKey",
                "c2VjcmV0a2V5",
                NOW + 60,
            );
            assert_eq!(
                cfg.check(Some(token.as_bytes()), &target("/orders/messages"), NOW),
                Ok(()),
                "{resource}"
            );
        }
    }

    #[test]
    fn refuses_bad_tokens() {
        let cfg = config();
        let t = target("/orders/messages");
        let expired = sas_token("ns", "RootManageSharedAccessKey", "c2VjcmV0a2V5", NOW - 1);
        assert_eq!(
            cfg.check(Some(expired.as_bytes()), &t, NOW),
            Err(AuthError::Expired)
        );
        let wrong_key = sas_token("ns", "RootManageSharedAccessKey", "other", NOW + 60);
        assert_eq!(
            cfg.check(Some(wrong_key.as_bytes()), &t, NOW),
            Err(AuthError::BadSignature)
        );
        let unknown = sas_token("ns", "Nobody", "c2VjcmV0a2V5", NOW + 60);
        assert_eq!(
            cfg.check(Some(unknown.as_bytes()), &t, NOW),
            Err(AuthError::UnknownKeyName)
        );
        let other_entity = sas_token(
            "https://ns.servicebus.windows.net/payments",
            "RootManageSharedAccessKey",
            "c2VjcmV0a2V5",
            NOW + 60,
        );
        assert_eq!(
            cfg.check(Some(other_entity.as_bytes()), &t, NOW),
            Err(AuthError::WrongResource)
        );
        let prefix_only = sas_token(
            "https://ns.servicebus.windows.net/ord",
            "RootManageSharedAccessKey",
            "c2VjcmV0a2V5",
            NOW + 60,
        );
        assert_eq!(
            cfg.check(Some(prefix_only.as_bytes()), &t, NOW),
            Err(AuthError::WrongResource)
        );
        let other_ns = sas_token(
            "https://other.servicebus.windows.net/orders",
            "RootManageSharedAccessKey",
            "c2VjcmV0a2V5",
            NOW + 60,
        );
        assert_eq!(
            cfg.check(Some(other_ns.as_bytes()), &t, NOW),
            Err(AuthError::WrongResource)
        );
        // Tampering with se after signing breaks the signature.
        let valid = sas_token("ns", "RootManageSharedAccessKey", "c2VjcmV0a2V5", NOW + 60);
        let tampered = valid.replace(&format!("se={}", NOW + 60), &format!("se={}", NOW + 61));
        assert_eq!(
            cfg.check(Some(tampered.as_bytes()), &t, NOW),
            Err(AuthError::BadSignature)
        );
        assert_eq!(cfg.check(None, &t, NOW), Err(AuthError::Missing));
        assert_eq!(
            cfg.check(Some(b"Basic abc"), &t, NOW),
            Err(AuthError::Malformed)
        );
        assert_eq!(
            cfg.check(Some(b"SharedAccessSignature sr=ns&se=1"), &t, NOW),
            Err(AuthError::Malformed)
        );
        assert_eq!(
            cfg.check(Some(b"Bearer nope"), &t, NOW),
            Err(AuthError::BearerRejected)
        );
        assert_eq!(cfg.check(Some(b"Bearer good-token"), &t, NOW), Ok(()));
        assert_eq!(
            cfg.check(Some(&[0xff, 0xfe]), &t, NOW),
            Err(AuthError::Malformed)
        );
    }

    #[test]
    fn open_when_nothing_is_configured() {
        assert_eq!(
            AuthConfig::default().check(None, &target("/x/messages"), NOW),
            Ok(())
        );
    }
}
