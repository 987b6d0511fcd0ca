use serde::Deserialize;

use super::SettingsError;

/// The store (`[store]`).
#[derive(Clone, PartialEq, Eq, Deserialize)]
#[serde(default, deny_unknown_fields)]
#[non_exhaustive]
pub struct StoreSettings {
    /// `sqlite:FILE` or `postgres://user@host/db` (`sqlite:txinbox.db`). Put a password in the environment
    /// (`TXINBOX_STORE__URL`), not in the file.
    pub url: String,
    /// Most connections in the pool (10); each shard's pool too, unless the shard sets its own.
    pub max_connections: u32,
    /// Several PostgreSQL stores behind one worker (`[store.shards.NAME]`), each delivery applied in the one that
    /// claims its tenant ([`crate::runtime::shards`]), `url` then left unset (refused beside them: it would never be
    /// used). Empty (the default): one store, `url`.
    pub shards: std::collections::BTreeMap<String, ShardSettings>,
    /// Refuse to start while a shard cannot be reached (false: start for the others; the unreachable shard's
    /// deliveries are released until it answers, and readiness names it).
    pub require_all_shards: bool,
}

impl Default for StoreSettings {
    fn default() -> Self {
        Self {
            url: "sqlite:txinbox.db".into(),
            max_connections: 10,
            shards: Default::default(),
            require_all_shards: false,
        }
    }
}

/// One shard of the store (`[store.shards.NAME]`, the name a metric label: 1 to 64 letters, digits, `-`, `_`,
/// `.`).
///
/// ```toml
/// [store.shards.eu-1]
/// url_env = "CRM_DB_EU_1_URL"        # the variable holding postgres://user:password@host/db
/// tenants = ["acme", "globex"]
///
/// [store.shards.eu-2]
/// url = "postgres://crm@db-eu-2/crm" # a URL without a password may sit in the file
/// tenants = ["initech"]
/// rest = true                         # and every tenant no shard claims, and messages without a tenant
/// ```
#[derive(Clone, PartialEq, Eq, Default, Deserialize)]
#[serde(default, deny_unknown_fields)]
#[non_exhaustive]
pub struct ShardSettings {
    /// The shard's `postgres://` URL. A password belongs in the environment: use `url_env`.
    pub url: Option<String>,
    /// The name of the environment variable that holds the shard's URL (with its password).
    pub url_env: Option<String>,
    /// The tenants (`ce-tenantid`) whose data this shard holds.
    pub tenants: Vec<String>,
    /// This shard also takes every tenant no shard claims, and messages without a tenant (at most one shard).
    pub rest: bool,
    /// Most connections in this shard's pool (at least 1; unset: `[store] max_connections`).
    pub max_connections: Option<u32>,
}

/// A shard of the settings with its URL resolved ([`StoreSettings::resolved_shards`]).
#[derive(Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct ResolvedShard {
    /// The shard's name.
    pub name: String,
    /// Its URL (it may hold a password: never log it).
    pub url: String,
    /// The tenants it claims.
    pub tenants: Vec<String>,
    /// Whether it takes the rest.
    pub rest: bool,
    /// Its pool size.
    pub max_connections: u32,
}

impl std::fmt::Debug for ResolvedShard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ResolvedShard")
            .field("name", &self.name)
            .field("url", &"<redacted>")
            .field("tenants", &self.tenants)
            .field("rest", &self.rest)
            .field("max_connections", &self.max_connections)
            .finish()
    }
}

impl StoreSettings {
    /// The shards with their URLs, `url_env` read from the process's environment. An unset variable is an
    /// error that names it (never a value).
    ///
    /// # Errors
    /// [`SettingsError::Override`] naming the variable that is not set.
    pub fn resolved_shards(&self) -> Result<Vec<ResolvedShard>, SettingsError> {
        self.resolved_shards_with(|var| std::env::var(var).ok())
    }

    /// [`resolved_shards`](Self::resolved_shards) reading variables through `env`.
    ///
    /// # Errors
    /// See [`resolved_shards`](Self::resolved_shards).
    pub fn resolved_shards_with(
        &self,
        env: impl Fn(&str) -> Option<String>,
    ) -> Result<Vec<ResolvedShard>, SettingsError> {
        self.shards
            .iter()
            .map(|(name, s)| {
                let url = match (&s.url, &s.url_env) {
                    (_, Some(var)) => {
                        let url = env(var).ok_or_else(|| SettingsError::Override {
                            var: var.clone(),
                            detail: format!("not set; [store.shards.{name}] url_env names it"),
                        })?;
                        // Checked as the file's `url` is, never quoted: the value may be a password alone.
                        let wrong = if url.trim().is_empty() {
                            Some("set but empty")
                        } else if !is_postgres_url(&url) {
                            Some("holds no postgres:// URL (shards are PostgreSQL stores)")
                        } else {
                            None
                        };
                        if let Some(wrong) = wrong {
                            return Err(SettingsError::Override {
                                var: var.clone(),
                                detail: format!("{wrong}; [store.shards.{name}] url_env names it"),
                            });
                        }
                        url
                    }
                    (Some(url), None) => url.clone(),
                    (None, None) => {
                        return Err(SettingsError::Override {
                            var: format!("store.shards.{name}.url"),
                            detail: "the shard has no url and no url_env".into(),
                        })
                    }
                };
                Ok(ResolvedShard {
                    name: name.clone(),
                    url,
                    tenants: s.tenants.clone(),
                    rest: s.rest,
                    max_connections: s.max_connections.unwrap_or(self.max_connections).max(1),
                })
            })
            .collect()
    }
}

/// Whether `url` names a PostgreSQL store (`postgres://` or `postgresql://`), the only kind a shard can be.
pub(super) fn is_postgres_url(url: &str) -> bool {
    url.starts_with("postgres://") || url.starts_with("postgresql://")
}

// Debug for a log line: the URLs without their password or query values (TXINBOX_STORE__URL is where a
// password belongs, and it ends up here).
impl std::fmt::Debug for StoreSettings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StoreSettings")
            .field("url", &crate::error::redact_url(&self.url))
            .field("max_connections", &self.max_connections)
            .field("shards", &self.shards)
            .field("require_all_shards", &self.require_all_shards)
            .finish()
    }
}

impl std::fmt::Debug for ShardSettings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ShardSettings")
            .field("url", &self.url.as_deref().map(crate::error::redact_url))
            .field("url_env", &self.url_env)
            .field("tenants", &self.tenants)
            .field("rest", &self.rest)
            .field("max_connections", &self.max_connections)
            .finish()
    }
}
