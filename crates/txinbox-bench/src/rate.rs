//! Throughput figures: an operation's rate at a concurrency, the client CPU it took, medians over rounds.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::future::BoxFuture;
use txinbox_lab::lab::LabError;

/// A throughput figure and the client CPU it took.
#[derive(Clone, Copy)]
pub(crate) struct Rate {
    /// Operations per second.
    pub(crate) per_sec: f64,
    /// Client CPU per operation in microseconds, (user, system), when the platform tells.
    pub(crate) cpu_us: Option<[f64; 2]>,
}

pub(crate) fn cpu_per_op(
    before: Option<[u64; 2]>,
    after: Option<[u64; 2]>,
    ops: f64,
) -> Option<[f64; 2]> {
    let (b, a) = (before?, after?);
    // Linux reports /proc CPU times in USER_HZ, 100 per second on every mainstream architecture.
    let us = |i: usize| a[i].saturating_sub(b[i]) as f64 * 10_000.0 / ops;
    (ops > 0.0).then(|| [us(0), us(1)])
}

pub(crate) async fn measure<F>(concurrency: usize, seconds: u64, op: F) -> Result<Rate, LabError>
where
    F: Fn(usize, u64) -> BoxFuture<'static, Result<(), String>> + Send + Sync + 'static,
{
    let op = Arc::new(op);
    let done = Arc::new(AtomicU64::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let cpu_before = cpu_ticks().map(|c| c.0);
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
    let ops = done.load(Ordering::Relaxed) as f64;
    Ok(Rate {
        per_sec: ops / start.elapsed().as_secs_f64(),
        cpu_us: cpu_per_op(cpu_before, cpu_ticks().map(|c| c.0), ops),
    })
}

/// CPU time used so far, in clock ticks: (this process, its waited-for children), each as (user, system).
/// Linux only; `None` elsewhere. Used to report the client's CPU per transaction next to the throughput
/// figures.
pub(crate) fn cpu_ticks() -> Option<([u64; 2], [u64; 2])> {
    let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
    // Fields after the command name (which is in parentheses and may hold spaces).
    let rest = stat.rsplit_once(')')?.1;
    let f: Vec<u64> = rest
        .split_whitespace()
        .skip(11)
        .take(4)
        .map(|x| x.parse().ok())
        .collect::<Option<_>>()?;
    (f.len() == 4).then(|| ([f[0], f[1]], [f[2], f[3]]))
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    match v.len() {
        0 => f64::NAN,
        n if n % 2 == 1 => v[n / 2],
        n => (v[n / 2 - 1] + v[n / 2]) / 2.0,
    }
}

/// The median over the rounds of one measurement: throughput and client CPU.
pub(crate) fn median_rate<R>(rounds: &[R], pick: fn(&R) -> Rate) -> Rate {
    let cpu: Option<Vec<[f64; 2]>> = rounds.iter().map(|r| pick(r).cpu_us).collect();
    Rate {
        per_sec: median(rounds.iter().map(|r| pick(r).per_sec).collect()),
        cpu_us: cpu.map(|c| {
            [
                median(c.iter().map(|x| x[0]).collect()),
                median(c.iter().map(|x| x[1]).collect()),
            ]
        }),
    }
}

/// A rate of batches as a rate of messages.
pub(crate) fn per_message(r: Rate, batch: usize) -> Rate {
    let b = batch as f64;
    Rate {
        per_sec: r.per_sec * b,
        cpu_us: r.cpu_us.map(|[u, s]| [u / b, s / b]),
    }
}
