//! The background deleter of settled deliveries: `DeleteMessage` for one, `DeleteMessageBatch` for several.

use std::collections::VecDeque;
use std::sync::Arc;

use aws_sdk_sqs::types::DeleteMessageBatchRequestEntry;
use futures::stream::{FuturesUnordered, StreamExt};
use tokio::sync::{mpsc, oneshot};
use txinbox_core::{BrokerError, BrokerErrorKind};

use crate::error::{sdk_error, BatchCallError, BatchEntryError};

#[derive(Debug)]
pub(super) struct DeleteRequest {
    pub(super) receipt: String,
    pub(super) reply: oneshot::Sender<Result<(), BrokerError>>,
}

pub(crate) async fn delete_one(
    client: &aws_sdk_sqs::Client,
    queue_url: &str,
    receipt: &str,
) -> Result<(), BrokerError> {
    client
        .delete_message()
        .queue_url(queue_url)
        .receipt_handle(receipt)
        .send()
        .await
        .map_err(|e| sdk_error("DeleteMessage", e))?;
    Ok(())
}

/// Delete requests the deleter keeps in flight at once. One at a time capped a worker at ten messages per round
/// trip (1,000 a second at 10 ms; 860 measured through the benchmark's own SQS server with a worker able to
/// apply 1,500); eight full batches per round trip is 8,000 a second at 10 ms, past the 3,000 of a FIFO queue's
/// batched quota.
pub(crate) const DELETES_IN_FLIGHT: usize = 8;

/// The most entries of one `DeleteMessageBatch` (the SQS limit).
const BATCH_MAX: usize = 10;

/// Requests in flight below which a batch of fewer than ten goes at once rather than waiting to fill. With 1 (a
/// partial batch only when nothing is in flight) each delete was a fuller batch (0.11 requests per message)
/// but waited up to a round trip for its turn: 1,114 msg/s at 10 ms; with 4, 0.30 requests per message and
/// 1,205-1,210 msg/s (docs/results.md, "Through the SQS adapter").
const PARTIAL_IN_FLIGHT: usize = 4;

/// Deletes settled deliveries: one `DeleteMessage` when one is waiting, a `DeleteMessageBatch` of up to 10
/// when several are. Failed batch entries are counted and logged; one SQS failed on its side (a retryable
/// code) is retried once with `DeleteMessage`, any other (a lost receipt, a refusal by the sender's fault)
/// returns its error to the delivery's `ack` at once, as does a retried one that still fails (the message is
/// then redelivered and absorbed by the inbox). A batch call that fails as a whole
/// (throttled, a server error, no answer) is sent again as a batch by the SDK's retries, never entry by
/// entry; when those are spent, each entry's `ack` gets the call's error.
///
/// Up to [`DELETES_IN_FLIGHT`] requests are in flight at once: a full batch of ten goes as soon as it is waiting
/// and a slot is free; a smaller one goes at once while fewer than [`PARTIAL_IN_FLIGHT`] are in flight, else
/// when one of them has answered, so batches fill under load, an `ack` waits at most one round trip longer than
/// its own request, and a quiet worker still deletes each message as it is settled.
pub(super) async fn run_deleter(
    client: aws_sdk_sqs::Client,
    queue_url: String,
    mut rx: mpsc::UnboundedReceiver<DeleteRequest>,
) {
    let mut pending: VecDeque<DeleteRequest> = VecDeque::new();
    let mut in_flight = FuturesUnordered::new();
    let mut open = true;
    loop {
        while let Ok(r) = rx.try_recv() {
            pending.push_back(r);
        }
        while in_flight.len() < DELETES_IN_FLIGHT
            && (pending.len() >= BATCH_MAX
                || (in_flight.len() < PARTIAL_IN_FLIGHT && !pending.is_empty()))
        {
            let n = pending.len().min(BATCH_MAX);
            let batch: Vec<DeleteRequest> = pending.drain(..n).collect();
            in_flight.push(send(client.clone(), queue_url.clone(), batch));
        }
        if !open && pending.is_empty() && in_flight.is_empty() {
            return;
        }
        tokio::select! {
            r = rx.recv(), if open => match r {
                Some(r) => pending.push_back(r),
                None => open = false,
            },
            Some(()) = in_flight.next(), if !in_flight.is_empty() => {}
        }
    }
}

/// One request: `DeleteMessage` for a batch of one, `DeleteMessageBatch` otherwise.
async fn send(client: aws_sdk_sqs::Client, queue_url: String, mut batch: Vec<DeleteRequest>) {
    if batch.len() == 1 {
        let req = batch.remove(0);
        let r = delete_one(&client, &queue_url, &req.receipt).await;
        let _ = req.reply.send(r);
    } else {
        delete_batch(&client, &queue_url, batch).await;
    }
}

async fn delete_batch(client: &aws_sdk_sqs::Client, queue_url: &str, batch: Vec<DeleteRequest>) {
    let mut entries = Vec::with_capacity(batch.len());
    for (i, req) in batch.iter().enumerate() {
        match DeleteMessageBatchRequestEntry::builder()
            .id(i.to_string())
            .receipt_handle(&req.receipt)
            .build()
        {
            Ok(e) => entries.push(e),
            Err(e) => tracing::error!(error = %e, "cannot build a DeleteMessageBatch entry"),
        }
    }
    let result = client
        .delete_message_batch()
        .queue_url(queue_url)
        .set_entries(Some(entries))
        .send()
        .await;
    let mut replies: Vec<Option<DeleteRequest>> = batch.into_iter().map(Some).collect();
    let mut retry: Vec<DeleteRequest> = Vec::new();
    match result {
        Ok(out) => {
            for ok in out.successful() {
                if let Some(req) = ok
                    .id()
                    .parse::<usize>()
                    .ok()
                    .and_then(|i| replies.get_mut(i)?.take())
                {
                    let _ = req.reply.send(Ok(()));
                }
            }
            for failed in out.failed() {
                let Some(req) = failed
                    .id()
                    .parse::<usize>()
                    .ok()
                    .and_then(|i| replies.get_mut(i)?.take())
                else {
                    continue;
                };
                metrics::counter!(crate::metrics::DELETE_BATCH_ENTRY_FAILURES, "code" => failed.code().to_owned())
                    .increment(1);
                let entry = BatchEntryError {
                    code: failed.code().to_owned(),
                    message: failed.message().unwrap_or_default().to_owned(),
                    sender_fault: failed.sender_fault(),
                };
                let kind = entry.kind();
                let err = BrokerError::new(kind, "DeleteMessageBatch", entry);
                if kind == BrokerErrorKind::LockLost {
                    tracing::warn!(error = %err, "batch delete entry failed: receipt no longer valid; the redelivery will be absorbed by the inbox");
                    let _ = req.reply.send(Err(err));
                } else if kind.is_retryable() {
                    tracing::warn!(error = %err, "batch delete entry failed; retrying it with DeleteMessage");
                    retry.push(req);
                } else {
                    // Refused by the sender's fault: the same delete sent alone would be refused alike.
                    tracing::warn!(error = %err, "batch delete entry refused; the message will be redelivered and absorbed by the inbox");
                    let _ = req.reply.send(Err(err));
                }
            }
        }
        Err(e) => {
            // The call failed as a whole, after the SDK's retries sent it again as a batch (with their
            // backoff): SQS reported no entry deleted, so no `ack` is done. None is sent again alone: ten
            // `DeleteMessage` calls for one refused batch would multiply the call rate exactly when SQS
            // asked for fewer calls (throttling), or is failing (a server error). The messages come back
            // after their visibility timeout and the inbox absorbs them.
            let err = sdk_error("DeleteMessageBatch", e);
            let (kind, retry_after) = (err.kind(), err.retry_after());
            let entries = replies.iter().flatten().count();
            tracing::warn!(error = %err, entries, "DeleteMessageBatch failed as a whole; the messages will be redelivered and absorbed by the inbox");
            let shared: Arc<dyn std::error::Error + Send + Sync> = Arc::from(err.into_source());
            for req in replies.into_iter().flatten() {
                let why = BatchCallError {
                    operation: "DeleteMessageBatch",
                    entries,
                    error: shared.clone(),
                };
                let _ = req
                    .reply
                    .send(Err(BrokerError::new(kind, "DeleteMessageBatch", why)
                        .with_retry_after(retry_after)));
            }
            return;
        }
    }
    // Entries the batch answer did not settle (unlisted ids, retryable entry failures).
    retry.extend(replies.into_iter().flatten());
    for req in retry {
        let r = delete_one(client, queue_url, &req.receipt).await;
        if let Err(e) = &r {
            tracing::warn!(error = %e, "delete failed; the message will be redelivered and absorbed by the inbox");
        }
        let _ = req.reply.send(r);
    }
}
