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

# Duplicate detection, which the inbox relies on, exists on Standard and
# Premium only: Basic is refused.
variable "sku" {
  description = "Namespace tier: Standard (default) or Premium (needed for a customer-managed key, private endpoints and partitions)."
  type        = string
  default     = "Standard"

  validation {
    condition     = contains(["Standard", "Premium"], var.sku)
    error_message = "sku must be \"Standard\" or \"Premium\": the Basic tier has no duplicate detection, which the txinbox worker relies on."
  }
}

variable "premium_capacity" {
  description = "Messaging units of a Premium namespace (1, 2, 4, 8 or 16; a multiple of the partitions). Ignored on Standard."
  type        = number
  default     = 1
}

variable "local_auth_enabled" {
  description = "Whether SAS keys (connection strings) work; false = Microsoft Entra ID only (managed identity, the roles below). Set true to use a connection string."
  type        = bool
  default     = false
}

variable "public_network_access_enabled" {
  description = "Whether the namespace is reachable from public networks. Private endpoints need Premium; on Standard, set true (and restrict with network rules) or the worker cannot connect."
  type        = bool
  default     = true
}

variable "premium_messaging_partitions" {
  description = "Messaging partitions of a Premium namespace (1, 2 or 4). Ignored on Standard."
  type        = number
  default     = 1
}

variable "key_vault_id" {
  description = "Key Vault holding the customer-managed key (RBAC-enabled, purge protection on); with key_vault_key_id."
  type        = string
  default     = null
}

variable "key_vault_key_id" {
  description = "Versionless id of a customer-managed key to encrypt the namespace at rest (Premium only); null = Microsoft-managed keys."
  type        = string
  default     = null
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

# Must keep queue TTL + poison TTL + the operator's redrive grace (7 days)
# within the inbox retention (30 days): 14 + 7 + 7 = 28 days.
variable "poison_message_ttl" {
  description = "Time to live of the poison queue dead letters are forwarded to, ISO 8601."
  type        = string
  default     = "P7D"
}

variable "worker_principal_id" {
  description = "Object id of the worker's managed identity (gets Azure Service Bus Data Receiver on the queue and Data Sender on the poison queue)."
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
