"""Structured-parameters allocation with Kubernetes 1.35 semantics, on compact internal structures."""

from controller.allocator.allocator import Allocator
from controller.allocator.errors import CANNOT_ALLOCATE, INVALID_POOLS, AllocationError, Unschedulable
from controller.allocator.model import MAX_RESULTS, Claim, Device, DeviceClass, Slice, parse_claim
from controller.allocator.nodes import Node, NodeSelector
from controller.allocator.pools import Pool, gather_pools
from controller.allocator.snapshot import ClusterSnapshot

__all__ = [
    "CANNOT_ALLOCATE",
    "INVALID_POOLS",
    "MAX_RESULTS",
    "AllocationError",
    "Allocator",
    "Claim",
    "ClusterSnapshot",
    "Device",
    "DeviceClass",
    "Node",
    "NodeSelector",
    "Pool",
    "Slice",
    "Unschedulable",
    "gather_pools",
    "parse_claim",
]
