"""Each MPI rank's process: its role chosen once from the rank, the MPI glue of the run."""
