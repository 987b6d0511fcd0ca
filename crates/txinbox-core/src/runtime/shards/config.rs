use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use crate::runtime::health::HealthCheck;

/// One shard: a name, the processor that applies its deliveries (an inbox on its store), the keys it claims.
#[must_use = "a Shard does nothing until given to Shards::new"]
pub struct Shard<P> {
    pub(super) name: String,
    pub(super) processor: P,
    pub(super) claims: Vec<String>,
    pub(super) rest: bool,
    pub(super) check: Option<Arc<dyn HealthCheck>>,
}

impl<P> std::fmt::Debug for Shard<P> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Shard")
            .field("name", &self.name)
            .field("claims", &self.claims)
            .field("rest", &self.rest)
            .field("check", &self.check.is_some())
            .finish()
    }
}

impl<P> Shard<P> {
    /// A shard named `name` (1 to 64 letters, digits, `-`, `_`, `.`: it is a metric label) applying its deliveries
    /// with `processor`.
    pub fn new(name: impl Into<String>, processor: P) -> Self {
        Self {
            name: name.into(),
            processor,
            claims: Vec::new(),
            rest: false,
            check: None,
        }
    }

    /// The keys (tenants) this shard holds.
    pub fn claims<I, K>(mut self, keys: I) -> Self
    where
        I: IntoIterator<Item = K>,
        K: Into<String>,
    {
        self.claims.extend(keys.into_iter().map(Into::into));
        self
    }

    /// This shard also takes every key no shard claims, and the messages without a key (at most one shard). A
    /// claimed key written in another form (case, Unicode form) is not one of them: it is dead-lettered
    /// `no_shard`, the detail naming the shard that claims it.
    pub fn rest(mut self) -> Self {
        self.rest = true;
        self
    }

    /// Whether the shard's store is reachable (the stores implement [`HealthCheck`]): probed while the worker
    /// runs, shown in readiness. A shard without a check is always taken as up.
    pub fn check(mut self, check: impl HealthCheck) -> Self {
        self.check = Some(Arc::new(check));
        self
    }

    /// The shard's name.
    pub fn name(&self) -> &str {
        &self.name
    }
}

/// Why a set of shards was refused.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[non_exhaustive]
pub enum ShardConfigError {
    /// No shard at all.
    #[error("no shard is configured")]
    NoShards,
    /// A shard's name is empty, longer than 64 bytes, or has a character a metric label cannot carry.
    #[error("shard name {0:?} is not valid: use 1 to 64 letters, digits, '-', '_' and '.'")]
    InvalidName(String),
    /// Two shards have one name.
    #[error("two shards are named {0:?}")]
    DuplicateName(String),
    /// A key is claimed by two shards: its messages would have two inboxes.
    #[error("tenant {key:?} is claimed by shard {first:?} and by shard {second:?}")]
    ClaimedTwice {
        /// The key.
        key: String,
        /// The first shard claiming it.
        first: String,
        /// The second.
        second: String,
    },
    /// One shard lists a key twice (a typing mistake, most likely of another tenant).
    #[error("shard {shard:?} lists tenant {key:?} twice")]
    ListedTwice {
        /// The key.
        key: String,
        /// The shard.
        shard: String,
    },
    /// Two shards take the rest.
    #[error("shards {first:?} and {second:?} both take the unclaimed tenants; at most one may")]
    TwoRests {
        /// The first.
        first: String,
        /// The second.
        second: String,
    },
    /// A claimed tenant that is no message's tenant as the inbox reads it (empty, with a control character, over
    /// an identity field's 512 bytes), or one with whitespace around it (tenants are matched exactly: `"acme "`
    /// never takes `acme`'s messages, which would go to the rest or be dead-lettered).
    #[error("shard {shard:?} claims tenant {key:?}, which {why}")]
    InvalidTenant {
        /// The shard.
        shard: String,
        /// The claim, as written.
        key: String,
        /// What is wrong with it.
        why: &'static str,
    },
    /// Two shards claim one tenant written in two forms: equal in Unicode NFC (precomposed `é` and `e` with a
    /// combining accent), or equal but for case (`Acme`, `ACME`; `ß`, `SS`). Tenants are matched exactly, so a
    /// producer writing the other form would land on the other shard, its data and markers apart from the
    /// tenant's. List every form on one shard.
    #[error("tenant {first_key:?} of shard {first:?} and tenant {second_key:?} of shard {second:?} are {how}: a producer writing one would land on the other's shard; list both forms on one shard")]
    ClaimedTwiceInAnotherForm {
        /// The claim of the first shard, as written.
        first_key: String,
        /// The first shard.
        first: String,
        /// The claim of the second shard, as written.
        second_key: String,
        /// The second shard.
        second: String,
        /// `the same in Unicode NFC` or `equal but for case`.
        how: &'static str,
    },
    /// A shard claims nothing and does not take the rest: it would never receive a delivery.
    #[error("shard {0:?} claims no tenant and does not take the rest")]
    ClaimsNothing(String),
}

/// How the shards are watched.
#[derive(Clone, Debug)]
#[non_exhaustive]
#[must_use = "ShardOptions do nothing until given to Shards::options"]
pub struct ShardOptions {
    /// How often each shard's check is probed while the worker runs (default 2 s; at least 100 ms).
    pub probe_interval: Duration,
    /// How long one probe may take before the shard counts as down (default 2 s).
    pub probe_timeout: Duration,
    /// The delay with which a delivery of an unavailable shard is released the first time (default 5 s); it
    /// doubles with each delivery of the same message, up to [`unavailable_backoff_max`](Self::unavailable_backoff_max),
    /// so that an outage spends the queue's receive count (SQS `maxReceiveCount`) slowly: with 5 s, 5 min and a
    /// count of 10 a message rides out about 20 minutes of outage before the broker dead-letters it. A broker
    /// without a delayed release (Service Bus) serves the delay by holding the delivery's lock up to its own
    /// bound (`max_release_delay`, 10 s), which then caps this delay; such a release waits in the background,
    /// not in a worker slot ([`MAX_BACKGROUND_RELEASES`](super::MAX_BACKGROUND_RELEASES)).
    pub unavailable_backoff: Duration,
    /// The longest such delay (default 5 min).
    pub unavailable_backoff_max: Duration,
    /// Whether every shard is required (default false): readiness then fails while any shard is unavailable,
    /// and a worker built from settings refuses to start without all of them. When false, readiness reports an
    /// unavailable shard as `degraded shard NAME: why` and fails only while every shard is unavailable.
    pub require_all: bool,
}

impl Default for ShardOptions {
    fn default() -> Self {
        Self {
            probe_interval: Duration::from_secs(2),
            probe_timeout: Duration::from_secs(2),
            unavailable_backoff: Duration::from_secs(5),
            unavailable_backoff_max: Duration::from_secs(300),
            require_all: false,
        }
    }
}

impl ShardOptions {
    /// The defaults.
    pub fn new() -> Self {
        Self::default()
    }
    /// Sets how often the checks are probed (at least 100 ms).
    pub fn probe_interval(mut self, d: Duration) -> Self {
        self.probe_interval = d.max(Duration::from_millis(100));
        self
    }
    /// Sets how long a probe may take (at least 10 ms).
    pub fn probe_timeout(mut self, d: Duration) -> Self {
        self.probe_timeout = d.max(Duration::from_millis(10));
        self
    }
    /// Sets the release delay of an unavailable shard's deliveries.
    pub fn unavailable_backoff(mut self, d: Duration) -> Self {
        self.unavailable_backoff = d;
        self
    }
    /// Sets the longest release delay of an unavailable shard's deliveries.
    pub fn unavailable_backoff_max(mut self, d: Duration) -> Self {
        self.unavailable_backoff_max = d;
        self
    }

    /// The release delay of the `delivery_count`-th delivery (1 = first) of an unavailable shard's message.
    pub fn unavailable_delay(&self, delivery_count: u32) -> Duration {
        crate::time::doubled(
            self.unavailable_backoff,
            self.unavailable_backoff_max,
            delivery_count,
        )
    }

    /// Sets whether every shard is required.
    pub fn require_all(mut self, all: bool) -> Self {
        self.require_all = all;
        self
    }
}

/// A shard's state as the last probe left it.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct ShardStatus {
    /// The shard's name.
    pub name: String,
    /// `None` while it is up (or has no check); the probe's error while it is down.
    pub down: Option<String>,
}

/// Which shard holds each key, and which takes the rest.
pub(super) struct Claims {
    pub(super) by_key: HashMap<String, usize>,
    /// Each claim's case-folded NFC form ([`case_folded`]), with its shard and the claim as written.
    pub(super) by_form: HashMap<String, (usize, String)>,
    pub(super) rest: Option<usize>,
}

/// Checks a set of shards given as (name, keys claimed, takes the rest), in order: every name valid and unique,
/// every key claimed once, at most one shard taking the rest, no shard that would never receive a delivery, at
/// least one shard. What [`Shards::new`](super::Shards::new) and the settings file's `[store.shards]` both check.
pub fn check_shards<'a, K: AsRef<str> + 'a>(
    shards: impl IntoIterator<Item = (&'a str, &'a [K], bool)>,
) -> Result<(), ShardConfigError> {
    check_claims(shards).map(|_| ())
}

pub(super) fn check_claims<'a, K: AsRef<str> + 'a>(
    shards: impl IntoIterator<Item = (&'a str, &'a [K], bool)>,
) -> Result<Claims, ShardConfigError> {
    let mut names: Vec<&str> = Vec::new();
    let mut by_key: HashMap<String, usize> = HashMap::new();
    // Each claim's NFC form and its case-folded one, with the first shard (and claim) that has it: two shards
    // whose claims meet there hold one tenant in two forms.
    let mut nfc_forms: HashMap<String, (usize, String)> = HashMap::new();
    let mut folded_forms: HashMap<String, (usize, String)> = HashMap::new();
    let mut rest: Option<usize> = None;
    for (i, (name, claims, takes_rest)) in shards.into_iter().enumerate() {
        if !valid_name(name) {
            return Err(ShardConfigError::InvalidName(name.to_owned()));
        }
        if names.contains(&name) {
            return Err(ShardConfigError::DuplicateName(name.to_owned()));
        }
        if claims.is_empty() && !takes_rest {
            return Err(ShardConfigError::ClaimsNothing(name.to_owned()));
        }
        for key in claims {
            let key = key.as_ref();
            if let Some(why) = unusable_claim(key) {
                return Err(ShardConfigError::InvalidTenant {
                    shard: name.to_owned(),
                    key: key.to_owned(),
                    why,
                });
            }
            if let Some(&first) = by_key.get(key) {
                if first == i {
                    return Err(ShardConfigError::ListedTwice {
                        key: key.to_owned(),
                        shard: name.to_owned(),
                    });
                }
                return Err(ShardConfigError::ClaimedTwice {
                    key: key.to_owned(),
                    first: names[first].to_owned(),
                    second: name.to_owned(),
                });
            }
            for (forms, form, how) in [
                (&mut nfc_forms, nfc(key), "the same in Unicode NFC"),
                (&mut folded_forms, case_folded(key), "equal but for case"),
            ] {
                match forms.get(&form) {
                    Some(&(first, ref first_key)) if first != i => {
                        return Err(ShardConfigError::ClaimedTwiceInAnotherForm {
                            first_key: first_key.clone(),
                            first: names[first].to_owned(),
                            second_key: key.to_owned(),
                            second: name.to_owned(),
                            how,
                        });
                    }
                    Some(_) => {}
                    None => {
                        forms.insert(form, (i, key.to_owned()));
                    }
                }
            }
            by_key.insert(key.to_owned(), i);
        }
        if takes_rest {
            if let Some(first) = rest {
                return Err(ShardConfigError::TwoRests {
                    first: names[first].to_owned(),
                    second: name.to_owned(),
                });
            }
            rest = Some(i);
        }
        names.push(name);
    }
    if names.is_empty() {
        return Err(ShardConfigError::NoShards);
    }
    Ok(Claims {
        by_key,
        by_form: folded_forms,
        rest,
    })
}

/// `key` in Unicode NFC.
fn nfc(key: &str) -> String {
    use unicode_normalization::UnicodeNormalization;
    key.nfc().collect()
}

/// `key` case-folded, near enough for tenants: NFC, then upper case, then lower case (so `ß` meets `SS`, and
/// `ſ`, `s` and `S` meet), where lower case alone would keep `ß` apart.
pub(super) fn case_folded(key: &str) -> String {
    nfc(&nfc(key).to_uppercase().to_lowercase())
}

/// Why a claimed key can never take a message's key as it is written, if so.
fn unusable_claim(key: &str) -> Option<&'static str> {
    if key.trim().is_empty() {
        Some("is empty")
    } else if key.len() > crate::pipeline::identity::MAX_ID_LEN {
        Some("is longer than a tenant can be (512 bytes)")
    } else if key.chars().any(char::is_control) {
        Some("has a control character, which no tenant can have")
    } else if key.trim() != key {
        Some("has whitespace around it (tenants are matched exactly)")
    } else {
        None
    }
}

fn valid_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 64
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
}
