//! A `postgres://` URL read into sqlx's connect options without a query value reaching a log line.

use std::str::FromStr;

use sqlx::postgres::PgConnectOptions;

use crate::StoreError;

/// The query parameters sqlx 0.8 reads from a `postgres://` URL (and `options[NAME]`).
const KNOWN: &[&str] = &[
    "sslmode",
    "ssl-mode",
    "sslrootcert",
    "ssl-root-cert",
    "ssl-ca",
    "sslcert",
    "ssl-cert",
    "sslkey",
    "ssl-key",
    "statement-cache-capacity",
    "host",
    "hostaddr",
    "port",
    "dbname",
    "user",
    "password",
    "application_name",
    "options",
];

/// `url`'s connect options, as sqlx reads them, but for the query parameters sqlx does not know (libpq's
/// `sslpassword`, `connect_timeout`, a misspelt `pasword`): sqlx ignores those with a warning that quotes
/// their value, which may be a password. They are left out before sqlx reads the URL, and the warning here
/// names the key only (when it reads as one: the text after a `?` of a password written unencoded does not).
///
/// # Errors
/// [`StoreError::Database`] (a configuration error, which never quotes the URL) when sqlx cannot read it.
pub fn pg_connect_options(url: &str) -> Result<PgConnectOptions, StoreError> {
    Ok(PgConnectOptions::from_str(&known_parameters_only(url))?)
}

/// `url` without the query parameters sqlx does not know, each one left out said at warn (its key only).
fn known_parameters_only(url: &str) -> std::borrow::Cow<'_, str> {
    let Some((base, rest)) = url.split_once('?') else {
        return url.into();
    };
    let (query, fragment) = match rest.split_once('#') {
        Some((q, f)) => (q, Some(f)),
        None => (rest, None),
    };
    let mut kept = Vec::new();
    let mut dropped = false;
    for part in query.split('&').filter(|p| !p.is_empty()) {
        let key = decoded(part.split_once('=').map_or(part, |(k, _)| k));
        let known =
            KNOWN.contains(&key.as_str()) || (key.starts_with("options[") && key.ends_with(']'));
        if known {
            kept.push(part);
            continue;
        }
        dropped = true;
        let reads_as_key = !key.is_empty()
            && key.len() <= 64
            && key
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.'));
        if reads_as_key {
            tracing::warn!(%key, "ignoring a connect parameter of the store URL that sqlx does not know");
        } else {
            tracing::warn!("ignoring a connect parameter of the store URL that is not a key (a password with an unencoded `?`?)");
        }
    }
    if !dropped {
        return url.into();
    }
    let mut out = base.to_owned();
    if !kept.is_empty() {
        out.push('?');
        out.push_str(&kept.join("&"));
    }
    if let Some(f) = fragment {
        out.push('#');
        out.push_str(f);
    }
    out.into()
}

/// A query key as a URL parser reads it: `+` a space, `%XX` its byte.
fn decoded(key: &str) -> String {
    let bytes = key.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let hex = |b: u8| char::from(b).to_digit(16);
        match bytes[i] {
            b'+' => out.push(b' '),
            b'%' if i + 2 < bytes.len() => match (hex(bytes[i + 1]), hex(bytes[i + 2])) {
                (Some(h), Some(l)) => {
                    out.push((h * 16 + l) as u8);
                    i += 2;
                }
                _ => out.push(b'%'),
            },
            b => out.push(b),
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::sync::Mutex;

    use super::*;

    /// Every event's fields, as a log line would show them.
    #[derive(Default)]
    struct Events(Mutex<Vec<String>>, AtomicU64);

    struct Fields<'a>(&'a mut String);

    impl tracing::field::Visit for Fields<'_> {
        fn record_debug(&mut self, field: &tracing::field::Field, value: &dyn std::fmt::Debug) {
            self.0.push_str(&format!(" {}={value:?}", field.name()));
        }
    }

    impl tracing::Subscriber for &'static Events {
        fn enabled(&self, _: &tracing::Metadata<'_>) -> bool {
            true
        }
        fn new_span(&self, _: &tracing::span::Attributes<'_>) -> tracing::span::Id {
            tracing::span::Id::from_u64(self.1.fetch_add(1, Ordering::SeqCst) + 1)
        }
        fn record(&self, _: &tracing::span::Id, _: &tracing::span::Record<'_>) {}
        fn record_follows_from(&self, _: &tracing::span::Id, _: &tracing::span::Id) {}
        fn event(&self, event: &tracing::Event<'_>) {
            let mut line = format!("{}", event.metadata().level());
            event.record(&mut Fields(&mut line));
            self.0.lock().unwrap().push(line);
        }
        fn enter(&self, _: &tracing::span::Id) {}
        fn exit(&self, _: &tracing::span::Id) {}
    }

    /// A query parameter sqlx does not know (libpq's `sslpassword`, a misspelt `pasword`) is one it logs,
    /// value and all, at warn: such a parameter is left out before sqlx reads the URL, and the warning names
    /// its key only. The parameters sqlx knows still apply.
    #[test]
    fn an_unknown_parameter_of_a_store_url_is_logged_without_its_value() {
        let events: &'static Events = Box::leak(Box::default());
        let _guard = tracing::subscriber::set_default(events);
        let o = pg_connect_options(
            "postgres://crm@db:5433/crm?sslpassword=SECRETxyz123&application_name=inbox&pas%77ord=SECRETxyz456&sslmode=disable",
        )
        .unwrap();
        assert_eq!(o.get_host(), "db");
        assert_eq!(o.get_port(), 5433);
        assert_eq!(o.get_database(), Some("crm"));
        assert_eq!(o.get_application_name(), Some("inbox"));
        assert!(matches!(
            o.get_ssl_mode(),
            sqlx::postgres::PgSslMode::Disable
        ));
        let logged = events.0.lock().unwrap().clone();
        for line in &logged {
            assert!(
                !line.contains("SECRETxyz"),
                "a secret in a log line: {line}"
            );
        }
        let all = logged.join("\n");
        assert!(
            all.contains("sslpassword") && all.contains("pasword"),
            "the parameters left out are named: {all}"
        );
    }

    /// What is left of a URL: the parameters sqlx knows, as written; a URL without others is kept as it is.
    /// The text after the `?` of a password written unencoded is not named.
    #[test]
    fn only_the_parameters_sqlx_knows_are_kept() {
        let events: &'static Events = Box::leak(Box::default());
        let _guard = tracing::subscriber::set_default(events);
        for (url, kept) in [
            (
                "postgres://crm@db/crm?sslmode=disable&options[search_path]=x",
                "postgres://crm@db/crm?sslmode=disable&options[search_path]=x",
            ),
            ("postgres://crm@db/crm", "postgres://crm@db/crm"),
            (
                "postgres://crm@db/crm?connect_timeout=10",
                "postgres://crm@db/crm",
            ),
            (
                "postgres://crm@db/crm?connect_timeout=10&ssl%2Dmode=require#f",
                "postgres://crm@db/crm?ssl%2Dmode=require#f",
            ),
            (
                "postgres://crm:5432?SECRETxyz789@db/crm",
                "postgres://crm:5432",
            ),
        ] {
            assert_eq!(known_parameters_only(url), kept, "{url}");
        }
        let logged = events.0.lock().unwrap().clone();
        assert_eq!(logged.len(), 3, "{logged:?}");
        for line in &logged {
            assert!(
                !line.contains("SECRETxyz"),
                "a secret in a log line: {line}"
            );
        }
    }
}
