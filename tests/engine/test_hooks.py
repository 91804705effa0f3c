"""studio.engine.hooks: one hook off (or one under others) without unwiring the rest."""

from __future__ import annotations

import pytest
import torch
from diffusers.hooks import HookRegistry, ModelHook

from studio.engine.hooks import register_inside, remove_hook


class Add(ModelHook):
    """Adds ``k`` to the output, with a new_forward as our levers have."""

    def __init__(self, k: float) -> None:
        super().__init__()
        self.k = k

    def new_forward(self, module, *args, **kwargs):
        return self.fn_ref.original_forward(*args, **kwargs) + self.k


def stack(*names_and_ks):
    module = torch.nn.Identity()
    registry = HookRegistry.check_if_exists_or_initialize(module)
    for name, k in names_and_ks:
        registry.register_hook(Add(k), name)
    return module, registry


def test_removing_a_middle_hook_keeps_the_outer_ones_and_their_order():
    module, registry = stack(("studio_a", 1.0), ("studio_b", 10.0), ("studio_c", 100.0))
    x = torch.zeros(1)
    assert module(x).item() == 111.0
    assert remove_hook(module, "studio_a")
    assert module(x).item() == 110.0 and registry._hook_order == ["studio_b", "studio_c"]
    assert remove_hook(module, "studio_c") and module(x).item() == 10.0
    assert remove_hook(module, "studio_b") and module(x).item() == 0.0
    assert not remove_hook(module, "studio_b")


def test_diffusers_plain_removal_of_a_middle_hook_is_what_this_avoids():
    module, registry = stack(("studio_a", 1.0), ("studio_b", 10.0))
    registry.remove_hook("studio_a", recurse=False)
    assert module(torch.zeros(1)).item() != 10.0  # the outer hook no longer runs (0.42)


def test_register_inside_and_foreign_hooks():
    module, registry = stack(("studio_a", 1.0), ("studio_cfg_parallel", 10.0))
    register_inside(module, Add(100.0), "studio_inner", ["studio_cfg_parallel"])
    assert registry._hook_order == ["studio_a", "studio_inner", "studio_cfg_parallel"]
    assert module(torch.zeros(1)).item() == 111.0
    # a hook of diffusers' own outside: not peeled (it would not survive); plain removal
    module, registry = stack(("studio_a", 1.0), ("group_offloading", 10.0))
    assert remove_hook(module, "studio_a")
    assert registry._hook_order == ["group_offloading"]
    with pytest.raises(ValueError, match="inside diffusers' own hooks"):
        register_inside(module, Add(1.0), "studio_x", ["group_offloading"])
    assert registry._hook_order == ["group_offloading"]
