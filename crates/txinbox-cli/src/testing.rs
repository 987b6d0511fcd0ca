//! What the unit tests share.

use std::path::{Path, PathBuf};

/// A workers' settings file of a test's own: `worker.toml` in a fresh folder, removed with the folder when
/// dropped.
pub struct SettingsFile {
    dir: PathBuf,
    path: PathBuf,
}

impl SettingsFile {
    /// Writes `toml` to a new settings file.
    pub fn new(toml: &str) -> Self {
        let dir = std::env::temp_dir().join(format!("txinbox-cli-{}", uuid::Uuid::new_v4()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("worker.toml");
        std::fs::write(&path, toml).unwrap();
        Self { dir, path }
    }

    /// The file's path.
    pub fn path(&self) -> &Path {
        &self.path
    }
}

impl Drop for SettingsFile {
    fn drop(&mut self) {
        std::fs::remove_dir_all(&self.dir).ok();
    }
}

/// A PostgreSQL schema of a test's own at `TXINBOX_TEST_PG_URL`, with the inbox's store in it.
pub struct PgSchema {
    /// `TXINBOX_TEST_PG_URL`.
    pub base: String,
    /// The schema's name.
    pub schema: String,
    /// A pool on `base`, outside the schema.
    pub admin: sqlx::PgPool,
    /// The store, migrated in the schema (one connection).
    pub store: txinbox_store::Store<sqlx::Postgres>,
}

impl PgSchema {
    /// Makes the schema and connects the store in it.
    pub async fn new() -> Self {
        let base = std::env::var("TXINBOX_TEST_PG_URL")
            .expect("TXINBOX_TEST_PG_URL is not set: run `bash scripts/test.sh`");
        let schema = format!("t_{}", uuid::Uuid::new_v4().simple());
        let admin = sqlx::PgPool::connect(&base).await.unwrap();
        sqlx::query(&format!("CREATE SCHEMA {schema}"))
            .execute(&admin)
            .await
            .unwrap();
        let store =
            txinbox_store::Store::<sqlx::Postgres>::connect_in_schema(&base, &schema, 1).await;
        let store = store.expect("PostgreSQL at TXINBOX_TEST_PG_URL");
        Self {
            base,
            schema,
            admin,
            store,
        }
    }

    /// Drops the schema (the store must be closed) and closes `admin`.
    pub async fn drop_schema(schema: &str, admin: sqlx::PgPool) {
        sqlx::query(&format!("DROP SCHEMA {schema} CASCADE"))
            .execute(&admin)
            .await
            .unwrap();
        admin.close().await;
    }
}
