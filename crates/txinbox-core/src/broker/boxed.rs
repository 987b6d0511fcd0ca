//! A receiver chosen at run time: [`BoxReceiver`] holds any [`Receiver`] behind one type, so one binary can pick
//! SQS or Service Bus from its settings file and build one worker for either.
//!
//! ```no_run
//! use txinbox_core::broker::{BoxReceiver, Receiver};
//!
//! fn pick(use_first: bool, a: impl Receiver, b: impl Receiver) -> BoxReceiver {
//!     if use_first { BoxReceiver::new(a) } else { BoxReceiver::new(b) }
//! }
//! ```
//!
//! The cost is one allocation per receive and per delivery, and a boxed future per settle: nothing beside a
//! broker round trip.

use std::sync::Arc;
use std::time::Duration;

use futures::future::BoxFuture;
use futures::FutureExt;

use super::{DeadLetter, Delivery, Lease, ReceivedMessage, Receiver};
use crate::error::BrokerError;

/// Any [`Receiver`], behind one type. Its deliveries are [`BoxDelivery`]s.
pub struct BoxReceiver(Box<dyn DynReceiver>);

impl std::fmt::Debug for BoxReceiver {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("BoxReceiver")
    }
}

impl BoxReceiver {
    /// `receiver`, boxed.
    pub fn new<R: Receiver>(receiver: R) -> Self {
        Self(Box::new(receiver))
    }
}

/// A delivery of a [`BoxReceiver`]: settled once by consuming it, as any [`Delivery`].
pub struct BoxDelivery(Box<dyn DynDelivery>);

impl std::fmt::Debug for BoxDelivery {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("BoxDelivery")
            .field(self.0.message())
            .finish()
    }
}

/// [`Receiver`] with boxed futures, so it can be a trait object.
trait DynReceiver: Send + 'static {
    fn receive_boxed(&mut self, max: usize)
        -> BoxFuture<'_, Result<Vec<BoxDelivery>, BrokerError>>;
    fn check_boxed(&mut self) -> BoxFuture<'_, Result<(), BrokerError>>;
    fn fork_boxed(&self) -> Option<Box<dyn DynReceiver>>;
}

impl<R: Receiver> DynReceiver for R {
    fn receive_boxed(
        &mut self,
        max: usize,
    ) -> BoxFuture<'_, Result<Vec<BoxDelivery>, BrokerError>> {
        self.receive(max)
            .map(|r| r.map(|ds| ds.into_iter().map(|d| BoxDelivery(Box::new(d))).collect()))
            .boxed()
    }
    fn check_boxed(&mut self) -> BoxFuture<'_, Result<(), BrokerError>> {
        self.check().boxed()
    }
    fn fork_boxed(&self) -> Option<Box<dyn DynReceiver>> {
        self.fork().map(|r| Box::new(r) as Box<dyn DynReceiver>)
    }
}

impl Receiver for BoxReceiver {
    type Delivery = BoxDelivery;

    async fn receive(&mut self, max: usize) -> Result<Vec<BoxDelivery>, BrokerError> {
        self.0.receive_boxed(max).await
    }

    async fn check(&mut self) -> Result<(), BrokerError> {
        self.0.check_boxed().await
    }

    fn fork(&self) -> Option<Self> {
        self.0.fork_boxed().map(BoxReceiver)
    }
}

/// [`Delivery`] with boxed futures, so it can be a trait object.
trait DynDelivery: Send + Sync + 'static {
    fn message(&self) -> &ReceivedMessage;
    fn ack_boxed(self: Box<Self>) -> BoxFuture<'static, Result<(), BrokerError>>;
    fn release_boxed(
        self: Box<Self>,
        delay: Duration,
    ) -> BoxFuture<'static, Result<(), BrokerError>>;
    fn dead_letter_boxed(
        self: Box<Self>,
        why: DeadLetter,
    ) -> BoxFuture<'static, Result<(), BrokerError>>;
    fn lease(&self) -> Option<Arc<dyn Lease>>;
    fn release_holds(&self) -> bool;
}

impl<D: Delivery> DynDelivery for D {
    fn message(&self) -> &ReceivedMessage {
        Delivery::message(self)
    }
    fn ack_boxed(self: Box<Self>) -> BoxFuture<'static, Result<(), BrokerError>> {
        (*self).ack().boxed()
    }
    fn release_boxed(
        self: Box<Self>,
        delay: Duration,
    ) -> BoxFuture<'static, Result<(), BrokerError>> {
        (*self).release(delay).boxed()
    }
    fn dead_letter_boxed(
        self: Box<Self>,
        why: DeadLetter,
    ) -> BoxFuture<'static, Result<(), BrokerError>> {
        (*self).dead_letter(why).boxed()
    }
    fn lease(&self) -> Option<Arc<dyn Lease>> {
        Delivery::lease(self)
    }
    fn release_holds(&self) -> bool {
        Delivery::release_holds(self)
    }
}

impl Delivery for BoxDelivery {
    fn message(&self) -> &ReceivedMessage {
        self.0.message()
    }
    async fn ack(self) -> Result<(), BrokerError> {
        self.0.ack_boxed().await
    }
    async fn release(self, delay: Duration) -> Result<(), BrokerError> {
        self.0.release_boxed(delay).await
    }
    async fn dead_letter(self, why: DeadLetter) -> Result<(), BrokerError> {
        self.0.dead_letter_boxed(why).await
    }
    fn lease(&self) -> Option<Arc<dyn Lease>> {
        self.0.lease()
    }
    fn release_holds(&self) -> bool {
        self.0.release_holds()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::broker::mem::{MemoryQueue, OutgoingMessage, QueueState};

    #[tokio::test]
    async fn a_boxed_receiver_receives_forks_and_settles_as_its_receiver() {
        let q = MemoryQueue::default();
        for i in 0..3 {
            q.send(OutgoingMessage::new(format!("m{i}")));
        }
        let mut r = BoxReceiver::new(q.receiver());
        let mut fork = r.fork().expect("the in-memory receiver forks");
        let mut got = r.receive(2).await.unwrap();
        got.extend(fork.receive(2).await.unwrap());
        assert_eq!(got.len(), 3);
        let mut it = got.into_iter();
        it.next().unwrap().ack().await.unwrap();
        it.next().unwrap().release(Duration::ZERO).await.unwrap();
        it.next()
            .unwrap()
            .dead_letter(DeadLetter::new("test", "boxed"))
            .await
            .unwrap();
        let s = q.state();
        assert_eq!(
            (s.visible, s.in_flight, s.dead_lettered),
            (1, 0, 1),
            "{s:?}"
        );
        assert_eq!(
            q.state(),
            QueueState {
                visible: 1,
                dead_lettered: 1,
                ..s
            }
        );
    }

    /// A receiver and a delivery answering every defaulted method of [`Receiver`] and [`Delivery`] otherwise
    /// than the trait's default: its check fails, and its deliveries' release holds its caller.
    struct Unlike;

    struct UnlikeDelivery(ReceivedMessage);

    impl Receiver for Unlike {
        type Delivery = UnlikeDelivery;
        async fn receive(&mut self, _: usize) -> Result<Vec<UnlikeDelivery>, BrokerError> {
            Ok(vec![UnlikeDelivery(ReceivedMessage::new(b"{}".to_vec()))])
        }
        async fn check(&mut self) -> Result<(), BrokerError> {
            Err(BrokerError::new(
                crate::BrokerErrorKind::EntityNotFound,
                "check",
                "no such queue",
            ))
        }
        fn fork(&self) -> Option<Self> {
            Some(Unlike)
        }
    }

    impl Delivery for UnlikeDelivery {
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
        fn release_holds(&self) -> bool {
            true
        }
    }

    /// Boxing hides nothing a receiver or its deliveries say in place of a trait default: the start-up check's
    /// failure, a fork, and a release that holds its caller (the shard router settles those in the background).
    #[tokio::test]
    async fn boxing_keeps_every_answer_that_is_not_the_default() {
        let mut r = BoxReceiver::new(Unlike);
        let e = r
            .check()
            .await
            .expect_err("the receiver's check, not the default");
        assert_eq!(e.kind(), crate::BrokerErrorKind::EntityNotFound);
        assert!(r.fork().is_some());
        let d = r.receive(1).await.unwrap().pop().unwrap();
        assert!(Delivery::release_holds(&d));
    }
}
