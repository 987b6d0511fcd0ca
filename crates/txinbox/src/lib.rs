#![doc = include_str!("../../../README.md")]
#![forbid(unsafe_code)]
#![warn(missing_docs)]

#[doc(inline)]
pub use txinbox_core::*;

#[doc(inline)]
pub use txinbox_store::{
    db_error, handler_fn, relay_outbox, BodyFormat, Handled, Handler, Inbound, Inbox,
    InboxProcessor, InputRules, RelayReport, Store, StoreError,
};

/// sqlx, as the inbox's stores use it: name its types (`txinbox::sqlx::query`, `txinbox::sqlx::Postgres`) with
/// no dependency line of your own.
pub use txinbox_store::sqlx;

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
