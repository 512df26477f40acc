"""The run's config: one validated RunConfig every package reads, its checks and its TOML file."""
