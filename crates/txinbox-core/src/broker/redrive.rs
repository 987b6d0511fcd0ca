//! What every adapter's redrive (dead-letter queue back to its queue, identity kept) reports, and how it
//! tells its progress.
//!
//! An adapter's `redrive` returns a [`RedriveReport`] and calls a [`RedriveProgress`] as it goes: each call
//! carries the report so far, so a caller whose redrive stopped on an error still knows what was moved. The
//! progress never fails the redrive: a renderer that cannot write keeps its error and reports it afterwards.

use std::time::Duration;

use crate::error::BrokerError;

/// What a redrive did. Fields an adapter does not use stay at their default.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
#[must_use = "a RedriveReport says what was moved and what failed"]
pub struct RedriveReport {
    /// Messages sent to the target and removed from the dead-letter queue.
    pub moved: usize,
    /// Messages left in the dead-letter queue because the target's deduplication window would drop them
    /// silently; run the redrive again after the window.
    pub deferred: usize,
    /// Messages of those moved that were sent with a new deduplication id, because the original was still
    /// inside the window and their identity is elsewhere (SQS FIFO: CloudEvents attributes).
    pub new_dedup_id: usize,
    /// Messages sent to the target whose removal from the dead-letter queue failed: a later run sends them
    /// again (the inbox absorbs the second copy).
    pub settle_failed: usize,
    /// Messages the dead-letter queue held when the redrive started, when the broker says (SQS
    /// `ApproximateNumberOfMessages`).
    pub initially_visible: Option<u64>,
    /// The identities (producer ids) of the messages moved, in order.
    pub moved_ids: Vec<String>,
    /// Messages left in the dead-letter queue because their identity was lost on the way there and a redrive
    /// would give them a new one (SQS FIFO: the deduplication id, replaced by AWS with the message id on the
    /// move to the DLQ, was their only identity). An operator decides what to do with them.
    pub identity_lost: usize,
}

/// One dead letter a [`RedriveEvent`] is about. Never a credential.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct RedriveItem<'a> {
    /// The message's identity on the wire (SQS deduplication id, Service Bus MessageId); empty if none.
    pub message_id: &'a str,
    /// Where it sat in the dead-letter queue (SQS MessageId, Service Bus SequenceNumber).
    pub position: &'a str,
}

impl<'a> RedriveItem<'a> {
    /// An item.
    pub fn new(message_id: &'a str, position: &'a str) -> Self {
        Self {
            message_id,
            position,
        }
    }
}

/// What just happened in a redrive.
#[derive(Debug)]
#[non_exhaustive]
pub enum RedriveEvent<'a> {
    /// The redrive is about to receive its first message.
    Started,
    /// A message was sent to the target and removed from the dead-letter queue.
    Moved(RedriveItem<'a>),
    /// A message was left in the dead-letter queue (inside the target's deduplication window).
    Deferred {
        /// The message.
        item: RedriveItem<'a>,
        /// How long ago it was first enqueued, when known.
        enqueued_ago: Option<chrono::Duration>,
        /// The deduplication window it is inside.
        window: Duration,
    },
    /// A message was left in the dead-letter queue because its identity was lost (see
    /// [`RedriveReport::identity_lost`]).
    IdentityLost {
        /// The message.
        item: RedriveItem<'a>,
    },
    /// A message was sent to the target but could not be removed from the dead-letter queue.
    SettleFailed {
        /// The message.
        item: RedriveItem<'a>,
        /// Why.
        error: &'a BrokerError,
    },
    /// The redrive ended: completely, or stopped by `error` (which is also the redrive's result).
    Finished {
        /// The error that stopped it, if one did.
        error: Option<&'a BrokerError>,
    },
}

/// Told about a redrive's progress. Implemented by the CLI's renderers; `()` ignores everything.
pub trait RedriveProgress: Send {
    /// `event` happened; `report` is the state after it.
    fn event(&mut self, event: RedriveEvent<'_>, report: &RedriveReport);
}

impl RedriveProgress for () {
    fn event(&mut self, _: RedriveEvent<'_>, _: &RedriveReport) {}
}

impl<F> RedriveProgress for F
where
    F: FnMut(RedriveEvent<'_>, &RedriveReport) + Send,
{
    fn event(&mut self, event: RedriveEvent<'_>, report: &RedriveReport) {
        self(event, report)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn closures_are_progress() {
        let mut moved = Vec::new();
        let mut p = |e: RedriveEvent<'_>, r: &RedriveReport| {
            if let RedriveEvent::Moved(item) = e {
                moved.push((item.message_id.to_owned(), r.moved));
            }
        };
        let report = RedriveReport {
            moved: 1,
            ..RedriveReport::default()
        };
        p.event(RedriveEvent::Moved(RedriveItem::new("m1", "7")), &report);
        p.event(RedriveEvent::Finished { error: None }, &report);
        assert_eq!(moved, vec![("m1".to_owned(), 1)]);
    }
}

/// How a redrive runs, on either broker.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
#[must_use = "RedriveOptions do nothing until given to a redrive"]
pub struct RedriveOptions {
    /// Move at most this many messages (default: all).
    pub max: Option<usize>,
    /// Long-poll wait per receive; the redrive ends at the first empty receive (default 2 s).
    pub wait: Duration,
    /// The target's duplicate-detection window, where the broker lets you set it (Service Bus; default 10
    /// minutes, the Terraform samples' `PT10M`): a message first sent within it is left in place, since the
    /// broker would drop the copy. SQS FIFO's window is fixed at 5 minutes, and its redrive does not read this.
    pub duplicate_detection_window: Duration,
}

impl Default for RedriveOptions {
    fn default() -> Self {
        Self {
            max: None,
            wait: Duration::from_secs(2),
            duplicate_detection_window: Duration::from_secs(600),
        }
    }
}

impl RedriveOptions {
    /// Sets the maximum number of messages to move.
    pub fn max(mut self, max: Option<usize>) -> Self {
        self.max = max;
        self
    }
    /// Sets the receive wait.
    pub fn wait(mut self, d: Duration) -> Self {
        self.wait = d;
        self
    }
    /// Sets the target's duplicate-detection window (zero: the target has none).
    pub fn duplicate_detection_window(mut self, d: Duration) -> Self {
        self.duplicate_detection_window = d;
        self
    }
}
