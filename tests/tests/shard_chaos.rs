//! The CRM follow-up example on three shards (three PostgreSQL clusters of the test command's own,
//! `scripts/pg-shards.sh`; the test command makes six, one set of three per broker, so that the two scenarios run
//! side by side without sharing a cluster that the other crashes), with an external CRM, under kill -9 and a shard outage: for each broker, `MEETINGS`
//! meetings of each of three tenants are published, each tenant claimed by one shard. The worker (its effect
//! runners in the same process, one per shard) is started and killed with SIGKILL `KILLS` times; shard 2's cluster
//! is down when the first workers start (unreachable at start: they start for the other two), comes back, and is
//! crashed (`pg_ctl -m immediate`) and started again under a running worker. A last worker runs until every
//! follow-up exists and is stopped with SIGTERM.
//!
//! At the end each shard holds exactly its own tenant's tasks and markers, one per meeting (0 lost, 0 doubled,
//! none in another tenant's shard), every effect of every shard is done, the CRM holds one task per meeting, and
//! the broker dead-lettered nothing. While shard 2 was down, the other shards' meetings were applied (they are
//! counted, not timed). The kill moments come from a seed printed at the start (`TXINBOX_CHAOS_SEED` replays one).

mod common_procs;

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use common_procs::*;
use txinbox::sqlx::{self, Connection};
use txinbox_crm_api::CrmApi;

/// Meetings published per tenant and broker.
const MEETINGS: usize = 10;
/// The tenants, claimed by shards s1, s2 and s3 in this order.
const TENANTS: [&str; 3] = ["acme", "globex", "initech"];
/// SIGKILLs per broker.
const KILLS: usize = 6;
/// The receives after which a broker dead-letters a message: the kills (see `agent_chaos.rs`) and shard 2's
/// outage (each of its deliveries is released once per `unavailable_backoff` while it is down) together stay far
/// below it.
const MAX_RECEIVES: usize = 60;

/// The clusters each scenario needs: `scripts/pg-shards.sh` makes `SETS * 3` (`SHARDS=6`, as the test command
/// starts it), and scenario `set` takes clusters `3 * set .. 3 * set + 3`.
const SETS: usize = 2;

/// Three clusters of `scripts/pg-shards.sh`: one scenario's shards.
struct Clusters {
    urls: Vec<String>,
    data: Vec<String>,
    pg_ctl: String,
}

impl Clusters {
    /// Set `set` (0 or 1) of the clusters in the environment.
    fn from_env(set: usize) -> Self {
        let var = |name: &str| {
            std::env::var(name).unwrap_or_else(|_| {
                panic!("{name} is not set: start the shards' PostgreSQL clusters with `eval \"$(bash scripts/pg-shards.sh start)\"` (scripts/test.sh does)")
            })
        };
        let split = |v: String| v.split(',').map(str::to_owned).collect::<Vec<_>>();
        let (urls, data) = (
            split(var("TXINBOX_SHARD_PG_URLS")),
            split(var("TXINBOX_SHARD_PG_DATA")),
        );
        assert!(
            urls.len() == 3 * SETS && data.len() == 3 * SETS,
            "the shard scenarios need {} clusters, one set of three each, and the environment names {}: start them with `eval \"$(SHARDS={} bash scripts/pg-shards.sh start)\"` (scripts/test.sh does)",
            3 * SETS,
            urls.len(),
            3 * SETS
        );
        let mine = 3 * set..3 * set + 3;
        Self {
            urls: urls[mine.clone()].to_vec(),
            data: data[mine].to_vec(),
            pg_ctl: var("TXINBOX_SHARD_PG_CTL"),
        }
    }

    /// `pg_ctl` on cluster `i` as the postgres user.
    async fn pg_ctl(&self, i: usize, args: &[&str]) {
        let out = tokio::process::Command::new("runuser")
            .args(["-u", "postgres", "--", &self.pg_ctl, "-D", &self.data[i]])
            .args(args)
            .output()
            .await
            .expect("runuser pg_ctl");
        assert!(
            out.status.success(),
            "pg_ctl {args:?} on shard {}: {}",
            i + 1,
            String::from_utf8_lossy(&out.stderr)
        );
    }

    /// Crashes cluster `i`: no shutdown checkpoint, every connection cut; the next start recovers.
    async fn crash(&self, i: usize) {
        self.pg_ctl(i, &["-m", "immediate", "stop"]).await;
    }

    /// Starts cluster `i` again (its port is in its configuration; its log in its data directory, so that
    /// the server holds no pipe of ours).
    async fn start(&self, i: usize) {
        let log = format!("{}/log", self.data[i]);
        self.pg_ctl(i, &["-l", &log, "-w", "-t", "60", "start"])
            .await;
    }

    /// A fresh database on each cluster; their URLs.
    async fn fresh_databases(&self) -> Vec<String> {
        let mut out = Vec::new();
        for url in &self.urls {
            let name = unique("chaos").replace('-', "_");
            let mut c = sqlx::PgConnection::connect(url)
                .await
                .unwrap_or_else(|e| panic!("shard cluster {url}: {e}"));
            sqlx::query(&format!("CREATE DATABASE {name}"))
                .execute(&mut c)
                .await
                .unwrap();
            let _ = c.close().await;
            out.push(pg_url_with(url, None, &name));
        }
        out
    }
}

/// What one shard's database holds: task ids, markers, effects by state.
async fn shard_state(url: &str) -> Option<(Vec<String>, i64, String)> {
    let mut c = sqlx::PgConnection::connect(url).await.ok()?;
    let tasks: Vec<String> =
        sqlx::query_scalar("SELECT task_id FROM crm_followup_tasks ORDER BY task_id")
            .fetch_all(&mut c)
            .await
            .ok()?;
    let markers: i64 = sqlx::query_scalar("SELECT count(*) FROM txinbox_inbox")
        .fetch_one(&mut c)
        .await
        .ok()?;
    let states: Vec<(String, i64)> =
        sqlx::query_as("SELECT state, count(*) FROM txinbox_effects GROUP BY state ORDER BY state")
            .fetch_all(&mut c)
            .await
            .ok()?;
    let _ = c.close().await;
    let states = states
        .iter()
        .map(|(s, n)| format!("{s}={n}"))
        .collect::<Vec<_>>()
        .join(" ");
    Some((tasks, markers, states))
}

/// The task a meeting of `tenant` creates.
fn task_id(prefix: &str, tenant: &str, i: usize) -> String {
    format!("followup-{prefix}{tenant}_op_{i}-m_{i}")
}

/// The settings file: three shards, one tenant each, the CRM as the effects' destination (by `--crm-url`).
fn settings(dir: &Path, urls: &[String]) -> std::path::PathBuf {
    let mut toml =
        String::from("[worker]\nconsumer = \"crm-followup\"\n[store]\nmax_connections = 4\n");
    for (i, (url, tenant)) in urls.iter().zip(TENANTS).enumerate() {
        toml.push_str(&format!(
            "[store.shards.s{}]\nurl = \"{url}\"\ntenants = [\"{tenant}\"]\n",
            i + 1
        ));
    }
    let path = dir.join("worker.toml");
    std::fs::write(&path, toml).unwrap();
    path
}

/// Tasks on shards 1 and 3 (`dbs[0]`, `dbs[2]`), once there is one; polled while `w` runs (at most 60 s).
async fn applied_elsewhere(name: &str, dbs: &[String], w: &mut Proc) -> usize {
    let deadline = Deadline::after(Duration::from_secs(60));
    loop {
        let (s1, s3) = (shard_state(&dbs[0]).await, shard_state(&dbs[2]).await);
        let n = s1.map_or(0, |s| s.0.len()) + s3.map_or(0, |s| s.0.len());
        if n > 0 {
            return n;
        }
        w.assert_running();
        assert!(
            !deadline.passed(),
            "{name}: while shard 2 was down, the other shards applied nothing (60 s):\n{}",
            w.tail()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[allow(clippy::too_many_arguments)]
async fn chaos(
    name: &str,
    dir: &Path,
    clusters: &Clusters,
    dbs: &[String],
    crm: &CrmApi,
    prefix: &str,
    worker: &str,
    args: &[&str],
    env: &[(&str, String)],
    dead_letters: &impl DeadLetters,
    seed: u64,
) {
    let config = settings(dir, dbs);
    let crm_url = crm.url();
    let config_arg = config.display().to_string();
    let mut all: Vec<&str> = args.to_vec();
    all.extend(["--config", &config_arg, "--crm-url", &crm_url]);
    let mut rng = Rng(seed);

    // Shard 2 is down when the first workers start: they start for shards 1 and 3.
    clusters.crash(1).await;
    let mut applied_elsewhere_during_outage = 0;
    for i in 1..=KILLS {
        if i == 3 {
            clusters.start(1).await;
        }
        let mut w = ready_worker(dir, &format!("{name}-{i}"), worker, &all, env, &http()).await;
        if i == 2 {
            // The last worker of the outage: the other shards' meetings are applied while shard 2 is down. Counted,
            // not timed: this worker runs until shards 1 and 3 hold a task, however slow the machine (two workers
            // killed 50-900 ms after their readiness may apply nothing on a loaded one).
            applied_elsewhere_during_outage = applied_elsewhere(name, dbs, &mut w).await;
        }
        if i == 4 {
            // Shard 2 crashes under a running worker and comes back.
            tokio::time::sleep(rng.millis(50, 400)).await;
            clusters.crash(1).await;
            tokio::time::sleep(rng.millis(200, 1200)).await;
            clusters.start(1).await;
        }
        tokio::time::sleep(rng.millis(50, 900)).await;
        w.sigkill().await;
        println!(
            "shard-chaos: {name}: after kill -9 #{i}: {} tasks at the CRM",
            crm.tasks().len()
        );
    }
    let total = MEETINGS * TENANTS.len();
    // Ready (so its SIGTERM handler is installed) before the loop below, which ends at once when the killed
    // workers already applied everything: a SIGTERM in the last worker's start-up would end it by the signal.
    let mut last = ready_worker(dir, &format!("{name}-final"), worker, &all, env, &http()).await;
    let deadline = Deadline::after(Duration::from_secs(240));
    let done = format!("done={MEETINGS}");
    loop {
        let mut finished = crm.tasks().len() >= total;
        for db in dbs {
            finished &= shard_state(db)
                .await
                .is_some_and(|(tasks, _, states)| tasks.len() == MEETINGS && states == done);
        }
        if finished {
            break;
        }
        let dead = dead_letters.count().await;
        assert_eq!(
            dead, 0,
            "{name}: the broker dead-lettered {dead} message(s)"
        );
        last.assert_running();
        assert!(
            !deadline.passed(),
            "{name}: after 240 s, {} tasks at the CRM; shards {:?}:\n{}",
            crm.tasks().len(),
            futures::future::join_all(dbs.iter().map(|d| shard_state(d))).await,
            last.tail()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    tokio::time::sleep(Duration::from_secs(1)).await;
    last.stop_cleanly().await;

    for (s, (db, tenant)) in dbs.iter().zip(TENANTS).enumerate() {
        let (tasks, markers, states) = shard_state(db).await.expect("the shard answers");
        let want: Vec<String> = {
            let mut v: Vec<String> = (0..MEETINGS).map(|i| task_id(prefix, tenant, i)).collect();
            v.sort();
            v
        };
        assert_eq!(
            tasks,
            want,
            "{name}: shard s{} holds exactly {tenant}'s tasks",
            s + 1
        );
        assert_eq!(
            markers,
            MEETINGS as i64,
            "{name}: markers of shard s{}",
            s + 1
        );
        assert_eq!(states, done, "{name}: effects of shard s{}", s + 1);
    }
    let mut by_ref: BTreeMap<Option<String>, usize> = BTreeMap::new();
    for t in crm.tasks() {
        *by_ref.entry(t.external_ref).or_default() += 1;
    }
    for tenant in TENANTS {
        for i in 0..MEETINGS {
            let r = task_id(prefix, tenant, i);
            assert_eq!(
                by_ref.get(&Some(r.clone())).copied(),
                Some(1),
                "{name}: CRM tasks for {r}"
            );
        }
    }
    assert_eq!(crm.tasks().len(), total, "{name}: {by_ref:?}");
    assert_eq!(dead_letters.count().await, 0, "{name}: dead letters");
    println!(
        "shard-chaos: {name} ok: {KILLS} x kill -9, shard 2 down at start and crashed once under a worker; {total} tasks, each in its tenant's shard and once at the CRM; {applied_elsewhere_during_outage} applied on shards 1 and 3 while shard 2 was down"
    );
}

async fn crm() -> CrmApi {
    CrmApi::builder()
        .latency(Duration::from_millis(100))
        .start()
        .await
        .expect("the CRM API starts")
}

/// `producer` once per meeting of every tenant (the queue created by the first).
async fn publish(
    dir: &Path,
    producer: &str,
    env: &[(&str, String)],
    prefix: &str,
    first: &[&str],
    queue: &[&str],
) {
    let mut n = 0;
    for tenant in TENANTS {
        for i in 0..MEETINGS {
            let (op, m) = (format!("{prefix}{tenant}_op_{i}"), format!("m_{i}"));
            let mut args = queue.to_vec();
            args.extend(["--opportunity", &op, "--meeting", &m, "--tenant", tenant]);
            if n == 0 {
                args.extend(first);
            }
            run(dir, &format!("producer-{n}"), producer, &args, env).await;
            n += 1;
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqs_agent_on_three_shards_under_kill_9_and_a_shard_outage() {
    let seed = chaos_seed();
    let clusters = Clusters::from_env(0);
    let dbs = clusters.fresh_databases().await;
    let endpoint = sqs_endpoint();
    let env = sqs_env(&endpoint);
    let work = WorkDir::new("txinbox-shard-chaos-sqs");
    let dir = work.path();
    let crm = crm().await;
    let q = unique("shard-chaos");
    let max = MAX_RECEIVES.to_string();
    publish(
        dir,
        "sqs-producer",
        &env,
        "",
        &["--create", "--max-receive-count", &max],
        &["--queue-name", &q],
    )
    .await;
    let client = sqs_client(&endpoint);
    let url = sqs_queue_url(&client, &format!("{q}.fifo")).await;
    let dlq = SqsDlq {
        url: sqs_queue_url(&client, &format!("{q}-dlq.fifo")).await,
        client,
    };
    chaos(
        "sqs",
        dir,
        &clusters,
        &dbs,
        &crm,
        "",
        "sqs-crm-worker",
        &[
            "--queue-url",
            &url,
            "--visibility-timeout",
            "2",
            "--concurrency",
            "4",
        ],
        &env,
        &dlq,
        seed,
    )
    .await;
    crm.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn servicebus_agent_on_three_shards_under_kill_9_and_a_shard_outage() {
    let seed = chaos_seed();
    let clusters = Clusters::from_env(1);
    let dbs = clusters.fresh_databases().await;
    let (emulator, env) = service_bus("txinbox-shards").await;
    let work = WorkDir::new("txinbox-shard-chaos-sb");
    let dir = work.path();
    let crm = crm().await;
    let q = unique("shard-chaos-sb");
    let max = MAX_RECEIVES.to_string();
    publish(
        dir,
        "servicebus-producer",
        &env,
        "sb_",
        &[
            "--create-on-emulator",
            "--lock-secs",
            "3",
            "--max-delivery-count",
            &max,
        ],
        &["--queue", &q],
    )
    .await;
    let poison = format!("{q}-poison");
    let dead = ServiceBusDlq {
        emulator: &emulator,
        queue: q.clone(),
    };
    chaos(
        "servicebus",
        dir,
        &clusters,
        &dbs,
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
            "4",
        ],
        &env,
        &dead,
        seed.wrapping_add(1),
    )
    .await;
    crm.shutdown().await;
    emulator.shutdown().await;
}
