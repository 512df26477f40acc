"""The simulator: the same server and clients on a virtual clock, and what it charges."""
