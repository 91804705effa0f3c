"""Taking one hook off a module's diffusers ``HookRegistry``, or putting one under others,
without breaking the rest of the stack.

diffusers 0.42's ``HookRegistry.remove_hook`` rewires cleanly only the outermost hook (the
last registered). Removing one with hooks registered after it writes the removed hook's
inner forward into the next hook's ``fn_ref.forward``: a next hook with a ``new_forward``
(our step cache, guidance reuse, attention routing) then stops running, and its
``original_forward`` still points at the removed hook's wrapper, so removing that one later
puts the removed hook back on ``module.forward``. In a long-lived engine, where each job
swaps levers, that silently runs a non-stock path under the ``exact`` profile.

Both functions peel the hooks outside the place they work at (outermost first: the clean
removal), do their work, and register the peeled hooks again in their order (in a
``finally``, so an error leaves the stack as it was). Only our own hooks (named
``studio_*``) are peeled: their ``initialize_hook`` only reads the module and their state
is kept. diffusers' own hooks (group offloading, layerwise casting) do not survive being
registered again, so under one of those the plain diffusers call is made and a warning
logged.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable

import torch
from diffusers.hooks import HookRegistry, ModelHook

log = logging.getLogger(__name__)

OURS = "studio_"


def _peel(registry: HookRegistry, start: int) -> list[tuple[str, ModelHook]] | None:
    """Removes the hooks at ``start`` and after it, outermost first; returns them innermost
    first. None (nothing removed) when one of them is not ours."""
    names = list(registry._hook_order)[start:]
    if any(not n.startswith(OURS) for n in names):
        return None
    peeled = [(n, registry.hooks[n]) for n in names]
    for name, _ in reversed(peeled):
        registry.remove_hook(name, recurse=False)
    return peeled


def _restore(registry: HookRegistry, peeled: list[tuple[str, ModelHook]]) -> None:
    for name, hook in peeled:
        registry.register_hook(hook, name)


def remove_hook(module: torch.nn.Module, name: str) -> bool:
    """Removes the hook ``name`` from ``module``'s registry (not its submodules'), keeping
    the hooks registered after it working and in their order.

    Returns:
        Whether there was such a hook.
    """
    registry = HookRegistry.check_if_exists_or_initialize(module)
    if registry.get_hook(name) is None:
        return False
    peeled = _peel(registry, registry._hook_order.index(name) + 1)
    if peeled is None:
        log.warning("hooks: %s is under diffusers' own hooks (%s); removed in place",
                    name, ", ".join(registry._hook_order))
        registry.remove_hook(name, recurse=False)
        return True
    try:
        registry.remove_hook(name, recurse=False)
    finally:
        _restore(registry, peeled)
    return True


def register_inside(module: torch.nn.Module, hook: ModelHook, name: str,
                    outer: Iterable[str]) -> None:
    """Registers ``hook`` as ``name`` inside the first hook of ``outer`` present (and every
    hook registered after that one); on top when none is."""
    registry = HookRegistry.check_if_exists_or_initialize(module)
    order = list(registry._hook_order)
    first = min((order.index(n) for n in outer if n in order), default=len(order))
    peeled = _peel(registry, first)
    if peeled is None:
        raise ValueError(f"hooks: {name} cannot go inside diffusers' own hooks "
                         f"({', '.join(order[first:])})")
    try:
        registry.register_hook(hook, name)
    finally:
        _restore(registry, peeled)
