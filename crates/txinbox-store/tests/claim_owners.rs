//! Who holds an effect's claim, on PostgreSQL as on SQLite: a runner whose host clock is ahead never takes
//! over a claim that has not run out (on PostgreSQL the database's clock decides, so every runner of one
//! database agrees), and a finish sent under one claim is never recorded for another claim of the same runner.

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use chrono::{DateTime, Utc};
use txinbox_core::effects::{
    BoxFuture, ClaimedEffect, Confirmation, EffectCount, EffectExecutor, EffectOptions,
    EffectRunner, EffectState, EffectStore, Execution, Transition, TransitionColumns,
};
use txinbox_store::Store;

mod effect_rows;
use effect_rows::{on_postgres, on_sqlite, PENDING};

/// A store seen from a runner whose host clock is `ahead` of the others' (every time it gives is shifted);
/// its finishes fail while `fail_finishes` is above zero (the first of them is kept in `stale`: a statement
/// that left the runner and is still on its way to the database), and the first claim after one failed
/// delivers that stale finish to the database once it has claimed (`stale_applied` says whether it applied).
#[derive(Clone)]
struct Host<S> {
    inner: S,
    ahead: chrono::Duration,
    fail_finishes: Arc<AtomicU32>,
    stale: Arc<Mutex<Option<(i64, String)>>>,
    stale_applied: Arc<Mutex<Option<bool>>>,
}

impl<S> Host<S> {
    fn new(inner: S, ahead: chrono::Duration) -> Self {
        Self {
            inner,
            ahead,
            fail_finishes: Arc::default(),
            stale: Arc::default(),
            stale_applied: Arc::default(),
        }
    }
}

impl<S: EffectStore<Error = sqlx::Error>> EffectStore for Host<S> {
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
            .claim_effects(
                holder,
                destinations,
                now + self.ahead,
                claim_until + self.ahead,
                limit,
            )
            .await?;
        let stale = self.stale.lock().unwrap().take();
        if let Some((id, stale_holder)) = stale {
            // The first claim's finish reaches the database now, after this claim took the effect.
            let late = Transition::Done {
                reference: Some("stale".into()),
                attempts: 1,
                reconciliations: 0,
            };
            let applied = self
                .inner
                .finish_effect(id, &stale_holder, &late.columns(), Utc::now() + self.ahead)
                .await?;
            *self.stale_applied.lock().unwrap() = Some(applied);
        }
        Ok(claimed)
    }

    async fn release_claim(&self, holder: &str, now: DateTime<Utc>) -> Result<u64, sqlx::Error> {
        self.inner.release_claim(holder, now + self.ahead).await
    }

    async fn finish_effect(
        &self,
        id: i64,
        holder: &str,
        transition: &TransitionColumns<'_>,
        now: DateTime<Utc>,
    ) -> Result<bool, sqlx::Error> {
        let failing = self
            .fail_finishes
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
            .is_ok();
        if failing {
            let mut stale = self.stale.lock().unwrap();
            if stale.is_none() {
                *stale = Some((id, holder.to_owned()));
            }
            return Err(sqlx::Error::PoolTimedOut);
        }
        self.inner
            .finish_effect(id, holder, transition, now + self.ahead)
            .await
    }

    async fn purge_done_effects(
        &self,
        before: DateTime<Utc>,
        limit: i64,
    ) -> Result<u64, sqlx::Error> {
        self.inner
            .purge_done_effects(before + self.ahead, limit)
            .await
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
        self.inner
            .mark_compensated(id, note, now + self.ahead)
            .await
    }
}

/// A destination that counts its calls and confirmations (it never finds anything); while `gate` is set, a
/// call says so on `entered` and waits for `release` before it answers.
#[derive(Clone, Default)]
struct Destination {
    calls: Arc<AtomicU32>,
    confirmations: Arc<AtomicU32>,
    gate: Option<Arc<Gate>>,
    /// Whether its calls lose their answer (uncertain), and how long its search lags behind its writes.
    uncertain: Option<Duration>,
}

#[derive(Default)]
struct Gate {
    entered: tokio::sync::Notify,
    release: tokio::sync::Notify,
}

impl EffectExecutor for Destination {
    fn execute<'a>(&'a self, _: &'a ClaimedEffect) -> BoxFuture<'a, Execution> {
        self.calls.fetch_add(1, Ordering::SeqCst);
        Box::pin(async move {
            if let Some(g) = &self.gate {
                g.entered.notify_one();
                g.release.notified().await;
            }
            if self.uncertain.is_some() {
                return Execution::uncertain("the answer was lost");
            }
            Execution::Done {
                reference: Some("task-1".into()),
            }
        })
    }

    fn confirm<'a>(&'a self, _: &'a ClaimedEffect) -> BoxFuture<'a, Confirmation> {
        self.confirmations.fetch_add(1, Ordering::SeqCst);
        Box::pin(async { Confirmation::NotFound })
    }

    fn reconcile_after(&self) -> Duration {
        self.uncertain.unwrap_or_default()
    }
}

/// Ends every claim (as if its time had run out).
const EXPIRE: &str = "UPDATE txinbox_effects SET claim_until = PAST WHERE state = 'in_flight'";

/// The scenario as two tests, on PostgreSQL and on SQLite.
macro_rules! on_both {
    ($pg:ident, $lite:ident, $scenario:ident) => {
        #[tokio::test]
        async fn $pg() {
            $scenario(txinbox_testkit::pg_store(4).await, on_postgres).await;
        }

        #[tokio::test]
        async fn $lite() {
            $scenario(txinbox_testkit::sqlite_store().await, on_sqlite).await;
        }
    };
}

/// Two runners of one database, the second on a host whose clock is two hours ahead; claims last a minute.
/// While the first runner's call is in flight, the second finds nothing to claim: by the first runner's
/// claim (and the database's clock) it has a minute to go, whatever the second host's clock says. The
/// destination is called once.
async fn a_runner_whose_clock_is_ahead<DB: txinbox_store::Backend>(
    store: Store<DB>,
    sql: fn(&str) -> String,
) where
    for<'c> &'c sqlx::Pool<DB>: sqlx::Executor<'c, Database = DB>,
    for<'q> <DB as sqlx::Database>::Arguments<'q>: sqlx::IntoArguments<'q, DB>,
{
    sqlx::query(&sql(PENDING))
        .execute(store.pool())
        .await
        .unwrap();
    let opts = EffectOptions::default().claim_for(Duration::from_secs(60));
    let gate = Arc::new(Gate::default());
    let first_dest = Destination {
        gate: Some(gate.clone()),
        ..Destination::default()
    };
    let first = EffectRunner::new(Host::new(store.clone(), chrono::Duration::zero()))
        .executor("crm", first_dest.clone())
        .options(opts.clone());
    let second_dest = Destination::default();
    let second = EffectRunner::new(Host::new(store.clone(), chrono::Duration::hours(2)))
        .executor("crm", second_dest.clone())
        .options(opts);

    let running = tokio::spawn(async move { first.run_pass().await });
    gate.entered.notified().await;
    let taken = second.run_pass().await;
    gate.release.notify_one();
    let done = running.await.unwrap();

    assert_eq!(
        (
            taken.claimed,
            second_dest.calls.load(Ordering::SeqCst),
            second_dest.confirmations.load(Ordering::SeqCst)
        ),
        (0, 0, 0),
        "the runner whose clock is ahead took over a claim that had not run out: {taken}"
    );
    assert_eq!(done.count(EffectState::Done), 1, "{done}");
    assert_eq!(first_dest.calls.load(Ordering::SeqCst), 1);
    let after = store.find_effect("k").await.unwrap().unwrap();
    assert_eq!(
        (after.claimed_from, after.reference.as_deref()),
        (EffectState::Done, Some("task-1"))
    );
}

on_both!(
    a_runner_whose_clock_is_ahead_does_not_take_over_a_live_claim_on_postgres,
    a_runner_whose_clock_is_ahead_does_not_take_over_a_live_claim_on_sqlite,
    a_runner_whose_clock_is_ahead
);

/// One runner: its first claim's finish fails on every try (the first try still on its way to the database),
/// the claim runs out, and the runner claims the effect again. The first claim's finish reaches the database
/// once the second claim holds the effect: it is refused (not that claim's), and the effect records the
/// second claim's outcome, as that claim's own.
async fn a_stale_finish<DB: txinbox_store::Backend>(store: Store<DB>, sql: fn(&str) -> String)
where
    for<'c> &'c sqlx::Pool<DB>: sqlx::Executor<'c, Database = DB>,
    for<'q> <DB as sqlx::Database>::Arguments<'q>: sqlx::IntoArguments<'q, DB>,
{
    sqlx::query(&sql(PENDING))
        .execute(store.pool())
        .await
        .unwrap();
    let host = Host::new(store.clone(), chrono::Duration::zero());
    host.fail_finishes.store(3, Ordering::SeqCst);
    let dest = Destination::default();
    let runner = EffectRunner::new(host.clone()).executor("crm", dest.clone());

    let first = runner.run_pass().await;
    assert_eq!((first.claimed, first.store_errors), (1, 1), "{first}");
    sqlx::query(&sql(EXPIRE))
        .execute(store.pool())
        .await
        .unwrap();
    let second = runner.run_pass().await;

    assert_eq!(
        *host.stale_applied.lock().unwrap(),
        Some(false),
        "the first claim's late finish was recorded while the second claim held the effect"
    );
    let after = store.find_effect("k").await.unwrap().unwrap();
    assert_eq!(
        (after.claimed_from, after.reference.as_deref()),
        (EffectState::Done, Some("task-1")),
        "{second}"
    );
    assert_eq!(
        (
            second.claimed,
            second.count(EffectState::Done),
            second.claims_lost
        ),
        (1, 1, 0),
        "the second claim recorded its own outcome: {second}"
    );
    assert_eq!(
        (
            dest.calls.load(Ordering::SeqCst),
            dest.confirmations.load(Ordering::SeqCst)
        ),
        (2, 1),
        "the second claim asked before it called again"
    );
}

on_both!(
    a_stale_finish_of_an_earlier_claim_is_refused_on_postgres,
    a_stale_finish_of_an_earlier_claim_is_refused_on_sqlite,
    a_stale_finish
);

/// A call whose answer was lost, at a destination whose search lags an hour behind its writes: its effect is
/// uncertain, reconciled no sooner than an hour after the call. A second runner, on a host whose clock is two
/// hours ahead, does not find it due: it would ask the destination before its search can find the call (a
/// "not found" that is no proof) and call it again.
async fn an_uncertain_effect_seen_from_a_clock_ahead<DB: txinbox_store::Backend>(
    store: Store<DB>,
    sql: fn(&str) -> String,
) where
    for<'c> &'c sqlx::Pool<DB>: sqlx::Executor<'c, Database = DB>,
    for<'q> <DB as sqlx::Database>::Arguments<'q>: sqlx::IntoArguments<'q, DB>,
{
    sqlx::query(&sql(PENDING))
        .execute(store.pool())
        .await
        .unwrap();
    let dest = Destination {
        uncertain: Some(Duration::from_secs(3600)),
        ..Destination::default()
    };
    let first = EffectRunner::new(Host::new(store.clone(), chrono::Duration::zero()))
        .executor("crm", dest.clone());
    let report = first.run_pass().await;
    assert_eq!(report.count(EffectState::Uncertain), 1, "{report}");
    let second = EffectRunner::new(Host::new(store.clone(), chrono::Duration::hours(2)))
        .executor("crm", dest.clone());
    let early = second.run_pass().await;
    assert_eq!(
        (
            early.claimed,
            dest.calls.load(Ordering::SeqCst),
            dest.confirmations.load(Ordering::SeqCst)
        ),
        (0, 1, 0),
        "reconciled before its destination could answer for the call: {early}"
    );
}

on_both!(
    an_uncertain_effect_is_not_due_early_for_a_clock_ahead_on_postgres,
    an_uncertain_effect_is_not_due_early_for_a_clock_ahead_on_sqlite,
    an_uncertain_effect_seen_from_a_clock_ahead
);
