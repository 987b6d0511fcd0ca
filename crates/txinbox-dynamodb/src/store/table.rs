//! The table's check at start-up and its creation for tests and development.

use aws_sdk_dynamodb::error::ProvideErrorMetadata;
use aws_sdk_dynamodb::types::{
    AttributeDefinition, BillingMode, GlobalSecondaryIndex, KeySchemaElement, KeyType, Projection,
    ProjectionType, ScalarAttributeType, TimeToLiveSpecification,
};
use aws_sdk_dynamodb::Client;

use super::DynamoStore;
use crate::error::call;
use crate::layout as l;
use crate::DynamoError;

impl DynamoStore {
    /// Checks that the table exists with the store's layout: hash key `pk` (string) and no range key, the
    /// indexes `by_consumer` and `due` with their keys, and TTL enabled on `expires_at`
    /// (`DescribeTable`, `DescribeTimeToLive`).
    pub async fn check_table(&self) -> Result<(), DynamoError> {
        let table = self.table.to_string();
        let bad = |detail: String| DynamoError::Table {
            table: table.clone(),
            detail,
        };
        let desc = self
            .client
            .describe_table()
            .table_name(&*self.table)
            .send()
            .await
            .map_err(|e| {
                if e.as_service_error()
                    .is_some_and(|e| e.is_resource_not_found_exception())
                {
                    // The answer's own message may not name the table (DynamoDB Local's does not).
                    bad("no such table in this account and region (DescribeTable: ResourceNotFoundException); \
                         create it with the Terraform sample (infra/aws-dynamodb) or, for tests and development, \
                         DynamoStore::create_table".into())
                } else {
                    call("DescribeTable", e)
                }
            })?;
        let t = desc
            .table()
            .ok_or_else(|| bad("DescribeTable answered without a table".into()))?;
        let keys: Vec<(&str, &KeyType)> = t
            .key_schema()
            .iter()
            .map(|k| (k.attribute_name(), k.key_type()))
            .collect();
        if keys != [(l::PK, &KeyType::Hash)] {
            return Err(bad(format!(
                "the key schema is {keys:?}; the store needs a hash key \"pk\" (string) and no range key"
            )));
        }
        let string_attr = |name: &str| {
            t.attribute_definitions().iter().any(|a| {
                a.attribute_name() == name && a.attribute_type() == &ScalarAttributeType::S
            })
        };
        if !string_attr(l::PK) {
            return Err(bad("attribute \"pk\" is not a string (S)".into()));
        }
        for (name, hash, range) in l::INDEXES {
            let Some(ix) = t
                .global_secondary_indexes()
                .iter()
                .find(|g| g.index_name() == Some(name))
            else {
                return Err(bad(format!("global secondary index {name:?} is missing ({hash} HASH, {range} RANGE, strings)")));
            };
            let keys: Vec<(&str, &KeyType)> = ix
                .key_schema()
                .iter()
                .map(|k| (k.attribute_name(), k.key_type()))
                .collect();
            if keys != [(hash, &KeyType::Hash), (range, &KeyType::Range)]
                || !string_attr(hash)
                || !string_attr(range)
            {
                return Err(bad(format!(
                    "index {name:?} has keys {keys:?}; the store needs {hash} HASH and {range} RANGE, both strings"
                )));
            }
            // `by_consumer` is read for its items' attributes (the filters on `expires_at`, evidence rows,
            // effect counts), which an index holds only when it projects them; `due` is read for its keys.
            let projection = ix.projection().and_then(|p| p.projection_type());
            if name == l::BY_CONSUMER && projection != Some(&ProjectionType::All) {
                return Err(bad(format!(
                    "index {name:?} projects {}; the store reads its items' attributes through it (expiry, evidence, effect counts) and needs projection ALL",
                    projection.map_or("nothing", |p| p.as_str())
                )));
            }
        }
        let ttl = self
            .client
            .describe_time_to_live()
            .table_name(&*self.table)
            .send()
            .await
            .map_err(|e| call("DescribeTimeToLive", e))?;
        let d = ttl.time_to_live_description();
        let status = d.and_then(|d| d.time_to_live_status()).map(|s| s.as_str());
        let attr = d.and_then(|d| d.attribute_name());
        if !matches!(status, Some("ENABLED") | Some("ENABLING")) || attr != Some(l::EXPIRES_AT) {
            return Err(bad(format!(
                "TTL is {} on {:?}; the store needs it enabled on \"expires_at\" (expired markers are otherwise never deleted)",
                status.unwrap_or("off"),
                attr.unwrap_or("no attribute")
            )));
        }
        Ok(())
    }

    /// Creates `table` with the store's layout (on-demand billing), waits until it and its indexes are
    /// `ACTIVE` (at once on DynamoDB Local; seconds to a minute on the service; at most
    /// [`CREATE_TABLE_DEADLINE`](Self::CREATE_TABLE_DEADLINE)) and enables TTL on `expires_at`: for tests,
    /// emulators and development. Production tables come from your infrastructure code (the Terraform
    /// sample creates one), with point-in-time recovery and encryption.
    ///
    /// When a step after `CreateTable` fails, the table is deleted before the error is returned (a
    /// `DeleteTable` that fails too is logged with the table's name), so a failed creation leaves nothing
    /// behind. The service refuses to delete a table still `CREATING` (`ResourceInUseException`): past the
    /// deadline the table may be left, and the error names it.
    pub async fn create_table(client: &Client, table: &str) -> Result<(), DynamoError> {
        let attr = |name: &str| {
            AttributeDefinition::builder()
                .attribute_name(name)
                .attribute_type(ScalarAttributeType::S)
                .build()
        };
        let key = |name: &str, kt: KeyType| {
            KeySchemaElement::builder()
                .attribute_name(name)
                .key_type(kt)
                .build()
        };
        let mut req = client
            .create_table()
            .table_name(table)
            .billing_mode(BillingMode::PayPerRequest)
            .attribute_definitions(attr(l::PK)?)
            .key_schema(key(l::PK, KeyType::Hash)?);
        for (name, hash, range) in l::INDEXES {
            let projection = if name == l::BY_CONSUMER {
                Projection::builder()
                    .projection_type(ProjectionType::All)
                    .build()
            } else {
                Projection::builder()
                    .projection_type(ProjectionType::KeysOnly)
                    .build()
            };
            req = req
                .attribute_definitions(attr(hash)?)
                .attribute_definitions(attr(range)?)
                .global_secondary_indexes(
                    GlobalSecondaryIndex::builder()
                        .index_name(name)
                        .key_schema(key(hash, KeyType::Hash)?)
                        .key_schema(key(range, KeyType::Range)?)
                        .projection(projection)
                        .build()?,
                );
        }
        req.send().await.map_err(|e| call("CreateTable", e))?;
        let rest = async {
            Self::wait_active(client, table, Self::CREATE_TABLE_DEADLINE).await?;
            Self::enable_ttl(client, table).await
        };
        Self::delete_on_error(client, table, rest.await).await
    }

    /// How long [`create_table`](Self::create_table) waits for a new table and its indexes to be `ACTIVE`.
    pub const CREATE_TABLE_DEADLINE: std::time::Duration = std::time::Duration::from_secs(300);

    /// Deletes `table` when `result` is an error, then returns `result`: the clean-up of a table created
    /// by the caller whose next step failed. A `DeleteTable` that fails is logged with the table's name and
    /// does not hide the first error.
    pub async fn delete_on_error<T>(
        client: &Client,
        table: &str,
        result: Result<T, DynamoError>,
    ) -> Result<T, DynamoError> {
        if result.is_err() {
            if let Err(e) = client.delete_table().table_name(table).send().await {
                let e = call("DeleteTable", e);
                tracing::warn!(table, error = %e, "a table created for a step that failed could not be deleted");
            }
        }
        result
    }

    /// Polls `DescribeTable` every second until the table and each of its indexes are `ACTIVE`.
    async fn wait_active(
        client: &Client,
        table: &str,
        deadline: std::time::Duration,
    ) -> Result<(), DynamoError> {
        let until = tokio::time::Instant::now() + deadline;
        loop {
            let out = client
                .describe_table()
                .table_name(table)
                .send()
                .await
                .map_err(|e| call("DescribeTable", e))?;
            let t = out.table();
            let active = t.and_then(|t| t.table_status()).map(|s| s.as_str()) == Some("ACTIVE")
                && t.map(|t| t.global_secondary_indexes())
                    .unwrap_or_default()
                    .iter()
                    .all(|i| i.index_status().map(|s| s.as_str()) == Some("ACTIVE"));
            if active {
                return Ok(());
            }
            if tokio::time::Instant::now() >= until {
                return Err(DynamoError::Table {
                    table: table.to_owned(),
                    detail: format!(
                        "the new table or one of its indexes was not ACTIVE after {} s; delete it once it is",
                        deadline.as_secs()
                    ),
                });
            }
            tokio::time::sleep(std::time::Duration::from_secs(1)).await;
        }
    }

    /// Enables TTL on `expires_at` (`UpdateTimeToLive`, on an `ACTIVE` table).
    ///
    /// The SDK sends the call again by itself when its answer is lost (a timeout, a 5xx), and AWS says of a
    /// second call: "It can take up to one hour for the change to fully process. Any additional
    /// UpdateTimeToLive calls for the same table during this one hour duration result in a
    /// ValidationException." (API Reference, UpdateTimeToLive). A `ValidationException` is therefore looked
    /// at: TTL found enabled (or enabling) on `expires_at` is what the call asked for, the first attempt's
    /// own write; anything else is the call's error.
    async fn enable_ttl(client: &Client, table: &str) -> Result<(), DynamoError> {
        let res = client
            .update_time_to_live()
            .table_name(table)
            .time_to_live_specification(
                TimeToLiveSpecification::builder()
                    .enabled(true)
                    .attribute_name(l::EXPIRES_AT)
                    .build()?,
            )
            .send()
            .await;
        let e = match res {
            Ok(_) => return Ok(()),
            Err(e) => e,
        };
        if e.as_service_error()
            .is_some_and(|se| se.code() == Some("ValidationException"))
            && Self::ttl_on_expires_at(client, table).await?
        {
            return Ok(());
        }
        Err(call("UpdateTimeToLive", e))
    }

    /// Whether `table` has TTL enabled, or being enabled, on `expires_at` (`DescribeTimeToLive`).
    async fn ttl_on_expires_at(client: &Client, table: &str) -> Result<bool, DynamoError> {
        let ttl = client
            .describe_time_to_live()
            .table_name(table)
            .send()
            .await
            .map_err(|e| call("DescribeTimeToLive", e))?;
        let d = ttl.time_to_live_description();
        let status = d.and_then(|d| d.time_to_live_status()).map(|s| s.as_str());
        Ok(matches!(status, Some("ENABLED") | Some("ENABLING"))
            && d.and_then(|d| d.attribute_name()) == Some(l::EXPIRES_AT))
    }
}
