# Worker: exactly the actions the store calls on the inbox table, and Query on
# its indexes. There is no IAM action dynamodb:TransactWriteItems: DynamoDB
# authorizes each action of a TransactWriteItems call as its own action
# (PutItem, UpdateItem, DeleteItem, ConditionCheckItem), on its own table; the
# store only puts on the inbox table (marker, business key item, effects). It
# never deletes an item there (TTL expires them): a worker allowed DeleteItem
# could delete markers, and a redelivery would then apply again. It makes no
# condition check there either (no ConditionCheckItem). No Scan,
# BatchWriteItem, UpdateTable, UpdateTimeToLive or DeleteTable:
# `txinbox check-infra` flags any action beyond the store's, and dynamodb:*.
data "aws_iam_policy_document" "worker" {
  statement {
    sid = "InboxTable"
    actions = [
      "dynamodb:PutItem",
      "dynamodb:UpdateItem",
      "dynamodb:GetItem",
      "dynamodb:Query",
      "dynamodb:DescribeTable",
      "dynamodb:DescribeTimeToLive",
    ]
    resources = [
      aws_dynamodb_table.inbox.arn,
      "${aws_dynamodb_table.inbox.arn}/index/*",
    ]
  }

  # The application's tables the handlers write in the same transaction: the
  # item actions a handler's writes and condition checks use. DeleteItem and
  # ConditionCheckItem belong here, not on the inbox table.
  dynamic "statement" {
    for_each = length(var.business_table_arns) == 0 ? [] : [var.business_table_arns]
    content {
      sid = "BusinessTables"
      actions = [
        "dynamodb:PutItem",
        "dynamodb:UpdateItem",
        "dynamodb:DeleteItem",
        "dynamodb:GetItem",
        "dynamodb:ConditionCheckItem",
      ]
      resources = statement.value
    }
  }

  # A customer-managed key: DynamoDB uses it on the worker's behalf.
  dynamic "statement" {
    for_each = var.kms_key_arn == null ? [] : [var.kms_key_arn]
    content {
      sid       = "UseTableKey"
      actions   = ["kms:Decrypt", "kms:DescribeKey", "kms:Encrypt", "kms:GenerateDataKey*", "kms:ReEncrypt*"]
      resources = [statement.value]

      condition {
        test     = "StringEquals"
        variable = "kms:ViaService"
        values   = ["dynamodb.${var.aws_region}.amazonaws.com"]
      }
    }
  }
}

resource "aws_iam_policy" "worker" {
  name        = "${var.table_name}-worker"
  description = "txinbox worker access to the inbox table ${var.table_name}."
  policy      = data.aws_iam_policy_document.worker.json
}

resource "aws_iam_role_policy_attachment" "worker" {
  for_each   = var.worker_role_names
  role       = each.value
  policy_arn = aws_iam_policy.worker.arn
}
