"""The peers the bench compares against (torch DDP, a torch.distributed.rpc parameter server); not part of the tool."""
