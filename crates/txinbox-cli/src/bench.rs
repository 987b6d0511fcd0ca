//! `txinbox bench`: what the inbox costs on PostgreSQL.
//!
//! At each concurrency, for `--seconds` each, it measures:
//! * `bare`: the handler alone in a transaction (`BEGIN; INSERT business row; COMMIT`);
//! * `inbox`: the same handler through [`txinbox_store::Inbox`] (identity, fingerprint, marker insert, handler,
//!   COMMIT, settle on a no-op delivery so that no broker cost is counted);
//! * `inbox_dup`: the inbox on a stream where 9 of 10 deliveries are duplicates of applied messages;
//! * `pgbench_inbox`: `pgbench -M prepared` running exactly the SQL the inbox issues on the apply path
//!   (`BEGIN`, the marker insert [`txinbox_store::postgres::INSERT_MARKER`], the business insert, `COMMIT`),
//!   the measure of what the database itself allows.
//!
//! Figures are messages (or transactions) per second. The target is `inbox/pgbench >= 0.80`.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::future::BoxFuture;
use txinbox::{
    BrokerError, ConsumerName, DeadLetter, Delivery, HandlerError, IdentityPolicy, Lease,
    ReceivedMessage,
};
use txinbox_store::{db_error, handler_fn, Handled, Inbox, Store};

use crate::lab::LabError;

/// Arguments of `txinbox bench`.
#[derive(Debug, clap::Args)]
pub struct BenchArgs {
    /// PostgreSQL URL (the benchmark works in its own schema, dropped at the end).
    #[arg(long, env = "TXINBOX_BENCH_STORE_URL")]
    pub store: String,
    /// Seconds per measurement.
    #[arg(long, default_value_t = 5)]
    pub seconds: u64,
    /// Concurrency levels, comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "1,8,32")]
    pub concurrency: Vec<usize>,
    /// The pgbench binary.
    #[arg(long, default_value = "pgbench")]
    pub pgbench: String,
}

const CONSUMER: &str = "bench";
const BUSINESS_INSERT: &str = "INSERT INTO bench_tasks (task_id, message_id) VALUES ($1, $2)";

/// A delivery whose settles cost nothing: the benchmark measures the library and the database only.
struct NoopDelivery(ReceivedMessage);

impl Delivery for NoopDelivery {
    fn message(&self) -> &ReceivedMessage {
        &self.0
    }
    async fn ack(self) -> Result<(), BrokerError> {
        Ok(())
    }
    async fn release(self, _: Duration) -> Result<(), BrokerError> {
        Ok(())
    }
    async fn dead_letter(self, _: DeadLetter) -> Result<(), BrokerError> {
        Ok(())
    }
    fn lease(&self) -> Option<Arc<dyn Lease>> {
        None
    }
}

fn message(id: &str, n: u64) -> ReceivedMessage {
    let mut m = ReceivedMessage::new(
        format!("{{\"opportunity\":\"o-{n}\",\"meeting\":\"m-{n}\"}}").into_bytes(),
    );
    m.attributes.insert("ce-id".into(), id.to_owned());
    m.attributes.insert("ce-source".into(), "urn.bench".into());
    m.attributes.insert("ce-type".into(), "bench.event".into());
    m
}

async fn measure<F>(concurrency: usize, seconds: u64, op: F) -> Result<f64, LabError>
where
    F: Fn(usize, u64) -> BoxFuture<'static, Result<(), String>> + Send + Sync + 'static,
{
    let op = Arc::new(op);
    let done = Arc::new(AtomicU64::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let start = Instant::now();
    let mut tasks = Vec::new();
    for t in 0..concurrency {
        let (op, done, stop) = (op.clone(), done.clone(), stop.clone());
        tasks.push(tokio::spawn(async move {
            let mut i = 0u64;
            while !stop.load(Ordering::Relaxed) {
                op(t, i).await?;
                i += 1;
                done.fetch_add(1, Ordering::Relaxed);
            }
            Ok::<(), String>(())
        }));
    }
    tokio::time::sleep(Duration::from_secs(seconds)).await;
    stop.store(true, Ordering::Relaxed);
    for t in tasks {
        t.await
            .map_err(|e| LabError::Usage(e.to_string()))?
            .map_err(LabError::Usage)?;
    }
    Ok(done.load(Ordering::Relaxed) as f64 / start.elapsed().as_secs_f64())
}

async fn reset(pool: &sqlx::PgPool) -> Result<(), LabError> {
    sqlx::Executor::execute(pool, "TRUNCATE txinbox_inbox, bench_tasks").await?;
    Ok(())
}

fn pgbench_script(dir: &std::path::Path) -> Result<std::path::PathBuf, LabError> {
    // Exactly the statements the inbox sends on the apply path, with values of the same shape.
    let marker = txinbox_store::postgres::INSERT_MARKER
        .replace("$10", "now()")
        .replace("$11", "now() + interval '30 days'")
        .replace("$12", "'cloudevents_attributes'")
        .replace("$13", "1")
        .replace("$1,", "'bench',")
        .replace("$2,", "'urn.bench',")
        .replace(
            "$3,",
            "'pgb-' || CAST(:client_id AS text) || '-' || CAST(:n AS text),",
        )
        .replace("$4,", "'bench.event',")
        .replace("$5,", "NULL,")
        .replace(
            "$6,",
            "'9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08',",
        )
        .replace("$7,", "NULL,")
        .replace("$8,", "NULL,")
        .replace("$9,", "now(),");
    let business = BUSINESS_INSERT
        .replace(
            "$1",
            "'t-' || CAST(:client_id AS text) || '-' || CAST(:n AS text)",
        )
        .replace(
            "$2",
            "'pgb-' || CAST(:client_id AS text) || '-' || CAST(:n AS text)",
        );
    let script = format!(
        "\\set n random(1, 9000000000000000000)\nBEGIN;\n{marker};\n{business};\nCOMMIT;\n"
    );
    let path = dir.join(format!(
        "txinbox-bench-{}.sql",
        uuid::Uuid::new_v4().simple()
    ));
    std::fs::write(&path, script)
        .map_err(|e| LabError::Usage(format!("cannot write the pgbench script: {e}")))?;
    Ok(path)
}

fn run_pgbench(
    args: &BenchArgs,
    url: &str,
    script: &std::path::Path,
    c: usize,
) -> Result<f64, LabError> {
    let jobs = c.clamp(1, 2);
    let out = std::process::Command::new(&args.pgbench)
        .args([
            "-n",
            "-M",
            "prepared",
            "-c",
            &c.to_string(),
            "-j",
            &jobs.to_string(),
        ])
        .args(["-T", &args.seconds.to_string(), "-f"])
        .arg(script)
        .arg(url)
        .output()
        .map_err(|e| {
            LabError::Usage(format!(
                "cannot run {}: {e} (it ships with PostgreSQL)",
                args.pgbench
            ))
        })?;
    let stdout = String::from_utf8_lossy(&out.stdout);
    if !out.status.success() {
        return Err(LabError::Usage(format!(
            "pgbench failed ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
                .lines()
                .filter(|l| l.contains("error"))
                .collect::<Vec<_>>()
                .join(" | ")
        )));
    }
    stdout
        .lines()
        .find_map(|l| {
            l.trim()
                .strip_prefix("tps = ")
                .and_then(|r| r.split_whitespace().next())
                .and_then(|n| n.parse().ok())
        })
        .ok_or_else(|| LabError::Usage("pgbench printed no tps line".into()))
}

/// Runs the benchmark and prints one line per concurrency.
pub async fn run(args: BenchArgs) -> Result<(), LabError> {
    if !(args.store.starts_with("postgres://") || args.store.starts_with("postgresql://")) {
        return Err(LabError::Usage(
            "bench needs a postgres:// store URL".into(),
        ));
    }
    if args.seconds == 0 || args.concurrency.contains(&0) {
        return Err(LabError::Usage(
            "--seconds and every --concurrency must be at least 1".into(),
        ));
    }
    let max_c = args.concurrency.iter().copied().max().unwrap_or(1) as u32;
    let schema = format!("txinbox_bench_{}", uuid::Uuid::new_v4().simple());
    let store = Store::<sqlx::Postgres>::connect_in_schema(&args.store, &schema, max_c + 1).await?;
    let pool = store.pool().clone();
    sqlx::Executor::execute(
        &pool,
        "CREATE TABLE bench_tasks (task_id TEXT NOT NULL, message_id TEXT NOT NULL)",
    )
    .await?;
    let sep = if args.store.contains('?') { '&' } else { '?' };
    // The library's sqlx is built without TLS and talks plaintext; pgbench must use the same transport, or
    // its TLS encryption (sslmode=prefer by default) would slow the reference down.
    let pg_url = format!(
        "{}{sep}sslmode=disable&options=-csearch_path%3D{schema}",
        args.store
    );
    let script = pgbench_script(&std::env::temp_dir())?;
    let consumer = ConsumerName::new(CONSUMER).map_err(|e| LabError::Usage(e.to_string()))?;
    let inbox = Arc::new(Inbox::new(pool.clone(), IdentityPolicy::new(consumer)));
    let handler = Arc::new(handler_fn::<sqlx::Postgres, _>(|tx, msg| {
        Box::pin(async move {
            sqlx::query(BUSINESS_INSERT)
                .bind(format!("t-{}", msg.identity.message_id))
                .bind(&msg.identity.message_id)
                .execute(&mut *tx)
                .await
                .map_err(db_error)?;
            Ok::<_, HandlerError>(Handled::done())
        })
    }));
    println!(
        "# txinbox bench: PostgreSQL, {}s per figure, messages or transactions per second; target inbox/pgbench >= 0.80",
        args.seconds
    );
    let result = async {
        for &c in &args.concurrency {
            reset(&pool).await?;
            let p = pool.clone();
            let bare = measure(c, args.seconds, move |t, i| {
                let p = p.clone();
                Box::pin(async move {
                    let mut tx = p.begin().await.map_err(|e| e.to_string())?;
                    let id = format!("bare-{c}-{t}-{i}");
                    sqlx::query(BUSINESS_INSERT).bind(format!("t-{id}")).bind(&id).execute(&mut *tx).await.map_err(|e| e.to_string())?;
                    tx.commit().await.map_err(|e| e.to_string())
                })
            })
            .await?;

            reset(&pool).await?;
            let (ib, hd) = (inbox.clone(), handler.clone());
            let with_inbox = measure(c, args.seconds, move |t, i| {
                let (ib, hd) = (ib.clone(), hd.clone());
                Box::pin(async move {
                    let o = ib.process(NoopDelivery(message(&format!("in-{c}-{t}-{i}"), i)), &*hd).await;
                    if o.label() == "applied" { Ok(()) } else { Err(format!("unexpected outcome {o}")) }
                })
            })
            .await?;

            reset(&pool).await?;
            // Apply a pool of 1000 messages, then a stream where 9 of 10 deliveries repeat one of them.
            for n in 0..1000u64 {
                inbox.process(NoopDelivery(message(&format!("dup-{n}"), n)), &*handler).await;
            }
            let (ib, hd) = (inbox.clone(), handler.clone());
            let dup = measure(c, args.seconds, move |t, i| {
                let (ib, hd) = (ib.clone(), hd.clone());
                Box::pin(async move {
                    let (m, want) = if i % 10 == 0 {
                        (message(&format!("new-{c}-{t}-{i}"), i), "applied")
                    } else {
                        let n = (i * 7919 + t as u64 * 104_729) % 1000;
                        (message(&format!("dup-{n}"), n), "duplicate")
                    };
                    let o = ib.process(NoopDelivery(m), &*hd).await;
                    if o.label() == want { Ok(()) } else { Err(format!("unexpected outcome {o}, wanted {want}")) }
                })
            })
            .await?;

            reset(&pool).await?;
            // The inbox's statements through sqlx without the inbox: what the client library itself costs.
            let p = pool.clone();
            let same_sql = measure(c, args.seconds, move |t, i| {
                let p = p.clone();
                Box::pin(async move {
                    let mut tx = p.begin().await.map_err(|e| e.to_string())?;
                    let id = format!("sql-{c}-{t}-{i}");
                    let now = chrono::Utc::now();
                    sqlx::query(txinbox_store::postgres::INSERT_MARKER)
                        .bind(CONSUMER)
                        .bind("urn.bench")
                        .bind(&id)
                        .bind(Some("bench.event"))
                        .bind(None::<String>)
                        .bind("9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08")
                        .bind(None::<String>)
                        .bind(None::<String>)
                        .bind(now)
                        .bind(now)
                        .bind(now + chrono::Duration::days(30))
                        .bind("cloudevents_attributes")
                        .bind(1i32)
                        .execute(&mut *tx)
                        .await
                        .map_err(|e| e.to_string())?;
                    sqlx::query(BUSINESS_INSERT).bind(format!("t-{id}")).bind(&id).execute(&mut *tx).await.map_err(|e| e.to_string())?;
                    tx.commit().await.map_err(|e| e.to_string())
                })
            })
            .await?;

            reset(&pool).await?;
            let pgb = run_pgbench(&args, &pg_url, &script, c)?;
            println!(
                "c={c} bare={bare:.0} inbox={with_inbox:.0} inbox_dup={dup:.0} pgbench_inbox={pgb:.0} inbox/bare={:.2} inbox/pgbench={:.2}",
                with_inbox / bare,
                with_inbox / pgb
            );
            println!("#   c={c} sqlx_same_sql={same_sql:.0} inbox/sqlx_same_sql={:.2} sqlx_same_sql/pgbench={:.2}", with_inbox / same_sql, same_sql / pgb);
        }
        Ok::<(), LabError>(())
    }
    .await;
    let _ = std::fs::remove_file(&script);
    store.close().await;
    if let Ok(mut c) = <sqlx::PgConnection as sqlx::Connection>::connect(&args.store).await {
        let _ = sqlx::Executor::execute(
            &mut c,
            format!("DROP SCHEMA IF EXISTS \"{schema}\" CASCADE").as_str(),
        )
        .await;
    }
    result
}
