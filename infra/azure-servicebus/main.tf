# Identity the namespace uses to reach its customer-managed key.
resource "azurerm_user_assigned_identity" "servicebus" {
  name                = "${var.namespace_name}-cmk"
  resource_group_name = var.resource_group_name
  location            = var.location
  tags                = var.tags
}

resource "azurerm_role_assignment" "servicebus_cmk" {
  scope                = var.key_vault_id
  role_definition_name = "Key Vault Crypto Service Encryption User"
  principal_id         = azurerm_user_assigned_identity.servicebus.principal_id
}

resource "azurerm_servicebus_namespace" "main" {
  name                          = var.namespace_name
  resource_group_name           = var.resource_group_name
  location                      = var.location
  sku                           = "Premium"
  capacity                      = 1
  premium_messaging_partitions  = var.premium_messaging_partitions
  minimum_tls_version           = "1.2"
  local_auth_enabled            = false
  public_network_access_enabled = var.public_network_access_enabled
  tags                          = var.tags

  identity {
    type         = "UserAssigned"
    identity_ids = [azurerm_user_assigned_identity.servicebus.id]
  }

  customer_managed_key {
    key_vault_key_id                  = var.key_vault_key_id
    identity_id                       = azurerm_user_assigned_identity.servicebus.id
    infrastructure_encryption_enabled = true
  }

  depends_on = [azurerm_role_assignment.servicebus_cmk]
}

resource "azurerm_servicebus_queue" "main" {
  name         = var.queue_name
  namespace_id = azurerm_servicebus_namespace.main.id

  # Premium namespaces partition at the namespace level.
  partitioning_enabled = false
  requires_session     = false

  lock_duration      = var.lock_duration
  max_delivery_count = var.max_delivery_count

  requires_duplicate_detection            = true
  duplicate_detection_history_time_window = var.duplicate_detection_history_time_window

  default_message_ttl                  = var.default_message_ttl
  dead_lettering_on_message_expiration = true
}

resource "azurerm_role_assignment" "worker_receiver" {
  scope                = azurerm_servicebus_queue.main.id
  role_definition_name = "Azure Service Bus Data Receiver"
  principal_id         = var.worker_principal_id
}

resource "azurerm_role_assignment" "producer_sender" {
  for_each             = var.producer_principal_ids
  scope                = azurerm_servicebus_queue.main.id
  role_definition_name = "Azure Service Bus Data Sender"
  principal_id         = each.value
}
