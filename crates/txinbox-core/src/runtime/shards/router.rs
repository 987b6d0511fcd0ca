use std::sync::Arc;

use crate::pipeline::identity::ce;
use crate::ReceivedMessage;

type KeyFn = dyn Fn(&ReceivedMessage) -> Option<String> + Send + Sync;

/// How a delivery names its shard: a key read from the message (the tenant by default), which a [`Shard`](super::Shard)
/// claims. The key is read before any transaction opens, from the message alone, so every copy of a message
/// goes to the same shard.
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
    /// Routes by tenant: the CloudEvents `tenantid` extension, from the `ce-tenantid` attribute (binary mode)
    /// or the `tenantid` member of a structured CloudEvent body (JSON with `specversion`), as the inbox reads
    /// the tenant of a message's identity.
    pub fn tenant() -> Self {
        Self {
            key: Arc::new(tenant_of),
            what: "tenant (ce-tenantid)".into(),
        }
    }

    /// Routes by your function of the message (`None`: the message has no key; it goes to the shard that
    /// takes the rest, or is dead-lettered). `what` names the key in logs and dead-letter details.
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

/// The tenant of a message: the `ce-tenantid` attribute, else a structured CloudEvent's `tenantid`.
fn tenant_of(msg: &ReceivedMessage) -> Option<String> {
    if let Some(t) = msg.attribute(ce::TENANT_ID) {
        return Some(t.to_owned());
    }
    #[derive(serde::Deserialize)]
    struct Structured {
        specversion: Option<serde::de::IgnoredAny>,
        tenantid: Option<String>,
    }
    // Only a JSON object can be a structured CloudEvent; anything else has no tenant.
    if msg
        .body
        .iter()
        .find(|b| !b.is_ascii_whitespace())
        .is_none_or(|b| *b != b'{')
    {
        return None;
    }
    let s: Structured = serde_json::from_slice(&msg.body).ok()?;
    s.specversion.and(s.tenantid)
}
