//! Helpers for the tests against moto and PostgreSQL. Both are required: a missing or unreachable service
//! fails the test with a message (start them with `eval "$(bash scripts/moto.sh start)"` and set
//! `TXINBOX_TEST_PG_URL`).
#![allow(dead_code, missing_docs)]

use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use aws_sdk_sqs::config::http::HttpResponse;
use aws_sdk_sqs::types::{MessageAttributeValue, MessageSystemAttributeName, QueueAttributeName};
use aws_sdk_sqs::Client;
use metrics_util::debugging::DebuggingRecorder;
use txinbox_core::broker::redrive::{RedriveEvent, RedriveProgress, RedriveReport};
use txinbox_core::{
    ConsumerName, Handled, Handler, HandlerError, IdentityPolicy, Inbox, InboxStore, Message, Raw,
};
use txinbox_lab::faults::{Faults, FaultyStore};
use txinbox_store::{Store, Tx};
use txinbox_testkit::sdk_http::{with_hook, HttpRequest, SharedHttpConnector};
#[allow(unused_imports)] // not every test binary builds a transport
pub use txinbox_testkit::sdk_http::{ConnectorError, HttpConnector, HttpConnectorFuture};

pub fn endpoint() -> String {
    std::env::var("TXINBOX_SQS_ENDPOINT").unwrap_or_else(|_| {
        panic!("TXINBOX_SQS_ENDPOINT is not set: start moto with `eval \"$(bash scripts/moto.sh start)\"`")
    })
}

#[allow(unused_imports)] // not every test binary waits
pub use txinbox_testkit::wait_until;

/// A client of moto whose `ReceiveMessage` calls reach moto one at a time (see [`one_receive_at_a_time`]).
pub async fn client() -> Client {
    let endpoint = endpoint();
    let c = one_receive_at_a_time(txinbox_sqs::emulator_client(&endpoint));
    if let Err(e) = c.list_queues().send().await {
        panic!(
            "moto at {endpoint} does not answer: {}",
            aws_sdk_sqs::error::DisplayErrorContext(&e)
        );
    }
    c
}

/// The `ce-id` of a delivery.
pub fn ce_id(d: &txinbox_sqs::SqsDelivery) -> String {
    use txinbox_core::Delivery;
    d.message()
        .attributes
        .get("ce-id")
        .cloned()
        .unwrap_or_default()
}

pub fn unique(prefix: &str) -> String {
    format!(
        "{prefix}-{}",
        &uuid::Uuid::new_v4().simple().to_string()[..12]
    )
}

pub struct Queues {
    pub url: String,
    pub dlq: String,
}

/// A fresh FIFO queue and FIFO DLQ with a redrive policy of `max_receive` and a visibility timeout of `vt`.
pub async fn queue_pair(c: &Client, max_receive: u32, vt: u32) -> Queues {
    let name = unique("t");
    let dlq = c
        .create_queue()
        .queue_name(format!("{name}-dlq.fifo"))
        .attributes(QueueAttributeName::FifoQueue, "true")
        .send()
        .await
        .expect("create DLQ")
        .queue_url
        .expect("DLQ url");
    let arn = c
        .get_queue_attributes()
        .queue_url(&dlq)
        .attribute_names(QueueAttributeName::QueueArn)
        .send()
        .await
        .expect("DLQ arn")
        .attributes
        .and_then(|mut a| a.remove(&QueueAttributeName::QueueArn))
        .expect("DLQ arn");
    let url = c
        .create_queue()
        .queue_name(format!("{name}.fifo"))
        .attributes(QueueAttributeName::FifoQueue, "true")
        .attributes(QueueAttributeName::VisibilityTimeout, vt.to_string())
        .attributes(
            QueueAttributeName::RedrivePolicy,
            format!(r#"{{"deadLetterTargetArn":"{arn}","maxReceiveCount":"{max_receive}"}}"#),
        )
        .send()
        .await
        .expect("create queue")
        .queue_url
        .expect("queue url");
    Queues { url, dlq }
}

/// (visible, in flight) of a queue.
pub async fn counts(c: &Client, url: &str) -> (u64, u64) {
    let a = c
        .get_queue_attributes()
        .queue_url(url)
        .attribute_names(QueueAttributeName::ApproximateNumberOfMessages)
        .attribute_names(QueueAttributeName::ApproximateNumberOfMessagesNotVisible)
        .send()
        .await
        .expect("queue attributes")
        .attributes
        .unwrap_or_default();
    let n = |k: QueueAttributeName| a.get(&k).and_then(|v| v.parse().ok()).unwrap_or(0);
    (
        n(QueueAttributeName::ApproximateNumberOfMessages),
        n(QueueAttributeName::ApproximateNumberOfMessagesNotVisible),
    )
}

/// Messages in a queue, visible or not.
pub async fn total(c: &Client, url: &str) -> u64 {
    let (visible, in_flight) = counts(c, url).await;
    visible + in_flight
}

pub fn attr(v: &str) -> MessageAttributeValue {
    MessageAttributeValue::builder()
        .data_type("String")
        .string_value(v)
        .build()
        .unwrap()
}

/// A CRM follow-up request body.
pub fn body(opportunity: &str, meeting: &str, extra: serde_json::Value) -> String {
    let mut v =
        serde_json::json!({"opportunity": opportunity, "meeting": meeting, "note": "follow up"});
    if let (Some(o), Some(e)) = (v.as_object_mut(), extra.as_object()) {
        for (k, x) in e {
            o.insert(k.clone(), x.clone());
        }
    }
    v.to_string()
}

/// Sends `body` with CloudEvents attributes (when `ce_id` is set), a dedup id and a group.
pub async fn send(
    c: &Client,
    url: &str,
    body: &str,
    ce_id: Option<&str>,
    dedup: &str,
    group: &str,
) {
    let mut s = c
        .send_message()
        .queue_url(url)
        .message_body(body)
        .message_deduplication_id(dedup)
        .message_group_id(group);
    if let Some(id) = ce_id {
        s = s
            .message_attributes("ce-id", attr(id))
            .message_attributes("ce-source", attr("crm/meetings"))
            .message_attributes("ce-type", attr("meeting.ended"))
            .message_attributes("ce-specversion", attr("1.0"));
    }
    s.send().await.expect("send");
}

/// Sends message `i` of `range` to `url` in a group of its own: the follow-up of opportunity `o{i}`, `ce-id`
/// `evt-{i}`, deduplication id `{dedup}{i}`, group `g{i}`.
pub async fn send_one_per_group(c: &Client, url: &str, range: std::ops::Range<usize>, dedup: &str) {
    for i in range {
        send(
            c,
            url,
            &body(&format!("o{i}"), "m", serde_json::json!({})),
            Some(&format!("evt-{i}")),
            &format!("{dedup}{i}"),
            &format!("g{i}"),
        )
        .await;
    }
}

/// Sends to `url` a message whose only identity is its deduplication id `d-{name}` (no `ce-id`): the
/// follow-up of opportunity `o-{name}`, group `g-{name}`.
pub async fn send_without_ce_id(c: &Client, url: &str, name: &str) {
    send(
        c,
        url,
        &body(&format!("o-{name}"), "m", serde_json::json!({})),
        None,
        &format!("d-{name}"),
        &format!("g-{name}"),
    )
    .await;
}

/// Receives everything visible from a queue (for asserting DLQ contents), leaving it in flight.
pub async fn drain(c: &Client, url: &str) -> Vec<aws_sdk_sqs::types::Message> {
    let mut all = Vec::new();
    loop {
        let out = c
            .receive_message()
            .queue_url(url)
            .max_number_of_messages(10)
            .wait_time_seconds(1)
            .visibility_timeout(30)
            .message_system_attribute_names(MessageSystemAttributeName::All)
            .message_attribute_names("All")
            .send()
            .await
            .expect("receive");
        let msgs = out.messages.unwrap_or_default();
        if msgs.is_empty() {
            return all;
        }
        all.extend(msgs);
    }
}

pub async fn pg_store() -> Store<sqlx::Postgres> {
    let store = txinbox_testkit::pg_store(8).await;
    sqlx::query("CREATE TABLE followup_tasks (message_id TEXT NOT NULL, opportunity TEXT NOT NULL, meeting TEXT NOT NULL, position BIGINT NOT NULL)")
        .execute(store.pool())
        .await
        .expect("business table");
    store
}

pub async fn sqlite_store() -> Store<sqlx::Sqlite> {
    let store = txinbox_testkit::sqlite_store().await;
    sqlx::query("CREATE TABLE followup_tasks (message_id TEXT NOT NULL, opportunity TEXT NOT NULL, meeting TEXT NOT NULL, position INTEGER NOT NULL)")
        .execute(store.pool())
        .await
        .expect("business table");
    store
}

pub fn policy(consumer: &str) -> IdentityPolicy {
    IdentityPolicy::new(ConsumerName::new(consumer).unwrap()).business_key(|m| {
        let v: serde_json::Value = serde_json::from_slice(&m.body).map_err(|e| e.to_string())?;
        Ok(Some(format!(
            "criar_tarefa_followup:{}:{}",
            v["opportunity"].as_str().ok_or("no opportunity")?,
            v["meeting"].as_str().ok_or("no meeting")?
        )))
    })
}

/// Reads the body's optional `sleep_ms` and `fail` ("retry" or "permanent").
fn behaviour(body: &[u8]) -> (u64, Option<String>, String, String) {
    let v: serde_json::Value = serde_json::from_slice(body).unwrap_or_default();
    (
        v["sleep_ms"].as_u64().unwrap_or(0),
        v["fail"].as_str().map(str::to_owned),
        v["opportunity"].as_str().unwrap_or("").to_owned(),
        v["meeting"].as_str().unwrap_or("").to_owned(),
    )
}

/// The CRM follow-up handler on PostgreSQL: one `followup_tasks` row per applied message, with the order in
/// which handlers ran (`position`). Calls are counted in `calls`.
pub fn pg_handler<S: InboxStore<Tx = Tx<sqlx::Postgres>>>(
    calls: Arc<AtomicI64>,
) -> impl Handler<S, Raw> {
    move |tx: Tx<sqlx::Postgres>, msg: Message<Raw>| {
        let calls = calls.clone();
        async move {
            let position = calls.fetch_add(1, Ordering::SeqCst) + 1;
            let (sleep_ms, fail, opp, meeting) = behaviour(&msg.raw.body);
            if sleep_ms > 0 {
                tokio::time::sleep(Duration::from_millis(sleep_ms)).await;
            }
            match fail.as_deref() {
                Some("retry") => return Err(HandlerError::retry("CRM is busy")),
                Some("permanent") => return Err(HandlerError::permanent("CRM refused the task")),
                _ => {}
            }
            sqlx::query("INSERT INTO followup_tasks (message_id, opportunity, meeting, position) VALUES ($1, $2, $3, $4)")
                .bind(&msg.identity.message_id)
                .bind(&opp)
                .bind(&meeting)
                .bind(position)
                .execute(&tx)
                .await?;
            Ok(Handled::reference(format!("task:{opp}:{meeting}")))
        }
    }
}

pub fn sqlite_handler(calls: Arc<AtomicI64>) -> impl Handler<Store<sqlx::Sqlite>, Raw> {
    move |tx: Tx<sqlx::Sqlite>, msg: Message<Raw>| {
        let calls = calls.clone();
        async move {
            let position = calls.fetch_add(1, Ordering::SeqCst) + 1;
            let (_, _, opp, meeting) = behaviour(&msg.raw.body);
            sqlx::query("INSERT INTO followup_tasks (message_id, opportunity, meeting, position) VALUES ($1, $2, $3, $4)")
                .bind(&msg.identity.message_id)
                .bind(&opp)
                .bind(&meeting)
                .bind(position)
                .execute(&tx)
                .await?;
            Ok::<_, HandlerError>(Handled::reference(format!("task:{opp}:{meeting}")))
        }
    }
}

pub async fn pg_effects(store: &Store<sqlx::Postgres>) -> i64 {
    sqlx::query_scalar("SELECT count(*) FROM followup_tasks")
        .fetch_one(store.pool())
        .await
        .unwrap()
}

pub async fn pg_rows(store: &Store<sqlx::Postgres>, consumer: &str) -> i64 {
    store.inbox_rows(consumer).await.unwrap()
}

pub fn pg_inbox(store: &Store<sqlx::Postgres>, consumer: &str) -> Inbox<Store<sqlx::Postgres>> {
    Inbox::new(store.clone(), policy(consumer)).retry_backoff(Duration::from_secs(1))
}

/// The same inbox on a store that crashes at the point armed in `faults`.
pub fn faulty_pg_inbox(
    store: &Store<sqlx::Postgres>,
    consumer: &str,
    faults: &Arc<Faults>,
) -> Inbox<FaultyStore<Store<sqlx::Postgres>>> {
    Inbox::new(
        FaultyStore::new(store.clone(), faults.clone()),
        policy(consumer),
    )
    .retry_backoff(Duration::from_secs(1))
}

/// Fast options for tests: short long-poll, visibility `vt` (the lease is renewed every `vt/3`).
pub fn fast_options(vt: u64, dlq: &str) -> txinbox_sqs::SqsOptions {
    txinbox_sqs::SqsOptions::default()
        .wait(Duration::from_secs(1))
        .visibility_timeout(Duration::from_secs(vt))
        .dead_letter_queue(dlq)
}

/// A receiver of `q` through `c`, with the [`fast_options`] of visibility `vt` and `q`'s DLQ.
pub async fn fast_receiver(c: Client, q: &Queues, vt: u64) -> txinbox_sqs::SqsReceiver {
    txinbox_sqs::SqsReceiver::connect(c, &q.url, fast_options(vt, &q.dlq))
        .await
        .unwrap()
}

// ---- redrive ------------------------------------------------------------------------------------------

/// [`txinbox_sqs::redrive`] of everything in `q.dlq` back to `q.url` through `c`, its receives waiting 1 s.
pub async fn redrive_back(
    c: &Client,
    q: &Queues,
    progress: &mut dyn RedriveProgress,
) -> RedriveReport {
    txinbox_sqs::redrive(c, &q.dlq, &q.url, &redrive_options(), progress)
        .await
        .unwrap()
}

/// [`redrive_back`] with a visibility timeout of 0 on its receives, which puts every receive after the first
/// past it: what the run left in the DLQ comes back to it.
pub async fn redrive_back_past_visibility(
    c: &Client,
    q: &Queues,
    progress: &mut dyn RedriveProgress,
) -> RedriveReport {
    txinbox_sqs::redrive::redrive_with_visibility(
        c,
        &q.dlq,
        &q.url,
        &redrive_options(),
        Duration::ZERO,
        progress,
    )
    .await
    .unwrap()
}

fn redrive_options() -> txinbox_sqs::RedriveOptions {
    txinbox_sqs::RedriveOptions::default().wait(Duration::from_secs(1))
}

/// A redrive's progress that keeps the position of every dead letter it is told was moved, deferred or left
/// for a lost identity, and fails the test when told about one twice.
#[derive(Debug, Default)]
pub struct ToldOnce(pub Vec<String>);

impl RedriveProgress for ToldOnce {
    fn event(&mut self, e: RedriveEvent<'_>, _: &RedriveReport) {
        let told = &mut self.0;
        let item = match e {
            RedriveEvent::Moved(item)
            | RedriveEvent::Deferred { item, .. }
            | RedriveEvent::IdentityLost { item, .. } => item,
            _ => return,
        };
        assert!(
            !told.iter().any(|p| p == item.position),
            "told twice about {item:?} (told before: {told:?})"
        );
        told.push(item.position.to_owned());
    }
}

// ---- metrics: one global recorder; every test uses its own consumer name as the label -----------------

fn metrics_state() -> &'static txinbox_testkit::MetricTotals {
    static M: OnceLock<txinbox_testkit::MetricTotals> = OnceLock::new();
    M.get_or_init(|| {
        let rec = DebuggingRecorder::new();
        let totals = txinbox_testkit::MetricTotals::new(rec.snapshotter());
        rec.install().expect("install the metrics recorder");
        totals
    })
}

/// Installs the recorder (call at the start of a test that reads metrics).
pub fn metrics_init() {
    let _ = metrics_state();
}

/// The total of counter `name` over series carrying every label in `labels`.
pub fn counter(name: &str, labels: &[(&str, &str)]) -> u64 {
    metrics_state().counter(name, labels)
}

// ---- a documented SQS behaviour moto lacks: a receive is atomic -------------------------------------------

/// The same client, with a transport that lets one `ReceiveMessage` at a time reach moto (the others of the
/// test process wait for its answer); every other call goes through at once.
///
/// AWS: "Messages that are received but not yet deleted are in the inflight state. Inflight messages block
/// delivery of available messages within the same message group." (Knowledge Center, "Why doesn't my Amazon
/// SQS FIFO queue return all messages or messages in other message groups?"), and "Messages within the same
/// message group are always processed one at a time, in strict order" (SQS Developer Guide, "Using the message
/// group ID"). moto's server answers requests on threads and its `receive_message` takes no lock: it copies the
/// set of groups in flight when it starts and marks each message received as it goes, so two receives that
/// overlap can both hand out one message, or the next message of a group the other has just taken. A worker
/// of several receive loops (or one receive sent as several calls) overlaps its receives on purpose; this
/// transport gives those tests the atomic receive the service documents. The adapter still sends its calls
/// concurrently: only their execution inside moto is ordered.
pub fn one_receive_at_a_time(c: Client) -> Client {
    /// One turn per test process: every client of the process shares it.
    static TURN: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());
    hooked(&c, |request, connector| {
        let receive = operation(&request) == Some("ReceiveMessage");
        let connector = connector.clone();
        HttpConnectorFuture::new(async move {
            // Held until moto answers: it marks what it hands out before it answers.
            let _turn = if receive {
                Some(TURN.lock().await)
            } else {
                None
            };
            connector.call(request).await
        })
    })
}

// ---- transports in front of moto: what it does not do on demand -----------------------------------------

/// `c`, with `hook` called for every request and given the connector `c` would have sent it to
/// (`connector.call(request)` sends it on).
pub fn hooked(
    c: &Client,
    hook: impl Fn(HttpRequest, &SharedHttpConnector) -> HttpConnectorFuture + Send + Sync + 'static,
) -> Client {
    let inner = c
        .config()
        .http_client()
        .expect("the emulator client carries an HTTP client");
    Client::from_conf(
        c.config()
            .to_builder()
            .http_client(with_hook(inner, hook))
            .build(),
    )
}

/// `c`, whose requests for which `answer` gives an answer get it instead of reaching moto; the others reach
/// moto.
pub fn answering(
    c: &Client,
    answer: impl Fn(&HttpRequest) -> Option<HttpResponse> + Send + Sync + 'static,
) -> Client {
    hooked(c, move |request, connector| {
        let answer = answer(&request);
        let connector = connector.clone();
        HttpConnectorFuture::new(async move {
            match answer {
                Some(response) => Ok(response),
                None => connector.call(request).await,
            }
        })
    })
}

/// The SQS operation a request calls: its `X-Amz-Target` without `AmazonSQS.`.
pub fn operation(request: &HttpRequest) -> Option<&str> {
    request
        .headers()
        .get("x-amz-target")?
        .strip_prefix("AmazonSQS.")
}

/// A request's JSON body (`null` when it has none or it is not JSON).
pub fn json_body(request: &HttpRequest) -> serde_json::Value {
    serde_json::from_slice(request.body().bytes().unwrap_or_default()).unwrap_or_default()
}

/// An answer of HTTP `status` with the JSON `body`, as SQS answers over its JSON protocol.
pub fn json_answer(status: u16, body: &serde_json::Value) -> HttpResponse {
    let mut response = HttpResponse::new(
        status.try_into().expect("a status"),
        body.to_string().into(),
    );
    response
        .headers_mut()
        .insert("content-type", "application/x-amz-json-1.0");
    response
}

/// SQS's error answer of HTTP `status` with the error `code` (`com.amazonaws.sqs#{code}`) and `message`.
pub fn sqs_error(status: u16, code: &str, message: &str) -> HttpResponse {
    json_answer(
        status,
        &serde_json::json!({"__type": format!("com.amazonaws.sqs#{code}"), "message": message}),
    )
}
