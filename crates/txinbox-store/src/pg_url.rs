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
    let url = known_parameters_only(url);
    Ok(without_pgpass_lines(|| PgConnectOptions::from_str(&url))?)
}

/// `read` with sqlx's warnings that quote a line of the password file not passed on: sqlx reads the password
/// of a URL without one from `PGPASSFILE` (or `~/.pgpass`) and warns of a line it cannot read
/// (`db:5432:*:PASSWORD`, its user name left out) by quoting it whole. Its other warnings (a file it cannot
/// open, or open to others), and every other event, go to the subscriber in place.
fn without_pgpass_lines<T>(read: impl FnOnce() -> T) -> T {
    let outer = tracing::dispatcher::get_default(Clone::clone);
    if outer.is::<tracing::subscriber::NoSubscriber>() {
        return read();
    }
    tracing::dispatcher::with_default(&tracing::Dispatch::new(NoPgpassLines(outer)), read)
}

/// The subscriber in place, without sqlx's events that quote a line of the password file. Only while a URL is
/// read, which opens no span: the current span is not asked for.
struct NoPgpassLines(tracing::Dispatch);

impl NoPgpassLines {
    fn quotes_a_line(m: &tracing::Metadata<'_>) -> bool {
        m.target().starts_with("sqlx_postgres::options::pgpass")
            && m.fields().field("line").is_some()
    }
}

impl tracing::Subscriber for NoPgpassLines {
    fn register_callsite(
        &self,
        m: &'static tracing::Metadata<'static>,
    ) -> tracing::subscriber::Interest {
        if Self::quotes_a_line(m) {
            tracing::subscriber::Interest::sometimes()
        } else {
            self.0.register_callsite(m)
        }
    }
    fn max_level_hint(&self) -> Option<tracing::level_filters::LevelFilter> {
        Some(tracing::level_filters::LevelFilter::current())
    }
    fn enabled(&self, m: &tracing::Metadata<'_>) -> bool {
        !Self::quotes_a_line(m) && self.0.enabled(m)
    }
    fn new_span(&self, span: &tracing::span::Attributes<'_>) -> tracing::span::Id {
        self.0.new_span(span)
    }
    fn record(&self, span: &tracing::span::Id, values: &tracing::span::Record<'_>) {
        self.0.record(span, values);
    }
    fn record_follows_from(&self, span: &tracing::span::Id, follows: &tracing::span::Id) {
        self.0.record_follows_from(span, follows);
    }
    fn event(&self, event: &tracing::Event<'_>) {
        if !Self::quotes_a_line(event.metadata()) {
            self.0.event(event);
        }
    }
    fn enter(&self, span: &tracing::span::Id) {
        self.0.enter(span);
    }
    fn exit(&self, span: &tracing::span::Id) {
        self.0.exit(span);
    }
    fn clone_span(&self, id: &tracing::span::Id) -> tracing::span::Id {
        self.0.clone_span(id)
    }
    fn try_close(&self, id: tracing::span::Id) -> bool {
        self.0.try_close(id)
    }
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

    /// sqlx reads the password of a URL without one from `PGPASSFILE` (or `~/.pgpass`), and warns of a line
    /// it cannot read by quoting it whole, its password too: that warning is not passed on; the others are.
    #[test]
    fn a_malformed_pgpass_line_is_never_logged() {
        use std::os::unix::fs::PermissionsExt;
        let dir = std::env::temp_dir().join(format!("txinbox-pgpass-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("pgpass");
        // The user name left out: the password reads as it, and the line as malformed.
        std::fs::write(&file, "db:5433:*:PGPASSxyz123\n").unwrap();
        std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o600)).unwrap();
        let events: &'static Events = Box::leak(Box::default());
        let _guard = tracing::subscriber::set_default(events);
        std::env::set_var("PGPASSFILE", &file);
        let o = pg_connect_options("postgres://crm@db:5433/crm?connect_timeout=5");
        std::env::remove_var("PGPASSFILE");
        std::fs::remove_dir_all(&dir).ok();
        assert_eq!(o.unwrap().get_username(), "crm");
        let logged = events.0.lock().unwrap().clone();
        for line in &logged {
            assert!(
                !line.contains("PGPASSxyz"),
                "a password in a log line: {line}"
            );
        }
        assert!(
            logged.iter().any(|l| l.contains("connect_timeout")),
            "the other warnings are passed on: {logged:?}"
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
