//! The inbox keeps a connection whose transaction ended cleanly for the next delivery (sqlx's pool would test
//! it with a round trip on every return). These tests hold it to its rules on a real PostgreSQL: reuse,
//! return when idle, never the pool's last connection, nothing kept after a failure, a connection killed by
//! the server replaced without a retry, and a closed pool gets its connections back.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use txinbox::mem::MemoryQueue;
use txinbox::sqlx;
use txinbox::{Handler, HandlerError, Inbox, Message, Outcome, PgStore, Tx};
use txinbox_e2e::{pg_store, sqlite_store, wait_until, MetricTotals};
use txinbox_lab::lab::{lab_inbox, lab_message, lab_processor, task_handler, LabEvent, CONSUMER};
use txinbox_lab::labdb::LabDb;

/// A handler that records which server backend ran each delivery's transaction, and fails on demand.
fn pid_handler(pids: Arc<Mutex<Vec<i32>>>, fail: bool) -> impl Handler<PgStore, LabEvent> {
    move |tx: Tx<sqlx::Postgres>, _msg: Message<LabEvent>| {
        let pids = pids.clone();
        async move {
            let pid: i32 = sqlx::query_scalar("SELECT pg_backend_pid()")
                .fetch_one(&tx)
                .await?;
            pids.lock().unwrap().push(pid);
            if fail {
                return Err(HandlerError::retry(std::io::Error::other(
                    "downstream busy",
                )));
            }
            Ok(())
        }
    }
}

async fn deliver<H: Handler<PgStore, LabEvent>>(
    inbox: &Inbox<PgStore>,
    q: &MemoryQueue,
    h: &H,
    n: usize,
) -> Outcome {
    q.send(lab_message(n));
    let d = q.receive_now(1).pop().expect("the message just sent");
    inbox.process(d, h).await
}

/// A fresh schema with the lab tables, a store keeping connections for `keep`, its inbox, a recording handler
/// and a queue.
struct Fixture {
    store: PgStore,
    pool: sqlx::PgPool,
    inbox: Inbox<PgStore>,
    pids: Arc<Mutex<Vec<i32>>>,
    q: MemoryQueue,
}

impl Fixture {
    async fn new(max_connections: u32, keep: Duration) -> Self {
        let store = pg_store(max_connections).await.keep_connections(keep);
        let pool = store.pool().clone();
        <sqlx::Postgres as LabDb>::create_tables(&store)
            .await
            .unwrap();
        Self {
            inbox: lab_inbox(store.clone()),
            store,
            pool,
            pids: Arc::new(Mutex::new(Vec::new())),
            q: MemoryQueue::default(),
        }
    }

    fn handler(&self) -> impl Handler<PgStore, LabEvent> {
        pid_handler(self.pids.clone(), false)
    }

    fn pids(&self) -> Vec<i32> {
        self.pids.lock().unwrap().clone()
    }
}

#[tokio::test]
async fn a_kept_connection_serves_the_next_delivery_then_goes_back_when_idle() {
    // The idle limit is long enough that no pause of a loaded machine between two deliveries (or between a
    // delivery and the check after it) reaches it: the connection is still kept when the test looks.
    let f = Fixture::new(4, Duration::from_secs(5)).await;
    let h = f.handler();
    let applied = |o: Outcome| matches!(o, Outcome::Applied { .. });

    assert!(applied(deliver(&f.inbox, &f.q, &h, 0).await));
    assert_eq!(f.store.kept_connections(), 1, "kept after a clean COMMIT");
    let opened = f.pool.size();
    assert!(applied(deliver(&f.inbox, &f.q, &h, 1).await));
    // A duplicate's rollback is clean too: the connection is kept again.
    assert!(matches!(
        deliver(&f.inbox, &f.q, &h, 1).await,
        Outcome::Duplicate { .. }
    ));
    assert_eq!(f.store.kept_connections(), 1);
    assert_eq!(f.pool.size(), opened, "the pool opened nothing more");
    let seen = f.pids();
    assert_eq!(seen.len(), 2);
    assert_eq!(
        seen[0], seen[1],
        "the second delivery ran on the kept connection"
    );

    // Idle past the limit: the sweeper hands it back to the pool.
    wait_until(Duration::from_secs(60), "kept connection returned", || {
        let n = f.store.kept_connections();
        async move { n == 0 }
    })
    .await;
    wait_until(
        Duration::from_secs(60),
        "every connection idle in the pool",
        || {
            let all_idle = f.pool.num_idle() == f.pool.size() as usize;
            async move { all_idle }
        },
    )
    .await;
    f.store.close().await;
}

#[tokio::test]
async fn the_pools_last_connection_is_never_kept() {
    let f = Fixture::new(2, Duration::from_secs(600)).await;
    let h = f.handler();
    for m in 0..2 {
        f.q.send(lab_message(m));
    }
    // Two deliveries at once on a pool of two.
    let ds = f.q.receive_now(2);
    assert_eq!(ds.len(), 2);
    let outcomes = futures::future::join_all(ds.into_iter().map(|d| f.inbox.process(d, &h))).await;
    assert!(
        outcomes
            .iter()
            .all(|o| matches!(o, Outcome::Applied { .. })),
        "{outcomes:?}"
    );
    assert!(
        f.store.kept_connections() <= 1,
        "at most one kept, one left to the pool"
    );
    // The application still gets a connection without waiting for a kept one to be let go (600 s; the pool's
    // own acquire timeout, 10 s, would fail it first): 60 s is only a guard against a hang.
    let conn = tokio::time::timeout(Duration::from_secs(60), f.pool.acquire())
        .await
        .expect("a connection without waiting for the inbox")
        .unwrap();
    drop(conn);
    f.store.close().await;
}

#[tokio::test]
async fn nothing_is_kept_after_a_failure_or_when_keeping_is_off() {
    let f = Fixture::new(4, Duration::from_secs(30)).await;
    let failing = pid_handler(f.pids.clone(), true);
    assert!(matches!(
        deliver(&f.inbox, &f.q, &failing, 0).await,
        Outcome::Retry { .. }
    ));
    assert_eq!(
        f.store.kept_connections(),
        0,
        "a rolled-back failure goes back to the pool"
    );

    let off = lab_inbox(f.store.clone().keep_connections(Duration::ZERO));
    assert!(matches!(
        deliver(&off, &f.q, &f.handler(), 1).await,
        Outcome::Applied { .. }
    ));
    assert_eq!(off.store().kept_connections(), 0);
    f.store.close().await;
}

#[tokio::test]
async fn a_kept_connection_killed_by_the_server_is_replaced_without_a_retry() {
    let (metrics, _guard) = MetricTotals::install_local();
    let f = Fixture::new(4, Duration::from_secs(30)).await;
    let h = f.handler();
    assert!(matches!(
        deliver(&f.inbox, &f.q, &h, 0).await,
        Outcome::Applied { .. }
    ));
    let kept_pid = f.pids()[0];
    let killed: bool = sqlx::query_scalar("SELECT pg_terminate_backend($1)")
        .bind(kept_pid)
        .fetch_one(&f.pool)
        .await
        .unwrap();
    assert!(killed);
    // Give the server a moment to close the socket.
    tokio::time::sleep(Duration::from_millis(100)).await;

    assert!(
        matches!(
            deliver(&f.inbox, &f.q, &h, 1).await,
            Outcome::Applied { .. }
        ),
        "applied on a fresh connection, not released for a retry"
    );
    assert_ne!(f.pids()[1], kept_pid);
    assert_eq!(metrics.counter("txinbox_retries_total", &[]), 0);
    assert_eq!(f.store.inbox_rows(CONSUMER).await.unwrap(), 2);
    f.store.close().await;
}

#[tokio::test]
async fn closing_the_pool_closes_the_kept_connections() {
    let f = Fixture::new(4, Duration::from_secs(600)).await;
    assert!(matches!(
        deliver(&f.inbox, &f.q, &f.handler(), 0).await,
        Outcome::Applied { .. }
    ));
    assert_eq!(f.store.kept_connections(), 1);
    let kept_pid = f.pids()[0];
    // The inbox is still alive; close must not wait on it (for the 600 s of its idle limit: 60 s is a guard
    // against that, far above a loaded machine's close), and the kept connection must not outlive it.
    tokio::time::timeout(Duration::from_secs(60), f.store.close())
        .await
        .expect("Pool::close completes while an inbox keeps a connection");
    wait_until(Duration::from_secs(60), "kept connection released", || {
        let n = f.store.kept_connections();
        async move { n == 0 }
    })
    .await;
    let mut admin = <sqlx::PgConnection as sqlx::Connection>::connect(&txinbox_e2e::pg_url())
        .await
        .unwrap();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    loop {
        let left =
            sqlx::query_scalar::<_, i64>("SELECT count(*) FROM pg_stat_activity WHERE pid = $1")
                .bind(kept_pid)
                .fetch_one(&mut admin)
                .await
                .unwrap();
        if left == 0 {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the kept connection's backend outlived the closed pool (60 s)"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test]
async fn an_in_memory_sqlite_store_keeps_nothing_from_its_single_connection() {
    let store = sqlite_store()
        .await
        .keep_connections(Duration::from_secs(30));
    <sqlx::Sqlite as LabDb>::create_tables(&store)
        .await
        .unwrap();
    let processor = lab_processor(
        store.clone(),
        task_handler::<txinbox::Store<sqlx::Sqlite>>(),
    );
    let q = MemoryQueue::default();
    q.send(lab_message(0));
    let d = q.receive_now(1).pop().unwrap();
    assert!(matches!(
        processor.process_one(d).await,
        Outcome::Applied { .. }
    ));
    assert_eq!(store.kept_connections(), 0);
    assert_eq!(
        <sqlx::Sqlite as LabDb>::count_tasks(&store).await.unwrap(),
        1
    );
}
