"""Consistency checker: confirms blocks that a quorum of state replicas agree on."""
