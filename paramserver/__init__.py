"""Parameter server: config, protocol, transport, store, update rules, server driver."""
