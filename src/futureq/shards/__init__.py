"""Sharding a node's topics over several Raft groups (issue 15; ``docs/sharding.md``)."""
