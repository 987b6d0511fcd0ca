#![doc = include_str!("lib.md")]
#![cfg_attr(docsrs, feature(doc_cfg))]
#![forbid(unsafe_code)]
#![warn(missing_docs)]

// ---- The inbox and its handlers -------------------------------------------------------------------------
#[doc(inline)]
pub use txinbox_core::{
    BodyFormat, ConsumerName, FingerprintSpec, Handled, Handler, HandlerError, IdOrigin, Identity,
    IdentityPolicy, Inbox, InboxProcessor, InputRules, Message, Outcome, OutcomeKind, Payload, Raw,
    ReceivedMessage, RetentionPolicy, Retry,
};

// ---- The runtime -----------------------------------------------------------------------------------------
#[doc(inline)]
pub use txinbox_core::{
    shutdown_signal, CancellationToken, LeaseOptions, LeasedDelivery, Maintenance,
    MaintenanceOptions, MaintenanceReport, Monitor, MonitorReport, Processor, Worker,
    WorkerOptions, WorkerReport,
};

/// Several stores behind one worker: each delivery applied in the store that holds its tenant's data.
pub mod shards {
    #[doc(inline)]
    pub use txinbox_core::runtime::shards::*;
}

// ---- External effects ------------------------------------------------------------------------------------
#[doc(inline)]
pub use txinbox_core::{
    CompensateError, Effect, EffectOptions, EffectReport, EffectRunner, EffectState, OutboxMessage,
};

// ---- Errors ----------------------------------------------------------------------------------------------
#[doc(inline)]
pub use txinbox_core::{BadInput, BoxError, BrokerError, BrokerErrorKind};

// ---- The stores ------------------------------------------------------------------------------------------
#[doc(inline)]
pub use txinbox_store::{Store, StoreError, Tx};

/// The inbox on SQLite (feature `sqlite`): `SqliteStore::connect("sqlite:app.db")`.
#[cfg(feature = "sqlite")]
#[cfg_attr(docsrs, doc(cfg(feature = "sqlite")))]
pub type SqliteStore = Store<sqlx::Sqlite>;

/// The inbox on PostgreSQL (feature `postgres`): `PgStore::connect("postgres://..", 16)`.
#[cfg(feature = "postgres")]
#[cfg_attr(docsrs, doc(cfg(feature = "postgres")))]
pub type PgStore = Store<sqlx::Postgres>;

/// sqlx, as the inbox's stores use it: name its types (`txinbox::sqlx::query`, `txinbox::sqlx::Postgres`) with
/// no dependency line of your own. Its version is part of this crate's API: a sqlx release that breaks your
/// code comes with a txinbox release that says so.
pub use txinbox_store::sqlx;

/// What most workers need, in one line: `use txinbox::prelude::*;`.
pub mod prelude {
    #[doc(no_inline)]
    pub use crate::{
        ConsumerName, Effect, Handled, Handler, HandlerError, IdentityPolicy, Inbox, Message,
        Outcome, Raw, Retry, Store, Tx, Worker, WorkerOptions,
    };
}

/// The stores: [`Store`] over sqlx, and [`Backend`](store::Backend) for code generic over the database.
pub mod store {
    /// What the operator queries return (`Store::consumer_stats`, `message_story`, `rejections`): the same
    /// types on every store.
    pub use txinbox_core::store::ops;
    #[doc(inline)]
    pub use txinbox_store::{Backend, Migrations, Store, StoreError, StoreOptions, Tx};
}

/// External effects: what a handler wants done outside the database, recorded in the inbox transaction and
/// run after COMMIT. Everything a custom [`EffectExecutor`](effects::EffectExecutor) needs is here.
pub mod effects {
    #[doc(inline)]
    pub use txinbox_core::effects::outbox::{PublishEffect, Publisher};
    #[doc(inline)]
    pub use txinbox_core::effects::{
        idempotency_key, BoxError, BoxFuture, ClaimedEffect, CompensateError, CompensatedRow,
        Confirmation, Effect, EffectExecutor, EffectOptions, EffectReport, EffectRunner,
        EffectState, Execution, RowOutcome,
    };
}

/// The HTTP destination of effects (feature `http`): where the key goes, how answers and confirmations are
/// read.
#[cfg(feature = "http")]
#[cfg_attr(docsrs, doc(cfg(feature = "http")))]
pub mod http {
    #[doc(inline)]
    pub use txinbox_core::http::*;
}

/// Liveness and readiness of a worker (`GET /livez`, `GET /readyz` with feature `health-server`).
pub mod health {
    #[doc(inline)]
    pub use txinbox_core::runtime::health::*;
}

/// The lease keeper's cadence: renewed every third of a lock or visibility timeout.
pub mod lease {
    #[doc(inline)]
    pub use txinbox_core::runtime::lease::{renewal_interval, LeaseOptions};
}

/// One settings file for the worker and `txinbox check-infra`.
pub mod settings {
    #[doc(inline)]
    pub use txinbox_core::settings::*;
}

/// Masking the secrets a URL or an error text may hold, for a log line or a `Debug`.
pub mod error {
    #[doc(inline)]
    pub use txinbox_core::error::{redact_secrets, redact_url};
}

/// The metric names, and [`describe`](metrics::describe) to register their descriptions.
pub mod metrics {
    #[doc(inline)]
    pub use txinbox_core::metrics::*;
}

/// An in-memory broker with real at-least-once semantics: a worker without a broker, for tests and demos.
pub mod mem {
    #[doc(inline)]
    pub use txinbox_core::broker::mem::*;
}

/// The report both adapters' redrive tools share.
pub mod redrive {
    #[doc(inline)]
    pub use txinbox_core::broker::redrive::*;
}

/// The broker side, for code generic over brokers and for writing an adapter: [`Receiver`](broker::Receiver)
/// hands out [`Delivery`](broker::Delivery)s, settled once by consuming them.
pub mod broker {
    #[doc(inline)]
    pub use txinbox_core::broker::{
        dead_letter, BoxDelivery, BoxReceiver, DeadLetter, Delivery, Lease, Receiver,
    };
    #[doc(inline)]
    pub use txinbox_core::{BrokerError, BrokerErrorKind, ReceivedMessage};
}

/// The contracts a store driver implements (the inbox's statements, effects, maintenance). **Stability**:
/// these traits follow the pipeline's needs and may change in any 0.x release; depend on them only to write
/// a store of your own, and pin txinbox's minor version when you do.
pub mod driver {
    #[doc(inline)]
    pub use txinbox_core::effects::{
        EffectCount, EffectStore, NewEffect, Transition, TransitionColumns,
    };
    #[doc(inline)]
    pub use txinbox_core::runtime::maintenance::{MaintenanceStore, Table};
    #[doc(inline)]
    pub use txinbox_core::store::*;
}

/// The Amazon SQS FIFO adapter (feature `sqs`), with the AWS SDK crates it is built on (`aws_sdk_sqs`,
/// `aws_config`): configure a client with the same versions the adapter uses. The SDK's version is part of
/// this module's API: an SDK update that changes its types comes in a txinbox minor release.
#[cfg(feature = "sqs")]
#[cfg_attr(docsrs, doc(cfg(feature = "sqs")))]
pub mod sqs {
    #[doc(inline)]
    pub use txinbox_sqs::*;
}

/// The DynamoDB store (feature `dynamodb`): the marker, your writes and the effect intents in one
/// `TransactWriteItems`, with the AWS SDK crate it is built on (`aws_sdk_dynamodb`, a 1.x crate whose version
/// is part of this module's API).
#[cfg(feature = "dynamodb")]
#[cfg_attr(docsrs, doc(cfg(feature = "dynamodb")))]
pub mod dynamodb {
    #[doc(inline)]
    pub use txinbox_dynamodb::*;
}

/// The Azure Service Bus adapter (feature `servicebus`), with the Azure SDK crates it is built on
/// (`azure_messaging_servicebus`, `azure_identity`, `azure_core`: 0.x crates). Their versions are part of
/// this module's API: an SDK update that changes its types comes in a txinbox minor release.
#[cfg(feature = "servicebus")]
#[cfg_attr(docsrs, doc(cfg(feature = "servicebus")))]
pub mod servicebus {
    #[doc(inline)]
    pub use txinbox_servicebus::*;
}
