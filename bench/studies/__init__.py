"""Measurements behind one decision each (a reply policy, a transport, a GPU path), run by hand, not by `asgd bench`."""
