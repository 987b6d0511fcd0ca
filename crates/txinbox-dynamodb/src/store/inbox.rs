//! [`InboxStore`] on DynamoDB (markers kept for the commit, effect intents, evidence) and the readiness check.

use txinbox_core::effects::NewEffect;
use txinbox_core::pipeline::identity::Identity;
use txinbox_core::store::{Commit, ExistingMarker, MarkerInsert, MarkerRow, Rejection};
use txinbox_core::InboxStore;

use super::items::effect_item;
use super::DynamoStore;
use crate::error::call;
use crate::layout::{self as l, n, s, Item};
use crate::tx::{DynamoTx, Pending, PendingMarker};
use crate::DynamoError;

impl DynamoStore {
    /// The marker `pk` as its holder, read strongly consistent, if it is there and not expired.
    async fn live_marker(&self, pk: &str) -> Result<Option<ExistingMarker>, DynamoError> {
        let Some(item) = self.get_consistent(s(pk), &[]).await? else {
            return Ok(None);
        };
        let expires = crate::layout::Reader::new(&item).opt_i64(l::EXPIRES_AT)?;
        if expires.is_some_and(|e| e < chrono::Utc::now().timestamp()) {
            return Ok(None);
        }
        Self::holder(&item, true).map(Some)
    }

    /// What holds `id`'s message as a store that checks the marker first would find it: its own marker,
    /// else the item of its business key (another message's), each read strongly consistent and absent once
    /// past its `expires_at`; `None` when neither is held.
    pub(super) async fn live_holder(
        &self,
        id: &Identity,
    ) -> Result<Option<ExistingMarker>, DynamoError> {
        let consumer = id.consumer.as_str();
        if let Some(own) = self
            .live_marker(&l::marker_pk(consumer, &id.source, &id.message_id))
            .await?
        {
            return Ok(Some(own));
        }
        let Some(key) = &id.business_key else {
            return Ok(None);
        };
        let pk = l::business_pk(consumer, id.tenant_id.as_deref(), key);
        let Some(item) = self.get_consistent(s(pk), &[]).await? else {
            return Ok(None);
        };
        let expires = crate::layout::Reader::new(&item).opt_i64(l::EXPIRES_AT)?;
        if expires.is_some_and(|e| e < chrono::Utc::now().timestamp()) {
            return Ok(None);
        }
        Self::holder(&item, false).map(Some)
    }
}

impl InboxStore for DynamoStore {
    type Tx = DynamoTx;
    type Error = DynamoError;

    fn name(&self) -> &'static str {
        "dynamodb"
    }

    async fn begin(&self) -> Result<DynamoTx, DynamoError> {
        Ok(DynamoTx::new(self.client.clone(), self.table.clone()))
    }

    /// Keeps the marker for the commit, without a round trip: the commit's condition decides, and a
    /// conflict comes back from [`InboxStore::commit`] as [`Commit::Conflict`] with the holder as it was. In a
    /// batch (several markers in one transaction), a marker whose item an earlier marker of the same
    /// transaction already writes (the same message twice, or the same business key) is refused here, as a
    /// unique constraint would refuse it: DynamoDB allows one action per item in a transaction.
    ///
    /// A marker refused for its business key alone (an earlier marker of the transaction has the key, not
    /// the identity) may also meet a marker of its own identity already in the table, which a store answers
    /// first (a copy of a message applied before is a plain duplicate): that one is read (one strongly
    /// consistent `GetItem`, on this path only).
    async fn insert_marker(
        &self,
        tx: &DynamoTx,
        row: &MarkerRow<'_>,
    ) -> Result<MarkerInsert, DynamoError> {
        let id = row.identity;
        let consumer = id.consumer.as_str();
        let pk = l::marker_pk(consumer, &id.source, &id.message_id);
        let in_batch = {
            let st = tx.lock();
            if st.closed {
                return Err(DynamoError::Closed);
            }
            let business = |i: &Identity| {
                i.business_key
                    .as_deref()
                    .map(|k| l::business_pk(i.consumer.as_str(), i.tenant_id.as_deref(), k))
            };
            let bpk = business(id);
            let same = |p: &&Pending| {
                let other = &p.marker.identity;
                l::marker_pk(other.consumer.as_str(), &other.source, &other.message_id) == pk
            };
            // The holder of the identity first, whichever came first in the transaction, as a store reads it.
            let holder = |p: &Pending, same_identity: bool| {
                ExistingMarker::new(
                    same_identity,
                    p.marker.identity.message_id.clone(),
                    p.marker.payload_hash.clone(),
                    p.marker.processed_at,
                    p.result_reference.clone(),
                )
            };
            match st.pending.iter().find(same) {
                Some(p) => Some(holder(p, true)),
                None => st
                    .pending
                    .iter()
                    .find(|p| bpk.is_some() && business(&p.marker.identity) == bpk)
                    .map(|p| holder(p, false)),
            }
        };
        if let Some(holder) = in_batch {
            if !holder.same_identity {
                if let Some(own) = self.live_marker(&pk).await? {
                    return Ok(MarkerInsert::Conflict(Some(own)));
                }
            }
            return Ok(MarkerInsert::Conflict(Some(holder)));
        }
        let mut st = tx.lock();
        if st.closed {
            return Err(DynamoError::Closed);
        }
        st.pending.push(Pending {
            marker: PendingMarker {
                identity: id.clone(),
                payload_hash: row.payload_hash.to_owned(),
                received_at: row.received_at,
                processed_at: row.processed_at,
                retention_until: row.retention_until,
                delivery_count: row.delivery_count,
            },
            result_reference: None,
            effects: Vec::new(),
        });
        Ok(MarkerInsert::Inserted)
    }

    async fn record_result(
        &self,
        tx: &DynamoTx,
        identity: &Identity,
        result_reference: Option<&str>,
        effects: &[NewEffect<'_>],
    ) -> Result<(), DynamoError> {
        let mut st = tx.lock();
        if st.closed {
            return Err(DynamoError::Closed);
        }
        let Some(p) = st
            .pending
            .iter_mut()
            .rev()
            .find(|p| p.marker.identity == *identity)
        else {
            return Err(DynamoError::NoMarker);
        };
        p.result_reference = result_reference.map(str::to_owned);
        p.effects = effects.iter().map(effect_item).collect();
        Ok(())
    }

    async fn commit(&self, tx: DynamoTx) -> Result<Commit, DynamoError> {
        self.commit_inner(tx).await
    }

    async fn rollback(&self, tx: DynamoTx, _clean_end: bool) -> Result<(), DynamoError> {
        let mut st = tx.lock();
        st.closed = true;
        st.actions.clear();
        st.pending.clear();
        Ok(())
    }

    async fn record_rejection(&self, r: &Rejection<'_>) -> Result<(), DynamoError> {
        let id = uuid::Uuid::new_v4().to_string();
        let consumer = r.identity.consumer.as_str();
        let mut item = Item::new();
        item.insert(l::PK.into(), s(format!("r#{id}")));
        item.insert("kind".into(), s(r.kind.as_str()));
        item.insert("consumer".into(), s(consumer));
        item.insert("source".into(), s(&r.identity.source));
        item.insert("message_id".into(), s(&r.identity.message_id));
        if let Some(k) = &r.identity.business_key {
            item.insert("business_key".into(), s(k));
        }
        item.insert("payload_hash".into(), s(r.payload_hash));
        item.insert("conflicts_with".into(), s(r.conflicts_with));
        item.insert("detail".into(), s(r.detail));
        item.insert("recorded_at".into(), s(l::ts(r.recorded_at)));
        let until = txinbox_core::time::after(r.recorded_at, self.options.rejections_keep);
        item.insert(l::EXPIRES_AT.into(), n(l::epoch_ceil(until)));
        item.insert("gsi1pk".into(), s(l::rejections_of(consumer)));
        item.insert("gsi1sk".into(), s(format!("{}#{id}", l::ts(r.recorded_at))));
        self.client
            .put_item()
            .table_name(&*self.table)
            .set_item(Some(item))
            .send()
            .await
            .map_err(|e| call("PutItem", e))?;
        Ok(())
    }

    /// The holder of `identity`'s message, read strongly consistent: its marker, then its business key's
    /// item (one `GetItem` each, the second only when the first finds none and the message has a business
    /// key), as a permanent refusal of the transaction reads it ([`InboxStore::commit`]). The pipeline asks
    /// only when a delivery would be dead-lettered after its handler ran, which the marker's condition at
    /// commit never got to decide.
    async fn holder_of(&self, identity: &Identity) -> Result<Option<ExistingMarker>, DynamoError> {
        self.live_holder(identity).await
    }

    fn is_transient(e: &DynamoError) -> bool {
        e.is_transient()
    }

    fn classify(e: &(dyn std::error::Error + 'static)) -> Option<bool> {
        e.downcast_ref::<DynamoError>()
            .map(DynamoError::is_transient)
    }
}

/// Readiness depends on the table: `DescribeTable` answers and the table is `ACTIVE` (or `UPDATING`, which
/// still serves reads and writes). The error names the table's status or DynamoDB's error code, never a
/// credential.
impl txinbox_core::runtime::health::HealthCheck for DynamoStore {
    fn check(&self) -> txinbox_core::runtime::health::CheckFuture<'_> {
        Box::pin(async move {
            let out = self
                .client
                .describe_table()
                .table_name(&*self.table)
                .send()
                .await
                .map_err(|e| call("DescribeTable", e).to_string())?;
            let status = out
                .table()
                .and_then(|t| t.table_status())
                .map(|s| s.as_str().to_owned())
                .unwrap_or_default();
            match status.as_str() {
                "ACTIVE" | "UPDATING" => Ok(()),
                other => Err(format!("table {} is {other}", self.table)),
            }
        })
    }
}
