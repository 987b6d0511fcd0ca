use std::sync::atomic::Ordering;
use std::time::Duration;

use futures::future::join_all;

use super::{lock, Shards, Watch};
use crate::metrics as m;

/// Probes one shard and records the result (logging and counting a change), unless a probe that began after
/// this one has already recorded its own: the periodic probe and the one after a retry can overlap, and the
/// older answer (a timeout that began while the shard was down) must not undo the newer (it is back).
pub(super) async fn probe_one(w: &Watch, timeout: Duration, consumer: Option<&str>) {
    let Some(check) = &w.check else { return };
    let ticket = w.begun.fetch_add(1, Ordering::SeqCst) + 1;
    let result = match tokio::time::timeout(timeout, check.check()).await {
        Ok(r) => r,
        Err(_) => Err(format!("no answer within {} ms", timeout.as_millis())),
    };
    let mut down = lock(&w.down);
    if w.recorded.load(Ordering::SeqCst) > ticket {
        return;
    }
    w.recorded.store(ticket, Ordering::SeqCst);
    match (&*down, result) {
        (None, Err(why)) => {
            tracing::warn!(shard = %w.name, error = %why, "shard unavailable: its deliveries are released until it answers");
            *down = Some(why);
        }
        (Some(_), Err(why)) => *down = Some(why),
        (Some(_), Ok(())) => {
            tracing::info!(shard = %w.name, "shard available again");
            *down = None;
        }
        (None, Ok(())) => {}
    }
    // Before the worker started the processor its consumer label is not known: no gauge yet.
    if let Some(consumer) = consumer {
        let up = if down.is_none() { 1.0 } else { 0.0 };
        metrics::gauge!(m::SHARD_UP, "consumer" => consumer.to_owned(), "shard" => w.name.to_string())
            .set(up);
    }
}

pub(super) async fn probe_all(watch: &[Watch], timeout: Duration, consumer: Option<&str>) {
    join_all(watch.iter().map(|w| probe_one(w, timeout, consumer))).await;
}

impl<P> Shards<P> {
    /// Starts the probe loop (once), if a tokio runtime is there to run it.
    pub(super) fn start_probes(&self, consumer: &str) {
        if self.inner.started.swap(true, Ordering::SeqCst) {
            return;
        }
        let Ok(rt) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let watch = self.inner.watch.clone();
        let stop = self.inner.stop.clone();
        let opts = self.opts();
        let (every, timeout) = (opts.probe_interval, opts.probe_timeout);
        let consumer = consumer.to_owned();
        rt.spawn(async move {
            loop {
                probe_all(&watch, timeout, Some(&consumer)).await;
                tokio::select! {
                    () = stop.cancelled() => return,
                    () = tokio::time::sleep(every) => {}
                }
            }
        });
    }

    /// A delivery of shard `i` ended in a retry: probe that shard now (once at a time), so that a store that
    /// went away is seen before the next tick.
    pub(super) fn probe_soon(&self, i: usize, consumer: &str) {
        let w = &self.inner.watch[i];
        if w.check.is_none() || w.probing.swap(true, Ordering::SeqCst) {
            return;
        }
        let Ok(rt) = tokio::runtime::Handle::try_current() else {
            w.probing.store(false, Ordering::SeqCst);
            return;
        };
        let watch = self.inner.watch.clone();
        let timeout = self.opts().probe_timeout;
        let consumer = consumer.to_owned();
        rt.spawn(async move {
            probe_one(&watch[i], timeout, Some(&consumer)).await;
            watch[i].probing.store(false, Ordering::SeqCst);
        });
    }
}
