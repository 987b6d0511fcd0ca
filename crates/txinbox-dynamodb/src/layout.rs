//! The table's layout: one table, hash key `pk`, two sparse global secondary indexes, TTL on `expires_at`.
//!
//! | item | `pk` | `gsi1pk` / `gsi1sk` (`by_consumer`) | `gsi2pk` / `gsi2sk` (`due`) |
//! |---|---|---|---|
//! | marker | `m#` consumer, source, message id | `m#` consumer, shard / processed at, message id | |
//! | business key | `b#` consumer, tenant, business key | | |
//! | evidence | `r#` uuid | `r#` consumer / recorded at, uuid | |
//! | group tail | `gt#` consumer, group | | |
//! | effect | `e#` id | `fx#` shard / created at, id | `due#` destination, shard / due at, id (while due or held) |
//!
//! A grouped effect also holds `prev`, the key of the effect recorded before it in its group; the group's
//! tail item holds `tail`, the key of the last.
//!
//! Every variable part of a key is length-prefixed (`12:crm-followup`), so no value can forge another's key
//! whatever characters it holds. Times in sort keys are RFC 3339 UTC with microseconds, which sort as text
//! in time order.

use std::collections::HashMap;

use aws_sdk_dynamodb::primitives::Blob;
use aws_sdk_dynamodb::types::AttributeValue;
use chrono::{DateTime, SecondsFormat, Utc};
use sha2::{Digest, Sha256};

/// An item as the SDK carries it.
pub type Item = HashMap<String, AttributeValue>;

/// The table's hash key attribute.
pub const PK: &str = "pk";
/// The TTL attribute (epoch seconds).
pub const EXPIRES_AT: &str = "expires_at";
/// The index of markers, evidence and effects by consumer (or effect shard), oldest first.
pub const BY_CONSUMER: &str = "by_consumer";
/// The index of effects that are due, by destination and time.
pub const DUE: &str = "due";
/// The global secondary indexes and their (hash, range) attributes.
pub const INDEXES: [(&str, &str, &str); 2] =
    [(BY_CONSUMER, "gsi1pk", "gsi1sk"), (DUE, "gsi2pk", "gsi2sk")];
/// How many partitions of `by_consumer` the effects spread over (so that no one index partition takes every
/// effect write); counting effects reads all of them.
pub const EFFECT_SHARDS: u64 = 8;
/// How many partitions of `by_consumer` one consumer's markers spread over.
///
/// Every applied message writes its marker's index entry, and DynamoDB limits each partition of a table or
/// of an index to 1,000 write units a second; when an index cannot take its writes, the writes to the
/// table are throttled ("GSI back-pressure"). With one partition per consumer and a time-ordered sort key
/// (new entries always at the end of the range, where splitting a hot partition does not help), one
/// consumer would stop near 1,000 applied messages a second. Sixteen partitions put that at about 16,000;
/// counting a consumer's markers reads the sixteen (one `Query` each, paged).
pub const MARKER_SHARDS: u64 = 16;

/// The longest partition key value DynamoDB takes (bytes), of the table and of an index alike.
pub const MAX_KEY_BYTES: usize = 2048;

/// Whether `key` can be a partition key value: one longer is refused by every call that names it
/// (`ValidationException`), and no stored item has it, so a read for it finds nothing without asking.
pub fn fits_key(key: &str) -> bool {
    key.len() <= MAX_KEY_BYTES
}

fn part(out: &mut String, s: &str) {
    out.push_str(&s.len().to_string());
    out.push(':');
    out.push_str(s);
}

fn key(prefix: &str, parts: &[&str]) -> String {
    let mut out = String::from(prefix);
    for (i, p) in parts.iter().enumerate() {
        if i > 0 {
            out.push('#');
        }
        part(&mut out, p);
    }
    out
}

/// A marker's key.
pub fn marker_pk(consumer: &str, source: &str, message_id: &str) -> String {
    key("m#", &[consumer, source, message_id])
}

/// A business key item's key (unique per consumer and tenant).
pub fn business_pk(consumer: &str, tenant: Option<&str>, business_key: &str) -> String {
    key("b#", &[consumer, tenant.unwrap_or(""), business_key])
}

/// The `by_consumer` partition of shard `shard` (below [`MARKER_SHARDS`]) of a consumer's markers.
pub fn markers_of(consumer: &str, shard: u64) -> String {
    key("m#", &[consumer, &shard.to_string()])
}

/// The `by_consumer` partitions of a consumer's markers, every shard.
pub fn marker_partitions(consumer: &str) -> impl Iterator<Item = String> + '_ {
    (0..MARKER_SHARDS).map(move |shard| markers_of(consumer, shard))
}

/// The shard of a marker, from its key (so every copy of a message has the same): the first 64 bits of the
/// key's SHA-256, modulo [`MARKER_SHARDS`].
pub fn marker_shard(marker_pk: &str) -> u64 {
    sha256_u64(marker_pk) % MARKER_SHARDS
}

/// The first 64 bits of the SHA-256 of `s`, big-endian.
fn sha256_u64(s: &str) -> u64 {
    let d = Sha256::digest(s.as_bytes());
    let mut b = [0u8; 8];
    b.copy_from_slice(&d[..8]);
    u64::from_be_bytes(b)
}

/// The `by_consumer` partition of a consumer's evidence.
pub fn rejections_of(consumer: &str) -> String {
    key("r#", &[consumer])
}

/// The `by_consumer` partition of effect shard `n`.
pub fn effect_shard(n: u64) -> String {
    format!("fx#{n}")
}

/// An effect's key.
pub fn effect_pk(id: i64) -> String {
    format!("e#{id}")
}

/// How many partitions of the `due` index one destination's effects spread over.
///
/// An effect writes its destination's `due` partition about four times (its entry when recorded, a delete
/// and a put when a claim moves its sort key, a delete when it finishes), one write unit each: with one
/// partition per destination, DynamoDB's 1,000 write units a second per partition would hold one destination
/// near 250 effects a second. Four partitions put that near 1,000; a runner's poll queries the four (one
/// `Query` each, 0.5 read units when nothing is due).
pub const DUE_SHARDS: u64 = 4;

/// The `due` partition `shard` (below [`DUE_SHARDS`]) of a destination.
pub fn due_of(destination: &str, shard: u64) -> String {
    key("due#", &[destination, &shard.to_string()])
}

/// The `due` partitions of a destination, every shard.
pub fn due_partitions(destination: &str) -> impl Iterator<Item = String> + '_ {
    (0..DUE_SHARDS).map(move |shard| due_of(destination, shard))
}

/// The `due` shard of an effect id: bits 32 and up of the id, modulo [`DUE_SHARDS`] (the low bits pick its
/// `by_consumer` shard, [`shard_of`]; the two spreads are independent).
pub fn due_shard(id: i64) -> u64 {
    ((id as u64) >> 32) % DUE_SHARDS
}

/// The key of a group's tail item: the key of the group's latest recorded effect (`tail`), read and
/// conditionally replaced in the transaction that records the group's next effects, which point back at it
/// (`prev`). A runner reads an effect's `prev` with a strongly consistent `GetItem`, never an index.
pub fn group_tail_pk(consumer: &str, group: &str) -> String {
    key("gt#", &[consumer, group])
}

/// An effect's id: the first 63 bits of the SHA-256 of its idempotency key, so that the key alone finds the
/// item (`txinbox effects show KEY`, reconciliation) with one `GetItem`. Two keys with one id would make
/// the second effect's put fail its condition, never overwrite the first (a chance of about n²/2⁶⁴ for n
/// effects kept).
pub fn effect_id(key: &str) -> i64 {
    (sha256_u64(key) >> 1) as i64
}

/// The shard of an effect id.
pub fn shard_of(id: i64) -> u64 {
    (id as u64) % EFFECT_SHARDS
}

/// A time as stored (and sorted): RFC 3339 UTC to the microsecond (rounded down), years 1 to 9999. Only
/// four-digit years sort as text in time order and read back as RFC 3339 (`+10000-01-01T...` sorts before
/// `2026-...`), so a date beyond (a keep of "for ever") is kept as the last instant of year 9999 and one
/// before year 1 as its first, as the SQL stores keep them.
pub fn ts(t: DateTime<Utc>) -> String {
    let first =
        DateTime::<Utc>::from_timestamp(-62_135_596_800, 0).unwrap_or(DateTime::<Utc>::MIN_UTC);
    let last = DateTime::<Utc>::from_timestamp(253_402_300_799, 999_999_000)
        .unwrap_or(DateTime::<Utc>::MAX_UTC);
    t.clamp(first, last)
        .to_rfc3339_opts(SecondsFormat::Micros, true)
}

/// Epoch seconds for the TTL attribute, rounded up (an item never expires before its time).
pub fn epoch_ceil(t: DateTime<Utc>) -> i64 {
    let s = t.timestamp();
    if t.timestamp_subsec_nanos() > 0 {
        s + 1
    } else {
        s
    }
}

/// A string attribute.
pub fn s(v: impl Into<String>) -> AttributeValue {
    AttributeValue::S(v.into())
}

/// A number attribute.
pub fn n(v: impl ToString) -> AttributeValue {
    AttributeValue::N(v.to_string())
}

/// A binary attribute.
pub fn b(v: &[u8]) -> AttributeValue {
    AttributeValue::B(Blob::new(v))
}

/// Reads attributes of a stored item, naming the item and the attribute when one is missing or of another
/// type.
pub struct Reader<'a> {
    item: &'a Item,
}

impl<'a> Reader<'a> {
    /// Reads `item`.
    pub fn new(item: &'a Item) -> Self {
        Self { item }
    }

    fn pk(&self) -> &str {
        self.item
            .get(PK)
            .and_then(|v| v.as_s().ok())
            .map(String::as_str)
            .unwrap_or("?")
    }

    fn bad(&self, name: &str, what: &str) -> crate::DynamoError {
        crate::DynamoError::Corrupt {
            pk: self.pk().to_owned(),
            detail: format!("attribute {name:?} {what}"),
        }
    }

    /// A string attribute, if present.
    pub fn opt_s(&self, name: &str) -> Result<Option<String>, crate::DynamoError> {
        match self.item.get(name) {
            None | Some(AttributeValue::Null(_)) => Ok(None),
            Some(AttributeValue::S(v)) => Ok(Some(v.clone())),
            Some(_) => Err(self.bad(name, "is not a string")),
        }
    }

    /// A string attribute.
    pub fn s(&self, name: &str) -> Result<String, crate::DynamoError> {
        self.opt_s(name)?
            .ok_or_else(|| self.bad(name, "is missing"))
    }

    /// A number attribute, if present.
    pub fn opt_i64(&self, name: &str) -> Result<Option<i64>, crate::DynamoError> {
        match self.item.get(name) {
            None | Some(AttributeValue::Null(_)) => Ok(None),
            Some(AttributeValue::N(v)) => v
                .parse()
                .map(Some)
                .map_err(|_| self.bad(name, "is not an integer")),
            Some(_) => Err(self.bad(name, "is not a number")),
        }
    }

    /// A number attribute.
    pub fn i64(&self, name: &str) -> Result<i64, crate::DynamoError> {
        self.opt_i64(name)?
            .ok_or_else(|| self.bad(name, "is missing"))
    }

    /// A boolean attribute (absent is false).
    pub fn bool(&self, name: &str) -> Result<bool, crate::DynamoError> {
        match self.item.get(name) {
            None | Some(AttributeValue::Null(_)) => Ok(false),
            Some(AttributeValue::Bool(v)) => Ok(*v),
            Some(_) => Err(self.bad(name, "is not a boolean")),
        }
    }

    /// A binary attribute (absent is empty).
    pub fn bytes(&self, name: &str) -> Result<Vec<u8>, crate::DynamoError> {
        match self.item.get(name) {
            None | Some(AttributeValue::Null(_)) => Ok(Vec::new()),
            Some(AttributeValue::B(v)) => Ok(v.as_ref().to_vec()),
            Some(_) => Err(self.bad(name, "is not binary")),
        }
    }

    /// A map of strings (absent is empty): a map attribute, or a list of [key, value] pairs (how a map with
    /// an empty key is stored: DynamoDB refuses an empty key in a map).
    pub fn string_map(
        &self,
        name: &str,
    ) -> Result<std::collections::BTreeMap<String, String>, crate::DynamoError> {
        match self.item.get(name) {
            None | Some(AttributeValue::Null(_)) => Ok(Default::default()),
            Some(AttributeValue::M(m)) => m
                .iter()
                .map(|(k, v)| match v {
                    AttributeValue::S(s) => Ok((k.clone(), s.clone())),
                    _ => Err(self.bad(name, "holds a value that is not a string")),
                })
                .collect(),
            Some(AttributeValue::L(pairs)) => pairs
                .iter()
                .map(|p| match p.as_l().map(Vec::as_slice) {
                    Ok([AttributeValue::S(k), AttributeValue::S(v)]) => Ok((k.clone(), v.clone())),
                    _ => Err(self.bad(
                        name,
                        "holds an entry that is not a [key, value] pair of strings",
                    )),
                })
                .collect(),
            Some(_) => Err(self.bad(name, "is not a map")),
        }
    }

    /// A time attribute (RFC 3339), if present.
    pub fn opt_time(&self, name: &str) -> Result<Option<DateTime<Utc>>, crate::DynamoError> {
        self.opt_s(name)?
            .map(|v| {
                DateTime::parse_from_rfc3339(&v)
                    .map(|t| t.with_timezone(&Utc))
                    .map_err(|_| self.bad(name, "is not an RFC 3339 time"))
            })
            .transpose()
    }

    /// A time attribute (RFC 3339).
    pub fn time(&self, name: &str) -> Result<DateTime<Utc>, crate::DynamoError> {
        self.opt_time(name)?
            .ok_or_else(|| self.bad(name, "is missing"))
    }
}

/// The size DynamoDB bills and limits an item by (attribute names plus values, as its developer guide
/// counts them), closely enough to refuse an item over 400 KB before sending it.
pub fn item_size(item: &Item) -> usize {
    item.iter().map(|(k, v)| k.len() + value_size(v)).sum()
}

fn value_size(v: &AttributeValue) -> usize {
    match v {
        AttributeValue::S(s) => s.len(),
        AttributeValue::N(n) => n.len().div_ceil(2) + 1,
        AttributeValue::B(b) => b.as_ref().len(),
        AttributeValue::Bool(_) | AttributeValue::Null(_) => 1,
        AttributeValue::Ss(v) => v.iter().map(String::len).sum(),
        AttributeValue::Ns(v) => v.iter().map(|n| n.len().div_ceil(2) + 1).sum(),
        AttributeValue::Bs(v) => v.iter().map(|b| b.as_ref().len()).sum(),
        AttributeValue::L(l) => 3 + l.iter().map(|v| 1 + value_size(v)).sum::<usize>(),
        AttributeValue::M(m) => {
            3 + m
                .iter()
                .map(|(k, v)| 1 + k.len() + value_size(v))
                .sum::<usize>()
        }
        _ => 0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_cannot_be_forged_by_separators_in_values() {
        assert_ne!(marker_pk("c", "a#1:b", "x"), marker_pk("c", "a", "b#1:x"));
        assert_eq!(marker_pk("crm", "src", "m-1"), "m#3:crm#3:src#3:m-1");
        assert_ne!(
            business_pk("c", None, "k"),
            business_pk("c", Some(""), "k#")
        );
    }

    #[test]
    fn effect_ids_are_stable_positive_and_spread() {
        let a = effect_id("crm-followup:m-1:create_task");
        assert_eq!(a, effect_id("crm-followup:m-1:create_task"));
        assert!(a >= 0);
        let shards: std::collections::BTreeSet<u64> = (0..200)
            .map(|i| shard_of(effect_id(&format!("k{i}"))))
            .collect();
        assert_eq!(shards.len() as u64, EFFECT_SHARDS);
    }

    #[test]
    fn marker_shards_follow_the_key_and_spread() {
        // Pinned: a change of the function would leave the markers already written in partitions the counts
        // no longer expect (SHA-256 of the key, computed apart: 2).
        let pk = marker_pk("crm-followup", "crm", "m-1");
        assert_eq!(pk, "m#12:crm-followup#3:crm#3:m-1");
        assert_eq!(marker_shard(&pk), 2);
        let mut per_shard = [0u32; MARKER_SHARDS as usize];
        for i in 0..1600 {
            per_shard
                [marker_shard(&marker_pk("crm-followup", "crm", &format!("m-{i}"))) as usize] += 1;
        }
        // 100 a shard on average; a uniform hash keeps every shard well within 50..150.
        assert!(
            per_shard.iter().all(|&n| (50..150).contains(&n)),
            "{per_shard:?}"
        );
        let partitions: std::collections::BTreeSet<String> = marker_partitions("c").collect();
        assert_eq!(partitions.len() as u64, MARKER_SHARDS);
        assert!(
            !partitions.contains(&markers_of("c#2:", 1)),
            "no consumer's partition is another's"
        );
        assert_ne!(markers_of("c", 12), markers_of("c#2:1", 2));
    }

    #[test]
    fn due_shards_spread_and_are_independent_of_the_effect_shards() {
        let mut due = [0u32; DUE_SHARDS as usize];
        let mut pairs = std::collections::HashSet::new();
        for i in 0..1_600 {
            let id = effect_id(&format!("effect-{i}"));
            due[due_shard(id) as usize] += 1;
            pairs.insert((shard_of(id), due_shard(id)));
        }
        assert!(due.iter().all(|&c| (300..=500).contains(&c)), "{due:?}");
        assert_eq!(pairs.len() as u64, EFFECT_SHARDS * DUE_SHARDS);
        assert_ne!(due_of("mail", 0), due_of("mail", 1));
        assert_eq!(due_partitions("mail").count() as u64, DUE_SHARDS);
        assert!(due_partitions("mail").all(|p| p.starts_with("due#4:mail#")));
    }

    #[test]
    fn times_sort_as_text_and_ttl_rounds_up() {
        let t1 = DateTime::parse_from_rfc3339("2026-01-02T03:04:05.000001Z")
            .unwrap()
            .with_timezone(&Utc);
        let t2 = t1 + chrono::Duration::microseconds(999_999);
        assert!(ts(t1) < ts(t2));
        assert_eq!(epoch_ceil(t1), t1.timestamp() + 1);
        assert_eq!(ts(DateTime::<Utc>::MAX_UTC), "9999-12-31T23:59:59.999999Z");
        assert_eq!(ts(DateTime::<Utc>::MIN_UTC), "0001-01-01T00:00:00.000000Z");
    }

    #[test]
    fn item_size_counts_names_and_values() {
        let mut item = Item::new();
        item.insert("pk".into(), s("abc"));
        item.insert("n".into(), n(12345));
        assert_eq!(item_size(&item), 2 + 3 + 1 + 4);
    }
}
