//! Shared helpers: the emulator started by `scripts/sb-emulator.sh` (its control API), PostgreSQL, a business
//! table, a controllable handler, metrics.

use std::collections::HashMap;
use std::future::Future;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::Value;
use txinbox_core::{
    ConsumerName, Handled, Handler, HandlerError, IdentityPolicy, Inbox, Message, OutboxMessage,
    Raw,
};
use txinbox_servicebus::{
    ServiceBusClient, ServiceBusConfig, ServiceBusOptions, ServiceBusPublisher,
};
use txinbox_store::{Store, Tx};

pub const CONSUMER: &str = "crm-followup";

fn var(name: &str) -> String {
    match std::env::var(name) {
        Ok(v) if !v.is_empty() => v,
        _ => panic!(
            "{name} is not set: start the emulator with `eval \"$(bash scripts/sb-emulator.sh start)\"` \
             and set TXINBOX_TEST_PG_URL (e.g. postgres://postgres@127.0.0.1:5432/test) before `cargo test -p txinbox-servicebus`"
        ),
    }
}

/// The emulator the README's test command started.
#[derive(Clone, Debug)]
pub struct Emu {
    pub url: String,
    pub namespace: String,
    pub key_name: String,
    pub key: String,
    http: reqwest::Client,
}

impl Emu {
    pub async fn from_env() -> Self {
        let emu = Self {
            url: var("TXINBOX_SB_EMULATOR_URL")
                .trim_end_matches('/')
                .to_owned(),
            namespace: var("TXINBOX_SB_NAMESPACE"),
            key_name: var("TXINBOX_SB_KEY_NAME"),
            key: var("TXINBOX_SB_KEY"),
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
    for i in 0..n {
        publish(
            client,
            &event(queue, &format!("evt-{i}"), &format!("{{\"i\":{i}}}")),
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
