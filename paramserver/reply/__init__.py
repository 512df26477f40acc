"""When the server answers a push: gather, the pace, DyLU's windows."""
