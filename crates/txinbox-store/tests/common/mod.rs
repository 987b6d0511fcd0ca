//! What the partitioned layout's tests share: a store in a fresh PostgreSQL schema of its own.

use sqlx::Connection;

/// A store on a fresh schema of the test database, its schema dropped by [`Schema::drop`].
pub struct Schema {
    pub store: txinbox_store::Store<sqlx::Postgres>,
    pub name: String,
}

impl Schema {
    /// A store on a new schema (row by row until converted), four connections.
    pub async fn new() -> Self {
        let name = format!("t_{}", uuid::Uuid::new_v4().simple());
        let store = txinbox_store::Store::<sqlx::Postgres>::connect_with(
            &txinbox_testkit::pg_url(),
            txinbox_store::StoreOptions::new()
                .schema(&name)
                .max_connections(4),
        )
        .await
        .unwrap();
        Self { store, name }
    }

    /// Closes the store and drops its schema.
    pub async fn drop(self) {
        self.store.close().await;
        let mut c = sqlx::PgConnection::connect(&txinbox_testkit::pg_url())
            .await
            .unwrap();
        sqlx::Executor::execute(
            &mut c,
            format!("DROP SCHEMA IF EXISTS \"{}\" CASCADE", self.name).as_str(),
        )
        .await
        .unwrap();
    }
}
