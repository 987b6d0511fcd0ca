//! Redrive that keeps identity: moves dead letters back to a queue with their MessageId, CloudEvents
//! properties and other custom properties intact (dead-letter bookkeeping dropped), completing each dead
//! letter only after its copy was sent.
//!
//! **Duplicate detection.** A send whose MessageId the target saw less than its
//! `DuplicateDetectionHistoryTimeWindow` ago is answered 201 and silently dropped. A dead letter
//! whose original enqueue time is younger than [`RedriveOptions::duplicate_detection_window`] is therefore left
//! where it is (its lock is held until the run ends, then abandoned) and counted as `deferred`: run the redrive
//! again after the window. Set the window to zero when the target has no duplicate detection.

use chrono::Utc;
pub use txinbox_core::broker::redrive::RedriveOptions;
use txinbox_core::broker::redrive::{RedriveEvent, RedriveItem, RedriveProgress, RedriveReport};
use txinbox_core::{BrokerError, BrokerErrorKind};

use crate::config::ServiceBusClient;
use crate::dlq::{is_dead_letter_property, original_enqueued_at, resend_options, Sighting, Sweep};
use crate::error::send_error;
use crate::receiver::{settle, SettleOp};
use crate::wire::quote_property;

/// Custom property a redriven copy carries: the path it was redriven from.
pub const REDRIVEN_FROM_PROPERTY: &str = txinbox_core::dead_letter::REDRIVEN_FROM;

/// Moves dead letters from `from` (e.g. [`crate::dead_letter_queue_path`]`("orders")` or a forward
/// destination) to the queue `to`, telling `progress` about each message (MessageIds and sequence numbers
/// only, never a credential; `&mut ()` for nothing).
///
/// Each dead letter is looked at once per run. A run that lasts longer than the source's lock meets again the
/// messages it left in place (deferred, or sent but not completed) once their lock lapses (Microsoft, Peek-Lock
/// Message: "When the lock expires, the message becomes available to other receivers"): one already looked at,
/// by sequence number, is neither sent again nor counted again; its new lock is held, so the run moves on to
/// the messages behind it; before each receive, the locks it holds past half their length are renewed. The run
/// ends at the first empty receive, at `max` moved, or when more messages in a
/// row came round again than the run has left in place (one of them came round twice, a lock apart, with no
/// new message in between).
///
/// The report fills `moved`, `deferred`, `settle_failed` (sent but not completed in the source) and
/// `moved_ids`. On a failed send the message is abandoned in the source, the held ones are released, and the
/// error is returned; the last report `progress` saw says what was done before.
pub async fn redrive(
    client: &ServiceBusClient,
    from: &str,
    to: &str,
    options: &RedriveOptions,
    progress: &mut dyn RedriveProgress,
) -> Result<RedriveReport, BrokerError> {
    let from = from.trim_matches('/');
    let to = to.trim_matches('/');
    if from.is_empty() || to.is_empty() || from.eq_ignore_ascii_case(to) {
        return Err(BrokerError::new(
            BrokerErrorKind::Configuration,
            "redrive",
            "redrive needs two different, non-empty entity paths",
        ));
    }
    let source = client.queue_client(from);
    let target = client.queue_client(to);
    let window = chrono::Duration::from_std(options.duplicate_detection_window)
        .unwrap_or(chrono::Duration::MAX);
    let mut report = RedriveReport::default();
    let mut sweep = Sweep::default();
    progress.event(RedriveEvent::Started, &report);
    let outcome = loop {
        if options.max.is_some_and(|m| report.moved >= m) {
            break Ok(());
        }
        // What this run completed in the source cannot come round again; the rest (deferred, or sent but not
        // completed) can, and is neither sent nor counted twice.
        let locked = match sweep.next(&source, from, options.wait, report.moved).await {
            Ok(Sighting::New(l)) => *l,
            Ok(Sighting::Again) => continue,
            Ok(Sighting::Done) => break Ok(()),
            Err(e) => break Err(e),
        };
        let m = &locked.message;
        let id = m.producer_id.clone().unwrap_or_default();
        let seq = m.broker_id.clone().unwrap_or_default();
        if let Some(enqueued) = original_enqueued_at(m) {
            let age = Utc::now() - enqueued;
            if age < window {
                report.deferred += 1;
                progress.event(
                    RedriveEvent::Deferred {
                        item: RedriveItem::new(&id, &seq),
                        enqueued_ago: Some(age),
                        window: options.duplicate_detection_window,
                    },
                    &report,
                );
                sweep.hold(locked);
                continue;
            }
        }
        let Some(body) = m.body_str() else {
            break Err(BrokerError::new(
                BrokerErrorKind::Protocol,
                "redrive",
                format!("message {id} has a non-UTF-8 body"),
            ));
        };
        let options = resend_options(
            &locked,
            is_dead_letter_property,
            [(REDRIVEN_FROM_PROPERTY.to_owned(), quote_property(from, 300))],
        );
        let body_len = body.len();
        if let Err(e) = target.send_message(body, Some(options)).await {
            sweep.hold(locked);
            break Err(send_error("send", e, body_len));
        }
        match settle(
            &locked.response,
            SettleOp::Complete,
            from,
            3,
            locked.locked_until,
        )
        .await
        {
            Ok(()) => {
                report.moved += 1;
                report.moved_ids.push(id.clone());
                metrics::counter!(txinbox_core::metrics::REDRIVE_MOVED, "queue" => to.to_owned())
                    .increment(1);
                progress.event(RedriveEvent::Moved(RedriveItem::new(&id, &seq)), &report);
            }
            Err(e) => {
                report.settle_failed += 1;
                tracing::warn!(from, message_id = %id, error = %e, "sent to the target but not completed in the source; a later run sends it again");
                progress.event(
                    RedriveEvent::SettleFailed {
                        item: RedriveItem::new(&id, &seq),
                        error: &e,
                    },
                    &report,
                );
            }
        }
    };
    sweep.release(from).await;
    progress.event(
        RedriveEvent::Finished {
            error: outcome.as_ref().err(),
        },
        &report,
    );
    outcome.map(|()| report)
}
