//! The store's table helpers against DynamoDB Local (`TXINBOX_DYNAMODB_ENDPOINT`, started by
//! `scripts/dynamodb.sh`): `create_table` returns a table the store opens (ACTIVE, TTL on `expires_at`), and
//! `delete_on_error` removes a table created for a step that then failed, so a failed set-up (the lab's fresh
//! table, a test's) leaves nothing behind.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use aws_sdk_dynamodb::Client;
use txinbox_dynamodb::{DynamoError, DynamoOptions, DynamoStore};

fn client() -> Client {
    let endpoint = std::env::var("TXINBOX_DYNAMODB_ENDPOINT").unwrap_or_else(|_| {
        panic!("TXINBOX_DYNAMODB_ENDPOINT is not set: start it with `eval \"$(bash scripts/dynamodb.sh start)\"` (scripts/test.sh does)")
    });
    txinbox_dynamodb::emulator_client(&endpoint)
}

async fn exists(client: &Client, table: &str) -> bool {
    match client.describe_table().table_name(table).send().await {
        Ok(_) => true,
        Err(e)
            if e.as_service_error()
                .is_some_and(|e| e.is_resource_not_found_exception()) =>
        {
            false
        }
        Err(e) => panic!("DescribeTable {table}: {e:?}"),
    }
}

#[tokio::test]
async fn a_table_whose_next_step_failed_is_deleted_and_one_whose_step_succeeded_is_kept() {
    let client = client();
    let failed = format!("txinbox-{}", uuid::Uuid::new_v4().simple());
    DynamoStore::create_table(&client, &failed).await.unwrap();
    // The table is ready for the store: it opens with the table check on.
    DynamoStore::open(client.clone(), failed.clone(), DynamoOptions::default())
        .await
        .unwrap();
    let step: Result<(), DynamoError> = Err(DynamoError::Table {
        table: failed.clone(),
        detail: "the step after the creation failed".into(),
    });
    let r = DynamoStore::delete_on_error(&client, &failed, step).await;
    assert!(
        matches!(&r, Err(DynamoError::Table { detail, .. }) if detail == "the step after the creation failed"),
        "the step's own error is returned: {r:?}"
    );
    assert!(!exists(&client, &failed).await, "{failed} was left behind");

    let kept = format!("txinbox-{}", uuid::Uuid::new_v4().simple());
    DynamoStore::create_table(&client, &kept).await.unwrap();
    let r = DynamoStore::delete_on_error(&client, &kept, Ok(7)).await;
    assert_eq!(r.unwrap(), 7);
    assert!(
        exists(&client, &kept).await,
        "{kept} was deleted after a step that succeeded"
    );
    client
        .delete_table()
        .table_name(&kept)
        .send()
        .await
        .unwrap();
}

#[tokio::test]
async fn a_failed_clean_up_does_not_hide_the_first_error() {
    let client = client();
    // No such table: DeleteTable fails (ResourceNotFoundException), the caller still gets its own error.
    let missing = format!("txinbox-{}", uuid::Uuid::new_v4().simple());
    let step: Result<(), DynamoError> = Err(DynamoError::Table {
        table: missing.clone(),
        detail: "first".into(),
    });
    let r = DynamoStore::delete_on_error(&client, &missing, step).await;
    assert!(
        matches!(&r, Err(DynamoError::Table { detail, .. }) if detail == "first"),
        "{r:?}"
    );
}

#[tokio::test]
async fn a_missing_table_is_named_in_the_error() {
    let client = client();
    let missing = format!("txinbox-missing-{}", uuid::Uuid::new_v4().simple());
    let e = DynamoStore::open(client, missing.clone(), DynamoOptions::default())
        .await
        .unwrap_err();
    // DynamoDB Local answers "Cannot do operations on a non-existent table", without the name.
    assert!(
        matches!(&e, DynamoError::Table { table, .. } if *table == missing),
        "{e:?}"
    );
    let line = e.to_string();
    assert!(
        line.contains(&missing)
            && line.contains("ResourceNotFoundException")
            && !line.contains('\n'),
        "{line}"
    );
}

/// A client on `endpoint` whose own retries are off (the store's classification is what is looked at), with
/// the dummy credentials and region of the emulators unless told otherwise.
fn client_on(endpoint: &str, credentials: bool, region: bool) -> Client {
    use aws_sdk_dynamodb::config::retry::RetryConfig;
    use aws_sdk_dynamodb::config::{BehaviorVersion, Credentials, Region};
    let mut conf = aws_sdk_dynamodb::Config::builder()
        .behavior_version(BehaviorVersion::latest())
        .http_client(txinbox_dynamodb::http_client())
        .endpoint_url(endpoint)
        .retry_config(RetryConfig::disabled());
    if credentials {
        conf = conf.credentials_provider(Credentials::new("testing", "testing", None, None, "t"));
    }
    if region {
        conf = conf.region(Region::new("us-east-1"));
    }
    Client::from_conf(conf.build())
}

/// The store opened (the table check's `DescribeTable`) through `client`: its error.
async fn open_error(client: Client) -> DynamoError {
    DynamoStore::open(client, "txinbox-unreachable", DynamoOptions::default())
        .await
        .unwrap_err()
}

/// A client that cannot make a request at all (no credentials, no region, an endpoint that is not a URL)
/// fails before anything is sent, and the SDK reports it as a dispatch failure of no network kind; every
/// dispatch failure was taken for transient, so a worker on such a client released its messages again and
/// again instead of stopping at start with the reason. It is permanent now and its one line says what is
/// missing; a connection refused stays transient (the SDK's own retry classifier: a timeout or an I/O error
/// of the connector is transient).
#[tokio::test]
async fn a_client_that_cannot_make_a_request_is_a_permanent_error_and_a_refused_connection_is_transient(
) {
    let endpoint = std::env::var("TXINBOX_DYNAMODB_ENDPOINT").unwrap_or_else(|_| {
        panic!("TXINBOX_DYNAMODB_ENDPOINT is not set: start it with `eval \"$(bash scripts/dynamodb.sh start)\"` (scripts/test.sh does)")
    });
    for (what, client, reason) in [
        (
            "no credentials",
            client_on(&endpoint, false, true),
            "no identity resolver",
        ),
        (
            "no region",
            client_on(&endpoint, true, false),
            "missing signing region",
        ),
        (
            "an endpoint that is not a URL",
            client_on("http://exa mple:x/", true, true),
            "invalid uri character",
        ),
    ] {
        let e = open_error(client).await;
        let line = e.to_string();
        assert!(!e.is_transient(), "{what}: {line}");
        assert!(
            line.contains(reason) && !line.contains('\n'),
            "{what}: {line}"
        );
    }
    // Nothing listens on a port just released: the connection is refused, which a retry may get past.
    let closed = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let e = open_error(client_on(&format!("http://127.0.0.1:{closed}"), true, true)).await;
    assert!(e.is_transient(), "{e}");
}

/// A client of DynamoDB Local with the SDK's own retries (the default), that lets the first call of `op` reach
/// the emulator and loses its answer (a timeout, as the client sees a connection dropped after the request);
/// `sent` counts the calls of `op`.
fn losing_first(op: &'static str, sent: Arc<AtomicUsize>) -> Client {
    use aws_sdk_dynamodb::config::{BehaviorVersion, Credentials, Region};
    use txinbox_testkit::sdk_http::{
        with_hook, ConnectorError, HttpConnector, HttpConnectorFuture,
    };
    let endpoint = std::env::var("TXINBOX_DYNAMODB_ENDPOINT").unwrap_or_else(|_| {
        panic!("TXINBOX_DYNAMODB_ENDPOINT is not set: start it with `eval \"$(bash scripts/dynamodb.sh start)\"` (scripts/test.sh does)")
    });
    let http = with_hook(
        txinbox_dynamodb::http_client(),
        move |request, connector| {
            let called = request
                .headers()
                .get("x-amz-target")
                .is_some_and(|t| t.ends_with(&format!(".{op}")));
            let lost = called && sent.fetch_add(1, Ordering::SeqCst) == 0;
            let answer = connector.call(request);
            HttpConnectorFuture::new(async move {
                let answer = answer.await?;
                if lost {
                    return Err(ConnectorError::timeout("the answer was lost".into()));
                }
                Ok(answer)
            })
        },
    );
    let conf = aws_sdk_dynamodb::Config::builder()
        .behavior_version(BehaviorVersion::latest())
        .http_client(http)
        .region(Region::new("us-east-1"))
        .credentials_provider(Credentials::new("testing", "testing", None, None, "t"))
        .endpoint_url(endpoint);
    Client::from_conf(conf.build())
}

/// The `UpdateTimeToLive` of `create_table` applied and its answer was lost: the SDK sends it again by itself,
/// and AWS says of that second call: "It can take up to one hour for the change to fully process. Any
/// additional UpdateTimeToLive calls for the same table during this one hour duration result in a
/// ValidationException." (API Reference, UpdateTimeToLive). That refusal was read as the creation's failure:
/// the new table, ready with TTL on `expires_at`, was deleted and the creation reported an error. TTL found
/// enabled on `expires_at` after the refusal is the call's own write: the table is kept and the store opens.
#[tokio::test]
async fn a_ttl_enabled_whose_answer_was_lost_is_not_taken_for_a_failed_creation() {
    let sent = Arc::new(AtomicUsize::new(0));
    let client = losing_first("UpdateTimeToLive", sent.clone());
    let table = format!("txinbox-{}", uuid::Uuid::new_v4().simple());
    let created = DynamoStore::create_table(&client, &table).await;
    assert_eq!(
        sent.load(Ordering::SeqCst),
        2,
        "the SDK sent UpdateTimeToLive again after the lost answer"
    );
    assert!(created.is_ok(), "{created:?}");
    assert!(exists(&client, &table).await, "{table} was deleted");
    DynamoStore::open(client.clone(), table.clone(), DynamoOptions::default())
        .await
        .unwrap();
    client
        .delete_table()
        .table_name(&table)
        .send()
        .await
        .unwrap();
}
