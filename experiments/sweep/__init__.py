"""Sweeps: a spec's grid of runs, run point by point into a resumable folder."""
