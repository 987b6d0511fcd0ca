//! The CRM follow-up example with an external CRM, under kill -9: for each broker, `MEETINGS` meetings are
//! published, the worker (its effect runner in the same process) is killed with SIGKILL `KILLS` times, each at a
//! random moment after it became ready, then a last worker runs until every follow-up exists and is stopped
//! with SIGTERM. The external CRM (in this process, answering each create 300 ms after it acted, so kills land
//! between a call and its record) must end with exactly one task per meeting, the store with every effect done
//! (none pending, in flight or uncertain), and the broker's dead-letter queue empty (on Service Bus, the poison
//! queue too).
//!
//! Each queue dead-letters a message only after `2 * KILLS + 2` receives: a worker killed in its long poll
//! leaves that receive open at the broker (moto serves it to its end and marks what it finds received, and a
//! real broker cannot tell either), so `KILLS` kills can count up to `2 * KILLS + 1` receives of one message
//! with none of them processed. With the queues' usual limits (SQS maxReceiveCount 5, Service Bus
//! MaxDeliveryCount 10) the broker would, by chance, dead-letter a message the chaos never let anyone
//! process: correct broker behaviour, but not what this test is about (the dead-letter path has its own tests).
//!
//! SQS is moto (`TXINBOX_SQS_ENDPOINT`); Service Bus is our emulator, started in this process. The stores are
//! SQLite, and on SQS also DynamoDB (DynamoDB Local, `TXINBOX_DYNAMODB_ENDPOINT`), where each task item
//! counts the transactions that wrote it, so a doubled application shows in the store as well as at the CRM. The kill moments
//! come from a seed printed at the start (`TXINBOX_CHAOS_SEED` replays one). The two brokers run one after the
//! other.

mod common_procs;

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use common_procs::*;
use txinbox_crm_api::CrmApi;

/// Meetings published per broker.
const MEETINGS: usize = 40;
/// SIGKILLs per broker.
const KILLS: usize = 8;
/// The receives after which a broker dead-letters a message.
const MAX_RECEIVES: usize = 2 * KILLS + 2;

static ONE_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// The follow-up a meeting's task carries at the CRM (the agent's `external_ref`).
fn follow_up(prefix: &str, i: usize) -> String {
    format!("followup-{prefix}op_{i}-m_{i}")
}

/// Tasks at the CRM per external reference.
fn tasks_by_ref(crm: &CrmApi) -> BTreeMap<Option<String>, usize> {
    let mut m = BTreeMap::new();
    for t in crm.tasks() {
        *m.entry(t.external_ref).or_default() += 1;
    }
    m
}

/// `KILLS` rounds of start + SIGKILL a random 50-900 ms after the worker became ready, then one worker until the CRM holds every task
/// and every effect is done, stopped with SIGTERM; then the checks.
#[allow(clippy::too_many_arguments)]
async fn chaos(
    name: &str,
    dir: &Path,
    store: &ChaosStore,
    crm: &CrmApi,
    prefix: &str,
    worker: &str,
    args: &[&str],
    env: &[(&str, String)],
    dead_letters: &impl DeadLetters,
    seed: u64,
) {
    let url = store.url();
    let crm_url = crm.url();
    let mut all: Vec<&str> = args.to_vec();
    all.extend(["--store", &url, "--crm-url", &crm_url]);
    let mut rng = Rng(seed);
    let client = http();
    for i in 1..=KILLS {
        // Each killed worker answers `/readyz`: the random moment counts from its readiness (started, a receive
        // succeeded), so that the kills land in its work, not in its start-up, however slow the machine.
        let mut w = ready_worker(dir, &format!("{name}-{i}"), worker, &all, env, &client).await;
        tokio::time::sleep(rng.millis(50, 900)).await;
        w.sigkill().await;
        println!(
            "agent-chaos: {name}: after kill -9 #{i}: {} tasks at the CRM; effects {}",
            crm.tasks().len(),
            store.effect_states().await
        );
    }
    let done = format!("done={MEETINGS}");
    // Ready (so its SIGTERM handler is installed) before the loop below, which ends at once when the killed
    // workers already did everything: a SIGTERM in the last worker's start-up would end it by the signal.
    let mut last = ready_worker(dir, &format!("{name}-final"), worker, &all, env, &client).await;
    let deadline = Deadline::after(Duration::from_secs(180));
    loop {
        let states = store.effect_states().await;
        if crm.tasks().len() >= MEETINGS && states == done {
            break;
        }
        let dead = dead_letters.count().await;
        assert_eq!(
            dead, 0,
            "{name}: the broker dead-lettered {dead} message(s) (effects {states})"
        );
        last.assert_running();
        assert!(
            !deadline.passed(),
            "{name}: after 180 s, {} tasks at the CRM, effects {states}:\n{}",
            crm.tasks().len(),
            last.tail()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    // A (wrong) extra call would show up now.
    tokio::time::sleep(Duration::from_secs(1)).await;
    last.stop_cleanly().await;

    let by_ref = tasks_by_ref(crm);
    for i in 0..MEETINGS {
        let r = follow_up(prefix, i);
        assert_eq!(
            by_ref.get(&Some(r.clone())).copied().unwrap_or(0),
            1,
            "{name}: tasks at the CRM for {r}"
        );
    }
    assert_eq!(
        crm.tasks().len(),
        MEETINGS,
        "{name}: the CRM holds tasks for other follow-ups: {by_ref:?}"
    );
    let states = store.effect_states().await;
    assert_eq!(states, done, "{name}: effects in the store");
    store.assert_one_task_per_meeting(name, prefix).await;
    assert_eq!(
        dead_letters.count().await,
        0,
        "{name}: the broker dead-lettered messages"
    );
    println!(
        "agent-chaos: {name} ok: {KILLS} x kill -9, then {MEETINGS} tasks at the CRM, one per meeting; effects {states}"
    );
}

/// Where the chaos' worker keeps its inbox.
enum ChaosStore {
    /// A SQLite file.
    Sqlite(std::path::PathBuf),
    /// A table of DynamoDB Local (the agent writes its task items into it).
    DynamoDb(txinbox::dynamodb::DynamoStore),
}

impl ChaosStore {
    fn url(&self) -> String {
        match self {
            ChaosStore::Sqlite(p) => format!("sqlite:{}", p.display()),
            ChaosStore::DynamoDb(s) => format!("dynamodb://{}", s.table()),
        }
    }

    /// Effects by state, `state=count` sorted by state.
    async fn effect_states(&self) -> String {
        match self {
            ChaosStore::Sqlite(p) => sqlite_effect_states(p).await,
            ChaosStore::DynamoDb(s) => {
                use txinbox::driver::EffectStore;
                let mut by_state = BTreeMap::new();
                for c in s.effect_counts().await.unwrap_or_default() {
                    *by_state.entry(c.state.as_str()).or_insert(0) += c.count;
                }
                by_state
                    .iter()
                    .map(|(s, n)| format!("{s}={n}"))
                    .collect::<Vec<_>>()
                    .join(" ")
            }
        }
    }

    /// On DynamoDB, each meeting's task item was written by exactly one applied transaction (`applied` counts
    /// them): 0 doubled in the store as at the CRM.
    async fn assert_one_task_per_meeting(&self, name: &str, prefix: &str) {
        let ChaosStore::DynamoDb(s) = self else {
            return;
        };
        use txinbox::dynamodb::aws_sdk_dynamodb::types::AttributeValue;
        for i in 0..MEETINGS {
            let task = follow_up(prefix, i);
            let item = s
                .client()
                .get_item()
                .table_name(s.table())
                .key("pk", AttributeValue::S(format!("followup#{task}")))
                .consistent_read(true)
                .send()
                .await
                .expect("GetItem");
            let applied = item
                .item()
                .and_then(|i| i.get("applied"))
                .and_then(|v| v.as_n().ok())
                .cloned();
            assert_eq!(
                applied.as_deref(),
                Some("1"),
                "{name}: applications of {task}"
            );
        }
    }
}

/// The external CRM: idempotency keys honoured, tasks searchable; each create answers 300 ms after it acted.
async fn crm() -> CrmApi {
    CrmApi::builder()
        .latency(Duration::from_millis(300))
        .start()
        .await
        .expect("the CRM API starts")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqs_agent_under_kill_9_creates_one_crm_task_per_meeting() {
    sqs_chaos("sqs", |dir| async move {
        (ChaosStore::Sqlite(dir.join("sqs.db")), Vec::new())
    })
    .await;
}

/// The same on the DynamoDB store (DynamoDB Local, `TXINBOX_DYNAMODB_ENDPOINT`): the marker, the agent's task
/// item and the CRM effect in one `TransactWriteItems`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqs_agent_on_dynamodb_under_kill_9_creates_one_crm_task_per_meeting() {
    sqs_chaos("sqs-dynamodb", |_dir| async move {
        let endpoint = std::env::var("TXINBOX_DYNAMODB_ENDPOINT").expect(
            "TXINBOX_DYNAMODB_ENDPOINT is not set: start DynamoDB Local with `eval \"$(bash scripts/dynamodb.sh start)\"` (scripts/test.sh does)",
        );
        let client = txinbox::dynamodb::emulator_client(&endpoint);
        let table = unique("crm-chaos");
        txinbox::dynamodb::DynamoStore::create_table(&client, &table)
            .await
            .expect("the table is created");
        let store = txinbox::dynamodb::DynamoStore::open(
            client,
            table,
            txinbox::dynamodb::DynamoOptions::default(),
        )
        .await
        .expect("the table checks");
        (
            ChaosStore::DynamoDb(store),
            vec![("AWS_ENDPOINT_URL_DYNAMODB", endpoint)],
        )
    })
    .await;
}

/// The SQS agent's chaos on the store `make_store` gives (with the environment the worker needs for it).
async fn sqs_chaos<F, Fut>(name: &str, make_store: F)
where
    F: FnOnce(std::path::PathBuf) -> Fut,
    Fut: std::future::Future<Output = (ChaosStore, Vec<(&'static str, String)>)>,
{
    let _one = ONE_AT_A_TIME.lock().await;
    let seed = chaos_seed();
    let endpoint = sqs_endpoint();
    let mut env = sqs_env(&endpoint);
    let work = WorkDir::new("txinbox-chaos-sqs");
    let dir = work.path();
    let (store, extra_env) = make_store(dir.to_path_buf()).await;
    env.extend(extra_env);
    let crm = crm().await;
    let q = unique("crm-chaos");
    let max = MAX_RECEIVES.to_string();
    for i in 0..MEETINGS {
        let (op, m) = (format!("op_{i}"), format!("m_{i}"));
        let mut args = vec![
            "--queue-name",
            q.as_str(),
            "--opportunity",
            &op,
            "--meeting",
            &m,
        ];
        if i == 0 {
            args.extend(["--create", "--max-receive-count", &max]);
        }
        run(dir, &format!("producer-{i}"), "sqs-producer", &args, &env).await;
    }
    let client = sqs_client(&endpoint);
    let url = sqs_queue_url(&client, &format!("{q}.fifo")).await;
    let dlq = SqsDlq {
        url: sqs_queue_url(&client, &format!("{q}-dlq.fifo")).await,
        client,
    };
    chaos(
        name,
        dir,
        &store,
        &crm,
        "",
        "sqs-crm-worker",
        &[
            "--queue-url",
            &url,
            "--visibility-timeout",
            "2",
            "--concurrency",
            "1",
        ],
        &env,
        &dlq,
        seed,
    )
    .await;
    crm.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn servicebus_agent_under_kill_9_creates_one_crm_task_per_meeting() {
    let _one = ONE_AT_A_TIME.lock().await;
    let seed = chaos_seed();
    let (emulator, env) = service_bus("txinbox-chaos").await;
    let work = WorkDir::new("txinbox-chaos-sb");
    let dir = work.path();
    let crm = crm().await;
    let q = unique("crm-chaos-sb");
    let max = MAX_RECEIVES.to_string();
    for i in 0..MEETINGS {
        let (op, m) = (format!("sb_op_{i}"), format!("m_{i}"));
        let mut args = vec!["--queue", q.as_str(), "--opportunity", &op, "--meeting", &m];
        if i == 0 {
            args.extend([
                "--create-on-emulator",
                "--lock-secs",
                "3",
                "--max-delivery-count",
                &max,
            ]);
        }
        run(
            dir,
            &format!("producer-{i}"),
            "servicebus-producer",
            &args,
            &env,
        )
        .await;
    }
    let poison = format!("{q}-poison");
    let dead = ServiceBusDlq {
        emulator: &emulator,
        queue: q.clone(),
    };
    let store = ChaosStore::Sqlite(dir.join("servicebus.db"));
    chaos(
        "servicebus",
        dir,
        &store,
        &crm,
        "sb_",
        "servicebus-crm-worker",
        &[
            "--queue",
            &q,
            "--dead-letter-to",
            &poison,
            "--lock-duration-secs",
            "3",
            "--concurrency",
            "1",
        ],
        &env,
        &dead,
        seed.wrapping_add(1),
    )
    .await;
    crm.shutdown().await;
    emulator.shutdown().await;
}
