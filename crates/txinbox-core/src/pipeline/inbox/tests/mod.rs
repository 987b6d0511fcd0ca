//! The pipeline's decisions, without a database: an in-memory store that checks its unique keys at COMMIT
//! (as a DynamoDB `TransactWriteItems` would), so both conflict paths of the pipeline are exercised.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use chrono::{DateTime, Utc};

use super::*;
use crate::broker::mem::{MemoryQueue, OutgoingMessage, QueueState};
use crate::pipeline::handler::Raw;
use crate::pipeline::handler::{Handled, HandlerError, Message};
use crate::pipeline::identity::IdentityPolicy;
use crate::pipeline::outcome::Outcome;
use crate::store::{Commit, ExistingMarker, InboxStore, MarkerInsert, MarkerRow, Rejection};
use crate::{ConsumerName, Identity};

mod batch;
mod delivery;
mod lease;
mod prefetch;
mod receive;
mod settle;

#[derive(Clone, Debug)]
struct Row {
    message_id: String,
    business_key: Option<String>,
    hash: String,
    processed_at: DateTime<Utc>,
    result_reference: Option<String>,
}

#[derive(Default, Debug)]
struct State {
    /// (consumer, source, message_id) -> row.
    markers: HashMap<(String, String, String), Row>,
    /// Business effects written by handlers.
    effects: Vec<String>,
    rejections: Vec<(&'static str, String)>,
    begins: u32,
    fail_begin: bool,
    /// Whether the store answers savepoints (batch mode); off: one transaction per delivery.
    savepoints: bool,
    /// Savepoints opened.
    savepoints_opened: u32,
    /// Message ids whose marker has no partition (`MarkerInsert::Unplaced`).
    unplaced: Vec<String>,
    /// Whether `holder_of` answers the committed holder (as the DynamoDB store does); off: `None`, as the
    /// trait's default.
    answers_holders: bool,
    /// Whether `holder_of` fails (transient).
    fail_holder_reads: bool,
    /// `holder_of` calls.
    holder_reads: u32,
}

#[derive(Clone, Default, Debug)]
struct MemStore(Arc<Mutex<State>>);

/// A transaction: what it will write, applied at commit under the unique keys' checks.
#[derive(Clone, Debug, Default)]
struct MemTx(Arc<Mutex<Pending>>);

#[derive(Debug, Default)]
struct Pending {
    markers: Vec<((String, String, String), Row)>,
    effects: Vec<String>,
    /// Savepoints: (markers, effects) written before each.
    marks: Vec<(usize, usize)>,
}

impl MemTx {
    fn write(&self, effect: impl Into<String>) {
        self.0.lock().unwrap().effects.push(effect.into());
    }
}

#[derive(Debug, thiserror::Error)]
#[error("memory store unavailable")]
struct Unavailable;

impl MemStore {
    fn holder(
        st: &State,
        key: &(String, String, String),
        bkey: &Option<String>,
    ) -> Option<ExistingMarker> {
        if let Some(r) = st.markers.get(key) {
            return Some(ExistingMarker::new(
                true,
                r.message_id.clone(),
                r.hash.clone(),
                r.processed_at,
                r.result_reference.clone(),
            ));
        }
        let bkey = bkey.as_ref()?;
        st.markers
            .iter()
            .find(|((c, _, _), r)| *c == key.0 && r.business_key.as_ref() == Some(bkey))
            .map(|(_, r)| {
                ExistingMarker::new(
                    false,
                    r.message_id.clone(),
                    r.hash.clone(),
                    r.processed_at,
                    r.result_reference.clone(),
                )
            })
    }
    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.0.lock().unwrap()
    }
}

impl InboxStore for MemStore {
    type Tx = MemTx;
    type Error = Unavailable;

    fn name(&self) -> &'static str {
        "memory"
    }
    async fn begin(&self) -> Result<MemTx, Unavailable> {
        let mut st = self.state();
        st.begins += 1;
        if st.fail_begin {
            return Err(Unavailable);
        }
        Ok(MemTx::default())
    }
    async fn insert_marker(
        &self,
        tx: &MemTx,
        row: &MarkerRow<'_>,
    ) -> Result<MarkerInsert, Unavailable> {
        let id = row.identity;
        if self.state().unplaced.contains(&id.message_id) {
            return Ok(MarkerInsert::Unplaced(format!(
                "no partition for {}",
                id.message_id
            )));
        }
        let key = (
            id.consumer.as_str().to_owned(),
            id.source.clone(),
            id.message_id.clone(),
        );
        let row = Row {
            message_id: id.message_id.clone(),
            // Unique per consumer and tenant, as the stores' index (no tenant = the tenant '').
            business_key: id
                .business_key
                .as_ref()
                .map(|k| format!("{}\u{0}{k}", id.tenant_id.as_deref().unwrap_or(""))),
            hash: row.payload_hash.to_owned(),
            processed_at: row.processed_at,
            result_reference: None,
        };
        // Deferred: the keys are checked at commit.
        tx.0.lock().unwrap().markers.push((key, row));
        Ok(MarkerInsert::Inserted)
    }
    async fn record_result(
        &self,
        tx: &MemTx,
        _: &Identity,
        r: Option<&str>,
        _: &[crate::effects::NewEffect<'_>],
    ) -> Result<(), Unavailable> {
        if let Some((_, row)) = tx.0.lock().unwrap().markers.last_mut() {
            row.result_reference = r.map(str::to_owned);
        }
        Ok(())
    }
    async fn commit(&self, tx: MemTx) -> Result<Commit, Unavailable> {
        let pending = std::mem::take(&mut *tx.0.lock().unwrap());
        let mut st = self.state();
        let before = st.markers.clone();
        for (key, row) in pending.markers {
            if let Some(holder) = Self::holder(&st, &key, &row.business_key) {
                // All or nothing: a conflict anywhere writes nothing.
                st.markers = before;
                return Ok(Commit::Conflict(Some(holder)));
            }
            st.markers.insert(key, row);
        }
        st.effects.extend(pending.effects);
        Ok(Commit::Done)
    }
    async fn savepoint(&self, tx: &MemTx) -> Result<bool, Unavailable> {
        {
            let mut st = self.state();
            if !st.savepoints {
                return Ok(false);
            }
            st.savepoints_opened += 1;
        }
        let mut p = tx.0.lock().unwrap();
        let mark = (p.markers.len(), p.effects.len());
        p.marks.push(mark);
        Ok(true)
    }
    async fn rollback_to_savepoint(&self, tx: &MemTx) -> Result<(), Unavailable> {
        let mut p = tx.0.lock().unwrap();
        let (m, e) = p.marks.last().copied().unwrap_or_default();
        p.markers.truncate(m);
        p.effects.truncate(e);
        Ok(())
    }
    async fn rollback(&self, tx: MemTx, _: bool) -> Result<(), Unavailable> {
        *tx.0.lock().unwrap() = Pending::default();
        Ok(())
    }
    async fn record_rejection(&self, r: &Rejection<'_>) -> Result<(), Unavailable> {
        self.state()
            .rejections
            .push((r.kind.as_str(), r.identity.message_id.clone()));
        Ok(())
    }
    async fn holder_of(&self, id: &Identity) -> Result<Option<ExistingMarker>, Unavailable> {
        let mut st = self.state();
        st.holder_reads += 1;
        if st.fail_holder_reads {
            return Err(Unavailable);
        }
        if !st.answers_holders {
            return Ok(None);
        }
        let key = (
            id.consumer.as_str().to_owned(),
            id.source.clone(),
            id.message_id.clone(),
        );
        let bkey = id
            .business_key
            .as_ref()
            .map(|k| format!("{}\u{0}{k}", id.tenant_id.as_deref().unwrap_or("")));
        Ok(Self::holder(&st, &key, &bkey))
    }
    fn is_transient(_: &Unavailable) -> bool {
        true
    }
    fn classify(e: &(dyn std::error::Error + 'static)) -> Option<bool> {
        e.downcast_ref::<Unavailable>().map(|_| true)
    }
}

#[derive(Debug, serde::Deserialize)]
struct Meeting {
    opportunity: String,
    meeting: String,
}

fn event(id: &str, opportunity: &str) -> OutgoingMessage {
    OutgoingMessage::new(format!(
        r#"{{"opportunity":"{opportunity}","meeting":"184"}}"#
    ))
    .cloudevent("urn:crm", id, "crm.meeting.ended")
}

fn inbox(store: &MemStore) -> Inbox<MemStore> {
    Inbox::new(
        store.clone(),
        IdentityPolicy::new(ConsumerName::new("crm").unwrap()),
    )
    .retry_backoff(Duration::from_secs(7))
}

/// A typed handler writing one effect and returning its reference.
fn processor(
    store: &MemStore,
) -> InboxProcessor<MemStore, Meeting, impl Handler<MemStore, Meeting>> {
    inbox(store)
        .bind(|tx: MemTx, msg: Message<Meeting>| async move {
            tx.write(format!("task-{}", msg.body.opportunity));
            Ok(Handled::reference(format!("task-{}", msg.body.opportunity)))
        })
        .business_key(|m: &Meeting| Some(format!("followup:{}:{}", m.opportunity, m.meeting)))
}

/// A typed handler for a store that checks its markers at commit: it writes its effect, then succeeds
/// (`mode` 0), fails for good (1), records two effects of one name, which the pipeline refuses (2), or fails
/// retryably (3).
fn failing_for_good(
    store: &MemStore,
    mode: Arc<std::sync::atomic::AtomicU8>,
) -> InboxProcessor<MemStore, Meeting, impl Handler<MemStore, Meeting>> {
    inbox(store)
        .bind(move |tx: MemTx, msg: Message<Meeting>| {
            let mode = mode.load(std::sync::atomic::Ordering::SeqCst);
            async move {
                tx.write(format!("task-{}", msg.body.opportunity));
                let done = Handled::reference(format!("task-{}", msg.body.opportunity));
                let fx = |d: &str| crate::effects::Effect::new("notify", d, vec![]);
                match mode {
                    0 => Ok(done),
                    1 => Err(HandlerError::permanent(std::io::Error::other("no account"))),
                    2 => Ok(done.effect(fx("crm")).effect(fx("mail"))),
                    3 => Err(HandlerError::retry(std::io::Error::other("busy"))),
                    _ => panic!("the handler panicked"),
                }
            }
        })
        .business_key(|m: &Meeting| Some(format!("followup:{}:{}", m.opportunity, m.meeting)))
}

async fn one(
    q: &MemoryQueue,
    p: &InboxProcessor<MemStore, Meeting, impl Handler<MemStore, Meeting>>,
) -> Outcome {
    let d = q.receive_now(1).pop().expect("a delivery");
    p.process_one(d).await
}

/// The counters a debugging recorder holds, read once (a snapshot swaps each to zero): (name, labels, value).
type Counted = Vec<(String, Vec<(String, String)>, u64)>;

fn counters(snap: &metrics_util::debugging::Snapshotter) -> Counted {
    use metrics_util::debugging::DebugValue;
    snap.snapshot()
        .into_vec()
        .into_iter()
        .filter_map(|(key, _, _, value)| match value {
            DebugValue::Counter(n) => Some((
                key.key().name().to_owned(),
                key.key()
                    .labels()
                    .map(|l| (l.key().to_owned(), l.value().to_owned()))
                    .collect(),
                n,
            )),
            _ => None,
        })
        .collect()
}

/// The sum of the counters named `name` that carry every label of `labels`.
fn count(counted: &Counted, name: &str, labels: &[(&str, &str)]) -> u64 {
    counted
        .iter()
        .filter(|(n, ls, _)| {
            n == name
                && labels
                    .iter()
                    .all(|(k, v)| ls.iter().any(|(lk, lv)| lk == k && lv == v))
        })
        .map(|(_, _, v)| v)
        .sum()
}
