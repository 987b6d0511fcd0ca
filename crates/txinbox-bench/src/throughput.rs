//! The throughput lines: bare, inbox, inbox_dup, pgbench_inbox and the batch lines, per concurrency.

use std::sync::Arc;

use txinbox_core::{CancellationToken, Handler, Raw};
use txinbox_lab::lab::LabError;
use txinbox_store::Store;
use txinbox_testkit::NoopDelivery;

use crate::fixture::{
    business_insert, expect, marker_insert, marker_inserts, message, reset, BenchInbox,
};
use crate::pgbench::run_pgbench;
use crate::rate::{measure, median_rate, per_message, Rate};
use crate::BenchArgs;

/// The figures of one round at one concurrency.
#[derive(Clone, Copy)]
struct Round {
    bare: Rate,
    inbox: Rate,
    dup: Rate,
    same_sql: Rate,
    pgbench: Rate,
    /// `inbox_batchB` and `pgbench_batchB`, in messages per second.
    batch: Option<(Rate, Rate)>,
    /// The batched SQL through sqlx alone, in messages per second.
    same_sql_batch: Option<Rate>,
    /// pgbench on the savepoint pass's SQL, in messages per second.
    pgbench_savepoints: Option<Rate>,
}

/// What every measurement shares.
pub(super) struct Bench<H> {
    pub(super) args: BenchArgs,
    pub(super) pool: sqlx::PgPool,
    pub(super) inbox: Arc<BenchInbox<H>>,
    pub(super) pg_url: String,
    pub(super) script: std::path::PathBuf,
    /// The batch's pgbench scripts: the first pass's SQL (the reference), the savepoint pass's.
    pub(super) batch_script: Option<(std::path::PathBuf, std::path::PathBuf)>,
}

impl<H: Handler<Store<sqlx::Postgres>, Raw>> Bench<H> {
    /// `BEGIN; business insert; COMMIT` through sqlx.
    async fn bare(&self, c: usize, round: usize) -> Result<Rate, LabError> {
        reset(&self.pool).await?;
        let p = self.pool.clone();
        measure(c, self.args.seconds, move |t, i| {
            let p = p.clone();
            Box::pin(async move {
                let mut tx = p.begin().await.map_err(|e| e.to_string())?;
                let id = format!("bare-{c}-{round}-{t}-{i}");
                business_insert(&mut tx, &id).await?;
                tx.commit().await.map_err(|e| e.to_string())
            })
        })
        .await
    }

    /// The same handler through the inbox, every delivery a new message.
    async fn inbox(&self, c: usize, round: usize) -> Result<Rate, LabError> {
        reset(&self.pool).await?;
        let ib = self.inbox.clone();
        measure(c, self.args.seconds, move |t, i| {
            let ib = ib.clone();
            Box::pin(async move {
                let m = message(&format!("in-{c}-{round}-{t}-{i}"), i);
                expect(&ib, m, "applied").await
            })
        })
        .await
    }

    /// The inbox on a stream where 9 of 10 deliveries repeat one of 1000 applied messages.
    async fn dup(&self, c: usize, round: usize) -> Result<Rate, LabError> {
        reset(&self.pool).await?;
        for n in 0..1000u64 {
            let m = message(&format!("dup-{n}"), n);
            expect(&self.inbox, m, "applied")
                .await
                .map_err(|e| LabError::Usage(format!("preparing the duplicate stream: {e}")))?;
        }
        let ib = self.inbox.clone();
        measure(c, self.args.seconds, move |t, i| {
            let ib = ib.clone();
            Box::pin(async move {
                let (m, want) = if i % 10 == 0 {
                    (message(&format!("new-{c}-{round}-{t}-{i}"), i), "applied")
                } else {
                    let n = (i * 7919 + t as u64 * 104_729) % 1000;
                    (message(&format!("dup-{n}"), n), "duplicate")
                };
                expect(&ib, m, want).await
            })
        })
        .await
    }

    /// The inbox's statements through sqlx without the inbox: what the client library itself costs.
    async fn same_sql(&self, c: usize, round: usize) -> Result<Rate, LabError> {
        reset(&self.pool).await?;
        let p = self.pool.clone();
        measure(c, self.args.seconds, move |t, i| {
            let p = p.clone();
            Box::pin(async move {
                let mut tx = p.begin().await.map_err(|e| e.to_string())?;
                let id = format!("sql-{c}-{round}-{t}-{i}");
                marker_insert(&mut tx, &id).await?;
                business_insert(&mut tx, &id).await?;
                tx.commit().await.map_err(|e| e.to_string())
            })
        })
        .await
    }

    async fn pgbench(&self, c: usize) -> Result<Rate, LabError> {
        reset(&self.pool).await?;
        run_pgbench(&self.args, &self.pg_url, &self.script, c)
    }

    /// Batches of `--batch` new messages through
    /// [`InboxProcessor::process_batch`](txinbox_core::InboxProcessor::process_batch), in messages per second.
    async fn inbox_batch(&self, c: usize, round: usize) -> Result<Rate, LabError> {
        reset(&self.pool).await?;
        let ib = self.inbox.clone();
        let b = self.args.batch;
        let r = measure(c, self.args.seconds, move |t, i| {
            let ib = ib.clone();
            Box::pin(async move {
                let batch: Vec<NoopDelivery> = (0..b)
                    .map(|k| NoopDelivery(message(&format!("ib-{c}-{round}-{t}-{i}-{k}"), i)))
                    .collect();
                let out = ib.process_batch(batch, &CancellationToken::new()).await;
                match out.iter().find(|o| o.label() != "applied") {
                    None => Ok(()),
                    Some(o) => Err(format!("unexpected outcome {o} in a batch, wanted applied")),
                }
            })
        })
        .await?;
        Ok(per_message(r, b))
    }

    /// The batched SQL through sqlx without the inbox (`BEGIN`, the markers in one statement, per message the
    /// business insert, `COMMIT`), in messages per second: what the client library costs on its own.
    async fn same_sql_batch(&self, c: usize, round: usize) -> Result<Rate, LabError> {
        reset(&self.pool).await?;
        let p = self.pool.clone();
        let b = self.args.batch;
        let r = measure(c, self.args.seconds, move |t, i| {
            let p = p.clone();
            Box::pin(async move {
                let mut tx = p.begin().await.map_err(|e| e.to_string())?;
                let ids: Vec<String> = (0..b)
                    .map(|k| format!("sqlb-{c}-{round}-{t}-{i}-{k}"))
                    .collect();
                marker_inserts(&mut tx, &ids).await?;
                for id in &ids {
                    business_insert(&mut tx, id).await?;
                }
                tx.commit().await.map_err(|e| e.to_string())
            })
        })
        .await?;
        Ok(per_message(r, b))
    }

    /// pgbench on the batched SQL, in messages per second.
    async fn pgbench_batch(&self, c: usize, script: &std::path::Path) -> Result<Rate, LabError> {
        reset(&self.pool).await?;
        let r = run_pgbench(&self.args, &self.pg_url, script, c)?;
        Ok(per_message(r, self.args.batch))
    }

    async fn round(&self, c: usize, round: usize) -> Result<Round, LabError> {
        // The two figures of the target run back to back, in alternating order from round to round, so that
        // neither always follows the other.
        let (inbox, pgbench) = if round % 2 == 0 {
            let inbox = self.inbox(c, round).await?;
            (inbox, self.pgbench(c).await?)
        } else {
            let pgbench = self.pgbench(c).await?;
            (self.inbox(c, round).await?, pgbench)
        };
        let batch = match &self.batch_script {
            None => None,
            Some((script, _)) if round % 2 == 0 => {
                let ib = self.inbox_batch(c, round).await?;
                Some((ib, self.pgbench_batch(c, script).await?))
            }
            Some((script, _)) => {
                let pgb = self.pgbench_batch(c, script).await?;
                Some((self.inbox_batch(c, round).await?, pgb))
            }
        };
        let (same_sql_batch, pgbench_savepoints) = match &self.batch_script {
            Some((_, savepoints)) => (
                Some(self.same_sql_batch(c, round).await?),
                Some(self.pgbench_batch(c, savepoints).await?),
            ),
            None => (None, None),
        };
        Ok(Round {
            inbox,
            pgbench,
            batch,
            same_sql_batch,
            pgbench_savepoints,
            bare: self.bare(c, round).await?,
            dup: self.dup(c, round).await?,
            same_sql: self.same_sql(c, round).await?,
        })
    }

    pub(super) async fn concurrency(&self, c: usize) -> Result<(), LabError> {
        let mut rounds = Vec::with_capacity(self.args.rounds);
        for round in 0..self.args.rounds {
            rounds.push(self.round(c, round).await?);
        }
        let bare = median_rate(&rounds, |r| r.bare);
        let inbox = median_rate(&rounds, |r| r.inbox);
        let dup = median_rate(&rounds, |r| r.dup);
        let same_sql = median_rate(&rounds, |r| r.same_sql);
        let pgb = median_rate(&rounds, |r| r.pgbench);
        println!(
            "c={c} bare={:.0} inbox={:.0} inbox_dup={:.0} pgbench_inbox={:.0} inbox/bare={:.2} inbox/pgbench={:.2}",
            bare.per_sec,
            inbox.per_sec,
            dup.per_sec,
            pgb.per_sec,
            inbox.per_sec / bare.per_sec,
            inbox.per_sec / pgb.per_sec
        );
        let us = |r: Rate| {
            r.cpu_us
                .map_or_else(|| "?".to_owned(), |[u, s]| format!("{u:.0}+{s:.0}"))
        };
        let per_round: Vec<String> = rounds
            .iter()
            .map(|r| format!("{:.2}", r.inbox.per_sec / r.pgbench.per_sec))
            .collect();
        println!(
            "#   c={c} sqlx_same_sql={:.0} inbox/sqlx_same_sql={:.2} sqlx_same_sql/pgbench={:.2} inbox/pgbench_per_round=[{}] client_cpu_us_per_op(user+sys): bare={} inbox={} sqlx_same_sql={} pgbench={}",
            same_sql.per_sec,
            inbox.per_sec / same_sql.per_sec,
            same_sql.per_sec / pgb.per_sec,
            per_round.join(" "),
            us(bare),
            us(inbox),
            us(same_sql),
            us(pgb)
        );
        if self.batch_script.is_some() {
            let b = self.args.batch;
            let ib = median_rate(&rounds, |r| r.batch.map_or(r.inbox, |(i, _)| i));
            let pgbb = median_rate(&rounds, |r| r.batch.map_or(r.pgbench, |(_, p)| p));
            println!(
                "c={c} bare={:.0} inbox_batch{b}={:.0} pgbench_batch{b}={:.0} batch/bare={:.2} batch/pgbench_batch={:.2}",
                bare.per_sec,
                ib.per_sec,
                pgbb.per_sec,
                ib.per_sec / bare.per_sec,
                ib.per_sec / pgbb.per_sec
            );
            let per_round: Vec<String> = rounds
                .iter()
                .filter_map(|r| {
                    let (i, p) = r.batch?;
                    Some(format!(
                        "{:.2}:{:.2}",
                        i.per_sec / r.bare.per_sec,
                        i.per_sec / p.per_sec
                    ))
                })
                .collect();
            let sqlb = median_rate(&rounds, |r| r.same_sql_batch.unwrap_or(r.same_sql));
            let pgsp = median_rate(&rounds, |r| r.pgbench_savepoints.unwrap_or(r.pgbench));
            println!(
                "#   c={c} sqlx_same_sql_batch{b}={:.0} inbox_batch/sqlx_same_sql_batch={:.2} sqlx_same_sql_batch/pgbench_batch={:.2} pgbench_batch{b}_savepoint_sql={:.0} inbox_batch/pgbench_savepoint_sql={:.2} per_round(batch/bare:batch/pgbench_batch)=[{}] client_cpu_us_per_msg(user+sys): inbox_batch{b}={} sqlx_same_sql_batch{b}={} pgbench_batch{b}={}",
                sqlb.per_sec,
                ib.per_sec / sqlb.per_sec,
                sqlb.per_sec / pgbb.per_sec,
                pgsp.per_sec,
                ib.per_sec / pgsp.per_sec,
                per_round.join(" "),
                us(ib),
                us(sqlb),
                us(pgbb)
            );
        }
        Ok(())
    }
}
