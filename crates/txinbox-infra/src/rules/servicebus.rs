//! The Service Bus queue rules: duplicate detection, lock duration, dead-lettering on expiry, time to live.

use std::time::Duration;

use hcl::Value;

use super::{as_bool, show, Checker};
use crate::duration::{ceil_secs, exact, human, parse_iso8601};
use crate::terraform::{Module, Resolved, Resource};
use crate::RuleId;

/// Service Bus's lock duration when `lock_duration` is unset.
const SB_DEFAULT_LOCK: u64 = 60;

/// A duration (exact: `PT39.5S` is 39.5 s), its line, and how to show it.
type Found = (Duration, usize, String);
/// The line and message of a duration that cannot be used.
type Unusable = (usize, String);

/// Reads an ISO 8601 duration attribute: `Ok(Some((seconds, line, shown)))`,
/// `Ok(None)` when missing, `Err((line, message))` when unusable.
pub(crate) fn duration(
    module: &Module,
    queue: &Resource,
    key: &str,
) -> Result<Option<Found>, Unusable> {
    match module.resolve(queue, key) {
        Resolved::Missing => Ok(None),
        Resolved::Unknown { line, why, .. } => Err((line, format!("{key} cannot be resolved statically ({why}); set it to a literal or a variable with a default so the guarantee can be checked"))),
        Resolved::Known { value, line, origin } => {
            let parsed = match &value {
                Value::String(s) => parse_iso8601(s),
                _ => None,
            };
            match parsed {
                Some(seconds) => Ok(Some((seconds, line, format!("{key} = {}{origin}", show(&value))))),
                None => Err((line, format!("{key} = {}{origin} is not an ISO 8601 duration such as \"PT1M\"", show(&value)))),
            }
        }
    }
}

pub(super) fn check_servicebus_queue(c: &mut Checker<'_>, queue: &Resource) {
    let module = c.module;
    let settings = c.settings;

    // Duplicate detection, and its window.
    const DD: &str = "requires_duplicate_detection";
    match module.resolve(queue, DD) {
        Resolved::Missing => c.at(RuleId::ServiceBusDuplicateDetectionOff, queue, None, format!(
            "{DD} is not set (Service Bus default: false): the broker does not drop a producer's resend of the same MessageId, so every retry reaches the worker; set it to true (it cannot be changed after the queue is created)"
        )),
        Resolved::Unknown { line, why, .. } => c.unknown(RuleId::ServiceBusDuplicateDetectionOff, queue, DD, line, &why),
        Resolved::Known { value, line, origin } => {
            if as_bool(&value) == Some(true) {
                const WINDOW: &str = "duplicate_detection_history_time_window";
                match duration(module, queue, WINDOW) {
                    Ok(Some(_)) => {}
                    Ok(None) => c.at(RuleId::ServiceBusDuplicateWindowDefault, queue, None, format!(
                        "{DD} = true but {WINDOW} is left to the provider's default: set the window explicitly (the worker expects PT{}S) so that it is reviewed and cannot change with the provider",
                        settings.servicebus.duplicate_detection_window_seconds
                    )),
                    Err((line, message)) => c.at(RuleId::ServiceBusDuplicateWindowDefault, queue, Some(line), message),
                }
            } else {
                c.at(RuleId::ServiceBusDuplicateDetectionOff, queue, Some(line), format!(
                    "{DD} = {}{origin}: the broker does not drop a producer's resend of the same MessageId, so every retry reaches the worker; set it to true (it cannot be changed after the queue is created)",
                    show(&value)
                ));
            }
        }
    }

    // Lock duration against the renewal interval.
    const LOCK: &str = "lock_duration";
    // Exact, not in whole seconds (a third of a 50 s lock is 16.666 s).
    let renewal = settings.servicebus.lock_renewal_interval();
    let minimum = renewal.saturating_mul(2);
    let lock = match duration(module, queue, LOCK) {
        Ok(Some(found)) => Some(found),
        Ok(None) => Some((
            Duration::from_secs(SB_DEFAULT_LOCK),
            queue.at.line,
            format!("{LOCK} is not set (Service Bus default PT1M)"),
        )),
        Err((line, message)) => {
            c.at(
                RuleId::ServiceBusLockDurationTooShort,
                queue,
                Some(line),
                message,
            );
            None
        }
    };
    if let Some((lock, line, shown)) = lock {
        // A fraction of a second counts: PT39.5S is short of 2 x 20 s.
        if lock < minimum {
            c.at(RuleId::ServiceBusLockDurationTooShort, queue, Some(line), format!(
                "{shown} is {}, shorter than 2 x the worker's lock renewal interval (2 x {} = {}): the lock can expire before it is renewed and the message is delivered to another receiver while the handler still runs",
                exact(lock),
                exact(renewal),
                exact(minimum)
            ));
        }
    }

    // Dead-lettering on expiry.
    const DLX: &str = "dead_lettering_on_message_expiration";
    match module.resolve(queue, DLX) {
        Resolved::Missing => c.at(RuleId::ServiceBusNoDeadLetteringOnExpiry, queue, None, format!(
            "{DLX} is not set (Service Bus default: false): a message that expires before the worker completes it is dropped silently instead of kept in the dead-letter queue"
        )),
        Resolved::Unknown { line, why, .. } => c.unknown(RuleId::ServiceBusNoDeadLetteringOnExpiry, queue, DLX, line, &why),
        Resolved::Known { value, line, origin } => {
            if as_bool(&value) != Some(true) {
                c.at(RuleId::ServiceBusNoDeadLetteringOnExpiry, queue, Some(line), format!(
                    "{DLX} = {}{origin}: a message that expires before the worker completes it is dropped silently instead of kept in the dead-letter queue",
                    show(&value)
                ));
            }
        }
    }

    // Time to live against the inbox retention.
    const TTL: &str = "default_message_ttl";
    let inbox = settings.inbox.retention_seconds;
    match duration(module, queue, TTL) {
        Ok(None) => c.at(RuleId::ServiceBusTtlExceedsInbox, queue, None, format!(
            "{TTL} is not set (Service Bus default: practically forever), longer than the inbox keeps processed markers (inbox.retention_seconds = {}): a message redelivered after the inbox forgot its id would be processed again as new",
            human(inbox)
        )),
        Ok(Some((ttl, line, shown))) if ceil_secs(ttl) > inbox => c.at(RuleId::ServiceBusTtlExceedsInbox, queue, Some(line), format!(
            "{shown} is {}, longer than the inbox keeps processed markers (inbox.retention_seconds = {}): a message redelivered after the inbox forgot its id would be processed again as new",
            human(ceil_secs(ttl)),
            human(inbox)
        )),
        Ok(Some(_)) => {}
        Err((line, message)) => c.at(RuleId::ServiceBusTtlExceedsInbox, queue, Some(line), message),
    }
}
