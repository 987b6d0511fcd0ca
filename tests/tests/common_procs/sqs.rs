//! moto's SQS endpoint (set by `scripts/test.sh`), a client on it, its queues and their message counts.

/// moto's endpoint, from `TXINBOX_SQS_ENDPOINT`.
///
/// # Panics
/// When the variable is not set: moto is an outside service that `scripts/test.sh` starts.
pub fn sqs_endpoint() -> String {
    std::env::var("TXINBOX_SQS_ENDPOINT").unwrap_or_else(|_| {
        panic!(
            "TXINBOX_SQS_ENDPOINT is not set: run the tests with `bash scripts/test.sh` (it starts moto for SQS \
             and exports it), or `eval \"$(bash scripts/moto.sh start)\"` first"
        )
    })
}

/// The environment of an example that talks to SQS at `endpoint` (dummy credentials: moto takes anything).
pub fn sqs_env(endpoint: &str) -> Vec<(&'static str, String)> {
    vec![
        ("AWS_ENDPOINT_URL_SQS", endpoint.to_owned()),
        ("AWS_ACCESS_KEY_ID", "testing".into()),
        ("AWS_SECRET_ACCESS_KEY", "testing".into()),
        ("AWS_REGION", "us-east-1".into()),
    ]
}

/// An SDK client for moto at `endpoint`.
pub fn sqs_client(endpoint: &str) -> txinbox_sqs::aws_sdk_sqs::Client {
    txinbox_sqs::emulator_client(endpoint)
}

/// The URL of the queue `name` (`.fifo` included).
pub async fn sqs_queue_url(c: &txinbox_sqs::aws_sdk_sqs::Client, name: &str) -> String {
    c.get_queue_url()
        .queue_name(name)
        .send()
        .await
        .unwrap_or_else(|e| {
            panic!(
                "queue {name}: {}",
                txinbox_sqs::aws_sdk_sqs::error::DisplayErrorContext(&e)
            )
        })
        .queue_url
        .unwrap_or_else(|| panic!("queue {name}: no URL"))
}

/// Messages in an SQS queue, visible or in flight.
pub async fn sqs_messages(c: &txinbox_sqs::aws_sdk_sqs::Client, url: &str) -> u64 {
    use txinbox_sqs::aws_sdk_sqs::types::QueueAttributeName as A;
    let attrs = c
        .get_queue_attributes()
        .queue_url(url)
        .attribute_names(A::ApproximateNumberOfMessages)
        .attribute_names(A::ApproximateNumberOfMessagesNotVisible)
        .send()
        .await
        .unwrap_or_else(|e| {
            panic!(
                "attributes of {url}: {}",
                txinbox_sqs::aws_sdk_sqs::error::DisplayErrorContext(&e)
            )
        })
        .attributes
        .unwrap_or_default();
    let n = |k: A| {
        attrs
            .get(&k)
            .and_then(|v| v.parse::<u64>().ok())
            .unwrap_or(0)
    };
    n(A::ApproximateNumberOfMessages) + n(A::ApproximateNumberOfMessagesNotVisible)
}
