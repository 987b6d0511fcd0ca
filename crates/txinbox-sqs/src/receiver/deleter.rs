//! The background deleter of settled deliveries: `DeleteMessage` for one, `DeleteMessageBatch` for several.

use aws_sdk_sqs::types::DeleteMessageBatchRequestEntry;
use tokio::sync::{mpsc, oneshot};
use txinbox_core::{BrokerError, BrokerErrorKind};

use crate::error::{sdk_error, BatchEntryError};

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

/// Deletes settled deliveries: one `DeleteMessage` when one is waiting, a `DeleteMessageBatch` of up to 10
/// when several are. Failed batch entries are counted, logged and retried once with `DeleteMessage`; an
/// entry that still fails returns its error to the delivery's `ack` (the message is then redelivered and
/// absorbed by the inbox).
pub(super) async fn run_deleter(
    client: aws_sdk_sqs::Client,
    queue_url: String,
    mut rx: mpsc::UnboundedReceiver<DeleteRequest>,
) {
    while let Some(first) = rx.recv().await {
        let mut batch = vec![first];
        while batch.len() < 10 {
            match rx.try_recv() {
                Ok(r) => batch.push(r),
                Err(_) => break,
            }
        }
        if batch.len() == 1 {
            let req = batch.remove(0);
            let r = delete_one(&client, &queue_url, &req.receipt).await;
            let _ = req.reply.send(r);
            continue;
        }
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
                } else {
                    tracing::warn!(error = %err, "batch delete entry failed; retrying it with DeleteMessage");
                    retry.push(req);
                }
            }
        }
        Err(e) => {
            let err = sdk_error("DeleteMessageBatch", e);
            tracing::warn!(error = %err, "DeleteMessageBatch failed; retrying each with DeleteMessage");
        }
    }
    // Entries the batch did not settle (whole call failed, unlisted ids, retryable entry failures).
    retry.extend(replies.into_iter().flatten());
    for req in retry {
        let r = delete_one(client, queue_url, &req.receipt).await;
        if let Err(e) = &r {
            tracing::warn!(error = %e, "delete failed; the message will be redelivered and absorbed by the inbox");
        }
        let _ = req.reply.send(r);
    }
}
