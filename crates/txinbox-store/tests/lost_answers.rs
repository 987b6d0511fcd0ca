//! A claim whose write applied and whose answer was lost (the connection dropped after its COMMIT): the runner
//! gives its effects back at once, each to the state it was claimed from, on PostgreSQL as on SQLite. Without
//! it they stayed in flight under a runner that never ran them until the claim ran out, and their next holder
//! took them for possibly started: one never called was reconciled (and, at a destination with neither a key
//! nor a confirmation, needed attention).

use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::Arc;

use chrono::{DateTime, Utc};
use txinbox_core::effects::{
    BoxFuture, ClaimedEffect, Confirmation, EffectCount, EffectExecutor, EffectRunner, EffectState,
    EffectStore, Execution, TransitionColumns,
};
use txinbox_store::Store;

mod effect_rows;
use effect_rows::{on_postgres, on_sqlite, PENDING};

/// A store whose next claim applies and then loses its answer (an I/O error, as a connection dropped after
/// the COMMIT was sent), when `lose` is set; and whose next finish fails as `finish` says.
#[derive(Clone)]
struct LosesClaimAnswer<S> {
    inner: S,
    lose: Arc<AtomicBool>,
    finish: Arc<std::sync::Mutex<Option<FinishFault>>>,
    mark: Arc<std::sync::Mutex<Option<FinishFault>>>,
}

/// How the next finish (or compensation mark) fails.
#[derive(Clone, Copy, Debug)]
enum FinishFault {
    /// Before the statement reached the database (a pool timeout): nothing applied.
    NotApplied,
    /// After its COMMIT: applied, its answer lost.
    AnswerLost,
}

fn io_lost(what: &str) -> sqlx::Error {
    sqlx::Error::Io(std::io::Error::new(
        std::io::ErrorKind::ConnectionReset,
        what.to_owned(),
    ))
}

impl<S: EffectStore<Error = sqlx::Error>> EffectStore for LosesClaimAnswer<S> {
    type Error = sqlx::Error;

    async fn claim_effects(
        &self,
        holder: &str,
        destinations: &[String],
        now: DateTime<Utc>,
        claim_until: DateTime<Utc>,
        limit: i64,
    ) -> Result<Vec<ClaimedEffect>, sqlx::Error> {
        let claimed = self
            .inner
            .claim_effects(holder, destinations, now, claim_until, limit)
            .await?;
        if self.lose.swap(false, Ordering::SeqCst) {
            assert!(!claimed.is_empty(), "the claim applied");
            return Err(io_lost("the claim's answer was lost"));
        }
        Ok(claimed)
    }

    async fn release_claim(&self, holder: &str, now: DateTime<Utc>) -> Result<u64, sqlx::Error> {
        self.inner.release_claim(holder, now).await
    }

    async fn finish_effect(
        &self,
        id: i64,
        holder: &str,
        transition: &TransitionColumns<'_>,
        now: DateTime<Utc>,
    ) -> Result<bool, sqlx::Error> {
        let fault = self.finish.lock().unwrap().take();
        match fault {
            Some(FinishFault::NotApplied) => Err(sqlx::Error::PoolTimedOut),
            Some(FinishFault::AnswerLost) => {
                let applied = self
                    .inner
                    .finish_effect(id, holder, transition, now)
                    .await?;
                assert!(applied, "the finish applied");
                Err(io_lost("the finish's answer was lost"))
            }
            None => self.inner.finish_effect(id, holder, transition, now).await,
        }
    }

    async fn purge_done_effects(
        &self,
        before: DateTime<Utc>,
        limit: i64,
    ) -> Result<u64, sqlx::Error> {
        self.inner.purge_done_effects(before, limit).await
    }

    async fn effect_counts(&self) -> Result<Vec<EffectCount>, sqlx::Error> {
        self.inner.effect_counts().await
    }

    async fn find_effect(&self, key: &str) -> Result<Option<ClaimedEffect>, sqlx::Error> {
        self.inner.find_effect(key).await
    }

    async fn mark_compensated(
        &self,
        id: i64,
        note: &str,
        now: DateTime<Utc>,
    ) -> Result<bool, sqlx::Error> {
        let fault = self.mark.lock().unwrap().take();
        match fault {
            Some(FinishFault::NotApplied) => Err(sqlx::Error::PoolTimedOut),
            Some(FinishFault::AnswerLost) => {
                let applied = self.inner.mark_compensated(id, note, now).await?;
                assert!(applied, "the mark applied");
                Err(io_lost("the mark's answer was lost"))
            }
            None => self.inner.mark_compensated(id, note, now).await,
        }
    }
}

/// A destination that does every call, never finds anything and undoes what it is asked to; counts all three.
#[derive(Clone, Default)]
struct Counted {
    calls: Arc<AtomicU32>,
    confirmations: Arc<AtomicU32>,
    undone: Arc<AtomicU32>,
}

impl EffectExecutor for Counted {
    fn execute<'a>(&'a self, _: &'a ClaimedEffect) -> BoxFuture<'a, Execution> {
        self.calls.fetch_add(1, Ordering::SeqCst);
        Box::pin(async {
            Execution::Done {
                reference: Some("task-1".into()),
            }
        })
    }

    fn confirm<'a>(&'a self, _: &'a ClaimedEffect) -> BoxFuture<'a, Confirmation> {
        self.confirmations.fetch_add(1, Ordering::SeqCst);
        Box::pin(async { Confirmation::NotFound })
    }

    fn compensate<'a>(
        &'a self,
        _: &'a ClaimedEffect,
    ) -> BoxFuture<'a, Result<(), txinbox_core::effects::BoxError>> {
        self.undone.fetch_add(1, Ordering::SeqCst);
        Box::pin(async { Ok(()) })
    }
}

/// Effect `k` inserted by `insert`, and a runner of destination `crm` over `store` whose next claim loses its
/// answer (`lose`), and whose next finish and next compensation mark fail as `finish` and `mark` say.
async fn faulty_runner<DB: txinbox_store::Backend>(
    store: &Store<DB>,
    insert: &str,
    lose: bool,
    finish: Option<FinishFault>,
    mark: Option<FinishFault>,
) -> (EffectRunner<LosesClaimAnswer<Store<DB>>>, Counted)
where
    for<'c> &'c sqlx::Pool<DB>: sqlx::Executor<'c, Database = DB>,
    for<'q> <DB as sqlx::Database>::Arguments<'q>: sqlx::IntoArguments<'q, DB>,
{
    sqlx::query(insert).execute(store.pool()).await.unwrap();
    let dest = Counted::default();
    let runner = EffectRunner::new(LosesClaimAnswer {
        inner: store.clone(),
        lose: Arc::new(AtomicBool::new(lose)),
        finish: Arc::new(std::sync::Mutex::new(finish)),
        mark: Arc::new(std::sync::Mutex::new(mark)),
    })
    .executor("crm", dest.clone());
    (runner, dest)
}

/// Effect `k` for destination `crm` inserted by `insert`; the first claim loses its answer. Returns the
/// destination's counts of calls and confirmations after two passes, and the effect's state between them.
async fn lost_claim<DB: txinbox_store::Backend>(
    store: Store<DB>,
    insert: &str,
) -> (EffectState, u32, u32, EffectState)
where
    for<'c> &'c sqlx::Pool<DB>: sqlx::Executor<'c, Database = DB>,
    for<'q> <DB as sqlx::Database>::Arguments<'q>: sqlx::IntoArguments<'q, DB>,
{
    let (runner, dest) = faulty_runner(&store, insert, true, None, None).await;
    let first = runner.run_pass().await;
    assert_eq!(first.store_errors, 1, "{first}");
    let between = store.find_effect("k").await.unwrap().unwrap().claimed_from;
    let second = runner.run_pass().await;
    assert_eq!(
        second.claimed, 1,
        "the effect of the lost claim is claimed again at once: {second}"
    );
    let after = store.find_effect("k").await.unwrap().unwrap();
    (
        between,
        dest.calls.load(Ordering::SeqCst),
        dest.confirmations.load(Ordering::SeqCst),
        after.claimed_from,
    )
}

const EXPIRED: &str = "INSERT INTO txinbox_effects (consumer_name, message_id, idempotency_key, name, destination, payload, metadata, external_ref, state, next_attempt_at, created_at, updated_at, claimed_by, claim_until, attempts) VALUES ('c', 'm', 'k', 'n', 'crm', BYTES, '{}', 'k', 'in_flight', PAST, PAST, PAST, 'a runner that died', PAST, 1)";

/// The scenario as two tests, on PostgreSQL and on SQLite: `$scenario(store, insert, args...)` with `$insert`
/// written for each.
macro_rules! on_both {
    ($pg:ident, $lite:ident, $scenario:ident, $insert:expr $(, $arg:expr)*) => {
        #[tokio::test]
        async fn $pg() {
            $scenario(txinbox_testkit::pg_store(2).await, &on_postgres($insert) $(, $arg)*).await;
        }

        #[tokio::test]
        async fn $lite() {
            $scenario(txinbox_testkit::sqlite_store().await, &on_sqlite($insert) $(, $arg)*).await;
        }
    };
}

/// A pending effect whose claim lost its answer is pending again at once, then called once, without a
/// confirmation: it was never called before.
async fn a_lost_claim_of_a_pending_effect<DB: txinbox_store::Backend>(
    store: Store<DB>,
    insert: &str,
) where
    for<'c> &'c sqlx::Pool<DB>: sqlx::Executor<'c, Database = DB>,
    for<'q> <DB as sqlx::Database>::Arguments<'q>: sqlx::IntoArguments<'q, DB>,
{
    let (between, calls, confirmations, after) = lost_claim(store, insert).await;
    assert_eq!(
        between,
        EffectState::Pending,
        "given back to the state it was claimed from"
    );
    assert_eq!(
        (calls, confirmations),
        (1, 0),
        "called once, never taken for possibly started"
    );
    assert_eq!(after, EffectState::Done);
}

on_both!(
    a_claim_whose_answer_was_lost_gives_a_pending_effect_back_on_postgres,
    a_claim_whose_answer_was_lost_gives_a_pending_effect_back_on_sqlite,
    a_lost_claim_of_a_pending_effect,
    PENDING
);

/// An effect taken from a holder that died mid-call, whose claim then lost its answer: given back in flight
/// with its claim ended, so it is claimed again at once and still asked about before any call.
async fn a_lost_claim_of_an_expired_effect<DB: txinbox_store::Backend>(
    store: Store<DB>,
    insert: &str,
) where
    for<'c> &'c sqlx::Pool<DB>: sqlx::Executor<'c, Database = DB>,
    for<'q> <DB as sqlx::Database>::Arguments<'q>: sqlx::IntoArguments<'q, DB>,
{
    let (between, calls, confirmations, after) = lost_claim(store, insert).await;
    assert_eq!(between, EffectState::InFlight);
    assert_eq!(
        (calls, confirmations),
        (1, 1),
        "reconciled before its call: the dead holder may have called"
    );
    assert_eq!(after, EffectState::Done);
}

on_both!(
    a_claim_whose_answer_was_lost_gives_an_expired_effect_back_on_postgres,
    a_claim_whose_answer_was_lost_gives_an_expired_effect_back_on_sqlite,
    a_lost_claim_of_an_expired_effect,
    EXPIRED
);

/// A pending effect called once (done), whose first finish fails as `fault` says: the runner records the
/// outcome it knows, once, and reports it as its own.
async fn a_failed_finish<DB: txinbox_store::Backend>(
    store: Store<DB>,
    insert: &str,
    fault: FinishFault,
) where
    for<'c> &'c sqlx::Pool<DB>: sqlx::Executor<'c, Database = DB>,
    for<'q> <DB as sqlx::Database>::Arguments<'q>: sqlx::IntoArguments<'q, DB>,
{
    let (runner, dest) = faulty_runner(&store, insert, false, Some(fault), None).await;
    let report = runner.run_pass().await;
    let after = store.find_effect("k").await.unwrap().unwrap();
    assert_eq!(
        (after.claimed_from, after.reference.as_deref()),
        (EffectState::Done, Some("task-1")),
        "the call's outcome is recorded ({fault:?}): {report}"
    );
    assert_eq!(
        (
            report.count(EffectState::Done),
            report.claims_lost,
            report.store_errors
        ),
        (1, 0, 0),
        "recorded by this runner, not taken for a lost claim: {report}"
    );
    assert_eq!(
        (
            dest.calls.load(Ordering::SeqCst),
            dest.confirmations.load(Ordering::SeqCst)
        ),
        (1, 0)
    );
}

on_both!(
    a_finish_that_never_reached_the_database_is_sent_again_on_postgres,
    a_finish_that_never_reached_the_database_is_sent_again_on_sqlite,
    a_failed_finish,
    PENDING,
    FinishFault::NotApplied
);

on_both!(
    a_finish_whose_answer_was_lost_is_recognised_as_its_own_on_postgres,
    a_finish_whose_answer_was_lost_is_recognised_as_its_own_on_sqlite,
    a_failed_finish,
    PENDING,
    FinishFault::AnswerLost
);

const DONE: &str = "INSERT INTO txinbox_effects (consumer_name, message_id, idempotency_key, name, destination, payload, metadata, external_ref, state, next_attempt_at, created_at, updated_at, finished_at, result_reference, attempts) VALUES ('c', 'm', 'k', 'n', 'crm', BYTES, '{}', 'k', 'done', PAST, PAST, PAST, PAST, 'task-1', 1)";

/// A done effect undone at the destination whose mark as compensated fails as `fault` says: the compensation
/// answers compensated, the row says so, and the destination was asked once.
async fn a_failed_mark<DB: txinbox_store::Backend>(
    store: Store<DB>,
    insert: &str,
    fault: FinishFault,
) where
    for<'c> &'c sqlx::Pool<DB>: sqlx::Executor<'c, Database = DB>,
    for<'q> <DB as sqlx::Database>::Arguments<'q>: sqlx::IntoArguments<'q, DB>,
{
    let (runner, dest) = faulty_runner(&store, insert, false, None, Some(fault)).await;
    let r = runner.compensate("k").await;
    let after = store.find_effect("k").await.unwrap().unwrap();
    assert_eq!(
        after.claimed_from,
        EffectState::Compensated,
        "{fault:?}: {r:?}"
    );
    assert!(
        matches!(r, Ok(EffectState::Compensated)),
        "{fault:?}: marked, and said so: {r:?}"
    );
    assert_eq!(dest.undone.load(Ordering::SeqCst), 1);
}

on_both!(
    a_compensation_mark_that_never_reached_the_database_is_sent_again_on_postgres,
    a_compensation_mark_that_never_reached_the_database_is_sent_again_on_sqlite,
    a_failed_mark,
    DONE,
    FinishFault::NotApplied
);

on_both!(
    a_compensation_mark_whose_answer_was_lost_is_recognised_on_postgres,
    a_compensation_mark_whose_answer_was_lost_is_recognised_on_sqlite,
    a_failed_mark,
    DONE,
    FinishFault::AnswerLost
);
