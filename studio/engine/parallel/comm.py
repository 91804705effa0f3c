"""Counts what a rank sends: every collective and point-to-point operation seen by the
dispatcher (c10d and functional collectives), with the bytes this rank puts in.

Used by the tests to assert that every rank does only its share, and by the scaling model to
check its byte formulas against what the code really moves. Follows the idea of torch's
``CommDebugMode`` (which counts operations, not bytes).
"""

from __future__ import annotations

from collections import defaultdict

import torch
from torch.utils._python_dispatch import TorchDispatchMode

# operation -> which argument holds the tensors this rank contributes
_INPUT_ARG = {
    "allgather_": 1, "_allgather_base_": 1, "allgather_into_tensor_coalesced_": 1,
    "allreduce_": 0, "allreduce_coalesced_": 0, "broadcast_": 0, "reduce_": 0,
    "alltoall_base_": 1, "alltoall_": 1, "reduce_scatter_": 1, "_reduce_scatter_base_": 1,
    "send": 0, "gather_": 1, "scatter_": 1,
    "all_gather_into_tensor": 0, "all_gather_into_tensor_coalesced": 0, "all_reduce": 0,
    "all_reduce_coalesced": 0, "all_to_all_single": 0, "broadcast": 0,
    "reduce_scatter_tensor": 0, "reduce_scatter_tensor_coalesced": 0,
}


def _bytes(value) -> int:
    if isinstance(value, torch.Tensor):
        return value.numel() * value.element_size()
    if isinstance(value, (list, tuple)):
        return sum(_bytes(v) for v in value)
    return 0


class CommunicationLog(TorchDispatchMode):
    """A dispatch mode that records, per operation name, the number of calls and the bytes
    of the tensors this rank contributes (its input; for ``send``, the tensor sent).

    Use as a context manager around the work; then read :attr:`calls` and :attr:`sent`
    (dicts keyed by operation name such as ``"all_to_all_single"`` or ``"send"``) or
    :attr:`total_bytes`.
    """

    def __init__(self):
        super().__init__()
        self.calls: dict[str, int] = defaultdict(int)
        self.sent: dict[str, int] = defaultdict(int)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        namespace = func.namespace
        if namespace in ("c10d", "_c10d_functional", "c10d_functional"):
            name = func._opname
            index = _INPUT_ARG.get(name)
            if index is not None and index < len(args):
                self.calls[name] += 1
                self.sent[name] += _bytes(args[index])
        return func(*args, **kwargs)

    @property
    def total_bytes(self) -> int:
        """All bytes this rank contributed, over every operation."""
        return sum(self.sent.values())
