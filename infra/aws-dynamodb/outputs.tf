output "table_name" {
  description = "Name of the inbox table."
  value       = aws_dynamodb_table.inbox.name
}

output "table_arn" {
  description = "ARN of the inbox table."
  value       = aws_dynamodb_table.inbox.arn
}

output "store_url" {
  description = "The worker's store URL ([store] url)."
  value       = "dynamodb://${aws_dynamodb_table.inbox.name}"
}

output "worker_policy_arn" {
  description = "ARN of the IAM policy for the txinbox worker."
  value       = aws_iam_policy.worker.arn
}
