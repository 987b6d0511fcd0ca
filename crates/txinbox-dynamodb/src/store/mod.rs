//! The store: options, connection, the table check, and the inbox transaction.
//!
//! This file holds the options, the store and its clients; [`table`] checks and creates the table, [`items`]
//! builds the items the inbox writes, [`commit`] sends the transaction, [`limits`] checks it against the
//! service's limits, and [`inbox`] implements [`txinbox_core::InboxStore`] and the health check.

use std::sync::Arc;
use std::time::Duration;

use aws_sdk_dynamodb::types::AttributeValue;
use aws_sdk_dynamodb::Client;

use crate::error::call;
use crate::layout::{self as l, Item};
use crate::DynamoError;

mod commit;
mod inbox;
mod items;
mod limits;
mod table;

/// The most actions one `TransactWriteItems` call may carry.
pub const MAX_ACTIONS: usize = 100;
/// The most bytes one `TransactWriteItems` call may carry: its puts' items, the keys of its other actions and the
/// expression attribute values of all.
pub const MAX_TRANSACTION_BYTES: usize = 4 * 1024 * 1024;
/// The largest item DynamoDB stores.
pub const MAX_ITEM_BYTES: usize = 400 * 1024;
/// The room an effect's item keeps, below [`MAX_ITEM_BYTES`], for what its finish writes: the last error (at
/// most [`MAX_ERROR_LEN`](txinbox_core::effects::MAX_ERROR_LEN) bytes), the request hash (at most
/// [`MAX_SENT_HASH_LEN`](txinbox_core::effects::MAX_SENT_HASH_LEN)), the destination's reference (at most
/// [`MAX_REFERENCE_LEN`](txinbox_core::effects::MAX_REFERENCE_LEN)) and the finish's bookkeeping. An effect
/// recorded with less is refused with the transaction ([`DynamoError::Limit`](crate::DynamoError::Limit)),
/// since a finish DynamoDB refused would leave an effect that ran in flight, to be run again once its claim
/// ends.
pub const EFFECT_FINISH_ROOM: usize = 16 * 1024;

// Whatever a finish writes fits the room, with 2 KiB for its bookkeeping (its state, counts, dates, tokens
// and their attribute names).
const _: () = assert!(
    txinbox_core::effects::MAX_ERROR_LEN
        + txinbox_core::effects::MAX_REFERENCE_LEN
        + txinbox_core::effects::MAX_SENT_HASH_LEN
        + 2 * 1024
        <= EFFECT_FINISH_ROOM
);

/// How the store behaves.
#[derive(Clone, Debug)]
#[non_exhaustive]
#[must_use = "DynamoOptions do nothing until given to a DynamoStore"]
pub struct DynamoOptions {
    /// Check the table (key schema, indexes, TTL) when the store opens (default true).
    pub check_table: bool,
    /// Attempts of one commit on throttling, transaction conflicts and lost answers (default 5).
    pub commit_attempts: u32,
    /// First backoff between two attempts, doubled each time, with jitter (default 25 ms).
    pub backoff: Duration,
    /// How long evidence items are kept before the TTL deletes them (default 90 days).
    pub rejections_keep: Duration,
    /// How long done and compensated effects are kept before the TTL deletes them (default 7 days).
    pub effects_keep: Duration,
}

impl Default for DynamoOptions {
    fn default() -> Self {
        Self {
            check_table: true,
            commit_attempts: 5,
            backoff: Duration::from_millis(25),
            rejections_keep: Duration::from_secs(90 * 24 * 3600),
            effects_keep: Duration::from_secs(7 * 24 * 3600),
        }
    }
}

impl DynamoOptions {
    /// Whether to check the table when the store opens.
    pub fn check_table(mut self, check: bool) -> Self {
        self.check_table = check;
        self
    }
    /// Attempts of one commit (at least 1).
    pub fn commit_attempts(mut self, n: u32) -> Self {
        self.commit_attempts = n.max(1);
        self
    }
    /// First backoff between two commit attempts.
    pub fn backoff(mut self, d: Duration) -> Self {
        self.backoff = d;
        self
    }
    /// How long evidence items are kept.
    pub fn rejections_keep(mut self, d: Duration) -> Self {
        self.rejections_keep = d;
        self
    }
    /// How long done effects are kept.
    pub fn effects_keep(mut self, d: Duration) -> Self {
        self.effects_keep = d;
        self
    }
}

/// The effects of claims whose `UpdateItem` failed without telling whether it applied, by the claim's holder
/// name: each effect's id and the claim's write token.
pub(crate) type UnsureClaims = std::collections::HashMap<String, Vec<(i64, String)>>;

/// The inbox on one DynamoDB table. Cheap to clone.
#[derive(Clone)]
pub struct DynamoStore {
    pub(crate) client: Client,
    pub(crate) table: Arc<str>,
    pub(crate) options: Arc<DynamoOptions>,
    /// The claims whose `UpdateItem` failed without telling whether it applied, given back by
    /// [`EffectStore::release_claim`].
    ///
    /// [`EffectStore::release_claim`]: txinbox_core::effects::EffectStore::release_claim
    pub(crate) unsure_claims: Arc<std::sync::Mutex<UnsureClaims>>,
}

impl std::fmt::Debug for DynamoStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DynamoStore")
            .field("table", &self.table)
            .field("options", &self.options)
            .finish()
    }
}

/// The table name of a `dynamodb://TABLE` URL.
pub fn table_from_url(url: &str) -> Result<String, DynamoError> {
    // Quoted redacted: another store's URL given by mistake holds a password.
    let refused = || DynamoError::Url(txinbox_core::error::redact_url(url));
    let table = url.strip_prefix("dynamodb://").ok_or_else(refused)?;
    let ok = (3..=255).contains(&table.len())
        && table
            .bytes()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, b'_' | b'-' | b'.'));
    if ok {
        Ok(table.to_owned())
    } else {
        Err(refused())
    }
}

/// An HTTPS client on rustls with the *ring* provider (no OpenSSL, no aws-lc), for SDK configs built by hand.
pub fn http_client() -> aws_sdk_dynamodb::config::SharedHttpClient {
    use aws_smithy_http_client::tls::{rustls_provider::CryptoMode, Provider};
    aws_smithy_http_client::Builder::new()
        .tls_provider(Provider::Rustls(CryptoMode::Ring))
        .build_https()
}

/// A client for a local emulator (DynamoDB Local, moto) at `endpoint`, with static dummy credentials and
/// region `us-east-1`. Never use it against AWS.
pub fn emulator_client(endpoint: &str) -> Client {
    use aws_sdk_dynamodb::config::{BehaviorVersion, Credentials, Region};
    let conf = aws_sdk_dynamodb::Config::builder()
        .behavior_version(BehaviorVersion::latest())
        .http_client(http_client())
        .region(Region::new("us-east-1"))
        .credentials_provider(Credentials::new(
            "testing", "testing", None, None, "emulator",
        ))
        .endpoint_url(endpoint)
        .build();
    Client::from_conf(conf)
}

/// A client from the standard AWS configuration chain (environment, shared files, web identity, container
/// and instance metadata; `AWS_ENDPOINT_URL_DYNAMODB` points it at an emulator), on the store's HTTP client.
pub async fn client_from_env() -> Client {
    let conf = aws_config::defaults(aws_config::BehaviorVersion::latest())
        .http_client(http_client())
        .load()
        .await;
    Client::new(&conf)
}

impl DynamoStore {
    /// Opens `dynamodb://TABLE` with the standard AWS configuration chain (environment, shared files, web
    /// identity, container and instance metadata; `AWS_ENDPOINT_URL_DYNAMODB` points it at an emulator) and
    /// checks the table.
    pub async fn connect(url: &str) -> Result<Self, DynamoError> {
        let table = table_from_url(url)?;
        Self::open(client_from_env().await, table, DynamoOptions::default()).await
    }

    /// Opens `table` through a client of your own (an emulator's, a tuned retry policy) and, unless
    /// [`DynamoOptions::check_table`] is off, checks the table.
    pub async fn open(
        client: Client,
        table: impl Into<String>,
        options: DynamoOptions,
    ) -> Result<Self, DynamoError> {
        let store = Self {
            client,
            table: Arc::from(table.into()),
            options: Arc::new(options),
            unsure_claims: Arc::default(),
        };
        if store.options.check_table {
            store.check_table().await?;
        }
        Ok(store)
    }

    /// The table.
    pub fn table(&self) -> &str {
        &self.table
    }

    /// The client.
    pub fn client(&self) -> &Client {
        &self.client
    }

    /// The item of key `pk` as it is now (a strongly consistent `GetItem`), `None` when there is none;
    /// `only` names the attributes to read (every attribute when empty). Expiry is the caller's to judge.
    pub(crate) async fn get_consistent(
        &self,
        pk: AttributeValue,
        only: &[&str],
    ) -> Result<Option<Item>, DynamoError> {
        let mut get = self
            .client
            .get_item()
            .table_name(&*self.table)
            .key(l::PK, pk)
            .consistent_read(true);
        if !only.is_empty() {
            let names: Vec<String> = (0..only.len()).map(|i| format!("#a{i}")).collect();
            get = get.projection_expression(names.join(", "));
            for (name, attribute) in names.into_iter().zip(only) {
                get = get.expression_attribute_names(name, *attribute);
            }
        }
        let out = get.send().await.map_err(|e| call("GetItem", e))?;
        Ok(out.item)
    }
}

#[cfg(test)]
mod url_tests {
    /// A store URL that is not `dynamodb://TABLE` is named in the error without its password or query values:
    /// another store's URL given by mistake (`postgres://crm:PASSWORD@db`), a table with a query.
    #[test]
    fn a_store_url_refused_is_quoted_without_its_secrets() {
        for url in [
            "postgres://crm:SECRETxyz123@db/crm",
            "dynamodb://inbox?aws_secret_access_key=SECRETxyz123",
            "dynamodb://crm:SECRETxyz123@inbox",
        ] {
            let e = super::table_from_url(url).unwrap_err();
            for shown in [e.to_string(), format!("{e:?}")] {
                assert!(!shown.contains("SECRETxyz123"), "{shown}");
            }
            assert!(e.to_string().contains("dynamodb://TABLE"), "{e}");
        }
    }
}
