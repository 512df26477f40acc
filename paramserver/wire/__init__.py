"""The wire: every message and its frame, the transport (the only module that talks MPI), liveness, compression and the shard fan-out."""
