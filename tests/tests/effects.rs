//! External effects end to end: intents recorded by handlers through the inbox (messages sent through the
//! in-memory broker), run after COMMIT by the `EffectRunner` against the local CRM HTTP API, on SQLite and
//! PostgreSQL. Each test checks the CRM's tasks, the effects table and the runner's `EffectReport`.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use chrono::Utc;
use futures::future::BoxFuture;
use txinbox::driver::EffectStore;
use txinbox::effects::{idempotency_key, ClaimedEffect, Confirmation, EffectExecutor, Execution};
use txinbox::http::HttpEffect;
use txinbox::mem::MemoryQueue;
use txinbox::sqlx;
use txinbox::{
    metrics as m, Effect, EffectOptions, EffectReport, EffectRunner, EffectState, Handled,
    HandlerError, Message, Outcome, Store, Tx,
};
use txinbox_e2e::{pg_store, sqlite_store, wait_until, MetricTotals};
use txinbox_lab::lab::{lab_message, lab_processor, LabEvent, CONSUMER};
use txinbox_lab::labdb::LabDb;

/// What the poisoned destination always answers.
const POISON_ERROR: &str = "poison: the destination refused the connection";
/// A generous deadline for bounded waits (never an assertion on duration).
const DEADLINE: Duration = Duration::from_secs(60);

mod common;

use common::*;

// ---------------------------------------------------------------------------------------------------------
// Test executors.
// ---------------------------------------------------------------------------------------------------------

/// A destination that never receives anything: every call is `NotSent`.
struct Poison;

impl EffectExecutor for Poison {
    fn execute<'a>(&'a self, _: &'a ClaimedEffect) -> BoxFuture<'a, Execution> {
        Box::pin(async { Execution::not_sent(POISON_ERROR) })
    }
    fn confirm<'a>(&'a self, _: &'a ClaimedEffect) -> BoxFuture<'a, Confirmation> {
        Box::pin(async { Confirmation::NotFound })
    }
}

/// Records the names it executes, in order; the first call is `NotSent`.
#[derive(Clone, Default)]
struct FailsFirst {
    seen: Arc<Mutex<Vec<String>>>,
    failed_once: Arc<AtomicBool>,
}

impl EffectExecutor for FailsFirst {
    fn execute<'a>(&'a self, e: &'a ClaimedEffect) -> BoxFuture<'a, Execution> {
        Box::pin(async move {
            self.seen.lock().unwrap().push(e.name.clone());
            if !self.failed_once.swap(true, Ordering::SeqCst) {
                Execution::not_sent("the first call never left")
            } else {
                Execution::Done {
                    reference: Some(format!("ref-{}", e.name)),
                }
            }
        })
    }
    fn confirm<'a>(&'a self, _: &'a ClaimedEffect) -> BoxFuture<'a, Confirmation> {
        Box::pin(async { Confirmation::NotFound })
    }
}

/// The CRM destination whose holder stalls after the call (a paused or partitioned process): the call
/// reaches the CRM, the answer is held until `gate` opens.
struct Stalling {
    inner: HttpEffect,
    gate: Arc<tokio::sync::Semaphore>,
}

impl EffectExecutor for Stalling {
    fn execute<'a>(&'a self, e: &'a ClaimedEffect) -> BoxFuture<'a, Execution> {
        Box::pin(async move {
            let r = self.inner.execute(e).await;
            if let Ok(p) = self.gate.acquire().await {
                p.forget();
            }
            r
        })
    }
    fn confirm<'a>(&'a self, e: &'a ClaimedEffect) -> BoxFuture<'a, Confirmation> {
        self.inner.confirm(e)
    }
}

fn report_states(r: &EffectReport) -> Vec<(EffectState, u64)> {
    EffectState::ALL
        .into_iter()
        .map(|s| (s, r.count(s)))
        .filter(|(_, n)| *n > 0)
        .collect()
}

// ---------------------------------------------------------------------------------------------------------
// 1. A poisoned effect does not delay the others.
// ---------------------------------------------------------------------------------------------------------

async fn poisoned_effect_does_not_delay_the_others<DB: FxDb>(store: Store<DB>) {
    DB::create_tables(&store).await.unwrap();
    let crm = start_crm(true).await;
    // Message 0 also asks for a call to the poisoned destination: its CRM task must not wait for it either.
    let (h, ids) = recording::<DB>(|msg| {
        let mut fx = vec![crm_effect(msg)];
        if msg.identity.message_id == "evt-482" {
            fx.push(Effect::new("poison.notify", "poison", b"{}".to_vec()));
        }
        fx
    });
    assert_all_applied(&deliver(&store, h, 0..1000).await, 1000);
    assert_eq!(DB::count(&store, "txinbox_effects").await, 1001);

    let runner = EffectRunner::new(store.clone())
        .executor("crm", crm_by_key(&crm))
        .executor("poison", Poison)
        .options(
            EffectOptions::default().backoff(Duration::from_secs(60), Duration::from_secs(600)),
        );
    let report = runner.run_until_idle().await;
    assert_eq!(report.claimed, 1001, "{report}");
    assert_eq!(
        report_states(&report),
        vec![(EffectState::Pending, 1), (EffectState::Done, 1000)],
        "{report}"
    );
    assert_eq!(
        (report.claims_lost, report.store_errors),
        (0, 0),
        "{report}"
    );

    // Every CRM task exactly once, under its key; the effect keeps the CRM's reference.
    let tasks = crm.tasks();
    assert_eq!(tasks.len(), 1000);
    assert_eq!(crm.calls(), 1000, "one call per effect, nothing repeated");
    let crm_keys = keys(&ids, CRM_TASK);
    assert_eq!(crm_keys.len(), 1000);
    let rows = DB::effect_rows(&store).await;
    for k in &crm_keys {
        assert_eq!(crm.count_with_key(k), 1, "key {k}");
        let row = rows.iter().find(|r| &r.key == k).expect("effect row");
        assert_eq!(row.state, "done", "{row:?}");
        assert_eq!((row.attempts, row.reconciliations), (1, 0), "{row:?}");
        assert_eq!(
            row.result_reference,
            crm.task_with_key(k).map(|t| t.id),
            "{row:?}"
        );
        assert!(row.finished && row.claimed_by.is_none(), "{row:?}");
    }

    // The poisoned effect waits for its own backoff, with its error kept.
    let poison: Vec<&FxRow> = rows.iter().filter(|r| r.destination == "poison").collect();
    assert_eq!(poison.len(), 1);
    let p = poison[0];
    assert_eq!(p.key, {
        let ids = ids.lock().unwrap();
        let id = ids.iter().find(|i| i.message_id == "evt-482").unwrap();
        idempotency_key(id, "poison.notify")
    });
    assert_eq!(p.state, "pending", "{p:?}");
    assert_eq!((p.attempts, p.reconciliations), (1, 0), "{p:?}");
    let now = Utc::now();
    assert!(
        p.next_attempt_at > now,
        "next_attempt_at {} must be in the future (now {now})",
        p.next_attempt_at
    );
    assert!(
        p.last_error
            .as_deref()
            .is_some_and(|e| e.contains(POISON_ERROR)),
        "{p:?}"
    );
    assert!(!p.finished && p.claimed_by.is_none(), "{p:?}");

    // Nothing is due any more: a second pass claims nothing (the poison is not retried early).
    let again = runner.run_until_idle().await;
    assert_eq!(again.claimed, 0, "{again}");

    // The attempt limit: one more poisoned effect, with zero backoff and one attempt allowed, is failed with
    // its evidence; the first poisoned effect (not due) is left alone.
    let (h, _) = recording::<DB>(|_| vec![Effect::new("poison.notify", "poison", b"{}".to_vec())]);
    assert_all_applied(&deliver(&store, h, 1000..1001).await, 1);
    let limited = EffectRunner::new(store.clone())
        .executor("poison", Poison)
        .options(
            EffectOptions::default()
                .backoff(Duration::ZERO, Duration::ZERO)
                .max_attempts(1),
        );
    let report = limited.run_until_idle().await;
    assert_eq!(report.claimed, 1, "{report}");
    assert_eq!(
        report_states(&report),
        vec![(EffectState::Failed, 1)],
        "{report}"
    );
    let rows = DB::effect_rows(&store).await;
    let failed = rows
        .iter()
        .find(|r| r.message_id == "evt-1482")
        .expect("the second poisoned effect");
    assert_eq!(failed.state, "failed", "{failed:?}");
    assert_eq!(failed.attempts, 1, "{failed:?}");
    assert!(failed.finished, "{failed:?}");
    let err = failed.last_error.as_deref().unwrap_or_default();
    assert!(
        err.contains(POISON_ERROR) && err.contains("1 attempts"),
        "last_error {err:?}"
    );
    let first = rows.iter().find(|r| r.id == p.id).unwrap();
    assert_eq!(
        (first.state.as_str(), first.attempts),
        ("pending", 1),
        "{first:?}"
    );
    assert_eq!(crm.tasks().len(), 1000);
}

#[tokio::test]
async fn a_poisoned_effect_does_not_delay_the_others_on_sqlite() {
    poisoned_effect_does_not_delay_the_others(sqlite_store().await).await;
}

#[tokio::test]
async fn a_poisoned_effect_does_not_delay_the_others_on_postgres() {
    poisoned_effect_does_not_delay_the_others(pg_store(8).await).await;
}

// ---------------------------------------------------------------------------------------------------------
// 2. Answer lost -> uncertain -> reconciled, never executed twice.
// ---------------------------------------------------------------------------------------------------------

async fn lost_answers_are_reconciled<DB: FxDb>(store: Store<DB>) {
    let (totals, _guard) = MetricTotals::install_local();
    DB::create_tables(&store).await.unwrap();
    let crm = start_crm(true).await;
    let (h, ids) = recording::<DB>(|msg| vec![crm_effect(msg)]);
    assert_all_applied(&deliver(&store, h, 0..20).await, 20);

    crm.drop_next_answers(5);
    let runner = EffectRunner::new(store.clone()).executor("crm", crm_by_key(&crm));
    let mut report = runner.run_until_idle().await;
    if DB::effect_rows(&store)
        .await
        .iter()
        .any(|r| r.state != "done")
    {
        let second = runner.run_until_idle().await;
        report.claimed += second.claimed;
        for s in EffectState::ALL {
            *report.transitions.entry(s).or_default() += second.count(s);
        }
    }
    // 20 executions (5 answers lost), then the 5 uncertain ones reconciled: found at the CRM, done.
    assert_eq!(report.claimed, 25, "{report}");
    assert_eq!(report.count(EffectState::Done), 20, "{report}");
    assert_eq!(report.count(EffectState::Uncertain), 5, "{report}");
    assert_eq!(report.count(EffectState::Pending), 0, "{report}");

    let rows = DB::effect_rows(&store).await;
    assert_eq!(
        states(&rows),
        [("done".to_owned(), 20)].into_iter().collect()
    );
    let reconciled = rows.iter().filter(|r| r.reconciliations == 1).count();
    assert_eq!(reconciled, 5, "{rows:#?}");
    assert_eq!(crm.tasks().len(), 20);
    assert_eq!(
        crm.calls(),
        20,
        "no execution beyond the first per effect: reconciliation found the lost ones"
    );
    for k in keys(&ids, CRM_TASK) {
        assert_eq!(crm.count_with_key(&k), 1, "key {k}");
        let row = rows.iter().find(|r| r.key == k).unwrap();
        assert_eq!(row.attempts, 1, "{row:?}");
        assert_eq!(row.result_reference, crm.task_with_key(&k).map(|t| t.id));
        assert_eq!(row.last_error, None, "done clears the error: {row:?}");
    }
    let rec = |outcome| totals.counter(m::EFFECT_RECONCILIATIONS, &[("outcome", outcome)]);
    assert_eq!(
        (rec("done"), rec("not_found"), rec("unknown")),
        (5, 0, 0),
        "reconciliation outcomes"
    );
    let exe = |result| totals.counter(m::EFFECT_EXECUTIONS, &[("result", result)]);
    assert_eq!((exe("done"), exe("uncertain")), (15, 5), "executions");
    assert_eq!(totals.counter(m::EFFECT_EXECUTIONS, &[]), 20);
}

#[tokio::test(flavor = "current_thread")]
async fn a_lost_answer_is_reconciled_never_executed_twice_on_sqlite() {
    lost_answers_are_reconciled(sqlite_store().await).await;
}

#[tokio::test(flavor = "current_thread")]
async fn a_lost_answer_is_reconciled_never_executed_twice_on_postgres() {
    lost_answers_are_reconciled(pg_store(4).await).await;
}

// ---------------------------------------------------------------------------------------------------------
// 3. Without idempotency support, only the confirmation prevents the repeat.
// ---------------------------------------------------------------------------------------------------------

async fn no_idempotency_confirmed_by_reference<DB: FxDb>(store: Store<DB>) {
    DB::create_tables(&store).await.unwrap();
    let crm = start_crm(false).await;
    let refs = Arc::new(Mutex::new(Vec::new()));
    let seen = refs.clone();
    let (h, _) = recording::<DB>(move |msg| {
        seen.lock().unwrap().push(followup_ref(msg));
        vec![crm_effect(msg)]
    });
    assert_all_applied(&deliver(&store, h, 0..12).await, 12);

    crm.drop_next_answers(4);
    let runner = EffectRunner::new(store.clone())
        .executor("crm", crm_by_ref(&crm))
        .options(EffectOptions::default().backoff(Duration::ZERO, Duration::ZERO));
    let report = runner.run_until_idle().await;
    assert_eq!(
        report_states(&report),
        vec![(EffectState::Done, 12), (EffectState::Uncertain, 4)],
        "{report}"
    );
    assert_eq!(report.claimed, 16, "{report}");
    let rows = DB::effect_rows(&store).await;
    assert_eq!(
        states(&rows),
        [("done".to_owned(), 12)].into_iter().collect()
    );
    assert_eq!(crm.tasks().len(), 12);
    assert_eq!(
        crm.calls(),
        12,
        "the lost ones were found, not posted again"
    );
    for r in refs.lock().unwrap().iter() {
        assert_eq!(crm.count_with_external_ref(r), 1, "external_ref {r}");
        let row = rows.iter().find(|x| &x.external_ref == r).unwrap();
        assert_eq!(
            row.result_reference,
            crm.task_with_external_ref(r).map(|t| t.id)
        );
    }
    assert_eq!(rows.iter().filter(|r| r.reconciliations == 1).count(), 4);
}

async fn no_idempotency_no_confirmation_needs_attention<DB: FxDb>(store: Store<DB>) {
    DB::create_tables(&store).await.unwrap();
    let crm = start_crm(false).await;
    let refs = Arc::new(Mutex::new(Vec::new()));
    let seen = refs.clone();
    let (h, _) = recording::<DB>(move |msg| {
        seen.lock().unwrap().push(followup_ref(msg));
        vec![crm_effect(msg)]
    });
    assert_all_applied(&deliver(&store, h, 0..12).await, 12);

    crm.drop_next_answers(4);
    const MAX_REC: i32 = 3;
    // No confirmation request: an uncertain effect cannot be decided; zero backoff so each pass reconciles.
    let runner = EffectRunner::new(store.clone())
        .executor(
            "crm",
            HttpEffect::post(format!("{}/tasks", crm.url()))
                .build()
                .expect("a valid destination"),
        )
        .options(
            EffectOptions::default()
                .backoff(Duration::ZERO, Duration::ZERO)
                .max_reconciliations(MAX_REC),
        );
    let report = runner.run_until_idle().await;
    // Uncertain: once after the lost answer, then after each undecided reconciliation but the last.
    assert_eq!(
        report_states(&report),
        vec![
            (EffectState::Done, 8),
            (EffectState::Uncertain, 4 * MAX_REC as u64),
            (EffectState::NeedsAttention, 4),
        ],
        "{report}"
    );
    let rows = DB::effect_rows(&store).await;
    assert_eq!(
        states(&rows),
        [("done".to_owned(), 8), ("needs_attention".to_owned(), 4)]
            .into_iter()
            .collect()
    );
    for r in rows.iter().filter(|r| r.state == "needs_attention") {
        assert_eq!(
            (r.attempts, r.reconciliations),
            (1, i64::from(MAX_REC)),
            "{r:?}"
        );
        assert!(
            r.last_error
                .as_deref()
                .is_some_and(|e| e.contains("no confirmation is configured")),
            "{r:?}"
        );
        assert!(!r.finished && r.claimed_by.is_none(), "{r:?}");
    }
    // No blind retry: exactly one task per reference, one call per effect.
    assert_eq!(crm.calls(), 12);
    assert_eq!(crm.tasks().len(), 12);
    for r in refs.lock().unwrap().iter() {
        assert_eq!(crm.count_with_external_ref(r), 1, "external_ref {r}");
    }
    // Needs attention is not retried by later passes.
    let again = runner.run_until_idle().await;
    assert_eq!(again.claimed, 0, "{again}");
    assert_eq!(crm.calls(), 12);
}

#[tokio::test]
async fn without_idempotency_the_confirmation_prevents_the_repeat_on_sqlite() {
    no_idempotency_confirmed_by_reference(sqlite_store().await).await;
}

#[tokio::test]
async fn without_idempotency_the_confirmation_prevents_the_repeat_on_postgres() {
    no_idempotency_confirmed_by_reference(pg_store(4).await).await;
}

#[tokio::test]
async fn without_idempotency_or_confirmation_a_lost_answer_needs_attention_on_sqlite() {
    no_idempotency_no_confirmation_needs_attention(sqlite_store().await).await;
}

#[tokio::test]
async fn without_idempotency_or_confirmation_a_lost_answer_needs_attention_on_postgres() {
    no_idempotency_no_confirmation_needs_attention(pg_store(4).await).await;
}

// ---------------------------------------------------------------------------------------------------------
// 4. A holder that died mid-call (and one that stalled past its claim).
// ---------------------------------------------------------------------------------------------------------

async fn died_mid_call<DB: FxDb>(store: Store<DB>) {
    DB::create_tables(&store).await.unwrap();
    let crm = start_crm(true).await;
    let (h, ids) = recording::<DB>(|msg| vec![crm_effect(msg)]);
    assert_all_applied(&deliver(&store, h, 0..3).await, 3);
    let keys = keys(&ids, CRM_TASK);

    // A holder claims two effects, makes the first call (it reaches the CRM) and dies before recording it;
    // the second call never left.
    let now = Utc::now();
    let dead = store
        .claim_effects(
            "dead-holder",
            &["crm".to_owned()],
            now,
            now + chrono::Duration::milliseconds(800),
            2,
        )
        .await
        .unwrap();
    assert_eq!(dead.len(), 2);
    assert_eq!(
        dead.iter().map(|e| e.key.clone()).collect::<Vec<_>>(),
        keys[..2].to_vec()
    );
    assert!(dead.iter().all(|e| e.claimed_from == EffectState::Pending));
    let called = crm_by_key(&crm).execute(&dead[0]).await;
    assert!(matches!(called, Execution::Done { .. }), "{called:?}");

    // Another holder takes the third effect; its call reaches the CRM and it stalls past its claim.
    let gate = Arc::new(tokio::sync::Semaphore::new(0));
    let zombie = EffectRunner::new(store.clone())
        .executor(
            "crm",
            Stalling {
                inner: crm_by_key(&crm),
                gate: gate.clone(),
            },
        )
        .options(EffectOptions::default().claim_for(Duration::from_millis(500)));
    let survivor = EffectRunner::new(store.clone()).executor("crm", crm_by_key(&crm));

    let (zombie_report, (before, survivor_report)) = tokio::join!(zombie.run_pass(), async {
        wait_until(
            DEADLINE,
            "the stalled holder's call reached the CRM",
            || async { crm.calls() == 2 },
        )
        .await;
        let before = DB::effect_rows(&store).await;
        // Every claim expires (read from the rows, not assumed).
        let expiry = before
            .iter()
            .map(|r| r.claim_until.expect("in flight rows have a claim"))
            .max()
            .unwrap();
        wait_until(DEADLINE, "every claim expired", || async {
            Utc::now() > expiry
        })
        .await;
        let report = survivor.run_until_idle().await;
        // The stalled holder wakes up now, too late.
        gate.add_permits(1);
        (before, report)
    });

    assert!(
        before
            .iter()
            .all(|r| r.state == "in_flight" && r.claimed_by.is_some()),
        "{before:#?}"
    );
    assert_eq!(
        before
            .iter()
            .filter(|r| r.claimed_by.as_deref() == Some("dead-holder"))
            .count(),
        2
    );
    // The survivor reconciles each one first (claimed from in_flight): two found, one not found and run.
    assert_eq!(survivor_report.claimed, 3, "{survivor_report}");
    assert_eq!(
        report_states(&survivor_report),
        vec![(EffectState::Done, 3)],
        "{survivor_report}"
    );
    // The stalled holder's late result is dropped: its claim was lost.
    assert_eq!(zombie_report.claimed, 1, "{zombie_report}");
    assert_eq!(zombie_report.claims_lost, 1, "{zombie_report}");
    assert_eq!(report_states(&zombie_report), vec![], "{zombie_report}");

    let rows = DB::effect_rows(&store).await;
    assert_eq!(
        states(&rows),
        [("done".to_owned(), 3)].into_iter().collect()
    );
    assert_eq!(crm.calls(), 3, "one call per effect");
    assert_eq!(crm.tasks().len(), 3);
    for k in &keys {
        assert_eq!(crm.count_with_key(k), 1, "key {k}");
        let row = rows.iter().find(|r| &r.key == k).unwrap();
        assert_eq!(
            row.reconciliations, 1,
            "reconciled before any retry: {row:?}"
        );
        assert_eq!(row.result_reference, crm.task_with_key(k).map(|t| t.id));
        assert!(row.claimed_by.is_none() && row.finished, "{row:?}");
    }
    // The one whose call never left was run by the survivor, with the same key.
    let second = rows.iter().find(|r| r.key == keys[1]).unwrap();
    assert_eq!(second.attempts, 1, "{second:?}");
}

#[tokio::test]
async fn a_holder_that_died_mid_call_is_reconciled_on_sqlite() {
    died_mid_call(sqlite_store().await).await;
}

#[tokio::test]
async fn a_holder_that_died_mid_call_is_reconciled_on_postgres() {
    died_mid_call(pg_store(4).await).await;
}

// ---------------------------------------------------------------------------------------------------------
// 5. Two runners on one PostgreSQL.
// ---------------------------------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_runners_on_one_postgres_execute_each_effect_once() {
    let store = pg_store(16).await;
    <sqlx::Postgres as LabDb>::create_tables(&store)
        .await
        .unwrap();
    let crm = start_crm(true).await;
    let (h, ids) = recording::<sqlx::Postgres>(|msg| vec![crm_effect(msg)]);
    assert_all_applied(&deliver(&store, h, 0..2000).await, 2000);

    let a = EffectRunner::new(store.clone()).executor("crm", crm_by_key(&crm));
    let b = EffectRunner::new(store.clone()).executor("crm", crm_by_key(&crm));
    assert_ne!(a.holder(), b.holder());
    let (ra, rb) = tokio::join!(a.run_until_idle(), b.run_until_idle());
    eprintln!("runner a: {ra}\nrunner b: {rb}");
    assert_eq!(ra.claimed + rb.claimed, 2000, "a: {ra} / b: {rb}");
    assert_eq!(
        ra.count(EffectState::Done) + rb.count(EffectState::Done),
        2000,
        "a: {ra} / b: {rb}"
    );
    assert_eq!(ra.claims_lost + rb.claims_lost, 0, "a: {ra} / b: {rb}");
    assert_eq!(ra.store_errors + rb.store_errors, 0, "a: {ra} / b: {rb}");
    assert_eq!(crm.calls(), 2000);
    assert_eq!(crm.tasks().len(), 2000);
    let keys = keys(&ids, CRM_TASK);
    assert_eq!(keys.len(), 2000);
    for k in &keys {
        assert_eq!(crm.count_with_key(k), 1, "key {k}");
    }
    let rows = <sqlx::Postgres as FxDb>::effect_rows(&store).await;
    assert_eq!(
        states(&rows),
        [("done".to_owned(), 2000)].into_iter().collect()
    );
    assert!(rows
        .iter()
        .all(|r| r.attempts == 1 && r.reconciliations == 0));
}

// ---------------------------------------------------------------------------------------------------------
// 6. Groups keep order.
// ---------------------------------------------------------------------------------------------------------

async fn groups_keep_order<DB: FxDb>(store: Store<DB>) {
    DB::create_tables(&store).await.unwrap();
    // Two messages record the group's five effects (g0..g2, then g3, g4) and one effect with no group.
    let (h, _) = recording::<DB>(|msg| {
        let g = |n: usize| Effect::new(format!("g{n}"), "ordered", b"{}".to_vec()).group("g");
        if msg.identity.message_id == "evt-482" {
            vec![g(0), g(1), g(2)]
        } else {
            vec![g(3), Effect::new("free", "ordered", b"{}".to_vec()), g(4)]
        }
    });
    assert_all_applied(&deliver(&store, h, 0..2).await, 2);
    let recorded: Vec<String> = DB::effect_rows(&store)
        .await
        .into_iter()
        .filter(|r| r.group_key.as_deref() == Some("g"))
        .map(|r| r.name)
        .collect();
    assert_eq!(recorded, ["g0", "g1", "g2", "g3", "g4"]);

    let exec = FailsFirst::default();
    let runner = EffectRunner::new(store.clone())
        .executor("ordered", exec.clone())
        .options(EffectOptions::default().backoff(Duration::ZERO, Duration::ZERO));
    // One pass: the group's head fails (nothing sent); the rest of the group waits, the ungrouped effect
    // does not.
    let first = runner.run_pass().await;
    assert_eq!(first.claimed, 2, "{first}");
    assert_eq!(
        report_states(&first),
        vec![(EffectState::Pending, 1), (EffectState::Done, 1)],
        "{first}"
    );
    assert_eq!(*exec.seen.lock().unwrap(), ["g0", "free"]);
    let rows = DB::effect_rows(&store).await;
    for r in &rows {
        let expect = match r.name.as_str() {
            "free" => ("done", 1),
            "g0" => ("pending", 1),
            _ => ("pending", 0),
        };
        assert_eq!((r.state.as_str(), r.attempts), expect, "{r:?}");
    }

    // The head is due again at once: each later pass claims only the group's oldest unfinished effect.
    let mut per_pass = Vec::new();
    loop {
        let pass = runner.run_pass().await;
        if pass.claimed == 0 {
            break;
        }
        assert_eq!(pass.claimed, 1, "one effect of the group at a time: {pass}");
        assert_eq!(report_states(&pass), vec![(EffectState::Done, 1)], "{pass}");
        per_pass.push(pass);
        assert!(per_pass.len() <= 5, "more passes than effects");
    }
    assert_eq!(per_pass.len(), 5);
    assert_eq!(
        *exec.seen.lock().unwrap(),
        ["g0", "free", "g0", "g1", "g2", "g3", "g4"],
        "the executor saw the group in the recorded order, its head retried before the rest"
    );
    let rows = DB::effect_rows(&store).await;
    for r in rows.iter().filter(|r| r.group_key.as_deref() == Some("g")) {
        let attempts = if r.name == "g0" { 2 } else { 1 };
        assert_eq!((r.state.as_str(), r.attempts), ("done", attempts), "{r:?}");
        assert_eq!(r.result_reference, Some(format!("ref-{}", r.name)));
    }
}

#[tokio::test]
async fn groups_keep_their_recorded_order_on_sqlite() {
    groups_keep_order(sqlite_store().await).await;
}

#[tokio::test]
async fn groups_keep_their_recorded_order_on_postgres() {
    groups_keep_order(pg_store(4).await).await;
}

/// A destination whose calls are done and whose compensation succeeds.
#[derive(Clone, Default)]
struct Undoable {
    seen: Arc<Mutex<Vec<String>>>,
}

impl EffectExecutor for Undoable {
    fn execute<'a>(&'a self, e: &'a ClaimedEffect) -> BoxFuture<'a, Execution> {
        Box::pin(async move {
            self.seen.lock().unwrap().push(e.name.clone());
            Execution::Done {
                reference: Some(format!("ref-{}", e.name)),
            }
        })
    }
    fn confirm<'a>(&'a self, _: &'a ClaimedEffect) -> BoxFuture<'a, Confirmation> {
        Box::pin(async { Confirmation::NotFound })
    }
    fn compensate<'a>(
        &'a self,
        _: &'a ClaimedEffect,
    ) -> BoxFuture<'a, Result<(), txinbox::effects::BoxError>> {
        Box::pin(async { Ok(()) })
    }
}

/// A compensated effect is finished for its group's order, as a done or failed one is: the next effect of its
/// group runs. (It held its group for good: a later effect still pending when an operator compensated the one
/// before it never ran.)
async fn a_compensated_effect_lets_its_group_go_on<DB: FxDb>(store: Store<DB>) {
    DB::create_tables(&store).await.unwrap();
    let (h, ids) = recording::<DB>(|_| {
        let g = |n: usize| Effect::new(format!("g{n}"), "ordered", b"{}".to_vec()).group("g");
        vec![g(0), g(1)]
    });
    assert_all_applied(&deliver(&store, h, 0..1).await, 1);
    let exec = Undoable::default();
    let runner = EffectRunner::new(store.clone()).executor("ordered", exec.clone());
    // One pass claims the group's head only; the second effect waits while the head is in flight.
    let first = runner.run_pass().await;
    assert_eq!(first.claimed, 1, "{first}");
    assert_eq!(*exec.seen.lock().unwrap(), ["g0"]);
    assert_eq!(
        runner
            .compensate(&keys(&ids, "g0")[0])
            .await
            .expect("compensated"),
        EffectState::Compensated
    );
    let second = runner.run_pass().await;
    assert_eq!(
        second.claimed, 1,
        "the group goes on past the compensated effect: {second}"
    );
    assert_eq!(*exec.seen.lock().unwrap(), ["g0", "g1"]);
    let states: Vec<(String, String)> = DB::effect_rows(&store)
        .await
        .into_iter()
        .map(|r| (r.name, r.state))
        .collect();
    assert_eq!(
        states,
        [
            ("g0".to_owned(), "compensated".to_owned()),
            ("g1".to_owned(), "done".to_owned())
        ]
    );
}

#[tokio::test]
async fn a_compensated_effect_lets_its_group_go_on_on_sqlite() {
    a_compensated_effect_lets_its_group_go_on(sqlite_store().await).await;
}

#[tokio::test]
async fn a_compensated_effect_lets_its_group_go_on_on_postgres() {
    a_compensated_effect_lets_its_group_go_on(pg_store(4).await).await;
}

// ---------------------------------------------------------------------------------------------------------
// 7. Done effects are purged after their retention.
// ---------------------------------------------------------------------------------------------------------

async fn done_effects_are_purged<DB: FxDb>(store: Store<DB>) {
    DB::create_tables(&store).await.unwrap();
    let crm = start_crm(true).await;
    let (h, _) = recording::<DB>(|msg| {
        let mut fx = vec![crm_effect(msg)];
        if msg.identity.message_id == "evt-482" {
            fx.push(Effect::new("poison.notify", "poison", b"{}".to_vec()));
        }
        fx
    });
    assert_all_applied(&deliver(&store, h, 0..10).await, 10);
    let runner = EffectRunner::new(store.clone())
        .executor("crm", crm_by_key(&crm))
        .executor("poison", Poison)
        .options(EffectOptions::default().max_attempts(1));
    let report = runner.run_until_idle().await;
    assert_eq!(
        report_states(&report),
        vec![(EffectState::Done, 10), (EffectState::Failed, 1)],
        "{report}"
    );
    // The default retention keeps them.
    let rows = DB::effect_rows(&store).await;
    assert_eq!(
        states(&rows),
        [("done".to_owned(), 10), ("failed".to_owned(), 1)]
            .into_iter()
            .collect()
    );

    let purging = EffectRunner::new(store.clone())
        .executor("crm", crm_by_key(&crm))
        .executor("poison", Poison)
        .options(EffectOptions::default().done_retention(Duration::ZERO));
    let report = purging.run_until_idle().await;
    assert_eq!(report.claimed, 0, "{report}");
    let rows = DB::effect_rows(&store).await;
    assert_eq!(
        states(&rows),
        [("failed".to_owned(), 1)].into_iter().collect(),
        "done rows purged, the failed one kept with its evidence"
    );
    assert_eq!(crm.tasks().len(), 10);
}

#[tokio::test]
async fn done_effects_are_purged_after_their_retention_on_sqlite() {
    done_effects_are_purged(sqlite_store().await).await;
}

#[tokio::test]
async fn done_effects_are_purged_after_their_retention_on_postgres() {
    done_effects_are_purged(pg_store(4).await).await;
}

// ---------------------------------------------------------------------------------------------------------
// 8. A rolled-back handler leaves no effect.
// ---------------------------------------------------------------------------------------------------------

async fn rolled_back_handler_leaves_no_effect<DB: FxDb>(store: Store<DB>) {
    DB::create_tables(&store).await.unwrap();
    let failing = lab_processor(
        store.clone(),
        |tx: Tx<DB>, msg: Message<LabEvent>| async move {
            let effect = crm_effect(&msg);
            // The local change and the effect are recorded, then the handler fails.
            let recorded = DB::insert_task(tx, msg).await?.effect(effect);
            assert_eq!(recorded.effects.len(), 1);
            Err::<Handled, _>(HandlerError::retry("the CRM is down for maintenance"))
        },
    );
    let q = MemoryQueue::default();
    q.send(lab_message(0));
    let d = q.receive_now(1).pop().unwrap();
    let o = failing.process_one(d).await;
    assert!(matches!(o, Outcome::Retry { .. }), "{o:?}");
    assert_eq!(DB::count(&store, "txinbox_effects").await, 0);
    assert_eq!(DB::count(&store, "lab_tasks").await, 0);
    assert_eq!(store.inbox_rows(CONSUMER).await.unwrap(), 0);

    // The redelivery that succeeds records the effect once, under the same key.
    let (h, ids) = recording::<DB>(|msg| vec![crm_effect(msg)]);
    let ok = lab_processor(store.clone(), h);
    let d = q.receive_now(1).pop().expect("released for redelivery");
    let o = ok.process_one(d).await;
    assert!(matches!(o, Outcome::Applied { .. }), "{o:?}");
    let rows = DB::effect_rows(&store).await;
    assert_eq!(rows.len(), 1);
    assert_eq!(rows[0].key, keys(&ids, CRM_TASK)[0]);
    assert_eq!(rows[0].state, "pending");
}

#[tokio::test]
async fn a_rolled_back_handler_leaves_no_effect_on_sqlite() {
    rolled_back_handler_leaves_no_effect(sqlite_store().await).await;
}

#[tokio::test]
async fn a_rolled_back_handler_leaves_no_effect_on_postgres() {
    rolled_back_handler_leaves_no_effect(pg_store(4).await).await;
}

// ---------------------------------------------------------------------------------------------------------
// 9. Duplicate effect names in one message dead-letter it.
// ---------------------------------------------------------------------------------------------------------

async fn duplicate_effect_names_dead_letter<DB: FxDb>(store: Store<DB>) {
    DB::create_tables(&store).await.unwrap();
    let (h, _) = recording::<DB>(|msg| {
        if msg.identity.message_id == "evt-482" {
            // Two effects under one name: they would share an idempotency key.
            vec![
                crm_effect(msg),
                Effect::new(CRM_TASK, "crm", br#"{"other":"task"}"#.to_vec()),
            ]
        } else {
            // The control: distinct names in one message are fine.
            vec![
                crm_effect(msg),
                Effect::new("crm.add_note", "crm", br#"{"note":"x"}"#.to_vec()),
            ]
        }
    });
    let p = lab_processor(store.clone(), h);
    let q = MemoryQueue::default();
    q.send(lab_message(0));
    q.send(lab_message(1));
    let d = q.receive_now(1).pop().unwrap();
    match p.process_one(d).await {
        Outcome::DeadLettered { reason, detail } => {
            assert_eq!(reason, "handler_permanent");
            assert!(detail.contains(CRM_TASK), "{detail}");
        }
        other => panic!("expected a dead letter, got {other:?}"),
    }
    assert_eq!(q.state().dead_lettered, 1);
    assert_eq!(DB::count(&store, "txinbox_effects").await, 0);
    assert_eq!(DB::count(&store, "lab_tasks").await, 0);
    assert_eq!(store.inbox_rows(CONSUMER).await.unwrap(), 0);

    let d = q.receive_now(1).pop().unwrap();
    let o = p.process_one(d).await;
    assert!(matches!(o, Outcome::Applied { .. }), "{o:?}");
    let rows = DB::effect_rows(&store).await;
    assert_eq!(
        rows.iter().map(|r| r.name.as_str()).collect::<Vec<_>>(),
        [CRM_TASK, "crm.add_note"]
    );
    assert!(rows.iter().all(|r| r.message_id == "evt-483"));
}

#[tokio::test]
async fn duplicate_effect_names_dead_letter_the_message_on_sqlite() {
    duplicate_effect_names_dead_letter(sqlite_store().await).await;
}

#[tokio::test]
async fn duplicate_effect_names_dead_letter_the_message_on_postgres() {
    duplicate_effect_names_dead_letter(pg_store(4).await).await;
}

/// An effect whose external reference or group a store cannot keep (a control character, over 512 bytes; on
/// PostgreSQL a NUL is refused in text and a long value in an index, on every delivery) dead-letters its message
/// with the reason, never releases it for ever; the control message's effect is recorded.
async fn an_effect_a_store_cannot_keep_dead_letters<DB: FxDb>(store: Store<DB>) {
    DB::create_tables(&store).await.unwrap();
    let (h, _) = recording::<DB>(|msg| {
        let e = Effect::new(CRM_TASK, "crm", br#"{"task":"x"}"#.to_vec());
        match msg.identity.message_id.as_str() {
            "evt-482" => vec![e.external_ref("ref\0with a NUL")],
            "evt-483" => vec![e.group("g".repeat(600))],
            _ => vec![e.external_ref("ref-484").group("g")],
        }
    });
    let p = lab_processor(store.clone(), h);
    let q = MemoryQueue::default();
    for i in 0..3 {
        q.send(lab_message(i));
    }
    for (field, n) in [("external reference", 14), ("group", 600)] {
        let d = q.receive_now(1).pop().unwrap();
        match p.process_one(d).await {
            Outcome::DeadLettered { reason, detail } => {
                assert_eq!(reason, "handler_permanent");
                assert!(
                    detail.contains(&format!("{field} is not 1 to 512 bytes")),
                    "{detail}"
                );
                assert!(detail.contains(&format!("it has {n} bytes")), "{detail}");
            }
            other => panic!("expected a dead letter for the {field}, got {other:?}"),
        }
    }
    assert_eq!(q.state().dead_lettered, 2);
    assert_eq!(DB::count(&store, "txinbox_effects").await, 0);
    assert_eq!(store.inbox_rows(CONSUMER).await.unwrap(), 0);

    let d = q.receive_now(1).pop().unwrap();
    let o = p.process_one(d).await;
    assert!(matches!(o, Outcome::Applied { .. }), "{o:?}");
    assert_eq!(DB::count(&store, "txinbox_effects").await, 1);
}

#[tokio::test]
async fn an_effect_a_store_cannot_keep_dead_letters_its_message_on_sqlite() {
    an_effect_a_store_cannot_keep_dead_letters(sqlite_store().await).await;
}

#[tokio::test]
async fn an_effect_a_store_cannot_keep_dead_letters_its_message_on_postgres() {
    an_effect_a_store_cannot_keep_dead_letters(pg_store(4).await).await;
}

// ---------------------------------------------------------------------------------------------------------
// 10. A destination that keeps failing before doing anything (503) is held to the attempt limit.
// ---------------------------------------------------------------------------------------------------------

/// The CRM answers 503 without performing anything: the HTTP effect cannot tell and marks the call
/// uncertain; reconciliation finds nothing and the effect runs again. Each of those runs is an execution,
/// so the effect's attempt limit and backoff must hold ("each effect has its own backoff and attempt
/// limit"): with `max_attempts(3)` and a 60 s backoff the CRM sees at most 3 calls, not one call per
/// armed failure in a hot loop.
async fn failing_destination_is_held_to_the_attempt_limit<DB: FxDb>(store: Store<DB>) {
    DB::create_tables(&store).await.unwrap();
    let crm = start_crm(true).await;
    let (h, ids) = recording::<DB>(|msg| vec![crm_effect(msg)]);
    assert_all_applied(&deliver(&store, h, 0..1).await, 1);
    // Far more failures than the attempt limit allows calls.
    crm.fail_next(40);
    let runner = EffectRunner::new(store.clone())
        .executor("crm", crm_by_key(&crm))
        .options(
            EffectOptions::default()
                .max_attempts(3)
                .backoff(Duration::from_secs(60), Duration::from_secs(60)),
        );
    let report = runner.run_until_idle().await;
    let rows = DB::effect_rows(&store).await;
    let row = &rows[0];
    assert_eq!(row.key, keys(&ids, CRM_TASK)[0]);
    assert!(
        crm.calls() <= 3 && row.attempts <= 3,
        "the attempt limit (3) did not hold: the CRM received {} calls, the effect records {} attempts, \
         state {} ({report})",
        crm.calls(),
        row.attempts,
        row.state
    );
}

#[tokio::test]
async fn a_destination_failing_with_503_is_held_to_the_attempt_limit_on_sqlite() {
    failing_destination_is_held_to_the_attempt_limit(sqlite_store().await).await;
}

#[tokio::test]
async fn a_destination_failing_with_503_is_held_to_the_attempt_limit_on_postgres() {
    failing_destination_is_held_to_the_attempt_limit(pg_store(4).await).await;
}

// ---------------------------------------------------------------------------------------------------------
// 11. An operator's compensation undoes a done effect once, through its destination.
// ---------------------------------------------------------------------------------------------------------

async fn compensation_undoes_a_done_effect_once<DB: FxDb>(store: Store<DB>) {
    DB::create_tables(&store).await.unwrap();
    let crm = start_crm(true).await;
    let (h, ids) = recording::<DB>(|msg| vec![crm_effect(msg)]);
    assert_all_applied(&deliver(&store, h, 0..1).await, 1);
    let runner = EffectRunner::new(store.clone()).executor(
        "crm",
        crm_by_key_builder(&crm)
            .compensate_url(format!("{}/tasks/{{reference}}", crm.url()))
            .build()
            .expect("a valid destination"),
    );
    let report = runner.run_until_idle().await;
    assert_eq!(report.count(EffectState::Done), 1, "{report}");
    assert_eq!(crm.tasks().len(), 1);
    let key = keys(&ids, CRM_TASK)[0].clone();

    // A destination without a compensation request refuses, and the effect stays done.
    let plain = EffectRunner::new(store.clone()).executor("crm", crm_by_key(&crm));
    let refused = plain.compensate(&key).await;
    assert!(
        matches!(refused, Err(txinbox::CompensateError::Refused { .. })),
        "{refused:?}"
    );
    assert_eq!(DB::effect_rows(&store).await[0].state, "done");
    assert_eq!(crm.tasks().len(), 1);

    // Undone at the CRM (DELETE by the CRM's own reference), recorded as compensated.
    assert_eq!(
        runner.compensate(&key).await.expect("compensated"),
        EffectState::Compensated
    );
    assert!(crm.tasks().is_empty(), "the CRM task is gone");
    let row = DB::effect_rows(&store).await.remove(0);
    assert_eq!(row.state, "compensated");
    assert!(row.last_error.unwrap_or_default().contains("compensated"));

    // Never twice, and a key nobody recorded is a typed error.
    let again = runner.compensate(&key).await;
    assert!(
        matches!(
            again,
            Err(txinbox::CompensateError::NotDone {
                state: EffectState::Compensated,
                ..
            })
        ),
        "{again:?}"
    );
    assert!(matches!(
        runner.compensate("no-such-key").await,
        Err(txinbox::CompensateError::NotFound(_))
    ));
    // A compensated effect is not claimed again.
    assert_eq!(runner.run_until_idle().await.claimed, 0);
}

#[tokio::test]
async fn compensation_undoes_a_done_effect_once_on_sqlite() {
    compensation_undoes_a_done_effect_once(sqlite_store().await).await;
}

#[tokio::test]
async fn compensation_undoes_a_done_effect_once_on_postgres() {
    compensation_undoes_a_done_effect_once(pg_store(4).await).await;
}
