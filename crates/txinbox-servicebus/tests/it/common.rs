//! Shared helpers: the Service Bus emulator, started in this test process (its control API), PostgreSQL, a
//! business table, a controllable handler, metrics.

use std::collections::HashMap;
use std::future::Future;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use serde_json::{json, Value};
use txinbox_core::{
    ConsumerName, Handled, Handler, HandlerError, IdentityPolicy, Inbox, Message, OutboxMessage,
    Raw,
};
use txinbox_sb_emulator::Emulator;
use txinbox_servicebus::{
    ServiceBusClient, ServiceBusConfig, ServiceBusDelivery, ServiceBusOptions, ServiceBusPublisher,
    ServiceBusReceiver,
};
use txinbox_store::{Store, Tx};

pub const CONSUMER: &str = "crm-followup";

/// The namespace the emulator signs for, and its SAS rule.
const NAMESPACE: &str = "txinbox-test";
const KEY_NAME: &str = "RootManageSharedAccessKey";

/// Where the emulator of this test binary listens, and its credentials (made for this run).
struct Running {
    url: String,
    key: String,
    bearer: String,
}

/// The emulator every test of this binary shares, started by the first test that asks for it.
///
/// Each `#[tokio::test]` has its own runtime, and a server spawned on it would die with that test: the emulator
/// runs on a thread of its own, on a multi-thread runtime of its own, for as long as the test binary runs.
fn running() -> &'static Running {
    static RUNNING: OnceLock<Running> = OnceLock::new();
    RUNNING.get_or_init(|| {
        let random = || {
            format!(
                "{}{}",
                uuid::Uuid::new_v4().simple(),
                uuid::Uuid::new_v4().simple()
            )
        };
        let (key, bearer) = (random(), random());
        let (ready, started) = std::sync::mpsc::channel();
        let (sas_key, token) = (key.clone(), bearer.clone());
        std::thread::Builder::new()
            .name("sb-emulator".into())
            .spawn(move || {
                let runtime = tokio::runtime::Builder::new_multi_thread()
                    .worker_threads(2)
                    .thread_name("sb-emulator")
                    .enable_all()
                    .build()
                    .expect("the emulator's runtime");
                runtime.block_on(async move {
                    let started = Emulator::builder()
                        .namespace(NAMESPACE)
                        .sas_key(KEY_NAME, sas_key)
                        .accept_bearer(token)
                        .start("127.0.0.1:0")
                        .await;
                    match started {
                        Ok(emulator) => {
                            let _ = ready.send(Ok(emulator.base_url()));
                            // The handle stops the server when dropped: keep it for the life of the binary.
                            std::future::pending::<()>().await;
                            drop(emulator);
                        }
                        Err(e) => {
                            let _ = ready.send(Err(e.to_string()));
                        }
                    }
                });
            })
            .expect("the emulator's thread");
        let url = started
            .recv()
            .expect("the emulator's thread ended before it started")
            .unwrap_or_else(|e| panic!("the Service Bus emulator does not start: {e}"));
        Running { url, key, bearer }
    })
}

/// The Service Bus emulator of this test binary (in process, on a loopback port, a random SAS key and bearer
/// token), and an HTTP client for its control API.
#[derive(Clone, Debug)]
pub struct Emu {
    pub url: String,
    pub namespace: String,
    pub key_name: String,
    pub key: String,
    /// A bearer token the emulator accepts (the Azure AD path).
    pub bearer: String,
    http: reqwest::Client,
}

impl Emu {
    /// The emulator shared by the tests of this binary, started on first use.
    pub async fn shared() -> Self {
        let running = running();
        let emu = Self {
            url: running.url.clone(),
            namespace: NAMESPACE.to_owned(),
            key_name: KEY_NAME.to_owned(),
            key: running.key.clone(),
            bearer: running.bearer.clone(),
            http: reqwest::Client::new(),
        };
        let health = emu
            .http
            .get(format!("{}/$emulator/health", emu.url))
            .timeout(Duration::from_secs(5))
            .send()
            .await
            .unwrap_or_else(|e| panic!("the emulator at {} is unreachable: {e}", emu.url));
        assert!(
            health.status().is_success(),
            "emulator health: {}",
            health.status()
        );
        emu
    }

    /// A client on the emulator with the SAS rule.
    pub fn client(&self) -> ServiceBusClient {
        ServiceBusConfig::shared_access_key(&self.namespace, &self.key_name, &self.key)
            .endpoint(self.url.parse().expect("emulator URL"))
            .request_timeout(Duration::from_secs(5))
            .connect()
            .expect("client")
    }

    /// A client on the emulator with the SAS rule's name and a wrong key: the emulator refuses what it signs.
    pub fn wrong_key_client(&self) -> ServiceBusClient {
        ServiceBusConfig::shared_access_key(&self.namespace, &self.key_name, "d3Jvbmcta2V5")
            .endpoint(self.url.parse().expect("emulator URL"))
            .connect()
            .expect("client")
    }

    /// A fresh queue with `props` (control API names), e.g. `{"lockDuration":"PT2S"}`.
    pub async fn queue(&self, props: Value) -> String {
        let name = format!("t-{}", uuid::Uuid::new_v4().simple());
        let r = self
            .http
            .put(format!("{}/$emulator/queues/{name}", self.url))
            .body(props.to_string())
            .send()
            .await
            .expect("control API");
        assert!(
            r.status().is_success(),
            "create queue: {}",
            r.text().await.unwrap_or_default()
        );
        name
    }

    /// Queue state from the control API.
    pub async fn state(&self, path: &str) -> Value {
        let r = self
            .http
            .get(format!("{}/$emulator/queues/{path}", self.url))
            .send()
            .await
            .expect("control API");
        assert!(
            r.status().is_success(),
            "queue state of {path}: {}",
            r.status()
        );
        serde_json::from_str(&r.text().await.expect("body")).expect("JSON")
    }

    pub async fn counts(&self, path: &str) -> (u64, u64) {
        let s = self.state(path).await;
        (
            s["activeMessageCount"].as_u64().unwrap_or(0),
            s["deadLetterMessageCount"].as_u64().unwrap_or(0),
        )
    }

    pub async fn fault(&self, rule: Value) {
        let r = self
            .http
            .post(format!("{}/$emulator/faults", self.url))
            .body(rule.to_string())
            .send()
            .await
            .expect("control API");
        assert!(
            r.status().is_success(),
            "fault: {}",
            r.text().await.unwrap_or_default()
        );
    }
}

/// Receiver options for fast tests: 1 s long polls, locks of `lock`.
pub fn fast_options(lock: Duration) -> ServiceBusOptions {
    ServiceBusOptions::default()
        .wait(Duration::from_secs(1))
        .lock_duration(lock)
        .max_release_delay(Duration::from_millis(100))
}

/// The shared emulator, a client on it with the SAS rule, and a fresh queue with `props` ([`Emu::queue`]).
pub async fn emu_queue(props: Value) -> (Emu, ServiceBusClient, String) {
    let emu = Emu::shared().await;
    let client = emu.client();
    let q = emu.queue(props).await;
    (emu, client, q)
}

/// A fresh queue ([`emu_queue`]) holding one message, received by a [`fast_receiver`] and still locked.
pub struct Received {
    pub emu: Emu,
    pub client: ServiceBusClient,
    pub q: String,
    pub receiver: ServiceBusReceiver,
    pub d: ServiceBusDelivery,
}

/// Publishes one message (id `id`, body `{}`) to a fresh queue whose lock lasts `lock` (whole seconds), and
/// receives it.
pub async fn publish_and_receive(lock: Duration, id: &str) -> Received {
    let (emu, client, q) =
        emu_queue(json!({"lockDuration": format!("PT{}S", lock.as_secs())})).await;
    publish(&client, &event(&q, id, "{}")).await;
    let mut receiver = fast_receiver(&client, &q, lock);
    let d = receive_next(&mut receiver).await;
    Received {
        emu,
        client,
        q,
        receiver,
        d,
    }
}

/// A receiver on `queue` with [`fast_options`]: locks of `lock`.
pub fn fast_receiver(client: &ServiceBusClient, queue: &str, lock: Duration) -> ServiceBusReceiver {
    ServiceBusReceiver::new(client, queue, fast_options(lock)).expect("receiver")
}

/// The message `receiver` receives next, within 2 s; a test that finds none fails.
pub async fn receive_next(receiver: &mut ServiceBusReceiver) -> ServiceBusDelivery {
    receiver
        .receive_one(Duration::from_secs(2))
        .await
        .expect("received")
        .expect("a message")
}

/// A fresh PostgreSQL schema with the inbox and an `effects` table (no unique constraint, so a repeated
/// effect would show).
pub async fn pg() -> Store<sqlx::Postgres> {
    let store = txinbox_testkit::pg_store(6).await;
    sqlx::query("CREATE TABLE effects (id BIGSERIAL PRIMARY KEY, message_id TEXT NOT NULL, body TEXT NOT NULL)")
        .execute(store.pool())
        .await
        .expect("business table");
    store
}

pub fn inbox(store: &Store<sqlx::Postgres>) -> Inbox<Store<sqlx::Postgres>> {
    Inbox::new(
        store.clone(),
        IdentityPolicy::new(ConsumerName::new(CONSUMER).expect("name")),
    )
    .retry_backoff(Duration::from_millis(50))
}

pub async fn effects(store: &Store<sqlx::Postgres>) -> (i64, i64) {
    sqlx::query_as::<_, (i64, i64)>("SELECT count(*), count(DISTINCT message_id) FROM effects")
        .fetch_one(store.pool())
        .await
        .expect("count effects")
}

pub async fn inbox_rows(store: &Store<sqlx::Postgres>) -> i64 {
    store.inbox_rows(CONSUMER).await.expect("inbox rows")
}

/// How the handler treats a message id.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fail {
    Permanent,
    Retryable,
}

/// The business handler: records an effect row; can be slowed down or told to fail per message id.
#[derive(Clone, Default)]
pub struct Effects {
    pub delay: Duration,
    pub fail: Arc<Mutex<HashMap<String, Fail>>>,
    pub calls: Arc<AtomicUsize>,
}

impl Effects {
    pub fn slow(delay: Duration) -> Self {
        Self {
            delay,
            ..Self::default()
        }
    }
    pub fn fail(&self, id: &str, how: Fail) {
        self.fail.lock().unwrap().insert(id.to_owned(), how);
    }
    pub fn heal(&self) {
        self.fail.lock().unwrap().clear();
    }
    pub fn calls(&self) -> usize {
        self.calls.load(Ordering::SeqCst)
    }
}

impl<S: txinbox_core::InboxStore<Tx = Tx<sqlx::Postgres>>> Handler<S, Raw> for Effects {
    type Output = Handled;

    async fn handle(
        &self,
        tx: Tx<sqlx::Postgres>,
        msg: Message<Raw>,
    ) -> Result<Handled, HandlerError> {
        self.calls.fetch_add(1, Ordering::SeqCst);
        if !self.delay.is_zero() {
            tokio::time::sleep(self.delay).await;
        }
        let how = self
            .fail
            .lock()
            .unwrap()
            .get(&msg.identity.message_id)
            .copied();
        match how {
            Some(Fail::Permanent) => return Err(HandlerError::permanent("poison message")),
            Some(Fail::Retryable) => return Err(HandlerError::retry("dependency busy")),
            None => {}
        }
        sqlx::query("INSERT INTO effects (message_id, body) VALUES ($1, $2)")
            .bind(&msg.identity.message_id)
            .bind(msg.raw.body_str().unwrap_or_default())
            .execute(&tx)
            .await?;
        Ok(Handled::reference(format!(
            "task-{}",
            msg.identity.message_id
        )))
    }
}

/// A CloudEvents message for `queue` with id `id`.
pub fn event(queue: &str, id: &str, body: &str) -> OutboxMessage {
    OutboxMessage {
        destination: queue.to_owned(),
        source: "crm/meetings".into(),
        message_id: id.to_owned(),
        event_type: "crm.meeting.ended".into(),
        group_id: None,
        body: body.as_bytes().to_vec(),
        attributes: Default::default(),
    }
}

pub async fn publish(client: &ServiceBusClient, msg: &OutboxMessage) {
    ServiceBusPublisher::new(client.clone())
        .send(msg)
        .await
        .expect("send");
}

/// Publishes `n` events (`evt-0` .., body `{"i":i}`) to `queue`, in order.
pub async fn publish_events(client: &ServiceBusClient, queue: &str, n: i64) {
    publish_numbered(client, queue, n, "i").await;
}

/// Publishes `n` meeting events (`evt-0` .., body `{"meeting":i}`) to `queue`, in order.
pub async fn publish_meetings(client: &ServiceBusClient, queue: &str, n: i64) {
    publish_numbered(client, queue, n, "meeting").await;
}

/// `evt-0` .. `evt-{n-1}`, body `{FIELD:i}`, in order.
async fn publish_numbered(client: &ServiceBusClient, queue: &str, n: i64, field: &str) {
    for i in 0..n {
        publish(
            client,
            &event(queue, &format!("evt-{i}"), &format!("{{\"{field}\":{i}}}")),
        )
        .await;
    }
}

/// Publishes `n` events (`evt-0` ..) to `queue`, twice over: each message and a copy of it.
pub async fn publish_each_twice(client: &ServiceBusClient, queue: &str, n: i64) {
    for _ in 0..2 {
        publish_events(client, queue, n).await;
    }
}

/// Resolves once `cond` holds (checked every 100 ms), or after `limit`.
pub async fn until<F, Fut>(limit: Duration, mut cond: F) -> bool
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    let deadline = tokio::time::Instant::now() + limit;
    loop {
        if cond().await {
            return true;
        }
        if tokio::time::Instant::now() >= deadline {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Metric totals from a thread-local recorder (current-thread test runtime); see `txinbox_testkit`.
pub struct Metrics(txinbox_testkit::MetricTotals);

impl Metrics {
    /// Installs a recorder on this thread; keep the guard alive for the test.
    pub fn install() -> (metrics::LocalRecorderGuard<'static>, Self) {
        let (totals, guard) = txinbox_testkit::MetricTotals::install_local();
        (guard, Self(totals))
    }

    /// Sum of a counter over the series whose labels include every `(key, value)` of `labels`.
    pub fn counter(&self, name: &str, labels: &[(&str, &str)]) -> u64 {
        self.0.counter(name, labels)
    }
}
