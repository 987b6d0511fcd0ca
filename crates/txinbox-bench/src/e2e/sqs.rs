//! The end-to-end line through the SQS adapter: a FIFO queue on an SQS server (`--sqs-endpoint builtin`, the
//! benchmark's own in this process, or an emulator such as moto), reached through the latency proxy, the
//! adapter with its defaults. The producer sends past the proxy (`SendMessageBatch`, ten at a time, over
//! `--sqs-groups` message groups): it is not what is measured.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use aws_sdk_sqs::types::{MessageAttributeValue, QueueAttributeName, SendMessageBatchRequestEntry};
use txinbox_lab::lab::LabError;
use txinbox_sqs::{SqsOptions, SqsReceiver};

use super::proxy::{Counts, LatencyProxy};
use super::sqs_server::SqsServer;
use super::{drive, Feed};
use crate::BenchArgs;

#[derive(Clone)]
struct Sqs {
    /// Straight to the emulator: the producer.
    direct: aws_sdk_sqs::Client,
    /// Through the latency proxy: the worker.
    through: aws_sdk_sqs::Client,
    queue_url: String,
    sent: Arc<AtomicU64>,
    counts: Arc<Counts>,
    /// On the benchmark's own server (`--sqs-endpoint builtin`).
    builtin: bool,
    /// Message groups (`--sqs-groups`).
    groups: u64,
}

impl Feed for Sqs {
    type Receiver = SqsReceiver;

    async fn send_all(&self, batch: Vec<(String, String)>) {
        for chunk in batch.chunks(10) {
            let mut entries = Vec::with_capacity(chunk.len());
            for (i, (id, body)) in chunk.iter().enumerate() {
                let n: u64 = id
                    .rsplit('-')
                    .next()
                    .and_then(|n| n.parse().ok())
                    .unwrap_or(0);
                let mut entry = SendMessageBatchRequestEntry::builder()
                    .id(i.to_string())
                    .message_body(body)
                    .message_group_id(format!("g-{}", n % self.groups))
                    .message_deduplication_id(id);
                // The CloudEvents attributes the identity is read from, as the in-memory line's messages carry.
                for (name, value) in [
                    ("ce-specversion", "1.0"),
                    ("ce-source", "urn.bench"),
                    ("ce-id", id.as_str()),
                    ("ce-type", "bench.event"),
                ] {
                    if let Ok(v) = MessageAttributeValue::builder()
                        .data_type("String")
                        .string_value(value)
                        .build()
                    {
                        entry = entry.message_attributes(name, v);
                    }
                }
                let entry = entry.build();
                match entry {
                    Ok(e) => entries.push(e),
                    Err(e) => tracing::error!(error = %e, "a batch entry could not be built"),
                }
            }
            match self
                .direct
                .send_message_batch()
                .queue_url(&self.queue_url)
                .set_entries(Some(entries))
                .send()
                .await
            {
                Ok(out) => {
                    // A failed entry is reported: the run then ends with fewer messages applied than asked
                    // for, which it reports as an error.
                    for failed in out.failed() {
                        tracing::error!(code = failed.code(), "SendMessageBatch entry failed");
                    }
                    self.sent
                        .fetch_add(out.successful().len() as u64, Ordering::Relaxed);
                }
                Err(e) => tracing::error!(
                    error = %aws_sdk_sqs::error::DisplayErrorContext(&e),
                    "SendMessageBatch failed"
                ),
            }
        }
    }

    /// The other lines' backlog on the benchmark's own server; a small one on an emulator: moto's FIFO receive
    /// slows down as its queue grows.
    fn depth(&self, in_flight: usize) -> u64 {
        if self.builtin {
            2_000.max(in_flight as u64 * 20)
        } else {
            (in_flight as u64 * 4).max(100)
        }
    }

    fn waiting(&self) -> u64 {
        self.sent
            .load(Ordering::Relaxed)
            .saturating_sub(self.counts.deleted())
    }

    async fn receiver(&self) -> Result<Self::Receiver, LabError> {
        SqsReceiver::connect(
            self.through.clone(),
            self.queue_url.clone(),
            SqsOptions::default(),
        )
        .await
        .map_err(|e| LabError::Usage(format!("the SQS receiver: {e}")))
    }
}

/// The SQS line: the requests per message the proxy counted, then the shared figures.
pub(super) async fn run(args: &BenchArgs) -> Result<(), LabError> {
    let endpoint = args.sqs_endpoint.clone().ok_or_else(|| {
        LabError::Usage(
            "--e2e-broker sqs needs an SQS endpoint: --sqs-endpoint builtin (the benchmark's own SQS server, in this process) or --sqs-endpoint URL / TXINBOX_SQS_ENDPOINT of an emulator (moto: eval \"$(bash scripts/moto.sh start)\")"
                .into(),
        )
    })?;
    // `builtin`: the benchmark's own server, kept until the line is printed.
    let (server, endpoint) = if endpoint == "builtin" {
        let server =
            SqsServer::start_with_dedup_window(Duration::from_secs(args.sqs_dedup_window_secs))
                .await?;
        let url = server.url.clone();
        (Some(server), url)
    } else {
        (None, endpoint)
    };
    let direct = txinbox_sqs::emulator_client(&endpoint);
    let name = format!(
        "txinbox-bench-{}.fifo",
        &uuid::Uuid::new_v4().simple().to_string()[..12]
    );
    let queue_url = direct
        .create_queue()
        .queue_name(&name)
        .attributes(QueueAttributeName::FifoQueue, "true")
        .attributes(QueueAttributeName::VisibilityTimeout, "60")
        .send()
        .await
        .map_err(|e| {
            LabError::Usage(format!(
                "CreateQueue on {endpoint}: {}",
                aws_sdk_sqs::error::DisplayErrorContext(&e)
            ))
        })?
        .queue_url()
        .unwrap_or_default()
        .to_owned();
    let proxy =
        LatencyProxy::start(&endpoint, Duration::from_millis(args.e2e_round_trip_ms)).await?;
    let feed = Sqs {
        direct: direct.clone(),
        through: txinbox_sqs::emulator_client(&proxy.url),
        queue_url: queue_url.clone(),
        sent: Arc::default(),
        counts: proxy.counts.clone(),
        builtin: server.is_some(),
        groups: args.sqs_groups,
    };
    let result = drive(args, feed).await;
    let _ = direct.delete_queue().queue_url(&queue_url).send().await;
    let run = result?;
    let actions = proxy.counts.actions();
    let m = run.applied.max(1) as f64;
    let per = |action: &str| actions.get(action).copied().unwrap_or(0) as f64 / m;
    println!(
        "e2e worker broker=sqs receives_per_msg={:.3} delete_batches_per_msg={:.3} deletes_per_msg={:.3} visibility_changes_per_msg={:.3} {}",
        per("ReceiveMessage"),
        per("DeleteMessageBatch"),
        per("DeleteMessage"),
        per("ChangeMessageVisibility") + per("ChangeMessageVisibilityBatch"),
        run.line
    );
    Ok(())
}
