locals {
  premium = var.sku == "Premium"
  # A customer-managed key is used when its key id is given (Premium only).
  cmk = var.key_vault_key_id != null
  # The poison queue the adapter's recommended dead-letter strategy forwards to:
  # ServiceBusOptions::dead_letter_to("<queue>-poison") (txinbox_servicebus::roles::poison_queue_name).
  poison_queue_name = "${var.queue_name}-poison"
}

# Identity the namespace uses to reach its customer-managed key (only with a key).
resource "azurerm_user_assigned_identity" "servicebus" {
  count               = local.cmk ? 1 : 0
  name                = "${var.namespace_name}-cmk"
  resource_group_name = var.resource_group_name
  location            = var.location
  tags                = var.tags
}

resource "azurerm_role_assignment" "servicebus_cmk" {
  count                = local.cmk ? 1 : 0
  scope                = var.key_vault_id
  role_definition_name = "Key Vault Crypto Service Encryption User"
  principal_id         = azurerm_user_assigned_identity.servicebus[0].principal_id
}

# Standard by default: duplicate detection, which the inbox relies on as its first line of defence, exists
# on Standard and Premium, not on Basic (the sku variable refuses Basic).
resource "azurerm_servicebus_namespace" "main" {
  #checkov:skip=CKV_AZURE_201:A customer-managed key needs the Premium tier and a Key Vault most teams do not have; it is on when key_vault_key_id is set (Premium). Service Bus encrypts at rest with Microsoft-managed keys otherwise.
  #checkov:skip=CKV_AZURE_204:Private endpoints need Premium: a Standard namespace without public network access cannot be reached by the worker. Set public_network_access_enabled = false with sku = "Premium" and a private endpoint. Access still needs Entra ID roles (local auth is off by default).
  #checkov:skip=CKV_AZURE_199:Infrastructure (double) encryption exists only with a customer-managed key on Premium; it is on when key_vault_key_id is set.
  name                          = var.namespace_name
  resource_group_name           = var.resource_group_name
  location                      = var.location
  sku                           = var.sku
  capacity                      = local.premium ? var.premium_capacity : 0
  premium_messaging_partitions  = local.premium ? var.premium_messaging_partitions : 0
  minimum_tls_version           = "1.2"
  local_auth_enabled            = var.local_auth_enabled
  public_network_access_enabled = var.public_network_access_enabled
  tags                          = var.tags

  dynamic "identity" {
    for_each = local.cmk ? [1] : []
    content {
      type         = "UserAssigned"
      identity_ids = [azurerm_user_assigned_identity.servicebus[0].id]
    }
  }

  dynamic "customer_managed_key" {
    for_each = local.cmk ? [1] : []
    content {
      key_vault_key_id                  = var.key_vault_key_id
      identity_id                       = azurerm_user_assigned_identity.servicebus[0].id
      infrastructure_encryption_enabled = true
    }
  }

  depends_on = [azurerm_role_assignment.servicebus_cmk]

  lifecycle {
    precondition {
      condition     = !local.cmk || local.premium
      error_message = "A customer-managed key (key_vault_key_id) needs sku = \"Premium\"."
    }
  }
}

resource "azurerm_servicebus_queue" "main" {
  name         = var.queue_name
  namespace_id = azurerm_servicebus_namespace.main.id

  # Premium namespaces partition at the namespace level.
  partitioning_enabled = false
  requires_session     = false

  lock_duration      = var.lock_duration
  max_delivery_count = var.max_delivery_count

  # Standard or Premium only, and only when the queue is created: changing it
  # later makes Azure recreate the queue (losing its messages).
  requires_duplicate_detection            = true
  duplicate_detection_history_time_window = var.duplicate_detection_history_time_window

  default_message_ttl                  = var.default_message_ttl
  dead_lettering_on_message_expiration = true
}

# Where the worker forwards dead letters (DeadLetterStrategy::Forward): the copy keeps the identity and the
# reason. Duplicate detection drops the second copy of a forward retried after a crash.
resource "azurerm_servicebus_queue" "poison" {
  name         = local.poison_queue_name
  namespace_id = azurerm_servicebus_namespace.main.id

  partitioning_enabled = false
  requires_session     = false

  # Read by operators (txinbox servicebus dead-letters / redrive), not by the worker.
  lock_duration      = "PT1M"
  max_delivery_count = 10

  requires_duplicate_detection            = true
  duplicate_detection_history_time_window = "PT10M"

  default_message_ttl                  = var.poison_message_ttl
  dead_lettering_on_message_expiration = true
}

# The worker's identity: receive (and complete, abandon, renew) on the queue
# (txinbox_servicebus::roles::QUEUE_ROLES) ...
resource "azurerm_role_assignment" "worker_receiver" {
  scope                = azurerm_servicebus_queue.main.id
  role_definition_name = "Azure Service Bus Data Receiver"
  principal_id         = var.worker_principal_id
}

# ... and send the copy of a dead letter to the poison queue (POISON_QUEUE_ROLES).
resource "azurerm_role_assignment" "worker_poison_sender" {
  scope                = azurerm_servicebus_queue.poison.id
  role_definition_name = "Azure Service Bus Data Sender"
  principal_id         = var.worker_principal_id
}

resource "azurerm_role_assignment" "producer_sender" {
  for_each             = var.producer_principal_ids
  scope                = azurerm_servicebus_queue.main.id
  role_definition_name = "Azure Service Bus Data Sender"
  principal_id         = each.value
}
