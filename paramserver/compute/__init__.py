"""Where and how the server's arithmetic runs: its arrays, GPU paths and fused kernels."""
