#![doc = include_str!("../../../README.md")]
#![forbid(unsafe_code)]
#![warn(missing_docs)]

#[doc(inline)]
pub use txinbox_core::*;

#[doc(inline)]
pub use txinbox_store::{Store, StoreError, Tx};

/// The inbox on SQLite (feature `sqlite`): `SqliteStore::connect("sqlite:app.db")`.
#[cfg(feature = "sqlite")]
pub type SqliteStore = Store<sqlx::Sqlite>;

/// The inbox on PostgreSQL (feature `postgres`): `PgStore::connect("postgres://..", 16)`.
#[cfg(feature = "postgres")]
pub type PgStore = Store<sqlx::Postgres>;

/// sqlx, as the inbox's stores use it: name its types (`txinbox::sqlx::query`, `txinbox::sqlx::Postgres`) with
/// no dependency line of your own.
pub use txinbox_store::sqlx;

/// The store contract and the sqlx stores' own pieces (`Backend`, for code generic over the database).
pub mod store {
    #[doc(inline)]
    pub use txinbox_core::store::*;
    #[doc(inline)]
    pub use txinbox_store::{Backend, Store, StoreError, Tx};
}

/// The Amazon SQS FIFO adapter (feature `sqs`), with the AWS SDK crates it is built on.
#[cfg(feature = "sqs")]
pub mod sqs {
    #[doc(inline)]
    pub use txinbox_sqs::*;
}

/// The Azure Service Bus adapter (feature `servicebus`), with the Azure SDK crates it is built on.
#[cfg(feature = "servicebus")]
pub mod servicebus {
    #[doc(inline)]
    pub use txinbox_servicebus::*;
}
