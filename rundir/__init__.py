"""The run directory, the only link between training and analysis: its layout and lock,
durable files, the checkpoint, the record (summary and status).

The lowest layer of the project: it imports nothing else of ours, so the server, the
clients, the experiments and the plots all read it without reaching into one another.
Resuming a run checks the run config, so it lives above, in experiments/run/resume.py.
"""
