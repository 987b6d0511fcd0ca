//! `--shards URL,URL,...`: the worker over shards ([`txinbox_core::runtime::shards`]), one PostgreSQL per URL
//! (`scripts/pg-shards.sh` makes three on this machine). The messages carry tenants `t0`..`t{N-1}` in turn, each
//! shard claiming one; one worker (`--e2e-in-flight`, batch commit `--batch`) drains them from the in-memory
//! broker at `--e2e-round-trip-ms`. For each round, three lines:
//!
//! * `shards=1`: every tenant on the first URL's database (one shard claiming them all): the single-database
//!   figure, routing included;
//! * `shards=N`: each tenant in its own database;
//! * `shards=N one_unavailable`: the same for `--seconds`, with the last shard's check failing, its deliveries
//!   released (as a shard that is down): the rate at which the other shards' messages are applied meanwhile.
//!
//! Each line adds the machine's CPU busy share during the run (from `/proc/stat`, every process: the worker and
//! every PostgreSQL), which tells where the aggregate stops scaling: on a machine whose cores are all busy, more
//! databases cannot add throughput.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use txinbox_core::broker::mem::{MemoryQueue, OutgoingMessage, QueueOptions};
use txinbox_core::runtime::shards::{Shard, ShardOptions, ShardRouter, Shards};
use txinbox_core::{Worker, WorkerOptions};
use txinbox_lab::lab::LabError;
use txinbox_store::Store;

use crate::fixture::{bench_inbox, bench_store, drop_schema, CONSUMER};
use crate::BenchArgs;

/// Busy and total jiffies of the whole machine (`/proc/stat`'s first line).
fn machine_cpu() -> Option<(u64, u64)> {
    let stat = std::fs::read_to_string("/proc/stat").ok()?;
    let line = stat.lines().next()?.strip_prefix("cpu ")?;
    let f: Vec<u64> = line
        .split_whitespace()
        .filter_map(|x| x.parse().ok())
        .collect();
    let total: u64 = f.iter().sum();
    // idle and iowait are the 4th and 5th fields.
    let idle = f.get(3).copied().unwrap_or(0) + f.get(4).copied().unwrap_or(0);
    Some((total - idle, total))
}

fn busy_share(before: Option<(u64, u64)>, after: Option<(u64, u64)>) -> String {
    match (before, after) {
        (Some((b0, t0)), Some((b1, t1))) if t1 > t0 => {
            format!("{:.0}%", (b1 - b0) as f64 / (t1 - t0) as f64 * 100.0)
        }
        _ => "?".into(),
    }
}

/// One database per URL, each a fresh schema with the inbox and the handler's table.
async fn open(
    urls: &[String],
    connections: u32,
) -> Result<Vec<(String, String, Store<sqlx::Postgres>)>, LabError> {
    let mut out = Vec::new();
    for url in urls {
        match bench_store(url, connections).await {
            Ok((schema, store)) => out.push((url.clone(), schema, store)),
            Err(e) => {
                close(out).await;
                return Err(e);
            }
        }
    }
    Ok(out)
}

async fn close(stores: Vec<(String, String, Store<sqlx::Postgres>)>) {
    for (url, schema, store) in stores {
        store.close().await;
        drop_schema(&url, &schema).await;
    }
}

/// Message `k` of tenant `t{k % tenants}`.
fn message(k: u64, tenants: u64) -> OutgoingMessage {
    OutgoingMessage::new(format!(
        "{{\"opportunity\":\"o-{k}\",\"meeting\":\"m-{k}\"}}"
    ))
    .cloudevent("urn.bench", &format!("sh-{k}"), "bench.event")
    .attribute("ce-tenantid", format!("t{}", k % tenants))
}

/// The shards over `stores`: with `one_shard`, the first store claims every tenant; else store `i` claims
/// tenant `t{i}`. `down` makes the last shard's check fail.
fn shards(
    stores: &[(String, String, Store<sqlx::Postgres>)],
    tenants: usize,
    one_shard: bool,
    down: Option<Arc<AtomicBool>>,
) -> Result<
    Shards<
        impl txinbox_core::Processor<
                txinbox_core::LeasedDelivery<txinbox_core::broker::mem::MemoryDelivery>,
            > + Clone,
    >,
    LabError,
> {
    let base = bench_inbox(&stores[0].2)?;
    let last = stores.len() - 1;
    let list = stores.iter().enumerate().map(|(i, (_, _, store))| {
        let claims: Vec<String> = if one_shard {
            (0..tenants).map(|t| format!("t{t}")).collect()
        } else {
            vec![format!("t{i}")]
        };
        let shard = Shard::new(format!("s{i}"), base.on_store(store.clone())).claims(claims);
        match (&down, i == last) {
            (Some(flag), true) => {
                let flag = flag.clone();
                shard.check(move || {
                    let down = flag.load(Ordering::Relaxed);
                    async move {
                        if down {
                            Err("taken down by the benchmark".to_owned())
                        } else {
                            Ok(())
                        }
                    }
                })
            }
            _ => shard,
        }
    });
    Shards::new(ShardRouter::tenant(), list)
        // The default release delays (5 s, doubling): what a shard that is down costs the others.
        .map(|s| s.options(ShardOptions::new().probe_interval(Duration::from_millis(200))))
        .map_err(|e| LabError::Usage(e.to_string()))
}

fn queue(args: &BenchArgs) -> MemoryQueue {
    MemoryQueue::new(
        QueueOptions::default()
            .round_trip(Duration::from_millis(args.e2e_round_trip_ms))
            .wait(Duration::from_millis(20))
            .visibility_timeout(Duration::from_secs(30)),
    )
}

fn options(args: &BenchArgs) -> WorkerOptions {
    WorkerOptions::default()
        .concurrency(args.e2e_in_flight)
        .batch_size(args.e2e_receive_max)
        .batch_commit(args.batch)
}

/// Feeds `n` messages over `tenants` tenants, keeping at most 2,000 waiting (with `visible_only`, 2,000
/// receivable: the released messages of an unavailable shard do not hold the others' back); returns when all
/// are sent.
async fn feed(q: MemoryQueue, n: u64, tenants: u64, visible_only: bool) {
    let mut k = 0;
    while k < n {
        let s = q.state();
        let waiting = if visible_only {
            s.visible
        } else {
            s.visible + s.in_flight + s.delayed
        };
        if waiting < 2_000 {
            for _ in 0..500.min(n - k) {
                q.send(message(k, tenants));
                k += 1;
            }
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
}

/// Drains `n` messages through the shards; messages per second and the machine's busy share.
async fn drain(
    args: &BenchArgs,
    stores: &[(String, String, Store<sqlx::Postgres>)],
    tenants: usize,
    one_shard: bool,
) -> Result<(f64, String), LabError> {
    let n = args.e2e_messages;
    let q = queue(args);
    let processor = shards(stores, tenants, one_shard, None)?;
    let producer = tokio::spawn(feed(q.clone(), n, tenants as u64, false));
    let cpu = machine_cpu();
    let started = Instant::now();
    let q2 = q.clone();
    let stores_done: Vec<Store<sqlx::Postgres>> = stores.iter().map(|s| s.2.clone()).collect();
    let report = Worker::new(q.receiver(), processor)
        .options(options(args))
        .run_until(async move {
            loop {
                let s = q2.state();
                if s.visible + s.in_flight + s.delayed == 0 {
                    let mut rows = 0;
                    for st in &stores_done {
                        rows += st.inbox_rows(CONSUMER).await.unwrap_or(0);
                    }
                    if rows as u64 >= n {
                        return;
                    }
                }
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        })
        .await;
    let secs = started.elapsed().as_secs_f64();
    let busy = busy_share(cpu, machine_cpu());
    let _ = producer.await;
    let applied = report.count(txinbox_core::OutcomeKind::Applied);
    if applied != n {
        return Err(LabError::Usage(format!(
            "shards run: {applied} applied of {n} ({report})"
        )));
    }
    Ok((applied as f64 / secs, busy))
}

/// `--seconds` with the last shard unavailable: the rate at which the other shards' messages are applied.
async fn one_down(
    args: &BenchArgs,
    stores: &[(String, String, Store<sqlx::Postgres>)],
    tenants: usize,
) -> Result<(f64, u64, String), LabError> {
    let q = queue(args);
    let down = Arc::new(AtomicBool::new(true));
    let processor = shards(stores, tenants, false, Some(down))?;
    // Enough for the whole window at any rate this machine reaches.
    let producer = tokio::spawn(feed(q.clone(), 10_000_000, tenants as u64, true));
    let stop = txinbox_core::CancellationToken::new();
    let worker = tokio::spawn(
        Worker::new(q.receiver(), processor)
            .options(options(args))
            .run_until(stop.clone().cancelled_owned()),
    );
    // The first probe marks the shard down; then the window.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let ups = &stores[..stores.len() - 1];
    let mut before = 0;
    for s in ups {
        before += s.2.inbox_rows(CONSUMER).await?;
    }
    let cpu = machine_cpu();
    let started = Instant::now();
    tokio::time::sleep(Duration::from_secs(args.seconds.max(1))).await;
    let mut after = 0;
    for s in ups {
        after += s.2.inbox_rows(CONSUMER).await?;
    }
    let secs = started.elapsed().as_secs_f64();
    let busy = busy_share(cpu, machine_cpu());
    let down_rows = stores[stores.len() - 1].2.inbox_rows(CONSUMER).await?;
    stop.cancel();
    producer.abort();
    let report = worker.await.map_err(|e| LabError::Usage(e.to_string()))?;
    let _ = report;
    Ok(((after - before) as f64 / secs, down_rows as u64, busy))
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// Runs the three lines for `--rounds` rounds and prints the medians.
pub(crate) async fn run(args: &BenchArgs) -> Result<(), LabError> {
    let urls = &args.shards;
    let n = urls.len();
    if n < 2 {
        return Err(LabError::Usage("--shards needs two URLs or more".into()));
    }
    if args.e2e_messages == 0 {
        return Err(LabError::Usage(
            "--shards needs --e2e-messages above 0".into(),
        ));
    }
    let cores = std::thread::available_parallelism().map_or(0, |c| c.get());
    println!(
        "# shards: {} messages per line through one worker (in flight {}, batch commit {}, round trip {} ms, in-memory broker), tenants t0..t{} one per shard; {cores} cores; median of {} rounds",
        args.e2e_messages,
        args.e2e_in_flight,
        args.batch,
        args.e2e_round_trip_ms,
        n - 1,
        args.rounds.max(1)
    );
    let connections = args.e2e_in_flight as u32 + 2;
    let (mut one, mut many, mut down) = (Vec::new(), Vec::new(), Vec::new());
    for round in 0..args.rounds.max(1) {
        // Every schema is dropped, whether the measurement ends well or not.
        let single = open(&urls[..1], connections).await?;
        let r = drain(args, &single, n, true).await;
        close(single).await;
        let (r1, busy1) = r?;
        let all = open(urls, connections).await?;
        let r = drain(args, &all, n, false).await;
        close(all).await;
        let (rn, busyn) = r?;
        let all = open(urls, connections).await?;
        let r = one_down(args, &all, n).await;
        close(all).await;
        let (rd, down_rows, busyd) = r?;
        println!(
            "# round {round}: shards=1 {r1:.0} msg/s (cpu busy {busy1}); shards={n} {rn:.0} msg/s (cpu busy {busyn}); shards={n} one_unavailable: the others {rd:.0} msg/s (cpu busy {busyd}), the unavailable shard applied {down_rows}"
        );
        one.push(r1);
        many.push(rn);
        down.push(rd);
    }
    let (r1, rn, rd) = (median(one), median(many), median(down));
    println!("shards=1 msgs_per_s={r1:.0}");
    println!("shards={n} msgs_per_s={rn:.0} vs_one={:.2}", rn / r1);
    println!(
        "shards={n} one_unavailable others_msgs_per_s={rd:.0} vs_their_share_with_all_up={:.2}",
        rd / (rn * (n - 1) as f64 / n as f64)
    );
    Ok(())
}
