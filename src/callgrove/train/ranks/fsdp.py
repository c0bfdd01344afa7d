"""The FSDP2 units a rank's model is sharded into.

The build function runs in every rank and must build the same model there (seeded), which is
then sharded: a stack of blocks (every entry of a model's outermost `nn.ModuleList`: the tiny
decoder's blocks, a Hugging Face model's decoder layers, LoRA adapters inside them) one FSDP
unit each, the rest one unit at the root. The gradient shards are reduced by sum, not FSDP's
mean: every micro-batch's loss already divides by the whole step's denominator, so every
parameter's gradient is the one-process sum over the same rows.
"""

from __future__ import annotations

from collections.abc import Iterator

from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import FSDPModule, fully_shard


def shard(model: nn.Module, mesh: DeviceMesh) -> None:
    """FSDP2 over `model`: each block of its outermost block stacks a unit, the rest the root's;
    gradient shards reduced by sum (the loss already divides by the whole step's count)."""
    for block in _blocks(model):
        fully_shard(block, mesh=mesh)
    fully_shard(model, mesh=mesh)
    for module in model.modules():
        if isinstance(module, FSDPModule):
            module.set_gradient_divide_factor(1.0)
            # A plain sum: gloo has no pre-multiplied sum, which a factor asks for otherwise.
            module.set_force_sum_reduction_for_comms(True)


def _blocks(module: nn.Module) -> Iterator[nn.Module]:
    for child in module.children():
        if isinstance(child, nn.ModuleList):
            yield from child
        else:
            yield from _blocks(child)
