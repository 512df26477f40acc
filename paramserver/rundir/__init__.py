"""The run directory, the only link between training and analysis: its layout and lock, durable files, the checkpoint, the record (summary and status), resume."""
