use std::sync::Arc;

use crate::pipeline::identity::tenant_of;
use crate::ReceivedMessage;

type KeyFn = dyn Fn(&ReceivedMessage) -> Option<String> + Send + Sync;

/// How a delivery names its shard: a key read from the message (the tenant by default), which a [`Shard`](super::Shard)
/// claims. The key is read before any transaction opens, from the message alone, so every copy of a message
/// goes to the same shard. A message whose body is larger than every shard accepts is never given to the
/// router (see [the module docs](super)).
#[derive(Clone)]
#[must_use = "a ShardRouter does nothing until given to Shards::new"]
pub struct ShardRouter {
    key: Arc<KeyFn>,
    pub(super) what: Arc<str>,
}

impl std::fmt::Debug for ShardRouter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ShardRouter")
            .field("key", &self.what)
            .finish()
    }
}

impl ShardRouter {
    /// Routes by tenant: the CloudEvents `tenantid` extension, read exactly as the inbox reads the tenant of
    /// a message's identity (the same function), so a message's business data goes to the shard of the
    /// tenant its marker records: the `ce-tenantid` attribute of a binary-mode event (one with a `ce-id`
    /// attribute), else the `tenantid` member of a structured CloudEvent body (JSON with `specversion`, `id`
    /// and `source`); a message identified otherwise (a producer id) has no tenant.
    pub fn tenant() -> Self {
        Self {
            key: Arc::new(tenant_of),
            what: "tenant (ce-tenantid)".into(),
        }
    }

    /// Routes by your function of the message (`None`: the message has no key; it goes to the shard that
    /// takes the rest, or is dead-lettered). `what` names the key in logs and dead-letter details. A panic in
    /// `f` (on a hostile message) dead-letters that message `no_shard`, the detail saying it panicked; the
    /// other deliveries of its batch go on. `f` runs on the worker's async runtime for every delivery (for
    /// each of a batch in turn): keep it to reading the message, with no I/O and nothing that blocks.
    pub fn by(
        what: impl Into<String>,
        f: impl Fn(&ReceivedMessage) -> Option<String> + Send + Sync + 'static,
    ) -> Self {
        Self {
            key: Arc::new(f),
            what: what.into().into(),
        }
    }

    /// The key of `msg`.
    pub fn key(&self, msg: &ReceivedMessage) -> Option<String> {
        (self.key)(msg)
    }
}

impl Default for ShardRouter {
    fn default() -> Self {
        Self::tenant()
    }
}
