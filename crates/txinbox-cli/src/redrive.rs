//! The progress of `txinbox sqs redrive` and `txinbox servicebus redrive`: renderers of the core's
//! [`RedriveProgress`] events, and the command's error when a redrive stops or its progress cannot be written.

use std::io::Write;
use std::time::Instant;

use txinbox_core::broker::redrive::{RedriveEvent, RedriveProgress, RedriveReport};
use txinbox_core::BrokerError;

/// Whether `from` and `to` are one SQS queue: the same account and queue name (the URL's path, whose case
/// counts) at the same endpoint, whatever the scheme (`https` or `http`), a default port, the case of the host
/// (a DNS name) or a trailing `/`; AWS's legacy endpoints `REGION.queue.amazonaws.com` and `queue.amazonaws.com`
/// (us-east-1) are the region's `sqs.REGION.amazonaws.com`. A redrive from a queue to itself never ends: each
/// copy sent is visible at once and received again by the next `ReceiveMessage`, while the message it replaces
/// is deleted.
pub fn same_sqs_queue(from: &str, to: &str) -> bool {
    fn norm(url: &str) -> String {
        let url = url.trim().trim_end_matches('/');
        let Some((scheme, rest)) = url.split_once("://") else {
            return url.to_owned();
        };
        let (host, path) = rest.split_once('/').unwrap_or((rest, ""));
        let mut host = host.to_ascii_lowercase();
        let default_port = match scheme.to_ascii_lowercase().as_str() {
            "https" => ":443",
            "http" => ":80",
            _ => "",
        };
        if !default_port.is_empty() && host.ends_with(default_port) {
            host.truncate(host.len() - default_port.len());
        }
        for suffix in [".amazonaws.com", ".amazonaws.com.cn"] {
            if suffix == ".amazonaws.com" && host == "queue.amazonaws.com" {
                host = format!("sqs.us-east-1{suffix}");
            } else if let Some(region) = host.strip_suffix(&format!(".queue{suffix}")) {
                if !region.is_empty() && !region.contains('.') {
                    host = format!("sqs.{region}{suffix}");
                }
            }
        }
        format!("{host}/{path}")
    }
    norm(from) == norm(to)
}

/// `Ok` when the SQS queue `from` is a dead-letter queue: some queue's `RedrivePolicy` names it. AWS
/// (ListDeadLetterSourceQueues): "Returns a list of your queues that have the RedrivePolicy queue attribute
/// configured with a dead-letter queue." Else the reason to refuse it as a redrive's source, with the flag that
/// moves from it all the same: a `--from` naming a live work queue (a pasted URL of the wrong queue) would
/// drain that queue into `--to`. A failed call (no `sqs:ListDeadLetterSourceQueues`, no such queue) is refused
/// too: the source is not known to be a dead-letter queue.
pub async fn sqs_source_is_a_dead_letter_queue(
    client: &txinbox_sqs::aws_sdk_sqs::Client,
    from: &str,
) -> Result<(), String> {
    match client
        .list_dead_letter_source_queues()
        .queue_url(from)
        .max_results(1)
        .send()
        .await
    {
        Ok(sources) if !sources.queue_urls().is_empty() => Ok(()),
        Ok(_) => Err(format!(
            "--from {from} is no queue's dead-letter queue (no queue's RedrivePolicy names it): a redrive would drain it into --to; check --from, or give --from-any-queue to move from it all the same"
        )),
        Err(e) => {
            use txinbox_sqs::aws_sdk_sqs::error::{DisplayErrorContext, ProvideErrorMetadata};
            // A service error by its code and message (`QueueDoesNotExist: The specified queue does not
            // exist.`, `AccessDenied: ...`); a transport error with its causes.
            let why = match (e.code(), e.message()) {
                (Some(code), Some(message)) => format!("{code}: {message}"),
                (Some(code), None) => code.to_owned(),
                _ => DisplayErrorContext(&e).to_string(),
            };
            Err(format!(
                "cannot tell whether --from {from} is a dead-letter queue (ListDeadLetterSourceQueues: {why}); give --from-any-queue to move from it without asking"
            ))
        }
    }
}

/// Whether `from` and `to` are one Service Bus entity path, without regard to case or surrounding `/`: a
/// redrive from a queue to itself never ends (each copy sent is received again). Two paths differing only in
/// case are refused too: refusing costs the operator a retyped name, a loop costs copies without end.
pub fn same_servicebus_entity(from: &str, to: &str) -> bool {
    from.trim()
        .trim_matches('/')
        .eq_ignore_ascii_case(to.trim().trim_matches('/'))
}

/// The last segment of a dead-letter subqueue's path. Microsoft (Overview of Service Bus dead-letter queues):
/// "You can access the dead-letter queue by using the following syntax: <queue path>/$deadletterqueue <topic
/// path>/Subscriptions/<subscription path>/$deadletterqueue". The docs write it in lower case, the SDKs and
/// [`txinbox_servicebus::dead_letter_queue_path`] as here; the service takes it in any case.
const DEAD_LETTER_SEGMENT: &str = "$DeadLetterQueue";

/// `Ok` when the Service Bus entity path `from` is a dead-letter subqueue, `<entity path>/$DeadLetterQueue` (the
/// segment in any case, surrounding `/` aside; a subscription's, `topic/Subscriptions/s/$DeadLetterQueue`, and
/// the transfer dead-letter queue, `queue/$Transfer/$DeadLetterQueue`, included), or the target's poison queue
/// `poison` (the queue the worker forwards its dead letters to: [`servicebus_poison_queue`]). Else the reason to
/// refuse it as a redrive's source, with the flag that moves from it all the same: a `--from` naming a live
/// queue (a mistyped name) would drain that queue into `--queue`.
pub fn servicebus_source_is_a_dead_letter_queue(from: &str, poison: &str) -> Result<(), String> {
    if same_servicebus_entity(from, poison) {
        return Ok(());
    }
    match from.trim().trim_matches('/').rsplit_once('/') {
        Some((entity, last))
            if !entity.trim_matches('/').is_empty()
                && last.eq_ignore_ascii_case(DEAD_LETTER_SEGMENT) =>
        {
            Ok(())
        }
        _ => Err(format!(
            "--from {from} is no queue's dead-letter queue (its path does not end in /{DEAD_LETTER_SEGMENT}, and it is not the target's poison queue {poison}): a redrive would drain it into --queue; check --from, or give --from-any-queue to move from it all the same"
        )),
    }
}

/// The poison queue the worker of `queue` forwards its dead letters to: the settings file's `[servicebus]
/// dead_letter_to` when `config` names one that sets it, else the convention `{queue}-poison`
/// ([`txinbox_servicebus::roles::poison_queue_name`]).
pub fn servicebus_poison_queue(
    queue: &str,
    config: Option<&std::path::Path>,
) -> Result<String, String> {
    let configured = match config {
        Some(path) => {
            txinbox_core::settings::WorkerSettings::load(path)
                .map_err(|e| e.to_string())?
                .servicebus
                .dead_letter_to
        }
        None => None,
    };
    Ok(configured.unwrap_or_else(|| txinbox_servicebus::roles::poison_queue_name(queue)))
}

/// The exit status of a redrive that ran to its end: 0 when it did all it could, 3 when it left messages for
/// an operator ([`left_for_an_operator`]), whatever else it moved.
pub fn exit_status(report: &RedriveReport) -> u8 {
    if left_for_an_operator(report).is_empty() {
        0
    } else {
        3
    }
}

/// What a redrive that ran to its end left undone, one sentence each: SQS dead letters whose identity was lost
/// (left in the DLQ), Service Bus dead letters sent to the target whose complete in the source failed (a copy
/// in both: the next run sends it again, and the inbox absorbs the second copy). Deferred messages are not in
/// it: the duplicate-detection window keeps them for the next run by design.
pub fn left_for_an_operator(report: &RedriveReport) -> Vec<String> {
    let mut left = Vec::new();
    if report.identity_lost > 0 {
        left.push(format!(
            "{} message(s) left in the DLQ: their identity (the deduplication id AWS replaced on the move) is lost",
            report.identity_lost
        ));
    }
    if report.settle_failed > 0 {
        left.push(format!(
            "{} message(s) sent to the target but not completed in the source: they are in both; run the redrive again later (the inbox absorbs the second copy)",
            report.settle_failed
        ));
    }
    left
}

/// The target's duplicate-detection window for `servicebus redrive`: `--dedup-window-secs`, else the settings
/// file's `[servicebus] duplicate_detection_window_seconds`, else an error. There is no default: Microsoft
/// (QueueProperties.RequiresDuplicateDetection): "If true, duplicate messages having the same MessageId and sent
/// to the queue within duration of DuplicateDetectionHistoryTimeWindow will be discarded", while the send
/// succeeds (docs/servicebus.md); a window assumed shorter than the target's resends such messages and completes
/// their dead letters, and they are lost.
pub fn servicebus_dedup_window(
    secs: Option<u64>,
    config: Option<&std::path::Path>,
) -> Result<std::time::Duration, String> {
    servicebus_dedup_window_with_env(secs, config, std::env::vars())
}

/// The `[servicebus]` key that gives the target's duplicate-detection window.
const DEDUP_WINDOW_KEY: &str = "duplicate_detection_window_seconds";

/// [`servicebus_dedup_window`] with the settings' environment overrides (`TXINBOX_SERVICEBUS__...`) taken from
/// `env`. A settings file is read for the window only when it, or an override, sets it: its default (600 s,
/// Service Bus's own) is no more known to be the target's than any other value.
fn servicebus_dedup_window_with_env(
    secs: Option<u64>,
    config: Option<&std::path::Path>,
    env: impl IntoIterator<Item = (String, String)>,
) -> Result<std::time::Duration, String> {
    match (secs, config) {
        (Some(s), _) => Ok(std::time::Duration::from_secs(s)),
        (None, Some(path)) => {
            let env: Vec<(String, String)> = env.into_iter().collect();
            let settings =
                txinbox_core::settings::WorkerSettings::load_with_env(path, env.iter().cloned())
                    .map_err(|e| e.to_string())?;
            let overridden = env.iter().any(|(var, _)| {
                var.len() > txinbox_core::settings::ENV_PREFIX.len()
                    && var.starts_with(txinbox_core::settings::ENV_PREFIX)
                    && var[txinbox_core::settings::ENV_PREFIX.len()..]
                        .eq_ignore_ascii_case(&format!("servicebus__{DEDUP_WINDOW_KEY}"))
            });
            // Read again as TOML: the settings' own reading fills an absent key with its default.
            let text = std::fs::read_to_string(path)
                .map_err(|e| format!("{}: {e}", path.display()))?;
            let in_file = text
                .parse::<toml::Table>()
                .map_err(|e| format!("{}: {e}", path.display()))?
                .get("servicebus")
                .and_then(toml::Value::as_table)
                .is_some_and(|t| t.contains_key(DEDUP_WINDOW_KEY));
            if !(in_file || overridden) {
                return Err(format!(
                    "{} does not set [servicebus] {DEDUP_WINDOW_KEY}, the target queue's duplicate-detection window: give --dedup-window-secs N (az servicebus queue show --query duplicateDetectionHistoryTimeWindow; 0 when duplicate detection is off) or set it in the file; a window assumed shorter than the target's resends messages Service Bus accepts and drops, and their dead letters would be completed",
                    path.display()
                ));
            }
            Ok(std::time::Duration::from_secs(
                settings.servicebus.duplicate_detection_window_seconds,
            ))
        }
        (None, None) => Err(
            "give the target queue's duplicate-detection window: --dedup-window-secs N (az servicebus queue show --query duplicateDetectionHistoryTimeWindow; 0 when duplicate detection is off), or --config worker.toml ([servicebus] duplicate_detection_window_seconds): a message resent inside the window is accepted and dropped by Service Bus, and its dead letter would be completed"
                .into(),
        ),
    }
}

/// Why a redrive command failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RedriveError {
    /// The redrive stopped on a broker error; `report` says what was done before, and what it left for an
    /// operator ([`left_for_an_operator`]).
    #[error(
        "redrive stopped after moving {} message(s){}: {source}",
        report.moved,
        left_for_an_operator(report).iter().map(|l| format!("; {l}")).collect::<String>()
    )]
    Interrupted {
        /// What the redrive did before the error.
        report: Box<RedriveReport>,
        /// The error.
        #[source]
        source: BrokerError,
    },
    /// Writing progress failed (the redrive itself went on to its end).
    #[error("writing progress failed: {0}")]
    Progress(#[source] std::io::Error),
}

/// What every renderer keeps: the output, the last report seen, the first write error.
#[derive(Debug)]
struct Sink<W> {
    out: W,
    last: RedriveReport,
    error: Option<std::io::Error>,
}

impl<W: Write> Sink<W> {
    fn new(out: W) -> Self {
        Self {
            out,
            last: RedriveReport::default(),
            error: None,
        }
    }

    fn write(&mut self, text: std::fmt::Arguments<'_>) {
        if self.error.is_some() {
            return;
        }
        if let Err(e) = self.out.write_fmt(text).and_then(|_| self.out.flush()) {
            self.error = Some(e);
        }
    }

    fn finish(
        self,
        result: Result<RedriveReport, BrokerError>,
    ) -> Result<RedriveReport, RedriveError> {
        match (result, self.error) {
            (Err(source), _) => Err(RedriveError::Interrupted {
                report: Box::new(self.last),
                source,
            }),
            (Ok(_), Some(e)) => Err(RedriveError::Progress(e)),
            (Ok(report), None) => Ok(report),
        }
    }
}

/// `txinbox sqs redrive`'s progress: `redrive: moved N/TOTAL[, K with a new dedup id][, D deferred (dedup
/// window)] in S.Ss`, as one updating line on a terminal, else a line every `line_every` messages and a last
/// one ending in `(done)`.
#[derive(Debug)]
pub struct SqsProgress<W> {
    sink: Sink<W>,
    max: Option<usize>,
    terminal: bool,
    line_every: usize,
    started: Instant,
    last_line: usize,
}

impl<W: Write> SqsProgress<W> {
    /// Progress to `out` for a redrive of at most `max` messages; `terminal` draws one updating line.
    pub fn new(out: W, max: Option<usize>, terminal: bool) -> Self {
        Self {
            sink: Sink::new(out),
            max,
            terminal,
            line_every: 100,
            started: Instant::now(),
            last_line: 0,
        }
    }

    /// The redrive's result, or the command's error: the redrive's (with what was done before) or the
    /// progress output's.
    pub fn finish(
        self,
        result: Result<RedriveReport, BrokerError>,
    ) -> Result<RedriveReport, RedriveError> {
        self.sink.finish(result)
    }

    fn draw(&mut self, r: &RedriveReport, done: bool) {
        let visible = r.initially_visible.unwrap_or(0) as usize;
        let line = format!(
            "redrive: moved {}/{}{}{}{} in {:.1}s",
            r.moved,
            self.max.map_or(visible, |m| m.min(visible)),
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
            if r.identity_lost > 0 {
                format!(
                    ", {} left in the DLQ (identity lost: deduplication id replaced by AWS)",
                    r.identity_lost
                )
            } else {
                String::new()
            },
            self.started.elapsed().as_secs_f64()
        );
        if self.terminal {
            let end = if done { "\n" } else { "" };
            self.sink.write(format_args!("\r\x1b[2K{line}{end}"));
        } else {
            let end = if done { " (done)" } else { "" };
            self.sink.write(format_args!("{line}{end}\n"));
        }
    }
}

impl<W: Write + Send> RedriveProgress for SqsProgress<W> {
    fn event(&mut self, event: RedriveEvent<'_>, report: &RedriveReport) {
        self.sink.last = report.clone();
        match event {
            RedriveEvent::Started => self.draw(report, false),
            RedriveEvent::Moved(_)
                if self.terminal || report.moved - self.last_line >= self.line_every.max(1) =>
            {
                self.last_line = report.moved;
                self.draw(report, false);
            }
            RedriveEvent::Finished { error: None } => self.draw(report, true),
            // The updating line ends here, so that the error printed next starts a line of its own.
            RedriveEvent::Finished { error: Some(_) } if self.terminal => {
                self.sink.write(format_args!("\n"))
            }
            _ => {}
        }
    }
}

/// `txinbox servicebus redrive`'s progress: one line per message (`moved sequence=… message_id=… from … to …`,
/// `deferred …`, `sent … but could not complete it …`) and a summary line at the end.
#[derive(Debug)]
pub struct ServiceBusProgress<W> {
    sink: Sink<W>,
    from: String,
    to: String,
}

impl<W: Write> ServiceBusProgress<W> {
    /// Progress to `out` for a redrive from `from` to `to`.
    pub fn new(out: W, from: &str, to: &str) -> Self {
        Self {
            sink: Sink::new(out),
            from: from.trim_matches('/').to_owned(),
            to: to.trim_matches('/').to_owned(),
        }
    }

    /// The redrive's result, or the command's error (see [`SqsProgress::finish`]).
    pub fn finish(
        self,
        result: Result<RedriveReport, BrokerError>,
    ) -> Result<RedriveReport, RedriveError> {
        self.sink.finish(result)
    }
}

impl<W: Write + Send> RedriveProgress for ServiceBusProgress<W> {
    fn event(&mut self, event: RedriveEvent<'_>, report: &RedriveReport) {
        self.sink.last = report.clone();
        let (from, to) = (&self.from, &self.to);
        match event {
            RedriveEvent::Moved(item) => self.sink.write(format_args!(
                "moved sequence={} message_id={} from {from} to {to}\n",
                crate::out::escaped(item.position),
                crate::out::escaped(item.message_id)
            )),
            RedriveEvent::Deferred {
                item,
                enqueued_ago,
                window,
            } => self.sink.write(format_args!(
                "deferred sequence={} message_id={}: enqueued {}s ago, inside the {}s duplicate-detection window of {to}\n",
                crate::out::escaped(item.position),
                crate::out::escaped(item.message_id),
                enqueued_ago.map_or(0, |d| d.num_seconds()),
                window.as_secs()
            )),
            RedriveEvent::SettleFailed { item, error } => self.sink.write(format_args!(
                "sent sequence={} message_id={} but could not complete it in {from}: {error}\n",
                crate::out::escaped(item.position),
                crate::out::escaped(item.message_id)
            )),
            RedriveEvent::Finished { .. } => self.sink.write(format_args!(
                "redrive {from} -> {to}: moved {}, deferred {}, complete failed {}\n",
                report.moved, report.deferred, report.settle_failed
            )),
            _ => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::SettingsFile;
    use txinbox_core::broker::redrive::RedriveItem;
    use txinbox_core::BrokerErrorKind;

    fn report(moved: usize, deferred: usize) -> RedriveReport {
        let mut r = RedriveReport::default();
        r.moved = moved;
        r.deferred = deferred;
        r.initially_visible = Some(5);
        r
    }

    /// The progress of a Service Bus redrive from `q/$DeadLetterQueue` to `to`, after it moved the message
    /// `message_id` (sequence number 7).
    fn servicebus_moved(to: &str, message_id: &str) -> ServiceBusProgress<Vec<u8>> {
        let mut p = ServiceBusProgress::new(Vec::new(), "q/$DeadLetterQueue", to);
        p.event(
            RedriveEvent::Moved(RedriveItem::new(message_id, "7")),
            &report(1, 0),
        );
        p
    }

    /// A Service Bus redrive whose complete in the source failed for some messages sent them to the target
    /// and left them in the source too: it did not do all it was asked, and says so with exit status 3 (as an
    /// SQS redrive that left messages whose identity was lost). It exited 0, with `complete_failed=N` on its
    /// line as the only sign.
    #[test]
    fn a_redrive_that_left_copies_in_the_source_exits_3() {
        let mut r = report(4, 1);
        assert_eq!(exit_status(&r), 0, "deferred messages wait by design");
        r.settle_failed = 2;
        assert_eq!(exit_status(&r), 3);
        let left = left_for_an_operator(&r);
        assert!(
            left.iter().any(|l| l.starts_with("2 message(s) sent")),
            "{left:?}"
        );
        let mut r = report(1, 0);
        r.identity_lost = 1;
        assert_eq!(exit_status(&r), 3);
    }

    /// A redrive stopped by an error says, beside what it moved, what it left for an operator before the
    /// error: a message sent but still in the source (Service Bus complete failed) is in both queues. It said
    /// only how many it moved.
    #[test]
    fn an_interrupted_redrive_says_what_it_left_behind() {
        let mut done = report(3, 0);
        done.settle_failed = 1;
        let e = RedriveError::Interrupted {
            report: Box::new(done),
            source: BrokerError::new(BrokerErrorKind::Throttled, "send", "429"),
        };
        let shown = e.to_string();
        assert!(
            shown.starts_with("redrive stopped after moving 3 message(s)"),
            "{shown}"
        );
        assert!(
            shown.contains("1 message(s) sent to the target but not completed in the source"),
            "{shown}"
        );
    }

    /// A dead letter's MessageId is the producer's, and may be why it was dead-lettered (an identity with a
    /// control character): the progress line writes it escaped, never raw to the operator's terminal.
    #[test]
    fn a_dead_letter_s_id_is_written_escaped() {
        let p = servicebus_moved("q", "m\u{1b}]52;c;eA==\u{7}\nmoved");
        let out = String::from_utf8(p.sink.out).unwrap();
        assert!(!out.contains('\u{1b}') && !out.contains('\u{7}'), "{out:?}");
        assert_eq!(out.lines().count(), 1, "{out:?}");
    }

    /// The target's poison queue is the settings file's `dead_letter_to` when it sets one, else `{queue}-poison`.
    #[test]
    fn the_poison_queue_comes_from_the_settings_else_the_convention() {
        let file = SettingsFile::new("[servicebus]\ndead_letter_to = \"orders-parked\"\n");
        assert_eq!(
            servicebus_poison_queue("orders", Some(file.path())).as_deref(),
            Ok("orders-parked")
        );
        let unset = SettingsFile::new("[servicebus]\nduplicate_detection_window_seconds = 60\n");
        assert_eq!(
            servicebus_poison_queue("orders", Some(unset.path())).as_deref(),
            Ok("orders-poison")
        );
        assert_eq!(
            servicebus_poison_queue("orders", None).as_deref(),
            Ok("orders-poison")
        );
    }

    /// The window comes from the flag, else the settings file; neither is an error, never an assumed 600 s.
    #[test]
    fn the_duplicate_detection_window_is_told_never_assumed() {
        let file = SettingsFile::new("[servicebus]\nduplicate_detection_window_seconds = 3600\n");
        let file = file.path();
        let secs = |d: std::time::Duration| d.as_secs();
        assert_eq!(
            secs(servicebus_dedup_window(None, Some(file)).unwrap()),
            3600
        );
        assert_eq!(
            secs(servicebus_dedup_window(Some(0), Some(file)).unwrap()),
            0
        );
        assert_eq!(secs(servicebus_dedup_window(Some(60), None).unwrap()), 60);
        let e = servicebus_dedup_window(None, None).unwrap_err();
        assert!(e.contains("duplicate-detection window"), "{e}");
    }

    /// One SQS queue has several URLs: AWS's endpoints `sqs.REGION.amazonaws.com`, the legacy
    /// `REGION.queue.amazonaws.com` and `queue.amazonaws.com` (us-east-1), over `https` or `http`, with or without
    /// the default port. `--from` and `--to` naming one queue in two of these spellings were taken for two queues,
    /// and the redrive moved the queue's messages into itself without end (up to `--max`), each under a new SQS
    /// MessageId. Another region, account, queue name or emulator host is another queue.
    #[test]
    fn one_sqs_queue_in_two_spellings_is_the_same_queue() {
        let a = "https://sqs.us-east-1.amazonaws.com/123456789012/orders-dlq";
        for b in [
            "https://us-east-1.queue.amazonaws.com/123456789012/orders-dlq",
            "https://queue.amazonaws.com/123456789012/orders-dlq",
            "http://sqs.us-east-1.amazonaws.com/123456789012/orders-dlq",
            "https://sqs.us-east-1.amazonaws.com:443/123456789012/orders-dlq/",
            "HTTPS://SQS.US-EAST-1.AMAZONAWS.COM/123456789012/orders-dlq",
        ] {
            assert!(same_sqs_queue(a, b), "{b}");
            assert!(same_sqs_queue(b, a), "{b}");
        }
        assert!(same_sqs_queue(
            "https://eu-west-1.queue.amazonaws.com/1/q",
            "https://sqs.eu-west-1.amazonaws.com/1/q"
        ));
        assert!(same_sqs_queue(
            "https://cn-north-1.queue.amazonaws.com.cn/1/q",
            "https://sqs.cn-north-1.amazonaws.com.cn/1/q"
        ));
        for b in [
            "https://sqs.eu-west-1.amazonaws.com/123456789012/orders-dlq",
            "https://sqs.us-east-1.amazonaws.com/210987654321/orders-dlq",
            "https://sqs.us-east-1.amazonaws.com/123456789012/orders",
            "https://sqs.us-east-1.amazonaws.com/123456789012/Orders-dlq",
            "http://localhost:4566/123456789012/orders-dlq",
        ] {
            assert!(!same_sqs_queue(a, b), "{b}");
        }
        assert!(!same_sqs_queue(
            "http://localhost:4566/000000000000/q",
            "http://localhost:4567/000000000000/q"
        ));
    }

    /// A settings file that does not set the window (a `[servicebus]` section without it, or none) is no
    /// source for it: its default, 600 s, was taken as the target's window, and a target whose window is longer
    /// (a day) got dead letters between 10 minutes and a day old resent, accepted and dropped by Service Bus,
    /// and completed in the source: lost. An environment override sets it as the file would.
    #[test]
    fn a_settings_file_without_the_window_is_refused_not_read_as_600_s() {
        for text in [
            "[servicebus]\ndead_letter_to = \"orders-parked\"\n",
            "[inbox]\nretention_seconds = 2592000\n",
        ] {
            let file = SettingsFile::new(text);
            let e =
                servicebus_dedup_window_with_env(None, Some(file.path()), Vec::new()).unwrap_err();
            assert!(
                e.contains("does not set [servicebus] duplicate_detection_window_seconds")
                    && e.contains("--dedup-window-secs"),
                "{text}: {e}"
            );
            let overridden = servicebus_dedup_window_with_env(
                None,
                Some(file.path()),
                vec![(
                    "TXINBOX_SERVICEBUS__DUPLICATE_DETECTION_WINDOW_SECONDS".to_owned(),
                    "86400".to_owned(),
                )],
            );
            assert_eq!(overridden.map(|d| d.as_secs()), Ok(86_400), "{text}");
            // The flag needs no file's word.
            let flag = servicebus_dedup_window_with_env(Some(0), Some(file.path()), Vec::new());
            assert_eq!(flag.map(|d| d.as_secs()), Ok(0), "{text}");
        }
    }

    /// A Service Bus redrive's source is a dead-letter subqueue, `<entity path>/$DeadLetterQueue` in any case,
    /// or the target's poison queue; any other path, another queue's poison queue included, is refused with the
    /// flag that moves from it.
    #[test]
    fn a_servicebus_source_is_a_dead_letter_subqueue() {
        for from in [
            "orders/$DeadLetterQueue",
            "/orders/$deadletterqueue/",
            &txinbox_servicebus::dead_letter_queue_path("orders"),
            "crm/Subscriptions/followup/$DeadLetterQueue",
            "orders/$Transfer/$DeadLetterQueue",
            "orders-poison",
            "Orders-Poison",
        ] {
            assert_eq!(
                servicebus_source_is_a_dead_letter_queue(from, "orders-poison"),
                Ok(()),
                "{from}"
            );
        }
        for from in [
            "orders",
            "billing-poison",
            "$DeadLetterQueue",
            "/$DeadLetterQueue",
            "orders/$DeadLetterQueueX",
            "orders$DeadLetterQueue",
            "orders/$DeadLetterQueue/messages",
            "",
        ] {
            let refused =
                servicebus_source_is_a_dead_letter_queue(from, "orders-poison").unwrap_err();
            assert!(
                refused.contains("is no queue's dead-letter queue")
                    && refused.contains("--from-any-queue"),
                "{from}: {refused}"
            );
        }
    }

    #[test]
    fn sqs_progress_lines_and_terminal_updates() {
        let mut p = SqsProgress::new(Vec::new(), None, false);
        p.event(RedriveEvent::Started, &report(0, 0));
        p.event(RedriveEvent::Finished { error: None }, &report(3, 1));
        let s = String::from_utf8(p.sink.out).unwrap();
        let lines: Vec<_> = s.lines().collect();
        assert_eq!(lines.len(), 2, "{s}");
        assert!(lines[0].starts_with("redrive: moved 0/5 in "), "{s}");
        assert!(
            lines[1].starts_with("redrive: moved 3/5, 1 deferred"),
            "{s}"
        );
        assert!(s.ends_with("(done)\n"));

        let mut p = SqsProgress::new(Vec::new(), Some(2), true);
        p.event(
            RedriveEvent::Moved(RedriveItem::new("m", "1")),
            &report(1, 0),
        );
        assert!(p.sink.out.starts_with(b"\r\x1b[2Kredrive: moved 1/2"));
        assert!(!p.sink.out.ends_with(b"\n"));
        let err = BrokerError::new(BrokerErrorKind::Throttled, "send", "429");
        p.event(RedriveEvent::Finished { error: Some(&err) }, &report(1, 0));
        assert!(
            p.sink.out.ends_with(b"\n"),
            "a stopped redrive ends its line: {:?}",
            String::from_utf8_lossy(&p.sink.out)
        );
    }

    #[test]
    fn an_interrupted_redrive_keeps_what_was_moved() {
        let mut p = servicebus_moved("/q/", "m1");
        let err = BrokerError::new(BrokerErrorKind::Throttled, "send", "429");
        p.event(RedriveEvent::Finished { error: Some(&err) }, &report(1, 0));
        let out = String::from_utf8(p.sink.out.clone()).unwrap();
        assert_eq!(
            out,
            "moved sequence=7 message_id=m1 from q/$DeadLetterQueue to q\n\
             redrive q/$DeadLetterQueue -> q: moved 1, deferred 0, complete failed 0\n"
        );
        match p.finish(Err(err)) {
            Err(RedriveError::Interrupted { report, source }) => {
                assert_eq!(report.moved, 1);
                assert_eq!(source.kind(), BrokerErrorKind::Throttled);
            }
            other => panic!("expected an interrupted redrive, got {other:?}"),
        }
    }
}
