"""The server's drivers: what carries messages to `handle()` (paramserver/handler.py) and its
replies back, each on one kind of link: MPI's loop for server 0 (`server`), the loop of a
server that follows server 0's decisions (`follow`), and the simulator's in-process calls
(`inprocess`). The decisions stay in the handler and the reply policy; a driver only moves
messages and keeps time."""
