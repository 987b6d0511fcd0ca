# Worker: receive, delete, extend visibility and read attributes on the main
# queue; resolve the dead-letter queue's URL (SqsReceiver::connect calls
# GetQueueUrl on the ARN in the RedrivePolicy), read its attributes (the
# start-up check) and send to it. These are the actions txinbox_sqs::iam
# declares; `txinbox check-infra` checks them.
data "aws_iam_policy_document" "worker" {
  statement {
    sid = "ConsumeMainQueue"
    actions = [
      "sqs:ReceiveMessage",
      "sqs:DeleteMessage",
      "sqs:ChangeMessageVisibility",
      "sqs:GetQueueAttributes",
    ]
    resources = [aws_sqs_queue.main.arn]
  }

  statement {
    sid       = "ForwardToDeadLetterQueue"
    actions   = ["sqs:SendMessage", "sqs:GetQueueUrl", "sqs:GetQueueAttributes"]
    resources = [aws_sqs_queue.dlq.arn]
  }

  dynamic "statement" {
    for_each = var.kms_master_key_id == null ? [] : [var.kms_master_key_id]
    content {
      sid       = "UseQueueKey"
      actions   = ["kms:Decrypt", "kms:GenerateDataKey"]
      resources = [statement.value]
    }
  }
}

# Producer: send to the main queue only.
data "aws_iam_policy_document" "producer" {
  statement {
    sid       = "SendToMainQueue"
    actions   = ["sqs:SendMessage"]
    resources = [aws_sqs_queue.main.arn]
  }

  dynamic "statement" {
    for_each = var.kms_master_key_id == null ? [] : [var.kms_master_key_id]
    content {
      sid       = "UseQueueKey"
      actions   = ["kms:Decrypt", "kms:GenerateDataKey"]
      resources = [statement.value]
    }
  }
}

resource "aws_iam_policy" "worker" {
  name        = "${var.name}-worker"
  description = "txinbox worker access to ${local.queue_name} and its dead-letter queue."
  policy      = data.aws_iam_policy_document.worker.json
}

resource "aws_iam_policy" "producer" {
  name        = "${var.name}-producer"
  description = "Producer access to ${local.queue_name}."
  policy      = data.aws_iam_policy_document.producer.json
}

resource "aws_iam_role_policy_attachment" "worker" {
  for_each   = var.worker_role_names
  role       = each.value
  policy_arn = aws_iam_policy.worker.arn
}

resource "aws_iam_role_policy_attachment" "producer" {
  for_each   = var.producer_role_names
  role       = each.value
  policy_arn = aws_iam_policy.producer.arn
}
