"""Running experiments: the asgd command, MPI launch, reports."""
