"""Outcomes of one allocation attempt that are not a solution."""

from __future__ import annotations

from dataclasses import dataclass


class AllocationError(Exception):
    """A fatal problem with the input (missing class, CEL error, bad request): kube-scheduler reports it
    as an Error for the pod and retries with backoff; trying other nodes would not help."""


@dataclass(frozen=True)
class Unschedulable:
    """The claims do not fit on this node; other nodes may still work."""

    reason: str


# kube-scheduler's text when the allocator finds no solution on a node.
CANNOT_ALLOCATE = "cannot allocate all claims"
# The allocator's text when nothing fits and some pool seen on the node was invalid.
INVALID_POOLS = "invalid resource pools were encountered"
