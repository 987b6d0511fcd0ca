//! Which store an operator command reads: `--store URL`, or the workers' settings file (`--config FILE`): its
//! `[store] url`, or each of its shards (`[store.shards.NAME]`; `--shard NAME` for one), the shard's URL read
//! from the variable its `url_env` names, as the worker reads it.

use std::path::PathBuf;

use txinbox_core::error::redact_url;
use txinbox_core::settings::WorkerSettings;

/// The variable that stands for `--store` when neither `--store` nor `--config` is given.
pub const STORE_URL_VAR: &str = "TXINBOX_STORE_URL";

/// `--store`, or `--config` with an optional `--shard`. Its `Debug` masks the store's password and query values.
#[derive(Default, clap::Args)]
pub struct StoreArgs {
    /// Store URL (`sqlite:path.db`, `postgres://...` or `dynamodb://TABLE`), the workers' own; without
    /// `--store` and `--config`, `TXINBOX_STORE_URL`.
    // Not clap's `env`: clap counts a value from the environment as given, so a TXINBOX_STORE_URL exported
    // in the operator's shell would refuse every `--config` as a conflict with `--store`.
    #[arg(long)]
    pub store: Option<String>,
    /// The workers' settings file instead of `--store`: its `[store] url`, or every shard of `[store.shards]`.
    #[arg(long, conflicts_with = "store")]
    pub config: Option<PathBuf>,
    /// With `--config` on shards: only this shard.
    #[arg(long, requires = "config")]
    pub shard: Option<String>,
}

/// One store to read, and the shard it is (`None` for a store that is not one of several). Its `Debug` masks the
/// URL's password and query values.
#[derive(Clone, PartialEq, Eq)]
pub struct StoreTarget {
    /// The shard's name.
    pub shard: Option<String>,
    /// Its URL (it may hold a password: never printed).
    pub url: String,
}

impl std::fmt::Debug for StoreArgs {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StoreArgs")
            .field("store", &self.store.as_deref().map(redact_url))
            .field("config", &self.config)
            .field("shard", &self.shard)
            .finish()
    }
}

impl std::fmt::Debug for StoreTarget {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StoreTarget")
            .field("shard", &self.shard)
            .field("url", &redact_url(&self.url))
            .finish()
    }
}

impl StoreArgs {
    /// The stores this command reads, in the settings file's order.
    pub fn targets(&self) -> Result<Vec<StoreTarget>, String> {
        if let Some(url) = &self.store {
            return Ok(vec![StoreTarget {
                shard: None,
                url: url.clone(),
            }]);
        }
        let Some(path) = &self.config else {
            return match std::env::var(STORE_URL_VAR) {
                Ok(url) if !url.is_empty() => Ok(vec![StoreTarget { shard: None, url }]),
                _ => Err("no store: give --store, TXINBOX_STORE_URL or --config".into()),
            };
        };
        let mut settings = WorkerSettings::load(path).map_err(|e| e.to_string())?;
        if settings.store.shards.is_empty() {
            if let Some(name) = &self.shard {
                return Err(format!(
                    "--shard {name}: {} has no [store.shards]",
                    path.display()
                ));
            }
            return Ok(vec![StoreTarget {
                shard: None,
                url: settings.store.url,
            }]);
        }
        let names: Vec<&str> = settings.store.shards.keys().map(String::as_str).collect();
        if let Some(name) = &self.shard {
            if !settings.store.shards.contains_key(name) {
                return Err(format!(
                    "--shard {name}: no such shard in {} (shards: {})",
                    path.display(),
                    names.join(", ")
                ));
            }
        }
        // Only the shard named is resolved: the others' `url_env` variables need not be set where the
        // operator runs the command.
        if let Some(name) = &self.shard {
            settings.store.shards.retain(|n, _| n == name);
        }
        Ok(settings
            .store
            .resolved_shards()
            .map_err(|e| e.to_string())?
            .into_iter()
            .filter(|s| self.shard.as_ref().is_none_or(|n| *n == s.name))
            .map(|s| StoreTarget {
                shard: Some(s.name),
                url: s.url,
            })
            .collect())
    }
}

/// A current-thread runtime and the stores the command names (`--store`, or `--config` [`--shard`]).
pub fn runtime_and_targets(
    args: &StoreArgs,
) -> Result<(tokio::runtime::Runtime, Vec<StoreTarget>), String> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| e.to_string())?;
    Ok((rt, args.targets()?))
}

/// Prints `error: MSG` on one line (a driver's message may hold line breaks), its secrets masked
/// ([`redact`]), and exits 2.
pub fn fail(msg: &str) -> std::process::ExitCode {
    error_line(msg);
    std::process::ExitCode::from(2)
}

/// Prints `error: MSG` on one line, its secrets masked and its control characters escaped
/// ([`escaped`](crate::out::escaped): a message can quote outside input).
fn error_line(msg: &str) {
    let one_line = msg.split_whitespace().collect::<Vec<_>>().join(" ");
    crate::out::errln!("error: {}", crate::out::escaped(&redact(&one_line)));
}

/// Prints the error of one store of the command as [`fail`] does, naming its shard (`error: shard NAME:
/// MSG`): on several shards the command goes on with the next one, and exits 2 at the end.
pub fn target_failed(target: &StoreTarget, msg: &str) {
    match &target.shard {
        Some(shard) => error_line(&format!("shard {shard}: {msg}")),
        None => error_line(msg),
    }
}

/// `text` with the secrets an error may quote masked as `***` (see
/// [`redact_secrets`](txinbox_core::error::redact_secrets)).
pub use txinbox_core::error::redact_secrets as redact;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::SettingsFile;

    #[test]
    fn a_settings_file_with_shards_gives_each_shard_and_shard_picks_one() {
        let file = SettingsFile::new(
            "[store.shards.eu-1]\nurl = \"postgres://crm@db1/crm\"\ntenants = [\"acme\"]\n[store.shards.eu-2]\nurl = \"postgres://crm@db2/crm\"\ntenants = [\"globex\"]\n",
        );
        let all = StoreArgs {
            config: Some(file.path().to_owned()),
            ..Default::default()
        };
        let t = all.targets().unwrap();
        assert_eq!(t.len(), 2);
        assert_eq!(t[0].shard.as_deref(), Some("eu-1"));
        assert_eq!(t[1].url, "postgres://crm@db2/crm");
        let one = StoreArgs {
            config: Some(file.path().to_owned()),
            shard: Some("eu-2".into()),
            ..Default::default()
        };
        assert_eq!(one.targets().unwrap().len(), 1);
        let unknown = StoreArgs {
            config: Some(file.path().to_owned()),
            shard: Some("us-1".into()),
            ..Default::default()
        };
        let e = unknown.targets().unwrap_err();
        assert!(
            e.contains("no such shard") && e.contains("eu-1, eu-2"),
            "{e}"
        );
        assert!(StoreArgs::default().targets().is_err());
    }

    #[test]
    fn shard_resolves_only_the_shard_named() {
        let file = SettingsFile::new(
            "[store.shards.eu-1]\nurl_env = \"TXINBOX_TEST_NEVER_SET_EU_1\"\ntenants = [\"acme\"]\n[store.shards.eu-2]\nurl = \"postgres://crm@db2/crm\"\nrest = true\n",
        );
        let one = StoreArgs {
            config: Some(file.path().to_owned()),
            shard: Some("eu-2".into()),
            ..Default::default()
        };
        let t = one.targets().unwrap();
        assert_eq!(t.len(), 1);
        assert_eq!(t[0].url, "postgres://crm@db2/crm");
        // Every shard: the unset variable is an error naming it.
        let all = StoreArgs {
            config: Some(file.path().to_owned()),
            ..Default::default()
        };
        let e = all.targets().unwrap_err();
        assert!(e.contains("TXINBOX_TEST_NEVER_SET_EU_1"), "{e}");
    }

    #[test]
    fn debug_of_store_args_and_targets_masks_the_password() {
        let url = "postgres://crm:s3cretpw@db1/crm?password=qs3cret";
        let target = StoreTarget {
            shard: Some("eu-1".into()),
            url: url.into(),
        };
        let args = StoreArgs {
            store: Some(url.into()),
            ..Default::default()
        };
        for shown in [format!("{target:?}"), format!("{args:?}")] {
            assert!(!shown.contains("s3cret"), "{shown}");
            assert!(shown.contains("postgres://crm:***@db1/crm"), "{shown}");
        }
        assert!(format!("{target:?}").contains("eu-1"));
    }
}
