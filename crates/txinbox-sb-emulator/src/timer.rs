//! Exact waits for the `delay` fault: a simulated round trip must last what it says.
//!
//! `tokio::time::sleep` works in whole milliseconds and rounds a deadline up to the next tick, so a 10 ms
//! delay would last 10 to 11 ms; a thread per wait (`spawn_blocking`) is exact but costs a thread and its
//! switches per request in flight. One thread keeps the deadlines in order and sleeps on a condition variable
//! until the nearest (a futex timeout: late by the kernel's timer slack, tens of microseconds).

use std::collections::BTreeMap;
use std::sync::{Condvar, Mutex, OnceLock};
use std::time::{Duration, Instant};

use tokio::sync::oneshot;

#[derive(Default)]
struct Deadlines {
    /// (deadline, arrival number) → the waiting request.
    due: BTreeMap<(Instant, u64), oneshot::Sender<()>>,
    arrivals: u64,
}

struct Timer {
    deadlines: Mutex<Deadlines>,
    changed: Condvar,
}

fn timer() -> &'static Timer {
    static TIMER: OnceLock<&'static Timer> = OnceLock::new();
    TIMER.get_or_init(|| {
        let timer: &'static Timer = Box::leak(Box::new(Timer {
            deadlines: Mutex::new(Deadlines::default()),
            changed: Condvar::new(),
        }));
        let spawned = std::thread::Builder::new()
            .name("sb-emulator-timer".into())
            .spawn(move || timer.run());
        if let Err(e) = spawned {
            tracing::error!(error = %e, "cannot start the delay timer's thread: delays end at once");
        }
        timer
    })
}

impl Timer {
    fn run(&self) {
        let mut d = self.deadlines.lock().unwrap_or_else(|e| e.into_inner());
        loop {
            let now = Instant::now();
            while let Some(entry) = d.due.first_entry() {
                if entry.key().0 > now {
                    break;
                }
                // A wait given up (its request's connection closed) has dropped its receiver.
                let _ = entry.remove().send(());
            }
            d = match d.due.keys().next().map(|(at, _)| *at) {
                None => self.changed.wait(d).unwrap_or_else(|e| e.into_inner()),
                Some(at) => {
                    let timeout = at.saturating_duration_since(now);
                    self.changed
                        .wait_timeout(d, timeout)
                        .unwrap_or_else(|e| e.into_inner())
                        .0
                }
            };
        }
    }
}

/// Waits `d`; returns how long the wait really lasted (until this task ran again).
pub async fn wait(d: Duration) -> Duration {
    let start = Instant::now();
    if d.is_zero() {
        return Duration::ZERO;
    }
    let (tx, rx) = oneshot::channel();
    let timer = timer();
    let nearest = {
        let mut deadlines = timer.deadlines.lock().unwrap_or_else(|e| e.into_inner());
        deadlines.arrivals += 1;
        let key = (start + d, deadlines.arrivals);
        let nearest = deadlines.due.keys().next().is_none_or(|first| key < *first);
        deadlines.due.insert(key, tx);
        nearest
    };
    if nearest {
        timer.changed.notify_one();
    }
    if rx.await.is_err() {
        // No timer thread (it could not start): the runtime's timer instead.
        tokio::time::sleep(d.saturating_sub(start.elapsed())).await;
    }
    start.elapsed()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Waits begun in any order end in the order of their deadlines, none before its time.
    #[tokio::test]
    async fn waits_end_in_deadline_order_and_never_early() {
        let order = std::sync::Arc::new(Mutex::new(Vec::new()));
        let mut tasks = Vec::new();
        for ms in [30u64, 10, 20] {
            let order = order.clone();
            tasks.push(tokio::spawn(async move {
                let waited = wait(Duration::from_millis(ms)).await;
                assert!(
                    waited >= Duration::from_millis(ms),
                    "{ms} ms lasted {waited:?}"
                );
                order.lock().unwrap().push(ms);
            }));
        }
        for t in tasks {
            t.await.unwrap();
        }
        assert_eq!(*order.lock().unwrap(), vec![10, 20, 30]);
    }
}
