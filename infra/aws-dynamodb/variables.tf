variable "aws_region" {
  description = "AWS region the table is created in."
  type        = string
  default     = "eu-west-1"
}

# The worker's store URL is dynamodb://<table_name> (output store_url).
variable "table_name" {
  description = "Name of the inbox table; the worker's store URL is dynamodb://<table_name>."
  type        = string
  default     = "txinbox-inbox"

  validation {
    condition     = can(regex("^[A-Za-z0-9_.-]{3,255}$", var.table_name))
    error_message = "table_name must be 3-255 characters of letters, digits, '_', '-' or '.'."
  }
}

variable "kms_key_arn" {
  description = "ARN of a customer-managed KMS key for encryption at rest; null uses the AWS managed key aws/dynamodb."
  type        = string
  default     = null
}

variable "deletion_protection" {
  description = "Refuse to delete the table (its markers are what keeps a redelivered message from being applied twice)."
  type        = bool
  default     = true
}

variable "business_table_arns" {
  description = "ARNs of the application's own tables the handlers write in the same transaction; the worker policy grants them the item actions (PutItem, UpdateItem, DeleteItem, GetItem, ConditionCheckItem)."
  type        = list(string)
  default     = []
}

variable "worker_role_names" {
  description = "IAM role names of the txinbox workers; the worker policy is attached to each."
  type        = set(string)
  default     = []
}

variable "tags" {
  description = "Tags added to every resource."
  type        = map(string)
  default     = {}
}
