"""Regional ``torch.compile`` of a denoiser: each repeated transformer block compiled once.

Compiling the whole denoiser costs minutes per shape and breaks on the Python-side hooks
(step cache, parallel plans); compiling the repeated blocks alone compiles one block class
once and reuses it for every block, which keeps most of the run-time gain (fused
element-wise ops around the GEMMs and attention) at a fraction of the compile time. The
blocks are diffusers' ``_repeated_blocks`` (``compile_repeated_blocks``), or for a model
without them the block lists the step cache knows (``transformer_blocks``).

Our Triton kernels are ``torch.library`` custom ops, so the compiled blocks call them as
opaque ops; the step cache's per-block hooks run as Python around them (graph breaks at the
decision, by design). Source: PyTorch's regional compilation recipe
(https://docs.pytorch.org/tutorials/recipes/regional_compilation.html) and diffusers'
``ModelMixin.compile_repeated_blocks``.

No profile turns it on yet (``ProfileLevers.compile``): its gain on a GPU has not been
measured here; ``bench/gpu/engine.py`` times it beside our other levers.
"""

from __future__ import annotations

import torch


@torch.compiler.disable
def count_outside_graph(counter: dict, key: str, n: int = 1) -> None:
    """``counter[key] += n``, run by Python even inside a compiled region (a graph break at
    the call). Traced, the increment read the count as a constant and guarded on it, so every
    call failed its guard and recompiled (the attention router's call counts: 464 ms a
    forward of a 2-block model on dynamo's eager backend, against 5 ms). Dynamo's
    ``reorderable_logging_functions`` would avoid the break but silently drops such calls
    made from inlined functions (torch 2.13), so the counts would be wrong."""
    counter[key] += n


def compiled_blocks(denoiser: torch.nn.Module) -> list[torch.nn.Module]:
    """The blocks :func:`compile_denoiser` compiles: modules whose class is named in the
    model's ``_repeated_blocks``, else the step cache's block lists.

    Raises:
        ValueError: the model has neither (names its class).
    """
    names = set(getattr(denoiser, "_repeated_blocks", None) or ())
    blocks = [m for m in denoiser.modules() if type(m).__name__ in names]
    if blocks:
        return blocks
    from studio.engine.caching.step_cache import transformer_blocks

    try:
        return transformer_blocks(denoiser)
    except ValueError as exc:
        raise ValueError(f"compile: {type(denoiser).__name__} has no repeated blocks to "
                         f"compile ({exc})") from exc


def compile_denoiser(denoiser: torch.nn.Module, *, backend: str = "inductor",
                     mode: str | None = None) -> str:
    """Compiles each of the denoiser's repeated blocks with ``torch.compile`` (not full
    graph, static shapes: a new resolution recompiles once). Idempotent for the same
    settings; other settings replace the earlier compilation.

    Args:
        denoiser: a diffusers transformer (or any module with block lists).
        backend: ``torch.compile``'s backend (``"inductor"``; ``"eager"`` in tests).
        mode: ``torch.compile``'s mode (None, ``"max-autotune-no-cudagraphs"``, ...).
    Returns:
        A note for the user.
    Raises:
        ValueError: nothing to compile (see :func:`compiled_blocks`).
    """
    blocks = compiled_blocks(denoiser)
    settings = (backend, mode)
    if getattr(denoiser, "_studio_compiled", None) != settings:
        uncompile_denoiser(denoiser)
        for block in blocks:
            block.compile(backend=backend, mode=mode, fullgraph=False, dynamic=False)
        denoiser._studio_compiled = settings
    return f"torch.compile ({backend}{', ' + mode if mode else ''}) on {len(blocks)} blocks"


def uncompile_denoiser(denoiser: torch.nn.Module) -> None:
    """Undoes :func:`compile_denoiser` (the blocks run eagerly again; no-op if not
    compiled). Compiled code stays in dynamo's cache until ``torch._dynamo.reset()``."""
    for module in denoiser.modules():
        if getattr(module, "_compiled_call_impl", None) is not None:
            module._compiled_call_impl = None
    denoiser._studio_compiled = None
