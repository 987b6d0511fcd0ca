locals {
  queue_name = "${var.name}.fifo"
  dlq_name   = "${var.name}-dlq.fifo"
  # Customer-managed key when given, SQS-managed encryption (SSE-SQS) otherwise.
  sse_sqs = var.kms_master_key_id == null ? true : null
}

# Dead-letter queue: a FIFO queue, as the source queue is FIFO.
resource "aws_sqs_queue" "dlq" {
  name                              = local.dlq_name
  fifo_queue                        = true
  content_based_deduplication       = false
  message_retention_seconds         = var.dlq_message_retention_seconds
  kms_master_key_id                 = var.kms_master_key_id
  kms_data_key_reuse_period_seconds = var.kms_master_key_id == null ? null : 300
  sqs_managed_sse_enabled           = local.sse_sqs
}

resource "aws_sqs_queue" "main" {
  name       = local.queue_name
  fifo_queue = true
  # Producers send an explicit MessageDeduplicationId: it is the identity the
  # inbox records, so SQS must not derive one from the body.
  content_based_deduplication       = false
  visibility_timeout_seconds        = var.visibility_timeout_seconds
  message_retention_seconds         = var.message_retention_seconds
  receive_wait_time_seconds         = var.receive_wait_time_seconds
  kms_master_key_id                 = var.kms_master_key_id
  kms_data_key_reuse_period_seconds = var.kms_master_key_id == null ? null : 300
  sqs_managed_sse_enabled           = local.sse_sqs

  redrive_policy = jsonencode({
    deadLetterTargetArn = aws_sqs_queue.dlq.arn
    maxReceiveCount     = var.max_receive_count
  })
}

# Only the main queue may use the DLQ (a separate resource avoids a cycle
# between the two queues).
resource "aws_sqs_queue_redrive_allow_policy" "dlq" {
  queue_url = aws_sqs_queue.dlq.id

  redrive_allow_policy = jsonencode({
    redrivePermission = "byQueue"
    sourceQueueArns   = [aws_sqs_queue.main.arn]
  })
}
