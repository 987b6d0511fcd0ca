//! The delivery pipeline: validation, identity, retention, fingerprint, the inbox transaction's decisions,
//! the settle, and what is counted. Written once here; a store ([`InboxStore`](crate::store::InboxStore)) only runs the statements.
//!
//! ```text
//! BEGIN
//!   INSERT marker ... (the store's unique constraints decide)
//!     conflict, same identity, same hash ...... Duplicate          ack (returns the first result reference)
//!     conflict, same identity, other hash ..... PayloadCollision   evidence row, dead-letter
//!     conflict on the business key ............ BusinessDuplicate  evidence row, ack
//!   handler(tx, message)   Ok  -> result and outbox rows -> COMMIT -> ack
//!                          Err(retryable) -> ROLLBACK -> release with backoff
//!                          Err(permanent) -> ROLLBACK -> dead-letter with reason
//! ```

pub mod fingerprint;
pub mod handler;
pub mod identity;
mod inbox;
pub mod outcome;
pub mod retention;

pub use inbox::{BodyFormat, Inbox, InboxProcessor, InputRules, TypedKeyFn};
