//! What the store's integration tests share: clients of an emulator through an HTTP client of the test's own
//! (a hook that answers or rewrites some calls) and which call a request is, and an effect done long ago.
#![allow(dead_code, missing_docs)]

use aws_sdk_dynamodb::config::http::HttpRequest;
use aws_sdk_dynamodb::config::{BehaviorVersion, Credentials, Region, SharedHttpClient};
use aws_sdk_dynamodb::Client;
use chrono::{TimeZone, Utc};
use txinbox_core::effects::{EffectStore, Transition};

/// The configuration of a client of the emulator at `endpoint` through `http`, with the dummy credentials and
/// the region of [`txinbox_dynamodb::emulator_client`]; a test sets what differs (retries, credentials)
/// before it builds.
pub fn emulator_conf(endpoint: &str, http: SharedHttpClient) -> aws_sdk_dynamodb::config::Builder {
    aws_sdk_dynamodb::Config::builder()
        .behavior_version(BehaviorVersion::latest())
        .http_client(http)
        .region(Region::new("us-east-1"))
        .credentials_provider(Credentials::new("testing", "testing", None, None, "t"))
        .endpoint_url(endpoint)
}

/// A client of the emulator at `endpoint` through `http`.
pub fn hooked_client(endpoint: &str, http: SharedHttpClient) -> Client {
    Client::from_conf(emulator_conf(endpoint, http).build())
}

/// Whether `request` calls DynamoDB's operation `op` (`"GetItem"`, `"TransactWriteItems"`, ...).
pub fn calls(request: &HttpRequest, op: &str) -> bool {
    request
        .headers()
        .get("x-amz-target")
        .and_then(|t| t.strip_suffix(op))
        .is_some_and(|t| t.ends_with('.'))
}

/// Claims the one due effect of `destination` (holder `r`, an hour ahead) and finishes it done by a runner
/// whose clock says 2000: its id. A store dates the finish on its own clock, whatever the runner's: the effect
/// is past its keep once the store's maintenance runs past it (SQL), or once [`expire_done_effect`] moved its
/// `expires_at` to the past (DynamoDB).
pub async fn done_long_ago<S: EffectStore>(store: &S, destination: &str) -> i64 {
    let now = Utc::now() + chrono::Duration::hours(1);
    let claimed = store
        .claim_effects(
            "r",
            &[destination.to_owned()],
            now,
            now + chrono::Duration::hours(1),
            10,
        )
        .await
        .unwrap();
    assert_eq!(claimed.len(), 1);
    let long_ago = Utc.with_ymd_and_hms(2000, 1, 1, 0, 0, 0).unwrap();
    let done = Transition::Done {
        reference: Some("ref".into()),
        attempts: 1,
        reconciliations: 0,
    };
    assert!(store
        .finish_effect(claimed[0].id, "r", &done.columns(), long_ago)
        .await
        .unwrap());
    claimed[0].id
}

/// Moves the `expires_at` of done effect `id` of `store`'s table an hour into the past, as if it had been
/// finished longer ago than the effects' keep (which a test cannot date: the store stamps the finish on its
/// own clock).
pub async fn expire_done_effect(store: &txinbox_dynamodb::DynamoStore, id: i64) {
    let past = (Utc::now() - chrono::Duration::hours(1)).timestamp();
    store
        .client()
        .update_item()
        .table_name(store.table())
        .key(
            "pk",
            aws_sdk_dynamodb::types::AttributeValue::S(txinbox_dynamodb::layout::effect_pk(id)),
        )
        .update_expression("SET expires_at = :past")
        .condition_expression("#state = :done")
        .expression_attribute_names("#state", "state")
        .expression_attribute_values(
            ":past",
            aws_sdk_dynamodb::types::AttributeValue::N(past.to_string()),
        )
        .expression_attribute_values(
            ":done",
            aws_sdk_dynamodb::types::AttributeValue::S("done".into()),
        )
        .send()
        .await
        .unwrap();
}
