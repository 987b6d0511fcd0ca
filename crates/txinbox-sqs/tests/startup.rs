//! The start-up check ([`Receiver::check`]) against moto: a missing queue, a missing dead-letter queue and a
//! queue without a dead-letter path are refused with one line naming what is wrong; the opt-out lets the
//! last one through; a usable queue passes and no message is taken by the check.

mod common;

use aws_sdk_sqs::types::QueueAttributeName;
use common::*;
use txinbox_core::{BrokerErrorKind, Receiver};
use txinbox_sqs::SqsReceiver;

fn one_line(e: &txinbox_core::BrokerError) -> String {
    let s = e.to_string();
    assert!(!s.contains('\n'), "one line: {s}");
    s
}

#[tokio::test]
async fn a_usable_queue_with_a_redrive_policy_passes_and_keeps_its_messages() {
    let c = client().await;
    let q = queue_pair(&c, 3, 30).await;
    send(
        &c,
        &q.url,
        &body("o", "m", serde_json::json!({})),
        Some("e1"),
        "d1",
        "g1",
    )
    .await;
    let opts = txinbox_sqs::SqsOptions::default();
    let mut r = SqsReceiver::connect(c.clone(), &q.url, opts).await.unwrap();
    r.check().await.expect("usable");
    assert_eq!(
        counts(&c, &q.url).await,
        (1, 0),
        "the check takes no message"
    );
}

#[tokio::test]
async fn a_missing_dead_letter_queue_is_refused() {
    let c = client().await;
    let q = queue_pair(&c, 3, 30).await;
    let gone = format!("{}/123456789012/{}", endpoint(), unique("gone-dlq"));
    let opts = txinbox_sqs::SqsOptions::default().dead_letter_queue(&gone);
    let mut r = SqsReceiver::connect(c.clone(), &q.url, opts).await.unwrap();
    let e = r.check().await.unwrap_err();
    assert_eq!(e.kind(), BrokerErrorKind::EntityNotFound, "{e}");
    let line = one_line(&e);
    assert!(
        line.contains("cannot use dead-letter queue") && line.contains(&gone),
        "{line}"
    );
}

#[tokio::test]
async fn a_missing_queue_is_refused_at_connect() {
    let c = client().await;
    let gone = format!("{}/123456789012/{}.fifo", endpoint(), unique("gone"));
    let e = SqsReceiver::connect(c, &gone, txinbox_sqs::SqsOptions::default())
        .await
        .unwrap_err();
    assert_eq!(e.kind(), BrokerErrorKind::EntityNotFound, "{e}");
    one_line(&e);
}

#[tokio::test]
async fn a_queue_without_a_dead_letter_path_is_refused_unless_opted_out() {
    let c = client().await;
    let url = c
        .create_queue()
        .queue_name(format!("{}.fifo", unique("no-dlq")))
        .attributes(QueueAttributeName::FifoQueue, "true")
        .send()
        .await
        .unwrap()
        .queue_url
        .unwrap();
    let mut r = SqsReceiver::connect(c.clone(), &url, txinbox_sqs::SqsOptions::default())
        .await
        .unwrap();
    let e = r.check().await.unwrap_err();
    assert_eq!(e.kind(), BrokerErrorKind::Configuration, "{e}");
    let line = one_line(&e);
    assert!(
        line.contains("no dead-letter path") && line.contains("allow_no_dead_letter"),
        "{line}"
    );
    let opts = txinbox_sqs::SqsOptions::default().allow_no_dead_letter(true);
    let mut r = SqsReceiver::connect(c, &url, opts).await.unwrap();
    r.check().await.expect("opted out");
}
