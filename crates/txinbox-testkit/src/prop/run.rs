//! Running the operations.

use txinbox_core::effects::EffectStore;
use txinbox_core::{CancellationToken, Handler, Inbox, InboxStore, Payload, ReceivedMessage};

use crate::NoopDelivery;

/// What one store remembers between steps: the effects' keys it was asked to record, and the last claim's
/// holder and keys.
#[derive(Default)]
pub struct Seen {
    /// The effects' keys the handlers were asked to record.
    pub keys: Vec<String>,
    /// The last claim's holder.
    pub holder: String,
    /// The last claim's keys.
    pub claimed: Vec<String>,
}

/// The id, in this store, of the effect `pick` designates among `keys`.
pub async fn picked<S: EffectStore>(store: &S, keys: &[String], pick: usize) -> Option<i64> {
    if keys.is_empty() {
        return None;
    }
    let key = &keys[pick % keys.len()];
    store.find_effect(key).await.ok().flatten().map(|e| e.id)
}

/// Delivers `msgs` through `inbox` to `handler`, as one batch or one by one, and answers their outcomes.
pub async fn process_all<S, T, H>(
    inbox: Inbox<S>,
    handler: H,
    msgs: Vec<ReceivedMessage>,
    batch: bool,
) -> Vec<txinbox_core::Outcome>
where
    S: InboxStore,
    T: Payload,
    H: Handler<S, T>,
{
    if batch {
        inbox
            .bind_handler(handler)
            .process_batch(
                msgs.into_iter().map(NoopDelivery).collect(),
                &CancellationToken::new(),
            )
            .await
    } else {
        let mut out = Vec::new();
        for m in msgs {
            out.push(inbox.process(NoopDelivery(m), &handler).await);
        }
        out
    }
}
