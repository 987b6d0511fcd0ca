//! PostgreSQL URLs through another address, and a database of its own per test.

use std::net::SocketAddr;

use txinbox::sqlx::{self, Connection};

/// `postgres_url` with its database replaced by `db` and its host and port by `addr` (when given).
pub fn pg_url_with(postgres_url: &str, addr: Option<SocketAddr>, db: &str) -> String {
    let (base, query) = match postgres_url.split_once('?') {
        Some((b, q)) => (b, Some(q)),
        None => (postgres_url, None),
    };
    let (scheme, rest) = base
        .split_once("://")
        .unwrap_or_else(|| panic!("not a postgres:// URL: {postgres_url}"));
    let (authority, _) = rest.split_once('/').unwrap_or((rest, ""));
    let authority = match addr {
        None => authority.to_owned(),
        Some(a) => {
            let (userinfo, _hostport) = match authority.rsplit_once('@') {
                Some((u, h)) => (Some(u), h),
                None => (None, authority),
            };
            match userinfo {
                Some(u) => format!("{u}@{a}"),
                None => a.to_string(),
            }
        }
    };
    let mut url = format!("{scheme}://{authority}/{db}");
    if let Some(q) = query {
        url.push('?');
        url.push_str(q);
    }
    url
}

/// The `host:port` a `postgres://` URL names (5432 when it names no port).
pub fn pg_host_port(postgres_url: &str) -> String {
    let rest = postgres_url
        .split_once("://")
        .map(|(_, r)| r)
        .unwrap_or_else(|| panic!("not a postgres:// URL: {postgres_url}"));
    let authority = rest.split(['/', '?']).next().unwrap_or_default();
    let hostport = authority.rsplit_once('@').map_or(authority, |(_, h)| h);
    assert!(
        !hostport.is_empty(),
        "the PostgreSQL URL names no host (a Unix socket?): {postgres_url}; these tests need host:port"
    );
    if hostport
        .rsplit_once(':')
        .is_some_and(|(_, p)| p.parse::<u16>().is_ok())
    {
        hostport.to_owned()
    } else {
        format!("{hostport}:5432")
    }
}

/// A database of its own on the PostgreSQL of `txinbox_e2e::pg_url()`, dropped (`WITH (FORCE)`) with
/// [`PgDatabase::drop_now`].
pub struct PgDatabase {
    pub name: String,
    admin_url: String,
}

impl PgDatabase {
    pub async fn create(prefix: &str) -> Self {
        let admin_url = txinbox_e2e::pg_url();
        let name = format!("{prefix}_{}", uuid::Uuid::new_v4().simple());
        let mut c = sqlx::PgConnection::connect(&admin_url)
            .await
            .unwrap_or_else(|e| panic!("PostgreSQL at TXINBOX_TEST_PG_URL is not reachable: {e}"));
        sqlx::query(&format!("CREATE DATABASE {name}"))
            .execute(&mut c)
            .await
            .unwrap_or_else(|e| panic!("CREATE DATABASE {name}: {e}"));
        let _ = c.close().await;
        Self { name, admin_url }
    }

    /// Its URL (through `addr` when given).
    pub fn url(&self, addr: Option<SocketAddr>) -> String {
        pg_url_with(&self.admin_url, addr, &self.name)
    }

    pub async fn drop_now(self) {
        if let Ok(mut c) = sqlx::PgConnection::connect(&self.admin_url).await {
            let _ = sqlx::query(&format!(
                "DROP DATABASE IF EXISTS {} WITH (FORCE)",
                self.name
            ))
            .execute(&mut c)
            .await;
            let _ = c.close().await;
        }
    }
}
