"""The process the user typed (`asgd train` without mpiexec): the run's lock, the MPI launcher, its supervision and the parent-death wrapper."""
