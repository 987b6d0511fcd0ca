//! The effect runner against destinations shaped like the public APIs, under kill -9: for each shape (a Stripe-
//! like list answering 200 + an empty list, a plain lookup answering 404, the IETF draft's key with a slow
//! destination answering 409 while it works, PayPal's key header with no search, Square's key in the body with a
//! HubSpot-like search by POST, a HubSpot-like search with no key at all, a Salesforce-like upsert by URL, and a
//! list search that lags behind the writes), on SQLite and on PostgreSQL, `txinbox effects run` processes are
//! killed with SIGKILL at random moments while the destination loses answers, answers 502 without forwarding,
//! 504 after doing the work, 503 and 429 with `Retry-After` (in seconds and as an HTTP-date). At the end:
//! every effect marked done exists at the destination exactly once with the reference the store kept; every
//! effect the destination refuses (a body it answers 400 to) does not exist there and is failed, or needs
//! attention when an earlier call of it may have happened; none is created twice, none is lost.
//!
//! The kill moments come from a seed printed at the start (`TXINBOX_CHAOS_SEED` replays one).

use std::collections::BTreeMap;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use txinbox_core::broker::mem::{MemoryQueue, OutgoingMessage};
use txinbox_core::{
    ConsumerName, Effect, Handled, HandlerError, IdentityPolicy, Inbox, Message, Raw, Worker,
};
use txinbox_crm_api::{CrmApi, FaultRates, KeyMode};
use txinbox_store::{Backend, Store, Tx};

/// Effects per shape and store.
const EFFECTS: usize = 30;
/// Of which the destination refuses every `REFUSED_EVERY`-th (a body it answers 400 to).
const REFUSED_EVERY: usize = 7;
/// SIGKILLs per shape and store.
const KILLS: usize = 3;

/// A destination shape: how the test destination answers, and the runner flags that describe it.
struct Shape {
    name: &'static str,
    key_mode: KeyMode,
    processing: Duration,
    search_lag: Duration,
    /// `txinbox effects run` flags for destination `d`, with `{url}` the destination's base URL.
    flags: &'static [&'static str],
}

const SHAPES: &[Shape] = &[
    Shape {
        name: "list-no-key",
        key_mode: KeyMode::None,
        processing: Duration::ZERO,
        search_lag: Duration::ZERO,
        flags: &[
            "--http=d={url}/v1/tasks",
            "--key=d=none",
            "--confirm-search=d={url}/v1/tasks?external_ref={external_ref}",
            "--found-at=d=/data/0/id",
            // This list shows a task as soon as it is created (no search_lag): declared so, instead of the
            // minute a search where no key is kept waits by default.
            "--reconcile-after-secs=d=0",
        ],
    },
    Shape {
        name: "lookup-no-key",
        key_mode: KeyMode::None,
        processing: Duration::ZERO,
        search_lag: Duration::ZERO,
        flags: &[
            "--http=d={url}/tasks",
            "--no-idempotency=d",
            "--confirm=d={url}/tasks?external_ref={external_ref}",
        ],
    },
    Shape {
        name: "draft-409",
        key_mode: KeyMode::Header(String::new()),
        processing: Duration::from_millis(1500),
        search_lag: Duration::ZERO,
        flags: &[
            "--http=d={url}/v1/tasks",
            "--key=d=header:Idempotency-Key",
            "--confirm-search=d={url}/v1/tasks?idempotency_key={key}",
            "--timeout-secs=1",
        ],
    },
    Shape {
        name: "paypal-header-no-search",
        key_mode: KeyMode::Header(String::new()),
        processing: Duration::ZERO,
        search_lag: Duration::ZERO,
        flags: &[
            "--http=d={url}/v1/tasks",
            "--key=d=header:PayPal-Request-Id",
        ],
    },
    Shape {
        name: "square-body-key-hubspot-search",
        key_mode: KeyMode::BodyField(String::new()),
        processing: Duration::ZERO,
        search_lag: Duration::ZERO,
        flags: &[
            "--http=d={url}/v1/tasks",
            "--key=d=body:idempotency_key",
            "--confirm-search-post=d={url}/v1/tasks/search",
            r#"--confirm-body=d={"filterGroups":[{"filters":[{"propertyName":"external_ref","operator":"EQ","value":"{external_ref}"}]}]}"#,
            "--count-at=d=/total",
            "--found-at=d=/results/0/id",
        ],
    },
    Shape {
        name: "hubspot-search-no-key",
        key_mode: KeyMode::None,
        processing: Duration::ZERO,
        search_lag: Duration::ZERO,
        flags: &[
            "--http=d={url}/v1/tasks",
            "--key=d=none",
            "--confirm-search-post=d={url}/v1/tasks/search",
            r#"--confirm-body=d={"filterGroups":[{"filters":[{"propertyName":"external_ref","operator":"EQ","value":"{external_ref}"}]}]}"#,
            "--count-at=d=/total",
            "--found-at=d=/results/0/id",
            // No search_lag here: declared, instead of the minute a search where no key is kept waits by default.
            "--reconcile-after-secs=d=0",
        ],
    },
    Shape {
        name: "salesforce-upsert",
        key_mode: KeyMode::None,
        processing: Duration::ZERO,
        search_lag: Duration::ZERO,
        flags: &["--upsert=d={url}/v1/tasks/by_ref/{external_ref}"],
    },
    Shape {
        name: "lagging-list-no-key",
        key_mode: KeyMode::None,
        processing: Duration::ZERO,
        search_lag: Duration::from_millis(400),
        flags: &[
            "--http=d={url}/v1/tasks",
            "--key=d=none",
            "--confirm-search=d={url}/v1/tasks?external_ref={external_ref}",
            "--reconcile-after-secs=d=1",
        ],
    },
];

impl Shape {
    fn key_mode(&self) -> KeyMode {
        match &self.key_mode {
            KeyMode::Header(_) if self.flags.iter().any(|f| f.contains("PayPal")) => {
                KeyMode::Header("PayPal-Request-Id".into())
            }
            KeyMode::Header(_) => KeyMode::default(),
            KeyMode::BodyField(_) => KeyMode::BodyField("idempotency_key".into()),
            other => other.clone(),
        }
    }
}

/// splitmix64: the kill moments, replayable from the printed seed.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    fn millis(&mut self, lo: u64, hi: u64) -> Duration {
        Duration::from_millis(lo + self.next() % (hi - lo))
    }
}

fn reference(i: usize) -> String {
    format!("followup:op-{i}:m-{i}")
}

/// The destination answers 400 to a body whose `external_ref` is not a string: nothing is created.
fn refused(i: usize) -> bool {
    i % REFUSED_EVERY == REFUSED_EVERY - 1
}

fn payload(i: usize) -> String {
    let r = reference(i);
    if refused(i) {
        // The reference is in the body (so a search by it is meaningful), the field is not a string.
        format!(r#"{{"title":"follow up {r}","ref":"{r}","external_ref":{i}}}"#)
    } else {
        format!(r#"{{"title":"follow up {r}","external_ref":"{r}"}}"#)
    }
}

/// Records `EFFECTS` effects for destination `d` through the inbox (one message each).
async fn record<DB: Backend>(store: &Store<DB>)
where
    for<'c> &'c Tx<DB>: sqlx::Executor<'c, Database = DB>,
{
    let q = MemoryQueue::default();
    for i in 0..EFFECTS {
        q.send(OutgoingMessage::new(payload(i)).cloudevent("urn:chaos", &format!("evt-{i}"), "t"));
    }
    let processor = Inbox::new(
        store.clone(),
        IdentityPolicy::new(ConsumerName::new("shapes").unwrap()),
    )
    .bind(|_tx: Tx<DB>, msg: Message<Raw>| async move {
        let body: serde_json::Value = serde_json::from_slice(&msg.raw.body)?;
        let r = body["ref"]
            .as_str()
            .or(body["external_ref"].as_str())
            .unwrap_or_default()
            .to_owned();
        Ok::<_, HandlerError>(
            Handled::done()
                .effect(Effect::new("crm.create_task", "d", msg.raw.body.clone()).external_ref(r)),
        )
    });
    let report = Worker::new(q.receiver(), processor).run_until_idle().await;
    assert_eq!(report.total(), EFFECTS as u64, "{report}");
}

fn runner(store_url: &str, config: &str, flags: &[String]) -> Child {
    Command::new(env!("CARGO_BIN_EXE_txinbox"))
        .args(["effects", "run", "--store", store_url, "--config", config])
        .args(flags)
        .env("RUST_LOG", "warn")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start txinbox effects run")
}

/// One effect as the store ends: state, the destination's reference, the external reference, reconciliations.
type Row = (String, Option<String>, String, i32);

async fn rows<DB: Backend>(store: &Store<DB>) -> Vec<Row>
where
    for<'c> &'c sqlx::Pool<DB>: sqlx::Executor<'c, Database = DB>,
    for<'r> Row: sqlx::FromRow<'r, DB::Row>,
    for<'q> <DB as sqlx::Database>::Arguments<'q>: sqlx::IntoArguments<'q, DB>,
{
    sqlx::query_as("SELECT state, result_reference, external_ref, reconciliations FROM txinbox_effects ORDER BY id")
        .fetch_all(store.pool())
        .await
        .expect("read effects")
}

fn settled(state: &str) -> bool {
    matches!(state, "done" | "failed" | "needs_attention")
}

/// One shape on one store: record, run under kill -9 and faults, drain, check. Returns a one-line summary.
async fn chaos<DB: Backend>(
    shape: &Shape,
    store: Store<DB>,
    store_url: &str,
    config: &str,
    seed: u64,
) -> String
where
    for<'c> &'c Tx<DB>: sqlx::Executor<'c, Database = DB>,
    for<'c> &'c sqlx::Pool<DB>: sqlx::Executor<'c, Database = DB>,
    for<'r> Row: sqlx::FromRow<'r, DB::Row>,
    for<'q> <DB as sqlx::Database>::Arguments<'q>: sqlx::IntoArguments<'q, DB>,
{
    let crm = CrmApi::builder()
        .key_mode(shape.key_mode())
        .processing(shape.processing)
        .search_lag(shape.search_lag)
        // Each call answers 300 ms after the destination acted: kills land between a call and its record.
        .latency(Duration::from_millis(300))
        .retry_after(1, seed % 2 == 0)
        .random_faults(
            FaultRates {
                drop_answer: 0.1,
                gateway_502: 0.1,
                gateway_504: 0.05,
                unavailable: 0.05,
                rate_limited: 0.05,
            },
            seed,
        )
        .start()
        .await
        .expect("the test destination starts");
    let url = crm.url();
    let flags: Vec<String> = shape
        .flags
        .iter()
        .map(|f| f.replace("{url}", &url))
        .collect();
    record(&store).await;

    let mut rng = Rng(seed);
    for _ in 0..KILLS {
        let mut child = runner(store_url, config, &flags);
        tokio::time::sleep(rng.millis(100, 1200)).await;
        child.kill().expect("SIGKILL the runner");
        let _ = child.wait();
    }
    // The last runner, until every effect has settled (bounded).
    let mut last = runner(store_url, config, &flags);
    let deadline = Instant::now() + Duration::from_secs(150);
    let end = loop {
        let r = rows(&store).await;
        if r.iter().all(|(s, _, _, _)| settled(s)) {
            break r;
        }
        if Instant::now() > deadline || last.try_wait().ok().flatten().is_some() {
            let _ = last.kill();
            let out = last.wait_with_output().expect("runner output");
            panic!(
                "{}: not every effect settled: {:?}\n{}",
                shape.name,
                count_states(&r),
                String::from_utf8_lossy(&out.stderr)
            );
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    // A (wrong) late call would show now.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let _ = Command::new("kill")
        .args(["-TERM", &last.id().to_string()])
        .status();
    let out = last.wait_with_output().expect("runner exits");
    assert!(
        out.status.success(),
        "{}: the last runner failed: {}",
        shape.name,
        String::from_utf8_lossy(&out.stderr)
    );

    let tasks = crm.tasks();
    let by_ref: BTreeMap<String, String> = tasks
        .iter()
        .filter_map(|t| Some((t.external_ref.clone()?, t.id.clone())))
        .collect();
    assert_eq!(end.len(), EFFECTS, "{}", shape.name);
    let by_effect: BTreeMap<&str, (&String, &Option<String>)> = end
        .iter()
        .map(|(state, kept, r, _)| (r.as_str(), (state, kept)))
        .collect();
    for i in 0..EFFECTS {
        let r = reference(i);
        let Some((state, kept)) = by_effect.get(r.as_str()) else {
            panic!("{}: effect {i} ({r}) is not in the store", shape.name);
        };
        let state = state.as_str();
        if refused(i) {
            assert!(
                state == "failed" || state == "needs_attention",
                "{}: effect {i} (a body the destination refuses) is {state}",
                shape.name
            );
            assert_eq!(
                crm.creates_for_ref(&r),
                0,
                "{}: a refused effect exists at the destination",
                shape.name
            );
        } else {
            assert_eq!(
                state, "done",
                "{}: effect {i} is {state}, not done: lost",
                shape.name
            );
            assert_eq!(
                crm.creates_for_ref(&r),
                1,
                "{}: effect {i} created {} times at the destination",
                shape.name,
                crm.creates_for_ref(&r)
            );
            let at_destination = by_ref.get(&r);
            // An upsert's reference is the resource's path; every other shape keeps the destination's id.
            if shape.name == "salesforce-upsert" {
                assert!(
                    kept.is_some(),
                    "{}: effect {i} done without a reference",
                    shape.name
                );
            } else {
                assert_eq!(
                    kept.as_ref(),
                    at_destination,
                    "{}: effect {i}'s reference is not the destination's",
                    shape.name
                );
            }
        }
    }
    let valid = (0..EFFECTS).filter(|i| !refused(*i)).count();
    assert_eq!(crm.creates(), valid, "{}: tasks ever created", shape.name);
    let reconciled = end.iter().filter(|r| r.3 > 0).count();
    let line = format!(
        "{:<32} calls={:<4} tasks={} reconciled={reconciled:<3} effects {:?}",
        shape.name,
        crm.attempts(),
        crm.creates(),
        count_states(&end)
    );
    crm.shutdown().await;
    line
}

fn count_states(rows: &[Row]) -> BTreeMap<String, usize> {
    let mut m = BTreeMap::new();
    for (s, _, _, _) in rows {
        *m.entry(s.clone()).or_default() += 1;
    }
    m
}

fn seed() -> u64 {
    std::env::var("TXINBOX_CHAOS_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(7, |d| d.as_nanos() as u64)
        })
}

fn write_config(dir: &std::path::Path) -> String {
    // Short claims, backoffs and limits high enough that a run of faults never exhausts an effect.
    let path = dir.join("runner.toml");
    std::fs::write(
        &path,
        "[effects]\nclaim_seconds = 2\nbackoff_ms = 100\nmax_backoff_seconds = 1\nmax_attempts = 30\nmax_reconciliations = 30\nidle_poll_ms = 50\nbatch = 4\n",
    )
    .expect("write the runner's settings");
    path.to_string_lossy().into_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_shape_under_kill_9_on_sqlite_loses_none_and_doubles_none() {
    let seed = seed();
    println!("TXINBOX_CHAOS_SEED={seed}");
    let dir =
        std::env::temp_dir().join(format!("txinbox-shapes-{}", uuid::Uuid::new_v4().simple()));
    std::fs::create_dir_all(&dir).unwrap();
    let config = write_config(&dir);
    let runs = SHAPES.iter().enumerate().map(|(n, shape)| {
        let dir = dir.clone();
        let config = config.clone();
        async move {
            let url = format!(
                "sqlite:{}",
                dir.join(format!("{}.db", shape.name)).display()
            );
            let store = Store::<sqlx::Sqlite>::connect(&url)
                .await
                .expect("SQLite store");
            chaos(shape, store, &url, &config, seed.wrapping_add(n as u64)).await
        }
    });
    for line in futures::future::join_all(runs).await {
        println!("sqlite: {line}");
    }
    std::fs::remove_dir_all(&dir).ok();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_shape_under_kill_9_on_postgres_loses_none_and_doubles_none() {
    let seed = seed();
    println!("TXINBOX_CHAOS_SEED={seed}");
    let dir =
        std::env::temp_dir().join(format!("txinbox-shapes-{}", uuid::Uuid::new_v4().simple()));
    std::fs::create_dir_all(&dir).unwrap();
    let config = write_config(&dir);
    let base = txinbox_testkit::pg_url();
    let runs = SHAPES.iter().enumerate().map(|(n, shape)| {
        let base = base.clone();
        let config = config.clone();
        async move {
            let schema = format!("t_{}", uuid::Uuid::new_v4().simple());
            let store = Store::<sqlx::Postgres>::connect_in_schema(&base, &schema, 4)
                .await
                .expect("PostgreSQL at TXINBOX_TEST_PG_URL");
            let sep = if base.contains('?') { '&' } else { '?' };
            let url = format!("{base}{sep}options=-csearch_path%3D{schema}");
            let line = chaos(
                shape,
                store.clone(),
                &url,
                &config,
                seed.wrapping_add(n as u64),
            )
            .await;
            store.close().await;
            line
        }
    });
    for line in futures::future::join_all(runs).await {
        println!("postgres: {line}");
    }
    std::fs::remove_dir_all(&dir).ok();
}
