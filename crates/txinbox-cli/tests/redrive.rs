//! `txinbox sqs redrive` and `txinbox servicebus redrive` as an operator runs them: what they refuse before
//! touching a queue. SQS against moto (`TXINBOX_SQS_ENDPOINT`, from `eval "$(cat /tmp/moto.env)"` or
//! `eval "$(bash scripts/moto.sh start)"`); Service Bus against the emulator (crates/txinbox-sb-emulator),
//! started in the test process.

mod common;

use common::{outcome, scratch, settings_file, txinbox_command};

/// Runs `txinbox ARGS` with `env` and no Service Bus namespace but one `env` names.
fn txinbox(args: &[&str], env: &[(&str, &str)]) -> (i32, String, String) {
    outcome(
        txinbox_command(args)
            .env_remove("SERVICEBUS_CONNECTION_STRING")
            .env_remove("SERVICEBUS_NAMESPACE")
            .env_remove("SERVICEBUS_ENDPOINT")
            .envs(env.iter().copied()),
    )
}

/// moto at `TXINBOX_SQS_ENDPOINT`, with a client to set a test's queues up and look at them.
struct Moto {
    endpoint: String,
    rt: tokio::runtime::Runtime,
    client: txinbox_sqs::aws_sdk_sqs::Client,
}

impl Moto {
    fn new() -> Self {
        let endpoint = std::env::var("TXINBOX_SQS_ENDPOINT").unwrap_or_else(|_| {
            panic!("TXINBOX_SQS_ENDPOINT is not set: start moto with `eval \"$(bash scripts/moto.sh start)\"`")
        });
        let client = txinbox_sqs::emulator_client(&endpoint);
        Self {
            endpoint,
            rt: tokio::runtime::Runtime::new().unwrap(),
            client,
        }
    }

    /// A queue name no other run uses: `prefix-` and 12 random hex digits.
    fn unique(prefix: &str) -> String {
        format!(
            "{prefix}-{}",
            &uuid::Uuid::new_v4().simple().to_string()[..12]
        )
    }

    /// Creates the queue `name`: its URL.
    fn create_queue(&self, name: &str) -> String {
        self.rt
            .block_on(self.client.create_queue().queue_name(name).send())
            .expect("create queue")
            .queue_url
            .expect("queue url")
    }

    /// Creates the queue `name` with a RedrivePolicy naming the queue at `dlq` as its dead-letter queue: its URL.
    fn create_queue_dead_lettering_to(&self, name: &str, dlq: &str) -> String {
        let attribute = txinbox_sqs::aws_sdk_sqs::types::QueueAttributeName::QueueArn;
        let arn = self
            .rt
            .block_on(
                self.client
                    .get_queue_attributes()
                    .queue_url(dlq)
                    .attribute_names(attribute.clone())
                    .send(),
            )
            .expect("get the DLQ's ARN")
            .attributes
            .and_then(|mut a| a.remove(&attribute))
            .expect("the DLQ's ARN");
        self.rt
            .block_on(
                self.client
                    .create_queue()
                    .queue_name(name)
                    .attributes(
                        txinbox_sqs::aws_sdk_sqs::types::QueueAttributeName::RedrivePolicy,
                        format!(r#"{{"deadLetterTargetArn":"{arn}","maxReceiveCount":"3"}}"#),
                    )
                    .send(),
            )
            .expect("create queue")
            .queue_url
            .expect("queue url")
    }

    /// How many messages the queue at `url` holds, visible (ApproximateNumberOfMessages).
    fn visible(&self, url: &str) -> usize {
        let attribute =
            txinbox_sqs::aws_sdk_sqs::types::QueueAttributeName::ApproximateNumberOfMessages;
        self.rt
            .block_on(
                self.client
                    .get_queue_attributes()
                    .queue_url(url)
                    .attribute_names(attribute.clone())
                    .send(),
            )
            .expect("get queue attributes")
            .attributes
            .and_then(|mut a| a.remove(&attribute))
            .and_then(|n| n.parse().ok())
            .expect("ApproximateNumberOfMessages")
    }

    /// Sends `{}` to `url`: its MessageId.
    fn send(&self, url: &str) -> String {
        self.rt
            .block_on(
                self.client
                    .send_message()
                    .queue_url(url)
                    .message_body("{}")
                    .send(),
            )
            .expect("send")
            .message_id
            .expect("message id")
    }

    /// The environment that points `txinbox` at moto.
    fn env(&self) -> [(&str, &str); 4] {
        [
            ("AWS_ENDPOINT_URL_SQS", self.endpoint.as_str()),
            ("AWS_ACCESS_KEY_ID", "testing"),
            ("AWS_SECRET_ACCESS_KEY", "testing"),
            ("AWS_REGION", "us-east-1"),
        ]
    }

    fn delete_queues(&self, urls: &[&str]) {
        for url in urls {
            self.rt
                .block_on(self.client.delete_queue().queue_url(*url).send())
                .expect("delete queue");
        }
    }
}

/// The Service Bus emulator, in this test process on a loopback port with a SAS key made for the test: the
/// environment that points `txinbox servicebus` at it, and its queues.
struct ServiceBus {
    // The runtime the emulator's server runs on: it stops with it.
    _rt: tokio::runtime::Runtime,
    emulator: txinbox_sb_emulator::EmulatorHandle,
    connection_string: String,
}

impl ServiceBus {
    const NAMESPACE: &'static str = "txinbox-test";
    const KEY_NAME: &'static str = "RootManageSharedAccessKey";

    /// An emulator with the queues `queues`, empty.
    fn with_queues(queues: &[&str]) -> Self {
        let key = uuid::Uuid::new_v4().simple().to_string();
        let rt = tokio::runtime::Runtime::new().unwrap();
        let emulator = rt
            .block_on(
                queues
                    .iter()
                    .fold(
                        txinbox_sb_emulator::Emulator::builder()
                            .namespace(Self::NAMESPACE)
                            .sas_key(Self::KEY_NAME, key.as_str()),
                        |b, q| b.queue(*q, txinbox_sb_emulator::QueueProperties::default()),
                    )
                    .start("127.0.0.1:0"),
            )
            .expect("the Service Bus emulator starts");
        let connection_string = format!(
            "Endpoint=sb://{}.servicebus.windows.net/;SharedAccessKeyName={};SharedAccessKey={key}",
            Self::NAMESPACE,
            Self::KEY_NAME
        );
        Self {
            _rt: rt,
            emulator,
            connection_string,
        }
    }

    /// What `txinbox servicebus` reads (`ServiceBusConfig::from_env`): the SAS connection string, the emulator's URL.
    fn env(&self) -> [(&str, String); 2] {
        [
            (
                "SERVICEBUS_CONNECTION_STRING",
                self.connection_string.clone(),
            ),
            ("SERVICEBUS_ENDPOINT", self.emulator.base_url()),
        ]
    }

    /// Runs `txinbox ARGS` against the emulator.
    fn txinbox(&self, args: &[&str]) -> (i32, String, String) {
        let env = self.env();
        let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
        txinbox(args, &env)
    }

    /// The active messages of `queue` (its dead-letter subqueue's aside).
    fn active(&self, queue: &str) -> usize {
        self.emulator
            .queue_state(queue)
            .expect("the queue exists")
            .active_message_count
    }
}

/// `--from` and `--to` naming one queue (a pasted URL twice) are refused before any call. The redrive ran: it
/// received the message, sent a copy to the same queue (visible at once), deleted the original and received
/// the copy again, so the one message was "moved" `--max` times (without `--max`, for ever), each time under a
/// new SQS MessageId, and the command exited 0.
#[test]
fn a_redrive_from_a_queue_to_itself_is_refused_and_touches_nothing() {
    let moto = Moto::new();
    let url = moto.create_queue(&Moto::unique("cli-self"));
    let sent = moto.send(&url);
    let (code, out, err) = txinbox(
        &["sqs", "redrive", "--from", &url, "--to", &url, "--max", "3"],
        &moto.env(),
    );
    assert_eq!(code, 2, "stdout: {out}\nstderr: {err}");
    assert!(err.contains("name the same queue"), "{err}");
    // The message is where it was, once, under its own MessageId.
    let got = moto
        .rt
        .block_on(
            moto.client
                .receive_message()
                .queue_url(&url)
                .max_number_of_messages(10)
                .wait_time_seconds(1)
                .send(),
        )
        .expect("receive")
        .messages
        .unwrap_or_default();
    let ids: Vec<_> = got.iter().filter_map(|m| m.message_id()).collect();
    assert_eq!(ids, [sent.as_str()], "the queue holds {ids:?}");
    moto.delete_queues(&[&url]);
}

/// `sqs redrive --from Q` where no queue's RedrivePolicy names Q as its dead-letter queue (a pasted URL of a
/// live work queue) is refused with one line, before any message is received: the redrive drained Q into
/// `--to`. moto answers ListDeadLetterSourceQueues as AWS documents it: "Returns a list of your queues that
/// have the RedrivePolicy queue attribute configured with a dead-letter queue." `--from-any-queue` moves from
/// it all the same.
#[test]
fn a_redrive_from_a_queue_that_is_no_dead_letter_queue_is_refused_unless_told() {
    let moto = Moto::new();
    let name = Moto::unique("cli-live");
    let live = moto.create_queue(&name);
    let to = moto.create_queue(&format!("{name}-to"));
    moto.send(&live);
    let (code, out, err) = txinbox(
        &["sqs", "redrive", "--from", &live, "--to", &to],
        &moto.env(),
    );
    assert_eq!(code, 2, "stdout: {out}\nstderr: {err}");
    assert!(
        err.contains("is no queue's dead-letter queue") && err.contains("--from-any-queue"),
        "{err}"
    );
    assert_eq!(err.trim().lines().count(), 1, "one line: {err}");
    assert_eq!(out, "", "nothing moved");
    assert_eq!(
        (moto.visible(&live), moto.visible(&to)),
        (1, 0),
        "the message is where it was"
    );
    // A `--from` that is no queue at all cannot be asked about: refused too, in one line.
    let (code, _, err) = txinbox(
        &[
            "sqs",
            "redrive",
            "--from",
            &format!("{live}-none"),
            "--to",
            &to,
        ],
        &moto.env(),
    );
    assert_eq!(code, 2, "{err}");
    assert!(
        err.contains("cannot tell whether") && err.contains("does not exist"),
        "{err}"
    );
    assert_eq!(err.trim().lines().count(), 1, "one line: {err}");
    let (code, out, err) = txinbox(
        &[
            "sqs",
            "redrive",
            "--from",
            &live,
            "--to",
            &to,
            "--from-any-queue",
        ],
        &moto.env(),
    );
    assert_eq!(code, 0, "stdout: {out}\nstderr: {err}");
    assert!(out.starts_with("moved=1 "), "{out}");
    moto.delete_queues(&[&live, &to]);
}

/// `txinbox servicebus redrive --queue Q --from Q` (any case, any surrounding `/`) is refused before the
/// namespace is even read: the redrive would resubmit each message to the queue it receives from.
#[test]
fn a_servicebus_redrive_from_the_target_queue_is_refused() {
    for from in ["orders", "/Orders/"] {
        let (code, out, err) = txinbox(
            &["servicebus", "redrive", "--queue", "orders", "--from", from],
            &[],
        );
        assert_eq!(code, 2, "stdout: {out}\nstderr: {err}");
        assert!(err.contains("is the target queue itself"), "{from}: {err}");
    }
    // The default source, the queue's dead-letter queue, is not the queue.
    let (_, _, err) = txinbox(&["servicebus", "redrive", "--queue", "orders"], &[]);
    assert!(!err.contains("is the target queue itself"), "{err}");
}

/// `servicebus redrive --from Q` where Q is no dead-letter subqueue (a mistyped `--from` naming a live queue)
/// is refused with one line, before the namespace is read: the redrive drained Q's live messages into
/// `--queue`. Microsoft (Overview of Service Bus dead-letter queues, "Path to the dead-letter queue"): "You can
/// access the dead-letter queue by using the following syntax: <queue path>/$deadletterqueue <topic
/// path>/Subscriptions/<subscription path>/$deadletterqueue". A path so ending, in any case (the docs write
/// `$deadletterqueue`, the SDKs `$DeadLetterQueue`), is taken; `--from-any-queue` moves from any other (a
/// poison queue the adapter forwards dead letters to).
#[test]
fn a_servicebus_redrive_from_a_queue_that_is_no_dead_letter_queue_is_refused_unless_told() {
    let sb = ServiceBus::with_queues(&["live", "orders", "orders-poison"]);
    sb.emulator
        .send_message("live", "m-1", "{}")
        .expect("send to the live queue");
    sb.emulator
        .send_message("orders-poison", "m-2", "{}")
        .expect("send to the poison queue");
    let redrive = |from: &str, extra: &[&str]| {
        let mut args = vec![
            "servicebus",
            "redrive",
            "--queue",
            "orders",
            "--from",
            from,
            "--dedup-window-secs",
            "0",
            "--wait-secs",
            "1",
        ];
        args.extend_from_slice(extra);
        sb.txinbox(&args)
    };
    let (code, out, err) = redrive("live", &[]);
    assert_eq!(code, 2, "stdout: {out}\nstderr: {err}");
    assert!(
        err.contains("is no queue's dead-letter queue") && err.contains("--from-any-queue"),
        "{err}"
    );
    assert_eq!(err.trim().lines().count(), 1, "one line: {err}");
    assert_eq!(out, "", "nothing moved");
    assert_eq!(
        (sb.active("live"), sb.active("orders")),
        (1, 0),
        "the message is where it was"
    );
    // The dead-letter subqueue as Microsoft writes its path, in lower case, is a source.
    let (code, out, err) = redrive("live/$deadletterqueue", &[]);
    assert_eq!(code, 0, "stdout: {out}\nstderr: {err}");
    assert_eq!(out, "moved=0 deferred=0 complete_failed=0\n", "{err}");
    assert_eq!((sb.active("live"), sb.active("orders")), (1, 0));
    // The poison queue the worker of `orders` forwards its dead letters to, by convention, is a source too.
    let (code, out, err) = redrive("orders-poison", &[]);
    assert_eq!(code, 0, "stdout: {out}\nstderr: {err}");
    assert_eq!(out, "moved=1 deferred=0 complete_failed=0\n", "{err}");
    assert_eq!((sb.active("orders-poison"), sb.active("orders")), (0, 1));
    let (code, out, err) = redrive("live", &["--from-any-queue"]);
    assert_eq!(code, 0, "stdout: {out}\nstderr: {err}");
    assert_eq!(out, "moved=1 deferred=0 complete_failed=0\n", "{err}");
    assert_eq!(
        (sb.active("live"), sb.active("orders")),
        (0, 2),
        "told, it moves"
    );
}

/// The line `sqs redrive` prints on stdout for scripts names every count every time, `identity_lost=0`
/// included: it was left out when zero, so a script reading it found the field only on a run that left
/// messages behind.
#[test]
fn the_sqs_redrive_line_names_every_count_every_time() {
    let moto = Moto::new();
    let name = Moto::unique("cli-line");
    let dlq = moto.create_queue(&format!("{name}-dlq"));
    let queue = moto.create_queue_dead_lettering_to(&name, &dlq);
    moto.send(&dlq);
    let (code, out, err) = txinbox(
        &["sqs", "redrive", "--from", &dlq, "--to", &queue],
        &moto.env(),
    );
    assert_eq!(code, 0, "stdout: {out}\nstderr: {err}");
    let fields: Vec<(&str, &str)> = out
        .trim_end()
        .split(' ')
        .map(|f| f.split_once('=').unwrap_or((f, "")))
        .collect();
    let keys: Vec<&str> = fields.iter().map(|(k, _)| *k).collect();
    assert_eq!(
        keys,
        [
            "moved",
            "new_dedup_id",
            "deferred",
            "initially_visible",
            "identity_lost"
        ],
        "{out}"
    );
    assert_eq!(fields[0].1, "1", "{out}");
    assert_eq!(fields[4].1, "0", "{out}");
    moto.delete_queues(&[&dlq, &queue]);
}

/// A Service Bus target drops a resent message whose MessageId it saw within its duplicate-detection window,
/// while the send succeeds, and the redrive then completes the dead letter: the message is gone. The window
/// was 600 s unless told, so on a queue with a longer window (up to 7 days) every dead letter between 10
/// minutes and the window old was lost. `servicebus redrive` now needs the window: `--dedup-window-secs`, or
/// the workers' settings file (`[servicebus] duplicate_detection_window_seconds`, which check-infra holds to
/// the Terraform).
#[test]
fn a_servicebus_redrive_needs_the_target_s_duplicate_detection_window() {
    let (code, out, err) = txinbox(&["servicebus", "redrive", "--queue", "orders"], &[]);
    assert_eq!(code, 2, "stdout: {out}\nstderr: {err}");
    assert!(
        err.contains("duplicate-detection window") && err.contains("--dedup-window-secs"),
        "{err}"
    );
    // Told either way, the command goes on to the namespace (none set here).
    let dir = scratch("sb-window");
    let config = settings_file(
        &dir,
        "[servicebus]\nduplicate_detection_window_seconds = 3600\n",
    );
    for told in [
        &["--dedup-window-secs", "0"][..],
        &["--config", config.to_str().unwrap()][..],
    ] {
        let mut args = vec!["servicebus", "redrive", "--queue", "orders"];
        args.extend_from_slice(told);
        let (code, _, err) = txinbox(&args, &[]);
        assert_eq!(code, 2, "{err}");
        assert!(
            err.contains("SERVICEBUS_CONNECTION_STRING"),
            "{told:?}: {err}"
        );
    }
    std::fs::remove_dir_all(&dir).ok();
}
