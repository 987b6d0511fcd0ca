//! Redrive that keeps identity: moves messages from a dead-letter queue back to a queue with their
//! CloudEvents attributes, FIFO group and deduplication id, deleting each from the DLQ only after its send
//! succeeded.
//!
//! SQS's own `StartMessageMoveTask` is not used: it re-sends messages with a new `MessageId` (fine when the
//! identity is in CloudEvents attributes or the deduplication id, fatal for consumers that opted into the
//! broker id), and it cannot skip messages that are still inside the FIFO deduplication window.
//!
//! The 5-minute FIFO deduplication window matters here: a send whose deduplication id was used on the target
//! queue less than 5 minutes ago is accepted and silently dropped. So a message whose DLQ copy is younger than
//! 5 minutes keeps its identity another way: when its identity is in CloudEvents (`ce-id` attribute or a
//! structured CloudEvents body) it is sent with the deduplication id `redrive-<DLQ MessageId>` (stable across
//! reruns, so a rerun after a failed DLQ delete is itself deduplicated); when the deduplication id *is* its
//! identity it is left in the DLQ and reported as deferred, to be moved by a later run.

use std::io::Write;
use std::time::{Duration, Instant};

use aws_sdk_sqs::types::{MessageSystemAttributeName, QueueAttributeName};
use chrono::{TimeZone, Utc};

use crate::dlq::{is_fifo, DETAIL_ATTRIBUTE, REASON_ATTRIBUTE};
use crate::error::SqsError;
use crate::receiver::delete_one;

/// SQS FIFO's deduplication interval.
pub const DEDUP_WINDOW: Duration = Duration::from_secs(300);

/// What a redrive did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct RedriveReport {
    /// Messages sent to the target and deleted from the DLQ.
    pub moved: usize,
    /// Messages of those that got a `redrive-…` deduplication id because their original one was still
    /// inside the 5-minute window (their identity is in CloudEvents).
    pub new_dedup_id: usize,
    /// Messages left in the DLQ because their deduplication id is their identity and is still inside the
    /// 5-minute window; they become visible again after 60 s, run the redrive again after the window.
    pub deferred: usize,
    /// `ApproximateNumberOfMessages` of the DLQ when the redrive started.
    pub initially_visible: u64,
}

/// How a redrive runs.
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct RedriveOptions {
    /// Move at most this many messages (default: all).
    pub max: Option<usize>,
    /// Draw progress as one updating line (`\r`), for a terminal; otherwise write a line every
    /// `line_every` messages.
    pub terminal: bool,
    /// Lines mode: one progress line per this many messages (default 100).
    pub line_every: usize,
    /// Long-poll wait per DLQ receive; the redrive ends at the first empty receive (default 2 s).
    pub wait: Duration,
}

impl Default for RedriveOptions {
    fn default() -> Self {
        Self {
            max: None,
            terminal: false,
            line_every: 100,
            wait: Duration::from_secs(2),
        }
    }
}

impl RedriveOptions {
    /// Sets the maximum number of messages to move.
    pub fn max(mut self, max: Option<usize>) -> Self {
        self.max = max;
        self
    }
    /// Sets the progress style (true: one updating line).
    pub fn terminal(mut self, terminal: bool) -> Self {
        self.terminal = terminal;
        self
    }
    /// Sets the long-poll wait per receive.
    pub fn wait(mut self, wait: Duration) -> Self {
        self.wait = wait;
        self
    }
}

/// `txinbox sqs redrive --from DLQ_URL --to QUEUE_URL [--max N]`: moves up to `max` messages (all when
/// `None`) from `from` to `to`, writing progress to `progress`, as an updating line when standard error is a
/// terminal and as plain lines otherwise. See the [module docs](self) for the identity rules.
pub async fn redrive(
    client: &aws_sdk_sqs::Client,
    from: &str,
    to: &str,
    max: Option<usize>,
    progress: &mut impl Write,
) -> Result<RedriveReport, SqsError> {
    use std::io::IsTerminal;
    let opts = RedriveOptions::default()
        .max(max)
        .terminal(std::io::stderr().is_terminal());
    redrive_with(client, from, to, &opts, progress).await
}

/// [`redrive`] with explicit options.
pub async fn redrive_with(
    client: &aws_sdk_sqs::Client,
    from: &str,
    to: &str,
    opts: &RedriveOptions,
    progress: &mut impl Write,
) -> Result<RedriveReport, SqsError> {
    let mut report = RedriveReport::default();
    match run(client, from, to, opts, progress, &mut report).await {
        Ok(()) => Ok(report),
        Err(e) => Err(SqsError::RedriveInterrupted {
            report,
            source: Box::new(e),
        }),
    }
}

async fn run(
    client: &aws_sdk_sqs::Client,
    from: &str,
    to: &str,
    opts: &RedriveOptions,
    progress: &mut impl Write,
    report: &mut RedriveReport,
) -> Result<(), SqsError> {
    let started = Instant::now();
    report.initially_visible = client
        .get_queue_attributes()
        .queue_url(from)
        .attribute_names(QueueAttributeName::ApproximateNumberOfMessages)
        .send()
        .await
        .map_err(|e| SqsError::from_sdk("GetQueueAttributes", e))?
        .attributes()
        .and_then(|a| a.get(&QueueAttributeName::ApproximateNumberOfMessages))
        .and_then(|n| n.parse().ok())
        .unwrap_or(0);
    let target_fifo = is_fifo(to);
    let limit = opts.max.unwrap_or(usize::MAX);
    let mut last_line = 0;
    draw(progress, opts, report, started, false)?;
    'outer: while report.moved < limit {
        let ask = (limit - report.moved).min(10);
        let out = client
            .receive_message()
            .queue_url(from)
            .max_number_of_messages(ask as i32)
            .wait_time_seconds(opts.wait.as_secs().min(20) as i32)
            .visibility_timeout(60)
            .message_system_attribute_names(MessageSystemAttributeName::All)
            .message_attribute_names("All")
            .send()
            .await
            .map_err(|e| SqsError::from_sdk("ReceiveMessage", e))?;
        let messages = out.messages.unwrap_or_default();
        if messages.is_empty() {
            break;
        }
        for m in messages {
            if report.moved >= limit {
                break 'outer;
            }
            let receipt = m.receipt_handle().ok_or(SqsError::Incomplete {
                field: "a receipt handle",
            })?;
            let sys =
                |k: MessageSystemAttributeName| m.attributes().and_then(|a| a.get(&k)).cloned();
            let mut attrs = m.message_attributes().cloned().unwrap_or_default();
            attrs.retain(|k, _| {
                !k.eq_ignore_ascii_case(REASON_ATTRIBUTE)
                    && !k.eq_ignore_ascii_case(DETAIL_ATTRIBUTE)
            });
            let mut send = client
                .send_message()
                .queue_url(to)
                .message_body(m.body().unwrap_or_default())
                .set_message_attributes((!attrs.is_empty()).then_some(attrs.clone()));
            if target_fifo {
                let original = sys(MessageSystemAttributeName::MessageDeduplicationId);
                let sent_ms = sys(MessageSystemAttributeName::SentTimestamp)
                    .and_then(|t| t.parse::<i64>().ok());
                let in_window = sent_ms
                    .and_then(|ms| Utc.timestamp_millis_opt(ms).single())
                    .is_none_or(|sent| {
                        (Utc::now() - sent).to_std().unwrap_or_default()
                            < DEDUP_WINDOW + Duration::from_secs(10)
                    });
                let identity_elsewhere = attrs
                    .keys()
                    .any(|k| k.eq_ignore_ascii_case(txinbox_core::identity::ce::ID))
                    || structured_cloudevent(m.body().unwrap_or_default());
                let dedup = match (original, in_window, identity_elsewhere) {
                    (Some(orig), false, _) => orig,
                    (Some(_), true, false) => {
                        report.deferred += 1;
                        tracing::warn!(dlq_message_id = m.message_id().unwrap_or(""), "deferred: its deduplication id is its identity and is still inside the 5-minute FIFO window; run the redrive again later");
                        continue;
                    }
                    (_, _, _) => {
                        report.new_dedup_id += 1;
                        format!("redrive-{}", m.message_id().unwrap_or(receipt))
                    }
                };
                let group = sys(MessageSystemAttributeName::MessageGroupId)
                    .unwrap_or_else(|| "txinbox-redrive".into());
                send = send.message_group_id(group).message_deduplication_id(dedup);
            }
            send.send()
                .await
                .map_err(|e| SqsError::from_sdk("SendMessage", e))?;
            // Only after the send: a failure here leaves a copy in both queues, which the inbox absorbs.
            delete_one(client, from, receipt).await?;
            report.moved += 1;
            metrics::counter!(txinbox_core::metrics::REDRIVEN, "consumer" => "sqs-redrive")
                .increment(1);
            if opts.terminal || report.moved - last_line >= opts.line_every.max(1) {
                last_line = report.moved;
                draw(progress, opts, report, started, false)?;
            }
        }
    }
    draw(progress, opts, report, started, true)
}

fn structured_cloudevent(body: &str) -> bool {
    if !body.trim_start().starts_with('{') {
        return false;
    }
    serde_json::from_str::<serde_json::Value>(body).is_ok_and(|v| {
        v.get("specversion").is_some() && v.get("id").is_some() && v.get("source").is_some()
    })
}

fn draw(
    w: &mut impl Write,
    opts: &RedriveOptions,
    r: &RedriveReport,
    started: Instant,
    done: bool,
) -> Result<(), SqsError> {
    let line = format!(
        "redrive: moved {}/{}{}{} in {:.1}s",
        r.moved,
        opts.max.map_or(r.initially_visible as usize, |m| m
            .min(r.initially_visible as usize)),
        if r.new_dedup_id > 0 {
            format!(", {} with a new dedup id", r.new_dedup_id)
        } else {
            String::new()
        },
        if r.deferred > 0 {
            format!(", {} deferred (dedup window)", r.deferred)
        } else {
            String::new()
        },
        started.elapsed().as_secs_f64()
    );
    let res = if opts.terminal {
        write!(w, "\r\x1b[2K{line}{}", if done { "\n" } else { "" })
    } else {
        writeln!(w, "{line}{}", if done { " (done)" } else { "" })
    };
    res.and_then(|_| w.flush()).map_err(SqsError::Progress)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn progress_lines_and_terminal_updates() {
        let r = RedriveReport {
            moved: 3,
            deferred: 1,
            initially_visible: 5,
            ..RedriveReport::default()
        };
        let mut out = Vec::new();
        draw(
            &mut out,
            &RedriveOptions::default(),
            &r,
            Instant::now(),
            true,
        )
        .unwrap();
        let s = String::from_utf8(out).unwrap();
        assert!(s.starts_with("redrive: moved 3/5, 1 deferred"), "{s}");
        assert!(s.ends_with("(done)\n"));
        let mut out = Vec::new();
        draw(
            &mut out,
            &RedriveOptions::default().terminal(true),
            &r,
            Instant::now(),
            false,
        )
        .unwrap();
        assert!(out.starts_with(b"\r\x1b[2K") && !out.ends_with(b"\n"));
    }

    #[test]
    fn structured_cloudevents_bodies_are_recognised() {
        assert!(structured_cloudevent(
            r#"{"specversion":"1.0","id":"e","source":"s"}"#
        ));
        assert!(!structured_cloudevent(r#"{"id":"e"}"#));
        assert!(!structured_cloudevent("plain"));
    }
}
