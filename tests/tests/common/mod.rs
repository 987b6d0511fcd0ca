//! What the effect tests share: reading the effects table on both backends, recording effects the way users
//! do (a handler, messages through the in-memory broker), and the local CRM as a destination.
#![allow(dead_code)]

use std::sync::{Arc, Mutex};

use chrono::{DateTime, Utc};
use futures::future::BoxFuture;
use txinbox::effects::idempotency_key;
use txinbox::http::{HttpEffect, HttpEffectBuilder, Key};
use txinbox::mem::MemoryQueue;
use txinbox::sqlx::{self, Database, Decode, Executor, IntoArguments, Row, Type};
use txinbox::{Effect, Handler, HandlerError, Identity, Message, Outcome, Store, Tx};
use txinbox_crm_api::CrmApi;
use txinbox_lab::lab::{lab_message, lab_processor, LabEvent};
use txinbox_lab::labdb::LabDb;

/// The name of the CRM effect every test handler records.
pub const CRM_TASK: &str = "crm.create_task";

// ---------------------------------------------------------------------------------------------------------
// Reading the effects table, on both backends.
// ---------------------------------------------------------------------------------------------------------

/// One row of `txinbox_effects`, as the tests read it.
#[derive(Clone, Debug)]
pub struct FxRow {
    pub id: i64,
    pub message_id: String,
    pub key: String,
    pub name: String,
    pub destination: String,
    pub state: String,
    pub attempts: i64,
    pub reconciliations: i64,
    pub next_attempt_at: DateTime<Utc>,
    pub claimed_by: Option<String>,
    pub claim_until: Option<DateTime<Utc>>,
    pub result_reference: Option<String>,
    pub last_error: Option<String>,
    pub external_ref: String,
    pub group_key: Option<String>,
    pub finished: bool,
}

pub fn parse_ts(s: &str) -> DateTime<Utc> {
    DateTime::parse_from_rfc3339(s)
        .unwrap_or_else(|e| panic!("timestamp {s:?}: {e}"))
        .with_timezone(&Utc)
}

/// A backend whose effects table the tests can read: every [`LabDb`] whose driver reads the columns below.
pub trait FxDb: LabDb {
    /// Every effect row, in id order.
    fn effect_rows(store: &Store<Self>) -> BoxFuture<'_, Vec<FxRow>>;
    /// Rows of a table (`SELECT count(*)`).
    fn count<'a>(store: &'a Store<Self>, table: &'a str) -> BoxFuture<'a, i64>;
}

impl<DB> FxDb for DB
where
    DB: LabDb,
    for<'c> &'c sqlx::Pool<DB>: Executor<'c, Database = DB>,
    for<'q> <DB as Database>::Arguments<'q>: IntoArguments<'q, DB>,
    for<'r> i64: Decode<'r, DB> + Type<DB>,
    for<'r> String: Decode<'r, DB> + Type<DB>,
    for<'r> Option<String>: Decode<'r, DB>,
    usize: sqlx::ColumnIndex<DB::Row>,
{
    fn effect_rows(store: &Store<Self>) -> BoxFuture<'_, Vec<FxRow>> {
        Box::pin(async move {
            // Timestamps as RFC 3339 text on both backends (SQLite stores them so).
            let ts = |col: &str| {
                if <DB as Database>::NAME == "PostgreSQL" {
                    format!(
                        "to_char({col} AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS.US\"Z\"')"
                    )
                } else {
                    col.to_owned()
                }
            };
            let sql = format!(
                "SELECT id, message_id, idempotency_key, name, destination, state, CAST(attempts AS BIGINT), \
                 CAST(reconciliations AS BIGINT), {}, claimed_by, {}, result_reference, last_error, external_ref, \
                 group_key, CASE WHEN finished_at IS NULL THEN NULL ELSE 'finished' END \
                 FROM txinbox_effects ORDER BY id",
                ts("next_attempt_at"),
                ts("claim_until")
            );
            let rows = sqlx::query(&sql)
                .fetch_all(store.pool())
                .await
                .expect("reading txinbox_effects");
            rows.iter()
                .map(|r| {
                    let next: String = r.get(8);
                    let until: Option<String> = r.get(10);
                    let finished: Option<String> = r.get(15);
                    FxRow {
                        id: r.get(0),
                        message_id: r.get(1),
                        key: r.get(2),
                        name: r.get(3),
                        destination: r.get(4),
                        state: r.get(5),
                        attempts: r.get(6),
                        reconciliations: r.get(7),
                        next_attempt_at: parse_ts(&next),
                        claimed_by: r.get(9),
                        claim_until: until.as_deref().map(parse_ts),
                        result_reference: r.get(11),
                        last_error: r.get(12),
                        external_ref: r.get(13),
                        group_key: r.get(14),
                        finished: finished.is_some(),
                    }
                })
                .collect()
        })
    }

    fn count<'a>(store: &'a Store<Self>, table: &'a str) -> BoxFuture<'a, i64> {
        Box::pin(async move {
            sqlx::query_scalar(&format!("SELECT count(*) FROM {table}"))
                .fetch_one(store.pool())
                .await
                .unwrap_or_else(|e| panic!("counting {table}: {e}"))
        })
    }
}

pub fn states(rows: &[FxRow]) -> std::collections::BTreeMap<String, usize> {
    let mut out = std::collections::BTreeMap::new();
    for r in rows {
        *out.entry(r.state.clone()).or_insert(0) += 1;
    }
    out
}

// ---------------------------------------------------------------------------------------------------------
// Recording effects the way users do: a handler, messages through the in-memory broker.
// ---------------------------------------------------------------------------------------------------------

pub type Ids = Arc<Mutex<Vec<Identity>>>;

/// A handler that inserts the lab's local task and records `effects(msg)` next to it; the identities of the
/// messages it handled are kept (to compute the idempotency keys).
pub fn recording<DB: LabDb>(
    effects: impl Fn(&Message<LabEvent>) -> Vec<Effect> + Send + Sync + 'static,
) -> (impl Handler<Store<DB>, LabEvent>, Ids) {
    let ids: Ids = Arc::default();
    let seen = ids.clone();
    let effects = Arc::new(effects);
    let handler = move |tx: Tx<DB>, msg: Message<LabEvent>| {
        let seen = seen.clone();
        let effects = effects.clone();
        async move {
            let fx = effects(&msg);
            let identity = msg.identity.clone();
            let mut done = DB::insert_task(tx, msg).await?;
            for e in fx {
                done = done.effect(e);
            }
            seen.lock().unwrap().push(identity);
            Ok::<_, HandlerError>(done)
        }
    };
    (handler, ids)
}

/// Sends lab messages `range` through a memory queue and processes each delivery with `handler`.
pub async fn deliver<DB: LabDb, H: Handler<Store<DB>, LabEvent>>(
    store: &Store<DB>,
    handler: H,
    range: std::ops::Range<usize>,
) -> Vec<Outcome> {
    let p = lab_processor(store.clone(), handler);
    let q = MemoryQueue::default();
    let expected = range.len();
    for i in range {
        q.send(lab_message(i));
    }
    let mut out = Vec::with_capacity(expected);
    while let Some(d) = q.receive_now(1).pop() {
        out.push(p.process_one(d).await);
        assert!(out.len() <= expected, "more deliveries than messages sent");
    }
    out
}

pub fn assert_all_applied(outcomes: &[Outcome], n: usize) {
    assert_eq!(outcomes.len(), n);
    for o in outcomes {
        assert!(matches!(o, Outcome::Applied { .. }), "{o:?}");
    }
}

/// The lab's follow-up reference: searchable at the CRM, percent-encoded in the confirmation URL.
pub fn followup_ref(msg: &Message<LabEvent>) -> String {
    format!("followup:{}:{}", msg.body.opportunity, msg.body.meeting)
}

/// The follow-up task to create at the CRM, with its searchable reference in the body and on the effect.
pub fn crm_effect(msg: &Message<LabEvent>) -> Effect {
    let reference = followup_ref(msg);
    let payload = serde_json::json!({
        "opportunity": msg.body.opportunity,
        "meeting": msg.body.meeting,
        "title": "follow up the meeting",
        "external_ref": reference,
    });
    Effect::json(CRM_TASK, "crm", &payload)
        .unwrap()
        .external_ref(reference)
}

pub fn keys(ids: &Ids, name: &str) -> Vec<String> {
    ids.lock()
        .unwrap()
        .iter()
        .map(|id| idempotency_key(id, name))
        .collect()
}

/// The CRM as a destination, confirmed by idempotency key (a lookup: 404 when none).
pub fn crm_by_key_builder(crm: &CrmApi) -> HttpEffectBuilder {
    HttpEffect::post(format!("{}/tasks", crm.url()))
        .confirm_url(format!("{}/tasks?idempotency_key={{key}}", crm.url()))
}

/// [`crm_by_key_builder`], built.
pub fn crm_by_key(crm: &CrmApi) -> HttpEffect {
    crm_by_key_builder(crm)
        .build()
        .expect("a valid destination")
}

/// The CRM as a destination without idempotency, confirmed by external reference (a lookup: 404 when none).
pub fn crm_by_ref(crm: &CrmApi) -> HttpEffect {
    HttpEffect::post(format!("{}/tasks", crm.url()))
        .key(Key::none())
        .confirm_url(format!("{}/tasks?external_ref={{external_ref}}", crm.url()))
        .build()
        .expect("a valid destination")
}

pub async fn start_crm(idempotency: bool) -> CrmApi {
    CrmApi::builder()
        .idempotency(idempotency)
        .start()
        .await
        .expect("the local CRM API starts")
}

/// A destination that answers each request with the next of `answers` (raw HTTP/1.1 responses, the last one
/// repeated), whatever was asked: for the answers the local CRM API does not give (a redirect, a 2xx of
/// another shape). Returns its base URL and the requests it received.
pub async fn canned(answers: Vec<&'static str>) -> (String, Arc<std::sync::atomic::AtomicUsize>) {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind loopback");
    let url = format!("http://{}", listener.local_addr().expect("address"));
    let hits = Arc::new(AtomicUsize::new(0));
    let seen = hits.clone();
    tokio::spawn(async move {
        while let Ok((mut conn, _)) = listener.accept().await {
            let n = seen.fetch_add(1, Ordering::SeqCst);
            let answer = answers[n.min(answers.len() - 1)];
            tokio::spawn(async move {
                // Read the head and the body the head announces, then answer and close.
                let mut buf = Vec::new();
                let mut chunk = [0u8; 4096];
                loop {
                    let Ok(read) = conn.read(&mut chunk).await else {
                        return;
                    };
                    if read == 0 {
                        return;
                    }
                    buf.extend_from_slice(&chunk[..read]);
                    let text = String::from_utf8_lossy(&buf).to_ascii_lowercase();
                    if let Some(end) = text.find("\r\n\r\n") {
                        let length = text[..end]
                            .lines()
                            .find_map(|l| l.strip_prefix("content-length:"))
                            .and_then(|v| v.trim().parse::<usize>().ok())
                            .unwrap_or(0);
                        if buf.len() >= end + 4 + length {
                            break;
                        }
                    }
                }
                let _ = conn.write_all(answer.as_bytes()).await;
                let _ = conn.shutdown().await;
            });
        }
    });
    (url, hits)
}
