//! Effect runners as processes (`txinbox effects run`) on one PostgreSQL: two runners and a third killed with
//! SIGKILL mid-run execute 10,000 effects against the local CRM API, each idempotency key exactly once, and
//! none is lost (the dead runner's claims expire and are reconciled by the others).

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use txinbox_core::broker::mem::{MemoryQueue, OutgoingMessage};
use txinbox_core::{
    ConsumerName, Effect, Handled, HandlerError, IdentityPolicy, Inbox, Message, Raw, Worker,
};
use txinbox_crm_api::CrmApi;
use txinbox_store::{Store, Tx};

const EFFECTS: usize = 10_000;

fn runner(url: &str, crm: &str) -> Child {
    Command::new(env!("CARGO_BIN_EXE_txinbox"))
        .args([
            "effects",
            "run",
            "--store",
            url,
            "--http",
            &format!("crm={crm}/tasks"),
            "--confirm",
            &format!("crm={crm}/tasks?idempotency_key={{key}}"),
            "--claim-secs",
            "3",
            "--batch",
            "64",
        ])
        .env("RUST_LOG", "warn")
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("start txinbox effects run")
}

async fn states(store: &Store<sqlx::Postgres>) -> Vec<(String, i64)> {
    sqlx::query_as("SELECT state, count(*) FROM txinbox_effects GROUP BY state ORDER BY state")
        .fetch_all(store.pool())
        .await
        .expect("count effects")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_runner_processes_one_killed_execute_each_key_once_and_lose_none() {
    let base = txinbox_testkit::pg_url();
    let schema = format!("t_{}", uuid::Uuid::new_v4().simple());
    let store = Store::<sqlx::Postgres>::connect_in_schema(&base, &schema, 8)
        .await
        .expect("PostgreSQL at TXINBOX_TEST_PG_URL");
    let sep = if base.contains('?') { '&' } else { '?' };
    let url = format!("{base}{sep}options=-csearch_path%3D{schema}");
    let crm = CrmApi::builder().start().await.expect("local CRM API");

    // 10,000 messages, each recording one effect in its inbox transaction.
    let q = MemoryQueue::default();
    for i in 0..EFFECTS {
        q.send(OutgoingMessage::new(format!("{{\"n\":{i}}}")).cloudevent(
            "urn:test",
            &format!("evt-{i}"),
            "t",
        ));
    }
    let processor = Inbox::new(
        store.clone(),
        IdentityPolicy::new(ConsumerName::new("crm").unwrap()),
    )
    .bind(|_tx: Tx<sqlx::Postgres>, msg: Message<Raw>| async move {
        Ok::<_, HandlerError>(Handled::done().effect(Effect::new(
            "crm.create_task",
            "crm",
            msg.raw.body.clone(),
        )))
    });
    let report = Worker::new(q.receiver(), processor).run_until_idle().await;
    assert_eq!(report.total(), EFFECTS as u64, "{report}");

    let started = Instant::now();
    let mut a = runner(&url, &crm.url());
    let mut b = runner(&url, &crm.url());
    let mut c = runner(&url, &crm.url());
    // Kill the third once it is working: some of its effects are claimed, some called, some recorded.
    let deadline = Instant::now() + Duration::from_secs(60);
    while crm.calls() < 500 {
        assert!(Instant::now() < deadline, "the runners made no progress");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    c.kill().expect("SIGKILL the third runner");
    let _ = c.wait();

    let deadline = Instant::now() + Duration::from_secs(180);
    loop {
        let s = states(&store).await;
        if s == vec![("done".to_owned(), EFFECTS as i64)] {
            break;
        }
        assert!(Instant::now() < deadline, "not every effect done: {s:?}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let elapsed = started.elapsed();
    for child in [&mut a, &mut b] {
        let _ = Command::new("kill")
            .args(["-TERM", &child.id().to_string()])
            .status();
    }
    for child in [a, b] {
        let out = child.wait_with_output().expect("runner exits");
        assert!(out.status.success(), "a runner failed: {:?}", out.status);
        assert!(String::from_utf8_lossy(&out.stdout).contains("EffectReport"));
    }

    // Each key executed once at the destination: one task per key, and no second POST of a key (a call whose
    // answer the killed runner never recorded was found by the confirmation, not sent again).
    let tasks = crm.tasks();
    assert_eq!(tasks.len(), EFFECTS);
    let mut keys: Vec<_> = tasks
        .iter()
        .filter_map(|t| t.idempotency_key.clone())
        .collect();
    keys.sort();
    keys.dedup();
    assert_eq!(keys.len(), EFFECTS, "every task has its own key");
    assert_eq!(crm.calls(), EFFECTS as u64, "no key was POSTed twice");
    let reconciled: i64 =
        sqlx::query_scalar("SELECT count(*) FROM txinbox_effects WHERE reconciliations > 0")
            .fetch_one(store.pool())
            .await
            .expect("count reconciled");
    println!(
        "effects: {reconciled} reconciled after the kill (claims of the dead runner, found at the CRM or sent once)"
    );
    println!(
        "effects: {EFFECTS} executed by 3 runner processes (one SIGKILLed) in {:.1} s ({:.0}/s)",
        elapsed.as_secs_f64(),
        EFFECTS as f64 / elapsed.as_secs_f64()
    );
    store.close().await;
}
