//! One received message ([`SqsDelivery`]) and its visibility timeout as a renewable lease ([`SqsLease`]).

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use aws_sdk_sqs::types::{Message, MessageAttributeValue};
use chrono::{DateTime, Utc};
use futures::future::BoxFuture;
use tokio::sync::oneshot;
use txinbox_core::{BrokerError, BrokerErrorKind, DeadLetter, Delivery, Lease, ReceivedMessage};

use super::deleter::{delete_one, DeleteRequest};
use super::{received_message, secs, visibility_allowed, Received, Returning, Shared};
use crate::dlq;
use crate::error::sdk_error;
use crate::options::MAX_VISIBILITY;

/// One received SQS message and its receipt handle. Settling consumes it: `ack` deletes (after COMMIT, as
/// the inbox calls it), `release` sets the visibility to the backoff, `dead_letter` forwards a copy to the
/// dead-letter queue and then deletes.
#[derive(Debug)]
pub struct SqsDelivery {
    shared: Arc<Shared>,
    /// Where the receiver that handed it out learns that it comes back (see [`Returning`]).
    returning: Returning,
    message: ReceivedMessage,
    body: String,
    receipt: String,
    raw_attributes: HashMap<String, MessageAttributeValue>,
    /// The deduplication id SQS returned (unless AWS replaced it): a forward to the DLQ carries it, whether or
    /// not it is the identity.
    dedup_id: Option<String>,
    pub(super) lease: Arc<SqsLease>,
}

impl SqsDelivery {
    pub(super) fn from_message(
        shared: Arc<Shared>,
        returning: Returning,
        m: Message,
        received: Received,
        now: DateTime<Utc>,
    ) -> Result<Self, BrokerError> {
        let receipt = m
            .receipt_handle()
            .ok_or_else(|| {
                BrokerError::new(
                    BrokerErrorKind::Protocol,
                    "ReceiveMessage",
                    "SQS returned a message without a receipt handle",
                )
            })?
            .to_owned();
        let mut message = received_message(&m, now);
        let dedup_id = message.producer_id.clone();
        if !shared.opts.deduplication_id_identity {
            // Not an identity unless the consumer opted in: it does not survive the DLQ path (see
            // `SqsOptions::deduplication_id_identity`).
            message.producer_id = None;
        }
        // The visibility runs from when the call that brought the message was sent (or the last extension
        // of a held one), not from this moment: SQS started it before the answer arrived, and a receive of
        // several calls, or a message held behind its group, is handed out later still.
        let at = |i: Instant| now - chrono::Duration::from_std(i.elapsed()).unwrap_or_default();
        let vt = chrono::Duration::from_std(shared.opts.visibility_timeout).unwrap_or_default();
        let expires = Window {
            end: at(received.visible_from) + vt,
            latest_end: at(received.visible_by) + vt,
        };
        let lease = Arc::new(SqsLease {
            client: shared.client.clone(),
            queue_url: shared.queue_url.clone(),
            receipt: receipt.clone(),
            received: received.at,
            duration: shared.opts.visibility_timeout,
            expires: Mutex::new(expires),
            settled: AtomicBool::new(false),
        });
        Ok(Self {
            body: m.body.unwrap_or_default(),
            raw_attributes: m.message_attributes.unwrap_or_default(),
            shared,
            returning,
            message,
            receipt,
            dedup_id,
            lease,
        })
    }

    /// The `MessageDeduplicationId` SQS returned, unless AWS replaced it on a move to a FIFO DLQ (see
    /// [`deduplication_id_replaced`](super::deduplication_id_replaced)). It is the message's identity only
    /// when the consumer opted in with
    /// [`SqsOptions::deduplication_id_identity`](crate::SqsOptions::deduplication_id_identity).
    pub fn deduplication_id(&self) -> Option<&str> {
        self.dedup_id.as_deref()
    }

    /// The receipt handle of this delivery.
    pub fn receipt_handle(&self) -> &str {
        &self.receipt
    }

    /// The message attributes as SQS returned them (names and data types untouched).
    pub fn raw_attributes(&self) -> &HashMap<String, MessageAttributeValue> {
        &self.raw_attributes
    }

    /// Tells the receiver that handed this delivery out that its message comes back (on a FIFO queue: the
    /// messages of its group held there go back to SQS behind it).
    fn group_returns(&self) {
        if self.shared.fifo {
            self.returning.push(self.message.group_id.as_deref());
        }
    }

    async fn delete(&self) -> Result<(), BrokerError> {
        let (reply, rx) = oneshot::channel();
        let req = DeleteRequest {
            receipt: self.receipt.clone(),
            reply,
        };
        if self.shared.deletes.send(req).is_err() {
            // The batching task is gone (its runtime is shutting down): delete directly.
            return delete_one(&self.shared.client, &self.shared.queue_url, &self.receipt).await;
        }
        match rx.await {
            Ok(r) => r,
            Err(_) => delete_one(&self.shared.client, &self.shared.queue_url, &self.receipt).await,
        }
    }

    async fn set_visibility(&self, d: Duration) -> Result<(), BrokerError> {
        let since = self.lease.received.elapsed();
        if visibility_allowed(since, MAX_VISIBILITY).is_zero() {
            // Too close to SQS's 12 h ceiling for any visibility: SQS would reject the call, and the
            // message comes back by itself within the margin.
            tracing::debug!(
                "release at SQS's 12 h visibility ceiling; the message comes back by itself"
            );
            return Ok(());
        }
        self.shared
            .client
            .change_message_visibility()
            .queue_url(&self.shared.queue_url)
            .receipt_handle(&self.receipt)
            .visibility_timeout(secs(visibility_allowed(since, d)))
            .send()
            .await
            .map_err(|e| sdk_error("ChangeMessageVisibility", e))?;
        Ok(())
    }
}

impl Delivery for SqsDelivery {
    fn message(&self) -> &ReceivedMessage {
        &self.message
    }

    async fn ack(self) -> Result<(), BrokerError> {
        self.lease.settled.store(true, Ordering::SeqCst);
        self.delete().await
    }

    async fn release(self, delay: Duration) -> Result<(), BrokerError> {
        self.lease.settled.store(true, Ordering::SeqCst);
        // Whether the visibility change succeeds or not, the message comes back.
        self.group_returns();
        self.set_visibility(delay).await
    }

    async fn dead_letter(self, why: DeadLetter) -> Result<(), BrokerError> {
        self.lease.settled.store(true, Ordering::SeqCst);
        let Some(dlq_url) = self.shared.dead_letter_queue.clone() else {
            self.group_returns();
            // Without a DLQ to forward to, leave the message to its visibility timeout: it comes back at most
            // once per timeout (never in a hot loop) until the queue's maxReceiveCount, if any, moves it.
            return Err(BrokerError::new(
                BrokerErrorKind::Configuration,
                "dead-letter",
                format!(
                    "no dead-letter queue configured; left to its visibility timeout, the queue's maxReceiveCount decides ({}: {})",
                    why.reason, why.detail
                ),
            ));
        };
        dlq::forward(
            &self.shared.client,
            &dlq_url,
            &self.body,
            &self.raw_attributes,
            &self.message,
            self.dedup_id.as_deref(),
            &why,
        )
        .await
        .inspect_err(|_| self.group_returns())?;
        metrics::counter!(crate::metrics::DLQ_FORWARDS, "reason" => why.reason.clone())
            .increment(1);
        tracing::warn!(
            reason = %why.reason,
            message_id = self.message.broker_id.as_deref().unwrap_or(""),
            "forwarded to the dead-letter queue with its identity attributes; deleting the original"
        );
        // If this delete fails the message comes back; its next forward carries the same deduplication id, so
        // the DLQ keeps one copy.
        self.delete().await
    }

    fn lease(&self) -> Option<Arc<dyn Lease>> {
        Some(self.lease.clone())
    }
}

/// The visibility timeout of one delivery as a renewable lease (`ChangeMessageVisibility`).
#[derive(Debug)]
pub struct SqsLease {
    client: aws_sdk_sqs::Client,
    queue_url: String,
    receipt: String,
    /// When the `ReceiveMessage` call that brought it was sent (see [`Received::at`]).
    received: Instant,
    duration: Duration,
    expires: Mutex<Window>,
    pub(super) settled: AtomicBool,
}

/// The end of a delivery's visibility, which SQS counts from a moment between when the call that set it
/// (`ReceiveMessage`, `ChangeMessageVisibility`) was sent and when its answer arrived.
#[derive(Debug, Clone, Copy)]
struct Window {
    /// Counted from when the call was sent: the earliest SQS can end it, the end the lease reports.
    end: DateTime<Utc>,
    /// Counted from when the answer arrived: the latest SQS can end it.
    latest_end: DateTime<Utc>,
}

impl SqsLease {
    /// The end of the visibility the lease reports: counted from when the call that set it was sent.
    pub(super) fn current(&self) -> DateTime<Utc> {
        self.window().end
    }

    /// The latest SQS can end the visibility (counted from when the answer arrived): until then SQS may still
    /// hold the message invisible, and its FIFO group with it.
    pub(super) fn latest_end(&self) -> DateTime<Utc> {
        self.window().latest_end
    }

    fn window(&self) -> Window {
        *self.expires.lock().unwrap_or_else(|p| p.into_inner())
    }
}

impl Lease for SqsLease {
    /// The visibility timeout set on the receive
    /// ([`SqsOptions::visibility_timeout`](crate::SqsOptions::visibility_timeout)).
    fn duration(&self) -> Duration {
        self.duration
    }

    fn expires_at(&self) -> Option<DateTime<Utc>> {
        Some(self.current())
    }

    /// `ChangeMessageVisibility` to `by` from now. Near SQS's 12 h ceiling (counted from the receive) it
    /// extends only as far as the ceiling, less a minute, and fails as
    /// [`LockLost`](BrokerErrorKind::LockLost) when that is less than `by` (nothing is sent when nothing is
    /// left): the lease cannot last `by`, and the message comes back at the ceiling unless settled before.
    fn renew(&self, by: Duration) -> BoxFuture<'_, Result<DateTime<Utc>, BrokerError>> {
        Box::pin(async move {
            // A settled delivery has nothing left to extend (and its receipt may be gone).
            if self.settled.load(Ordering::SeqCst) {
                return Ok(self.current());
            }
            let wanted = by;
            let by = visibility_allowed(self.received.elapsed(), wanted);
            if by < Duration::from_secs(1) {
                return Err(BrokerError::new(
                    BrokerErrorKind::LockLost,
                    "ChangeMessageVisibility",
                    "SQS's 12 h visibility ceiling for this receive is reached",
                ));
            }
            let asked = Utc::now();
            let r = self
                .client
                .change_message_visibility()
                .queue_url(&self.queue_url)
                .receipt_handle(&self.receipt)
                .visibility_timeout(secs(by))
                .send()
                .await;
            match r {
                Ok(_) => {
                    // AWS (`ChangeMessageVisibility`): "the 10 seconds begin to count from the time that
                    // you make the ChangeMessageVisibility call": at the earliest when it was sent.
                    let by = chrono::Duration::from_std(by).unwrap_or_default();
                    let until = asked + by;
                    *self.expires.lock().unwrap_or_else(|p| p.into_inner()) = Window {
                        end: until,
                        latest_end: Utc::now() + by,
                    };
                    if by.num_seconds() < secs(wanted).into() {
                        // Cut short by the 12 h ceiling: extended as far as SQS accepts (AWS,
                        // `ChangeMessageVisibility`: "If you attempt to set the VisibilityTimeout to an
                        // amount more than the maximum time left, Amazon SQS returns an error. It will not
                        // automatically recalculate and increase the timeout to the maximum time
                        // remaining."), but not for `wanted`. An Ok would tell the worker's lease keeper
                        // the lease lasts `wanted` from the call (it counts a renewal so, not from the
                        // expiry returned), after SQS has made the message visible again: the lease is
                        // lost from here, the message coming back at `until` unless settled before.
                        return Err(BrokerError::new(
                            BrokerErrorKind::LockLost,
                            "ChangeMessageVisibility",
                            format!(
                                "SQS's 12 h visibility ceiling for this receive: extended by {} s of the {} s asked, until {until}; the message comes back then",
                                by.num_seconds(),
                                secs(wanted)
                            ),
                        ));
                    }
                    Ok(until)
                }
                // Settled while the call was in flight: the failure says nothing about the lease.
                Err(_) if self.settled.load(Ordering::SeqCst) => Ok(self.current()),
                Err(e) => Err(sdk_error("ChangeMessageVisibility", e)),
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::options::MAX_VISIBILITY;
    use crate::receiver::test_support::{fifo_queue_with_one_message, moto};

    /// A fresh FIFO queue holding one message, received with a visibility of 5 s: the queue and the receipt.
    async fn one_received(c: &aws_sdk_sqs::Client) -> (String, String) {
        let url = fifo_queue_with_one_message(c, "lease").await;
        let m = c
            .receive_message()
            .queue_url(&url)
            .visibility_timeout(5)
            .send()
            .await
            .expect("receive")
            .messages
            .unwrap_or_default()
            .pop()
            .expect("the message");
        (url, m.receipt_handle.expect("a receipt handle"))
    }

    /// AWS (`ChangeMessageVisibility`): "The maximum allowed timeout value you can set the value to is 12
    /// hours. This means you can't extend the timeout of a message in an existing queue to more than a total
    /// visibility timeout of 12 hours." and "If you attempt to set the VisibilityTimeout to an amount more than
    /// the maximum time left, Amazon SQS returns an error. It will not automatically recalculate and increase
    /// the timeout to the maximum time remaining." The lease extends as far as the ceiling lets it, then said
    /// Ok: the worker's lease keeper counts an Ok renewal as holding the lease for what it asked from the call
    /// (`held_until = call_started + duration` in `txinbox_core::runtime::lease::keep_alive`), so it believed it
    /// held the message after SQS had made it visible again. A renewal cut short is a lost lease; what it could
    /// extend is still extended, and the lease's end says so.
    #[tokio::test]
    async fn a_renewal_the_ceiling_cuts_short_is_not_ok() {
        let c = moto();
        let (url, receipt) = one_received(&c).await;
        // Received 20 s (and the last-minute margin) short of the 12 h ceiling; the lease asks for 30 s.
        let received = Instant::now()
            .checked_sub(MAX_VISIBILITY - super::super::CEILING_MARGIN - Duration::from_secs(20))
            .expect("an instant 12 h back");
        let lease = SqsLease {
            client: c.clone(),
            queue_url: url.clone(),
            receipt,
            received,
            duration: Duration::from_secs(30),
            expires: Mutex::new(Window {
                end: Utc::now(),
                latest_end: Utc::now(),
            }),
            settled: AtomicBool::new(false),
        };
        let asked = Utc::now();
        let r = lease.renew(Duration::from_secs(30)).await;
        let e = r.expect_err("a renewal of 19 s where 30 s were asked is not a renewal by 30 s");
        assert_eq!(e.kind(), BrokerErrorKind::LockLost, "{e}");
        // Extended as far as SQS accepts: until the ceiling (less its margin), not beyond, not less.
        let end = lease.expires_at().expect("an end");
        assert!(
            end >= asked + chrono::Duration::seconds(18)
                && end <= Utc::now() + chrono::Duration::seconds(20),
            "the lease ends where the extension does: {end} (asked at {asked})"
        );
        let seen = c
            .receive_message()
            .queue_url(&url)
            .send()
            .await
            .expect("receive")
            .messages
            .unwrap_or_default();
        assert!(seen.is_empty(), "the extension reached SQS: {seen:?}");
        // Far from the ceiling, a renewal by the whole duration is Ok.
        let far = SqsLease {
            received: Instant::now(),
            ..lease
        };
        far.renew(Duration::from_secs(30))
            .await
            .expect("a renewal by the whole duration");
    }
}
