"""PyTorch clients of the asynchronous SGD parameter server."""
