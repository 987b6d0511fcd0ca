output "queue_url" {
  description = "URL of the main FIFO queue (the worker's queue URL)."
  value       = aws_sqs_queue.main.url
}

output "queue_arn" {
  description = "ARN of the main FIFO queue."
  value       = aws_sqs_queue.main.arn
}

output "dlq_url" {
  description = "URL of the dead-letter FIFO queue."
  value       = aws_sqs_queue.dlq.url
}

output "dlq_arn" {
  description = "ARN of the dead-letter FIFO queue."
  value       = aws_sqs_queue.dlq.arn
}

output "worker_policy_arn" {
  description = "ARN of the IAM policy for the txinbox worker."
  value       = aws_iam_policy.worker.arn
}

output "producer_policy_arn" {
  description = "ARN of the IAM policy for producers."
  value       = aws_iam_policy.producer.arn
}
