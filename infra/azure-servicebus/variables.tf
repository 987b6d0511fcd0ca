variable "subscription_id" {
  description = "Azure subscription the resources are created in."
  type        = string
}

variable "resource_group_name" {
  description = "Existing resource group for the namespace and its identity."
  type        = string
}

variable "location" {
  description = "Azure region."
  type        = string
  default     = "westeurope"
}

variable "namespace_name" {
  description = "Service Bus namespace name (globally unique, 6-50 characters)."
  type        = string
}

variable "queue_name" {
  description = "Queue the txinbox worker consumes."
  type        = string
  default     = "txinbox-orders"
}

variable "public_network_access_enabled" {
  description = "Whether the namespace is reachable from public networks; keep false and use a private endpoint."
  type        = bool
  default     = false
}

variable "premium_messaging_partitions" {
  description = "Messaging partitions of the Premium namespace (1, 2 or 4)."
  type        = number
  default     = 1
}

variable "key_vault_id" {
  description = "Key Vault holding the customer-managed key (RBAC-enabled, purge protection on)."
  type        = string
}

variable "key_vault_key_id" {
  description = "Versionless id of the customer-managed key used to encrypt the namespace at rest."
  type        = string
}

# Must be at least 2 x the worker's lock renewal interval (20 s).
variable "lock_duration" {
  description = "Peek-lock duration, ISO 8601 (Service Bus adapter default: PT1M)."
  type        = string
  default     = "PT1M"
}

variable "max_delivery_count" {
  description = "Deliveries before Service Bus dead-letters a message (Service Bus adapter default: 10)."
  type        = number
  default     = 10
}

# Set explicitly: the broker-side window is the first line of defence; the
# inbox catches what falls outside it.
variable "duplicate_detection_history_time_window" {
  description = "Duplicate detection window, ISO 8601 (Service Bus adapter default: PT10M)."
  type        = string
  default     = "PT10M"
}

# Must not exceed the inbox retention (30 days): a redelivery after the inbox
# forgot the message would look new.
variable "default_message_ttl" {
  description = "Default message time to live, ISO 8601 (Service Bus adapter default: P14D)."
  type        = string
  default     = "P14D"
}

variable "worker_principal_id" {
  description = "Object id of the worker's managed identity (gets Azure Service Bus Data Receiver on the queue)."
  type        = string
}

variable "producer_principal_ids" {
  description = "Object ids of the producers' identities (each gets Azure Service Bus Data Sender on the queue)."
  type        = set(string)
  default     = []
}

variable "tags" {
  description = "Tags added to every resource."
  type        = map(string)
  default     = {}
}
