//! Unit tests of the DynamoDB table checks: store URLs and DynamoDB action patterns.

use super::policy::is_dynamodb;
use super::store_table;

#[test]
fn store_urls() {
    assert_eq!(store_table("dynamodb://orders-inbox"), Some("orders-inbox"));
    assert_eq!(store_table("dynamodb://t?region=eu-west-1"), Some("t"));
    assert_eq!(store_table("dynamodb://"), None);
    assert_eq!(store_table("postgres://app@db/app"), None);
    assert_eq!(store_table("sqlite:txinbox.db"), None);
}

#[test]
fn dynamodb_action_patterns() {
    assert!(is_dynamodb("dynamodb:*"));
    assert!(is_dynamodb("DynamoDB:Scan"));
    assert!(is_dynamodb("*"));
    assert!(is_dynamodb("dynamo*:S*"));
    assert!(!is_dynamodb("kms:Decrypt"));
    assert!(!is_dynamodb("sqs:*"));
}
