variable "aws_region" {
  description = "AWS region the queues are created in."
  type        = string
  default     = "eu-west-1"
}

variable "name" {
  description = "Base name of the queues; \".fifo\" and \"-dlq.fifo\" are appended."
  type        = string
  default     = "txinbox-orders"

  validation {
    condition     = can(regex("^[A-Za-z0-9_-]{1,70}$", var.name))
    error_message = "name must be 1-70 characters of letters, digits, '-' or '_' (the suffix is added)."
  }
}

# Must be at least 2 x the worker's heartbeat interval (20 s): the worker
# extends the visibility while the handler runs. `txinbox check-infra` checks it.
variable "visibility_timeout_seconds" {
  description = "Visibility timeout of the main queue (SQS adapter default: 60)."
  type        = number
  default     = 60

  validation {
    condition     = var.visibility_timeout_seconds >= 0 && var.visibility_timeout_seconds <= 43200
    error_message = "visibility_timeout_seconds must be between 0 and 43200."
  }
}

# Must not exceed the inbox retention (30 days): a redelivery after the inbox
# forgot the message would look new.
variable "message_retention_seconds" {
  description = "Retention of the main queue (SQS adapter default: 345600 = 4 days)."
  type        = number
  default     = 345600

  validation {
    condition     = var.message_retention_seconds >= 60 && var.message_retention_seconds <= 1209600
    error_message = "message_retention_seconds must be between 60 and 1209600."
  }
}

variable "dlq_message_retention_seconds" {
  description = "Retention of the dead-letter queue (SQS adapter default: 1209600 = 14 days)."
  type        = number
  default     = 1209600

  validation {
    condition     = var.dlq_message_retention_seconds >= 60 && var.dlq_message_retention_seconds <= 1209600
    error_message = "dlq_message_retention_seconds must be between 60 and 1209600."
  }
}

variable "receive_wait_time_seconds" {
  description = "Long-poll wait of the main queue (SQS adapter default: 20)."
  type        = number
  default     = 20

  validation {
    condition     = var.receive_wait_time_seconds >= 0 && var.receive_wait_time_seconds <= 20
    error_message = "receive_wait_time_seconds must be between 0 and 20."
  }
}

variable "max_receive_count" {
  description = "Receives before SQS moves a message to the dead-letter queue (SQS adapter default: 5)."
  type        = number
  default     = 5

  validation {
    condition     = var.max_receive_count >= 1 && var.max_receive_count <= 1000
    error_message = "max_receive_count must be between 1 and 1000."
  }
}

variable "kms_master_key_id" {
  description = "Customer-managed KMS key (id, ARN or alias) for encryption at rest; null uses SQS-managed encryption (SSE-SQS)."
  type        = string
  default     = null
}

variable "worker_role_names" {
  description = "IAM role names of the txinbox workers; the worker policy is attached to each."
  type        = set(string)
  default     = []
}

variable "producer_role_names" {
  description = "IAM role names of the producers; the producer policy is attached to each."
  type        = set(string)
  default     = []
}

variable "tags" {
  description = "Tags added to every resource."
  type        = map(string)
  default     = {}
}
