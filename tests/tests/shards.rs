//! Shards on PostgreSQL: one worker, three stores (three schemas of the test database, each with its own pool and
//! business table), tenants routed by `ce-tenantid`. Each case checks where every marker and business row landed,
//! the broker (what was acknowledged, released, dead-lettered with which reason), and the metrics.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use txinbox::health::Health;
use txinbox::mem::{MemoryQueue, OutgoingMessage, QueueOptions};
use txinbox::shards::{Shard, ShardConfigError, ShardOptions, ShardRouter, Shards};
use txinbox::{
    sqlx, ConsumerName, Handler, IdentityPolicy, Inbox, InboxProcessor, Message, PgStore, Worker,
    WorkerOptions,
};
use txinbox_e2e::{pg_store, wait_until, MetricTotals};

const CONSUMER: &str = "crm-followup";

/// A shard's store: a fresh schema with the inbox and the business table (one task per message).
async fn shard_store() -> PgStore {
    let store = pg_store(4).await;
    sqlx::query("CREATE TABLE tasks (message_id TEXT PRIMARY KEY, tenant TEXT NOT NULL)")
        .execute(store.pool())
        .await
        .unwrap();
    store
}

/// The handler of every shard: one task row per message, with the tenant the message carries.
fn follow_up(
    store: PgStore,
) -> InboxProcessor<PgStore, serde_json::Value, impl Handler<PgStore, serde_json::Value>> {
    Inbox::new(
        store,
        IdentityPolicy::new(ConsumerName::new(CONSUMER).unwrap()),
    )
    .retry_backoff(Duration::from_millis(20))
    .bind(|tx, msg: Message<serde_json::Value>| async move {
        sqlx::query("INSERT INTO tasks (message_id, tenant) VALUES ($1, $2)")
            .bind(msg.id().to_owned())
            .bind(msg.identity.tenant_id.clone().unwrap_or_default())
            .execute(&tx)
            .await?;
        Ok(())
    })
}

/// Tasks of a store, by tenant: (tenant, count).
async fn tasks(store: &PgStore) -> Vec<(String, i64)> {
    sqlx::query_as("SELECT tenant, count(*) FROM tasks GROUP BY tenant ORDER BY tenant")
        .fetch_all(store.pool())
        .await
        .unwrap()
}

/// Message `n` of `tenant` (or of no tenant).
fn event(tenant: Option<&str>, n: usize) -> OutgoingMessage {
    let t = tenant.unwrap_or("none");
    let m = OutgoingMessage::new(format!(r#"{{"meeting":"{t}-{n}"}}"#)).cloudevent(
        "crm",
        &format!("{t}-{n}"),
        "meeting.ended",
    );
    match tenant {
        Some(t) => m.attribute("ce-tenantid", t),
        None => m,
    }
}

async fn drained(q: &MemoryQueue) -> bool {
    let s = q.state();
    s.visible + s.delayed + s.in_flight == 0
}

/// Three tenants on three shards, each message sent twice, a tenant no shard claims and a message without a
/// tenant: every message is applied once, in its tenant's shard; the other two are dead-lettered `no_shard`.
async fn each_tenant_in_its_shard(batch: usize) {
    let (a, b, c) = (
        shard_store().await,
        shard_store().await,
        shard_store().await,
    );
    let base = follow_up(a.clone());
    let shards = Shards::new(
        ShardRouter::tenant(),
        [
            Shard::new("a", base.on_store(a.clone()))
                .claims(["acme"])
                .check(a.clone()),
            Shard::new("b", base.on_store(b.clone()))
                .claims(["globex", "hooli"])
                .check(b.clone()),
            Shard::new("c", base.on_store(c.clone()))
                .claims(["initech"])
                .check(c.clone()),
        ],
    )
    .unwrap();
    let q = MemoryQueue::new(QueueOptions::default().wait(Duration::from_millis(20)));
    for copy in 0..2 {
        for n in 0..5 {
            for t in ["acme", "globex", "hooli", "initech"] {
                q.send(event(Some(t), n));
            }
        }
        let _ = copy;
    }
    q.send(event(Some("umbrella"), 0));
    q.send(event(None, 0));
    let q2 = q.clone();
    let report = Worker::new(q.receiver(), shards)
        .options(WorkerOptions::default().concurrency(8).batch_commit(batch))
        .run_until(async move {
            wait_until(Duration::from_secs(30), "the queue drained", || {
                drained(&q2)
            })
            .await
        })
        .await;
    assert!(report.gave_up.is_none(), "{report}");
    assert_eq!(tasks(&a).await, vec![("acme".into(), 5)]);
    assert_eq!(
        tasks(&b).await,
        vec![("globex".into(), 5), ("hooli".into(), 5)]
    );
    assert_eq!(tasks(&c).await, vec![("initech".into(), 5)]);
    assert_eq!(a.inbox_rows(CONSUMER).await.unwrap(), 5);
    assert_eq!(b.inbox_rows(CONSUMER).await.unwrap(), 10);
    assert_eq!(c.inbox_rows(CONSUMER).await.unwrap(), 5);
    let dead = q.dead_letters();
    assert_eq!(dead.len(), 2, "{dead:?}");
    assert!(
        dead.iter().all(|(_, why)| why.reason == "no_shard"),
        "{dead:?}"
    );
    assert!(
        dead.iter()
            .any(|(_, why)| why.detail.contains("\"umbrella\"")),
        "the detail names the tenant no shard claims: {dead:?}"
    );
    assert!(
        dead.iter()
            .any(|(_, why)| why.detail.contains("has no tenant")),
        "{dead:?}"
    );
    assert_eq!(report.total(), 42, "{report}");
}

#[tokio::test]
async fn every_delivery_is_applied_once_in_its_tenant_s_shard() {
    each_tenant_in_its_shard(1).await;
}

#[tokio::test]
async fn a_batch_is_split_by_shard_and_each_part_commits_in_its_own_store() {
    each_tenant_in_its_shard(10).await;
}

#[tokio::test]
async fn the_shard_that_takes_the_rest_gets_unclaimed_tenants_and_untenanted_messages() {
    let (a, rest) = (shard_store().await, shard_store().await);
    let base = follow_up(a.clone());
    let shards = Shards::new(
        ShardRouter::tenant(),
        [
            Shard::new("a", base.on_store(a.clone())).claims(["acme"]),
            Shard::new("rest", base.on_store(rest.clone())).rest(),
        ],
    )
    .unwrap();
    let q = MemoryQueue::new(QueueOptions::default().wait(Duration::from_millis(20)));
    q.send(event(Some("acme"), 0));
    q.send(event(Some("umbrella"), 0));
    q.send(event(None, 0));
    let q2 = q.clone();
    let report = Worker::new(q.receiver(), shards)
        .run_until(async move {
            wait_until(Duration::from_secs(30), "the queue drained", || {
                drained(&q2)
            })
            .await
        })
        .await;
    assert_eq!(report.total(), 3, "{report}");
    assert_eq!(tasks(&a).await, vec![("acme".into(), 1)]);
    assert_eq!(
        tasks(&rest).await,
        vec![("".into(), 1), ("umbrella".into(), 1)]
    );
    assert!(q.dead_letters().is_empty());
}

/// Shard b is unavailable (its check fails): its deliveries are released without touching its store, the
/// other shards' deliveries are applied meanwhile, readiness names shard b, and once it answers again its
/// deliveries are applied too.
#[tokio::test(flavor = "current_thread")]
async fn a_shard_that_is_down_delays_only_its_own_messages() {
    let (metrics, _guard) = MetricTotals::install_local();
    let (a, b) = (shard_store().await, shard_store().await);
    let b_down = Arc::new(AtomicBool::new(true));
    let base = follow_up(a.clone());
    let flag = b_down.clone();
    let b_check = b.clone();
    let shards = Shards::new(
        ShardRouter::tenant(),
        [
            Shard::new("a", base.on_store(a.clone()))
                .claims(["acme"])
                .check(a.clone()),
            Shard::new("b", base.on_store(b.clone()))
                .claims(["globex"])
                .check(move || {
                    let (down, store) = (flag.load(Ordering::SeqCst), b_check.clone());
                    async move {
                        if down {
                            return Err("connection refused (the test took shard b down)".into());
                        }
                        txinbox::health::HealthCheck::check(&store).await
                    }
                }),
        ],
    )
    .unwrap()
    .options(
        ShardOptions::new()
            .probe_interval(Duration::from_millis(100))
            .unavailable_backoff(Duration::from_millis(50))
            .unavailable_backoff_max(Duration::from_millis(100)),
    );
    let down_now = shards.probe().await;
    assert_eq!(down_now.len(), 1, "{down_now:?}");
    assert_eq!(down_now[0].name, "b");
    // Readiness names shard b; it stays true while shard a answers (the worker goes on for it). The worker
    // line fails here only because no worker has started on this handle.
    let ready = shards.health(Health::new()).readiness().await;
    let body = ready.to_string();
    assert!(
        body.contains("degraded shard b: connection refused"),
        "{body}"
    );
    assert!(body.contains("ok shard a"), "{body}");
    assert!(body.contains("ok shards"), "{body}");
    assert!(
        ready
            .checks
            .iter()
            .all(|c| c.ok || !c.required || c.name == "worker"),
        "{body}"
    );

    let q = MemoryQueue::new(QueueOptions::default().wait(Duration::from_millis(20)));
    for n in 0..10 {
        q.send(event(Some("acme"), n));
        q.send(event(Some("globex"), n));
    }
    let (q2, a2, b2, flag) = (q.clone(), a.clone(), b.clone(), b_down.clone());
    let status = shards.clone();
    let report = Worker::new(q.receiver(), shards)
        .options(WorkerOptions::default().concurrency(4))
        .run_until(async move {
            wait_until(
                Duration::from_secs(30),
                "shard a's messages applied",
                || async { a2.inbox_rows(CONSUMER).await.unwrap() == 10 },
            )
            .await;
            // A delivery is acknowledged after its commit, so a's last ones may still be in flight when its
            // tenth marker is visible: wait for their acks. Then only shard b's messages are in the queue,
            // released and received again, none applied (one of b's acknowledged would be lost, which the
            // count of b's tasks at the end catches).
            wait_until(
                Duration::from_secs(30),
                "shard a's deliveries acknowledged, shard b's still queued",
                || async {
                    let s = q2.state();
                    s.visible + s.delayed + s.in_flight == 10
                },
            )
            .await;
            assert_eq!(b2.inbox_rows(CONSUMER).await.unwrap(), 0);
            assert!(q2.dead_letters().is_empty());
            flag.store(false, Ordering::SeqCst);
            wait_until(Duration::from_secs(30), "the queue drained", || {
                drained(&q2)
            })
            .await
        })
        .await;
    assert!(report.gave_up.is_none(), "{report}");
    assert!(status.status().iter().all(|s| s.down.is_none()));
    assert_eq!(tasks(&a).await, vec![("acme".into(), 10)]);
    assert_eq!(tasks(&b).await, vec![("globex".into(), 10)]);
    assert!(q.dead_letters().is_empty());
    let released = metrics.counter(
        "txinbox_shard_unavailable_total",
        &[("consumer", CONSUMER), ("shard", "b")],
    );
    assert!(
        released >= 10,
        "every delivery of shard b was released at least once: {released}"
    );
    assert_eq!(
        metrics.counter(
            "txinbox_shard_unavailable_total",
            &[("consumer", CONSUMER), ("shard", "a")],
        ),
        0
    );
}

#[test]
fn a_tenant_claimed_twice_or_two_rests_are_refused_with_one_line() {
    let p = |n: &str| Shard::new(n, ());
    let e = Shards::new(
        ShardRouter::tenant(),
        [p("eu-1").claims(["acme"]), p("eu-2").claims(["acme"])],
    )
    .unwrap_err();
    assert_eq!(
        e,
        ShardConfigError::ClaimedTwice {
            key: "acme".into(),
            first: "eu-1".into(),
            second: "eu-2".into()
        }
    );
    assert_eq!(
        e.to_string(),
        r#"tenant "acme" is claimed by shard "eu-1" and by shard "eu-2""#
    );
    let e = Shards::new(ShardRouter::tenant(), [p("x").rest(), p("y").rest()]).unwrap_err();
    assert!(matches!(e, ShardConfigError::TwoRests { .. }), "{e}");
    let e = Shards::new(ShardRouter::tenant(), [p("x")]).unwrap_err();
    assert_eq!(e, ShardConfigError::ClaimsNothing("x".into()));
    let e = Shards::new(ShardRouter::tenant(), [p("x").rest(), p("x").claims(["a"])]).unwrap_err();
    assert_eq!(e, ShardConfigError::DuplicateName("x".into()));
    let e = Shards::new(ShardRouter::tenant(), [p("eu 1").rest()]).unwrap_err();
    assert!(matches!(e, ShardConfigError::InvalidName(_)), "{e}");
    let e = Shards::<()>::new(ShardRouter::tenant(), []).unwrap_err();
    assert_eq!(e, ShardConfigError::NoShards);
}

/// Several consumers in one process, under one `Monitor`: `crm-followup` and `billing` share one store, `audit`
/// has a store of its own; each reads its own queue. The same event reaches all three: each consumer applies
/// it once, under its own consumer name, and a copy sent again is a duplicate for each.
#[tokio::test]
async fn several_consumers_in_one_process_share_or_split_stores() {
    let (shared, own) = (pg_store(4).await, pg_store(4).await);
    for s in [&shared, &own] {
        sqlx::query("CREATE TABLE seen (consumer TEXT NOT NULL, message_id TEXT NOT NULL, PRIMARY KEY (consumer, message_id))")
            .execute(s.pool())
            .await
            .unwrap();
    }
    let consumer = |store: &PgStore, name: &'static str| {
        Inbox::new(
            store.clone(),
            IdentityPolicy::new(ConsumerName::new(name).unwrap()),
        )
        .bind(move |tx, msg: Message<serde_json::Value>| async move {
            sqlx::query("INSERT INTO seen (consumer, message_id) VALUES ($1, $2)")
                .bind(name)
                .bind(msg.id().to_owned())
                .execute(&tx)
                .await?;
            Ok(())
        })
    };
    let queues: Vec<MemoryQueue> = (0..3)
        .map(|_| MemoryQueue::new(QueueOptions::default().wait(Duration::from_millis(20))))
        .collect();
    for q in &queues {
        for n in 0..5 {
            q.send(event(Some("acme"), n));
            q.send(event(Some("acme"), n));
        }
    }
    let watch = queues.clone();
    let report = txinbox::Monitor::new()
        .worker(Worker::new(
            queues[0].receiver(),
            consumer(&shared, "crm-followup"),
        ))
        .worker(Worker::new(
            queues[1].receiver(),
            consumer(&shared, "billing"),
        ))
        .worker(Worker::new(queues[2].receiver(), consumer(&own, "audit")))
        .run_until(async move {
            for q in &watch {
                wait_until(Duration::from_secs(30), "every queue drained", || {
                    drained(q)
                })
                .await;
            }
        })
        .await;
    assert!(report.ok(), "{report}");
    assert_eq!(report.workers.len(), 3);
    for w in &report.workers {
        assert_eq!(w.count(txinbox::OutcomeKind::Applied), 5, "{report}");
        assert_eq!(w.count(txinbox::OutcomeKind::Duplicate), 5, "{report}");
    }
    let seen = |s: PgStore| async move {
        sqlx::query_as::<_, (String, i64)>(
            "SELECT consumer, count(*) FROM seen GROUP BY consumer ORDER BY consumer",
        )
        .fetch_all(s.pool())
        .await
        .unwrap()
    };
    assert_eq!(
        seen(shared.clone()).await,
        vec![("billing".into(), 5), ("crm-followup".into(), 5)]
    );
    assert_eq!(seen(own.clone()).await, vec![("audit".into(), 5)]);
    for (store, name, rows) in [
        (&shared, "crm-followup", 5),
        (&shared, "billing", 5),
        (&own, "audit", 5),
    ] {
        assert_eq!(store.inbox_rows(name).await.unwrap(), rows, "{name}");
    }
    assert_eq!(shared.inbox_rows("audit").await.unwrap(), 0);
}
