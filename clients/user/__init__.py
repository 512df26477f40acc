"""The user's own code: models, data, loss, metric and optimizer factories loaded by name, and checked before launch."""
