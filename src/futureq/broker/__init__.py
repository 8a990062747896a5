"""trio adapters around the cores: command log, dispatcher, hub, gateway, HTTP, server."""
