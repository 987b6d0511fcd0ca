//! The exact delay behind the simulated round trip: one thread keeps the pending deadlines.

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::sync::{Condvar, Mutex, OnceLock};
use std::time::{Duration, Instant};

use tokio::sync::oneshot::Sender;

/// Waits `d`, to within tens of microseconds.
///
/// The simulated round trip is what the benchmarks' end-to-end figures are read against, so it must last what
/// it says. `tokio::time::sleep` cannot promise that: tokio's timer works in whole milliseconds and rounds a
/// deadline up to the next tick, so a 10 ms sleep ends 10 to 11 ms after it began (11.2 ms on average over 300
/// serial sleeps: docs/results.md). One thread keeps the pending deadlines and waits on a condition variable for the
/// nearest (a futex timeout, late by the kernel's timer slack); a dropped wait simply finds its receiver gone.
pub(super) async fn exact_delay(d: Duration) {
    let (tx, rx) = tokio::sync::oneshot::channel();
    push(std::time::Instant::now() + d, tx);
    // The sender is never dropped unsent: the timer thread lives as long as the process.
    let _ = rx.await;
}

struct Due {
    at: Instant,
    seq: u64,
    tx: Sender<()>,
}

impl PartialEq for Due {
    fn eq(&self, other: &Self) -> bool {
        (self.at, self.seq) == (other.at, other.seq)
    }
}
impl Eq for Due {}
impl PartialOrd for Due {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for Due {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        (self.at, self.seq).cmp(&(other.at, other.seq))
    }
}

#[derive(Default)]
struct Pending {
    heap: BinaryHeap<Reverse<Due>>,
    seq: u64,
}

struct Timer {
    pending: Mutex<Pending>,
    wake: Condvar,
}

fn timer() -> &'static Timer {
    static TIMER: OnceLock<&'static Timer> = OnceLock::new();
    TIMER.get_or_init(|| {
        let t: &'static Timer = Box::leak(Box::new(Timer {
            pending: Mutex::new(Pending::default()),
            wake: Condvar::new(),
        }));
        std::thread::Builder::new()
            .name("txinbox-mem-timer".into())
            .spawn(move || run(t))
            .expect("spawn the in-memory broker's timer thread");
        t
    })
}

pub(super) fn push(at: Instant, tx: Sender<()>) {
    let t = timer();
    let mut p = t.pending.lock().unwrap_or_else(|e| e.into_inner());
    p.seq += 1;
    let seq = p.seq;
    let nearest = p.heap.peek().is_none_or(|Reverse(d)| at < d.at);
    p.heap.push(Reverse(Due { at, seq, tx }));
    drop(p);
    if nearest {
        t.wake.notify_one();
    }
}

fn run(t: &'static Timer) {
    let mut p = t.pending.lock().unwrap_or_else(|e| e.into_inner());
    loop {
        let now = Instant::now();
        while p.heap.peek().is_some_and(|Reverse(d)| d.at <= now) {
            if let Some(Reverse(d)) = p.heap.pop() {
                let _ = d.tx.send(());
            }
        }
        p = match p.heap.peek().map(|Reverse(d)| d.at) {
            None => t.wake.wait(p).unwrap_or_else(|e| e.into_inner()),
            Some(at) => {
                t.wake
                    .wait_timeout(p, at.saturating_duration_since(now))
                    .unwrap_or_else(|e| e.into_inner())
                    .0
            }
        };
    }
}
