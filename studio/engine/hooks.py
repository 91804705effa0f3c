"""Taking one hook off a module's diffusers ``HookRegistry`` without breaking the others.

diffusers 0.42's ``HookRegistry.remove_hook`` rewires cleanly only the outermost hook (the
last registered). Removing one with hooks registered after it writes the removed hook's
inner forward into the next hook's ``fn_ref.forward``: a next hook with a ``new_forward``
(our step cache, guidance reuse, attention routing) then stops running, and its
``original_forward`` still points at the removed hook's wrapper, so removing that one later
puts the removed hook back on ``module.forward``. In a long-lived engine, where each job
swaps levers, that silently runs a non-stock path under the ``exact`` profile.

:func:`remove_hook` peels every hook outside the one removed (outermost first), removes it,
and registers the peeled hooks again in their order. Our hooks' ``initialize_hook`` only
reads the module, so registering one again is safe; their state is kept.
"""

from __future__ import annotations

import torch
from diffusers.hooks import HookRegistry


def remove_hook(module: torch.nn.Module, name: str) -> bool:
    """Removes the hook ``name`` from ``module``'s registry (not its submodules'), keeping
    the hooks registered after it working and in their order.

    Returns:
        Whether there was such a hook.
    """
    registry = HookRegistry.check_if_exists_or_initialize(module)
    if registry.get_hook(name) is None:
        return False
    order = list(registry._hook_order)
    outer = [(n, registry.hooks[n]) for n in order[order.index(name) + 1:]]
    for outer_name, _ in reversed(outer):  # the outermost first: the clean removal
        registry.remove_hook(outer_name, recurse=False)
    registry.remove_hook(name, recurse=False)
    for outer_name, hook in outer:
        registry.register_hook(hook, outer_name)
    return True
