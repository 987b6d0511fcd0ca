output "namespace_id" {
  description = "Resource id of the Service Bus namespace."
  value       = azurerm_servicebus_namespace.main.id
}

output "namespace_fqdn" {
  description = "Fully qualified namespace the worker connects to (<name>.servicebus.windows.net)."
  value       = "${azurerm_servicebus_namespace.main.name}.servicebus.windows.net"
}

output "queue_id" {
  description = "Resource id of the queue."
  value       = azurerm_servicebus_queue.main.id
}

output "queue_name" {
  description = "Name of the queue."
  value       = azurerm_servicebus_queue.main.name
}

output "poison_queue_name" {
  description = "Name of the poison queue the worker forwards dead letters to (ServiceBusOptions::dead_letter_to)."
  value       = azurerm_servicebus_queue.poison.name
}
