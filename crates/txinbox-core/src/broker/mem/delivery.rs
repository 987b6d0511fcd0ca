use std::time::Duration;

use chrono::Utc;
use futures::future::BoxFuture;

use super::*;

/// A receiver on a [`MemoryQueue`].
#[derive(Clone, Debug)]
pub struct MemoryReceiver {
    pub(super) queue: MemoryQueue,
}

impl Receiver for MemoryReceiver {
    type Delivery = MemoryDelivery;

    fn fork(&self) -> Option<Self> {
        Some(self.clone())
    }

    async fn receive(&mut self, max: usize) -> Result<Vec<MemoryDelivery>, BrokerError> {
        let deadline = tokio::time::Instant::now() + self.queue.inner.opts.wait;
        loop {
            let notified = self.queue.inner.notify.notified();
            let got = self.queue.receive_now(max);
            if !got.is_empty() || tokio::time::Instant::now() >= deadline {
                self.queue.round_trip().await;
                return Ok(got);
            }
            // Wake on a send, or poll again shortly (visibility expiry has no event).
            let _ = tokio::time::timeout(Duration::from_millis(20), notified).await;
        }
    }
}

/// One received copy of a message on a [`MemoryQueue`].
#[derive(Debug)]
pub struct MemoryDelivery {
    pub(super) queue: MemoryQueue,
    pub(super) seq: u64,
    pub(super) receipt: u64,
    pub(super) message: ReceivedMessage,
    pub(super) expires: Arc<Mutex<DateTime<Utc>>>,
}

impl MemoryDelivery {
    /// The queue this delivery came from.
    pub fn queue(&self) -> &MemoryQueue {
        &self.queue
    }
}

impl Delivery for MemoryDelivery {
    fn message(&self) -> &ReceivedMessage {
        &self.message
    }

    async fn ack(self) -> Result<(), BrokerError> {
        self.queue.round_trip().await;
        let fault = self.queue.lock().faults.pop_front();
        if fault == Some(SettleFault::Fail) {
            return Err(BrokerError::new(
                BrokerErrorKind::OutcomeUnknown,
                "ack",
                "injected ack failure",
            ));
        }
        self.queue.with_current(self.seq, self.receipt, |s, i, _| {
            s.messages.remove(i);
        })?;
        if fault == Some(SettleFault::DropResponse) {
            return Err(BrokerError::new(
                BrokerErrorKind::OutcomeUnknown,
                "ack",
                "injected: ack applied, response lost",
            ));
        }
        Ok(())
    }

    async fn release(self, delay: Duration) -> Result<(), BrokerError> {
        self.queue.round_trip().await;
        self.queue
            .with_current(self.seq, self.receipt, |s, i, now| {
                let m = &mut s.messages[i];
                m.receipt = None;
                m.invisible_until = Some(now + to_chrono(delay));
            })?;
        self.queue.inner.notify.notify_waiters();
        Ok(())
    }

    async fn dead_letter(self, why: DeadLetter) -> Result<(), BrokerError> {
        self.queue.round_trip().await;
        self.queue.with_current(self.seq, self.receipt, |s, i, _| {
            if let Some(m) = s.messages.remove(i) {
                s.dead.push((m.msg, why));
            }
        })
    }

    fn lease(&self) -> Option<Arc<dyn Lease>> {
        Some(Arc::new(MemoryLease {
            queue: self.queue.clone(),
            seq: self.seq,
            receipt: self.receipt,
            expires: self.expires.clone(),
        }))
    }
}

struct MemoryLease {
    queue: MemoryQueue,
    seq: u64,
    receipt: u64,
    expires: Arc<Mutex<DateTime<Utc>>>,
}

impl Lease for MemoryLease {
    /// The queue's visibility timeout.
    fn duration(&self) -> Duration {
        self.queue.inner.opts.visibility_timeout
    }

    fn expires_at(&self) -> Option<DateTime<Utc>> {
        Some(*self.expires.lock().unwrap_or_else(|p| p.into_inner()))
    }

    fn renew(&self, by: Duration) -> BoxFuture<'_, Result<DateTime<Utc>, BrokerError>> {
        Box::pin(async move {
            self.queue.round_trip().await;
            let until = self
                .queue
                .with_current(self.seq, self.receipt, |s, i, now| {
                    let until = now + to_chrono(by);
                    s.messages[i].invisible_until = Some(until);
                    until
                })?;
            *self.expires.lock().unwrap_or_else(|p| p.into_inner()) = until;
            Ok(until)
        })
    }
}
