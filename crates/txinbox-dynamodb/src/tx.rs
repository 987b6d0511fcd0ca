//! The open transaction: the handler's actions, gathered until the store sends them with the marker.

use std::sync::{Arc, Mutex, MutexGuard};

use aws_sdk_dynamodb::types::{ConditionCheck, Delete, Put, TransactWriteItem, Update};
use chrono::{DateTime, Utc};
use txinbox_core::pipeline::identity::Identity;

use crate::layout::Item;
use crate::DynamoError;

/// The marker the pipeline asked for, kept until the commit.
#[derive(Clone, Debug)]
pub(crate) struct PendingMarker {
    pub identity: Identity,
    pub payload_hash: String,
    pub received_at: DateTime<Utc>,
    pub processed_at: DateTime<Utc>,
    pub retention_until: DateTime<Utc>,
    pub delivery_count: u32,
}

/// One delivery's share of the transaction: its marker, its handler's result reference and its effect items.
#[derive(Clone, Debug)]
pub(crate) struct Pending {
    pub marker: PendingMarker,
    pub result_reference: Option<String>,
    /// Effect items (a grouped one gets its `prev` when the transaction is sent).
    pub effects: Vec<Item>,
}

#[derive(Default)]
pub(crate) struct State {
    pub actions: Vec<TransactWriteItem>,
    /// The deliveries of the transaction: one, or the deliveries of a batch (`batch_commit`), in order.
    pub pending: Vec<Pending>,
    pub closed: bool,
}

/// An open inbox transaction on DynamoDB.
///
/// DynamoDB has no interactive transaction: a `TransactWriteItems` call carries every write at once. The
/// handler adds its writes here ([`put`](DynamoTx::put), [`update`](DynamoTx::update),
/// [`delete`](DynamoTx::delete), [`condition_check`](DynamoTx::condition_check), on any table of the account
/// and region), and the store sends them at commit in one call with the marker, the business key item and
/// the effect intents: all of them are written, or none.
///
/// Reads go through [`client`](DynamoTx::client), outside the transaction. A decision that depends on a read
/// is made safe by a condition in the same transaction: read the item with its `version`, then add a
/// [`ConditionCheck`] (or a condition on the update) that `version` is still what was read. If another
/// writer changed it in between, the whole transaction is cancelled, the handler's condition failure is
/// reported as [`DynamoError::HandlerCondition`], and the delivery is retried on fresh reads.
///
/// Clones share the transaction; after the commit or a rollback every clone refuses to add
/// ([`DynamoError::Closed`]).
#[derive(Clone)]
pub struct DynamoTx {
    state: Arc<Mutex<State>>,
    client: aws_sdk_dynamodb::Client,
    table: Arc<str>,
}

impl std::fmt::Debug for DynamoTx {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let st = self.lock();
        f.debug_struct("DynamoTx")
            .field("actions", &st.actions.len())
            .field("closed", &st.closed)
            .finish()
    }
}

impl DynamoTx {
    pub(crate) fn new(client: aws_sdk_dynamodb::Client, table: Arc<str>) -> Self {
        Self {
            state: Arc::new(Mutex::new(State::default())),
            client,
            table,
        }
    }

    pub(crate) fn lock(&self) -> MutexGuard<'_, State> {
        // A handler that panicked while holding the lock left no half-written state behind (every change is
        // one push): the data is still consistent.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The DynamoDB client, for reads (outside the transaction).
    pub fn client(&self) -> &aws_sdk_dynamodb::Client {
        &self.client
    }

    /// The inbox's table, for a single-table design that keeps business items beside the store's. The store
    /// owns the keys that start with `m#`, `b#`, `e#`, `r#`, `fx#`, `due#` and `gt#` (see
    /// [`layout`](crate::layout)): give business items a prefix of their own.
    pub fn inbox_table(&self) -> &str {
        &self.table
    }

    /// Adds an action (any kind) to the transaction.
    pub fn push(&self, item: TransactWriteItem) -> Result<(), DynamoError> {
        let mut st = self.lock();
        if st.closed {
            return Err(DynamoError::Closed);
        }
        st.actions.push(item);
        Ok(())
    }

    /// Adds a put.
    pub fn put(&self, put: Put) -> Result<(), DynamoError> {
        self.push(TransactWriteItem::builder().put(put).build())
    }

    /// Adds an update.
    pub fn update(&self, update: Update) -> Result<(), DynamoError> {
        self.push(TransactWriteItem::builder().update(update).build())
    }

    /// Adds a delete.
    pub fn delete(&self, delete: Delete) -> Result<(), DynamoError> {
        self.push(TransactWriteItem::builder().delete(delete).build())
    }

    /// Adds a condition check (an item that must match a condition for the transaction to commit).
    pub fn condition_check(&self, check: ConditionCheck) -> Result<(), DynamoError> {
        self.push(TransactWriteItem::builder().condition_check(check).build())
    }

    /// How many actions the handler added so far.
    pub fn len(&self) -> usize {
        self.lock().actions.len()
    }

    /// Whether the handler added no action.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}
