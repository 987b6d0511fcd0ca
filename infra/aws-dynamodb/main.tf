# The inbox table of the DynamoDB store (txinbox-dynamodb). The layout is the
# store's: do not change keys or index names, `txinbox check-infra` checks them.
resource "aws_dynamodb_table" "inbox" {
  name                        = var.table_name
  billing_mode                = "PAY_PER_REQUEST"
  hash_key                    = "pk"
  deletion_protection_enabled = var.deletion_protection

  attribute {
    name = "pk"
    type = "S"
  }

  attribute {
    name = "gsi1pk"
    type = "S"
  }

  attribute {
    name = "gsi1sk"
    type = "S"
  }

  attribute {
    name = "gsi2pk"
    type = "S"
  }

  attribute {
    name = "gsi2sk"
    type = "S"
  }

  # Markers and evidence by consumer, oldest first (counts without a scan).
  global_secondary_index {
    name            = "by_consumer"
    hash_key        = "gsi1pk"
    range_key       = "gsi1sk"
    projection_type = "ALL"
  }

  # Effects that are due, by destination and time.
  global_secondary_index {
    name            = "due"
    hash_key        = "gsi2pk"
    range_key       = "gsi2sk"
    projection_type = "KEYS_ONLY"
  }

  # Expired markers (Number, epoch seconds) are deleted by DynamoDB, at no cost.
  ttl {
    attribute_name = "expires_at"
    enabled        = true
  }

  point_in_time_recovery {
    enabled = true
  }

  # A KMS key: the customer-managed key when given, else the AWS managed key.
  server_side_encryption {
    enabled     = true
    kms_key_arn = var.kms_key_arn
  }
}
