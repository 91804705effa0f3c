"""A small, general training loop: seeded, resumable, checkpointing often.

The loop knows nothing of the model, the data or the objective: a :class:`TrainTask` gives
the trainable modules, draws a batch for a step and computes the loss. That keeps the same
loop usable for the embedded model's autoencoder and denoiser and, later, for fine-tuning.

Checkpoints (``<out>/checkpoint/``) hold each module's weights as safetensors, the optimizer
state (``torch.save``, read back with ``weights_only=True``) and ``state.json`` (step, elapsed
seconds, seed). A checkpoint is written to a temporary folder and renamed into place, so a run
killed at any moment resumes from the last complete one. Data for step ``n`` is drawn from a
generator seeded by ``(seed, n)``, so a resumed run sees the same batches as an uninterrupted
one.
"""

from __future__ import annotations

import json
import logging
import math
import os
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors.torch import load_model, save_model

from studio.paths import fsync_dir

log = logging.getLogger("studio.train")


class TrainTask:
    """What to train. Subclasses implement the three methods below.

    ``optional_modules``: names of :meth:`modules` a checkpoint may lack (a module added to a
    task whose run is already under way): :func:`load_checkpoint` keeps their fresh
    initialisation and, since the optimizer's parameter list then differs from the saved
    one, restarts the optimizer's moments.
    """

    optional_modules: frozenset[str] = frozenset()

    def lr_scales(self) -> dict[str, float]:
        """Learning-rate multipliers by module name (default 1 for a module not named): a
        module trained fresh beside well-trained ones can learn faster without moving them.
        Each distinct multiplier is one AdamW parameter group."""
        return {}

    def modules(self) -> dict[str, torch.nn.Module]:
        """The trainable modules by name (saved as ``<name>.safetensors``)."""
        raise NotImplementedError

    def batch(self, rng: np.random.Generator) -> Any:
        """The batch of one step, drawn only from ``rng``."""
        raise NotImplementedError

    def loss(self, batch: Any, gen: torch.Generator) -> tuple[torch.Tensor, dict[str, float]]:
        """The scalar loss to minimise and metrics to log; noise only from ``gen``."""
        raise NotImplementedError

    def on_checkpoint(self, out_dir: Path, step: int) -> None:
        """Called after each checkpoint (e.g. to write a sample grid)."""


@dataclass
class TrainConfig:
    """Optimisation settings.

    Attributes:
        lr: peak AdamW learning rate; warmup_steps: linear warm-up; min_lr_ratio: cosine
        floor as a fraction of ``lr`` reached at ``total_steps``; weight_decay; grad_clip
        (max global norm); seed; checkpoint_every_s: seconds between checkpoints;
        log_every: steps between log lines.
    """

    lr: float = 1e-3
    warmup_steps: int = 200
    total_steps: int = 100_000
    min_lr_ratio: float = 0.1
    weight_decay: float = 0.01
    grad_clip: float = 1.0
    seed: int = 0
    checkpoint_every_s: float = 300.0
    log_every: int = 20

    def lr_at(self, step: int) -> float:
        if step < self.warmup_steps:
            return self.lr * (step + 1) / self.warmup_steps
        frac = min(1.0, (step - self.warmup_steps) / max(1, self.total_steps - self.warmup_steps))
        floor = self.min_lr_ratio
        return self.lr * (floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * frac)))


def _save_checkpoint(out_dir: Path, task: TrainTask, opt: torch.optim.Optimizer,
                     state: dict[str, Any]) -> None:
    final = out_dir / "checkpoint"
    tmp = out_dir / "checkpoint.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    for name, module in task.modules().items():
        save_model(module, str(tmp / f"{name}.safetensors"))  # handles tied weights
    torch.save(opt.state_dict(), tmp / "optimizer.pt")
    (tmp / "state.json").write_text(json.dumps(state, indent=1))
    for f in tmp.iterdir():
        with open(f, "rb") as fh:
            os.fsync(fh.fileno())
    old = out_dir / "checkpoint.old"
    # at every moment one complete checkpoint is there: ``checkpoint``, else ``.old``
    # (a save cut off between the renames leaves only ``.old``; the next save must not
    # delete it before its own ``checkpoint`` is in place)
    if final.exists():
        shutil.rmtree(old, ignore_errors=True)
        final.rename(old)
    tmp.rename(final)
    fsync_dir(out_dir)
    shutil.rmtree(old, ignore_errors=True)


def _param_groups(task: TrainTask) -> list[dict[str, Any]]:
    """AdamW parameter groups: the trainable parameters of ``task.modules()`` grouped by
    ``task.lr_scales()`` (one group, scale 1, when the task sets none)."""
    scales = task.lr_scales()
    unknown = set(scales) - set(task.modules())
    if unknown or any(not (v > 0 and math.isfinite(v)) for v in scales.values()):
        raise ValueError(f"lr_scales={scales}: names must be modules of the task "
                         f"({sorted(task.modules())}) and scales finite and > 0")
    by_scale: dict[float, list[torch.nn.Parameter]] = {}
    for name, module in task.modules().items():
        trainable = [p for p in module.parameters() if p.requires_grad]
        if trainable:
            by_scale.setdefault(float(scales.get(name, 1.0)), []).extend(trainable)
    return [{"params": ps, "lr_scale": scale} for scale, ps in sorted(by_scale.items())]


def last_checkpoint(out_dir: str | os.PathLike[str]) -> Path | None:
    """The folder of the last complete checkpoint under ``out_dir``: ``checkpoint``, or
    ``checkpoint.old`` when a save was cut off between its two renames; None if neither
    holds a ``state.json``."""
    for name in ("checkpoint", "checkpoint.old"):
        ckpt = Path(out_dir) / name
        if (ckpt / "state.json").exists():
            return ckpt
    return None


def _state_without_new_modules(saved: dict, opt: torch.optim.Optimizer, task: TrainTask,
                               fresh: list[str]) -> dict | None:
    """``saved`` (an optimizer ``state_dict`` of the run before ``fresh`` modules joined)
    re-indexed for ``opt``, whose groups hold the same parameters in the same order with the
    fresh modules' parameters added: each old parameter keeps its moments, a new one gets
    none. None when the groups do not line up (then the moments restart)."""
    new = {id(p) for name in fresh for p in task.modules()[name].parameters()}
    groups = opt.param_groups
    if len(saved["param_groups"]) != len(groups):
        return None
    state, param_groups, index = {}, [], 0
    for saved_group, group in zip(saved["param_groups"], groups, strict=True):
        old = [i for i, p in enumerate(group["params"]) if id(p) not in new]
        if len(old) != len(saved_group["params"]):
            return None
        ids = list(range(index, index + len(group["params"])))
        for position, saved_id in zip(old, saved_group["params"], strict=True):
            if saved_id in saved["state"]:
                state[ids[position]] = saved["state"][saved_id]
        param_groups.append({**saved_group, "params": ids})
        index += len(group["params"])
    return {"state": state, "param_groups": param_groups}


def load_checkpoint(out_dir: Path, task: TrainTask,
                    opt: torch.optim.Optimizer | None = None) -> dict[str, Any] | None:
    """Loads the last complete checkpoint into ``task`` (and ``opt``); None if there is none.

    A module named in ``task.optional_modules`` whose file the checkpoint lacks keeps its
    initial weights. The optimizer's moments are loaded for every parameter the checkpoint
    had (the saved order is the task's order without the new modules); the new modules'
    parameters start with none. They restart for all only when ``opt``'s groups are not
    the saved groups plus the new parameters (:func:`_state_without_new_modules`).

    Raises:
        FileNotFoundError: the checkpoint lacks a module that is not optional.
    """
    ckpt = last_checkpoint(out_dir)
    if ckpt is None:
        return None
    fresh = []
    for name, module in task.modules().items():
        path = ckpt / f"{name}.safetensors"
        if not path.exists() and name in task.optional_modules:
            fresh.append(name)
            continue
        if not path.exists():
            raise FileNotFoundError(f"checkpoint {ckpt} has no {path.name}")
        load_model(module, str(path))
    saved = None
    if opt is not None and (ckpt / "optimizer.pt").exists():
        saved = torch.load(ckpt / "optimizer.pt", weights_only=True)
    if fresh:
        kept = None if saved is None else _state_without_new_modules(saved, opt, task, fresh)
        log.warning("checkpoint %s: new modules %s start fresh; %s", ckpt, ", ".join(fresh),
                    "the other modules keep their optimizer moments" if kept is not None
                    else "optimizer moments restart")
        if kept is not None:
            scales = [g.get("lr_scale", 1.0) for g in opt.param_groups]
            opt.load_state_dict(kept)
            for group, scale in zip(opt.param_groups, scales, strict=True):
                group["lr_scale"] = scale
    elif saved is not None:
        sizes = [len(g["params"]) for g in saved["param_groups"]]
        if sizes == [len(g["params"]) for g in opt.param_groups]:
            scales = [g.get("lr_scale", 1.0) for g in opt.param_groups]
            opt.load_state_dict(saved)  # also restores the saved groups' settings
            for group, scale in zip(opt.param_groups, scales, strict=True):
                group["lr_scale"] = scale  # the task's, not the checkpoint's
        else:  # the task's learning-rate groups changed since the checkpoint
            log.warning("checkpoint %s: parameter groups %s -> %s; optimizer moments restart",
                        ckpt, sizes, [len(g["params"]) for g in opt.param_groups])
    return json.loads((ckpt / "state.json").read_text())


def train(task: TrainTask, out_dir: str | os.PathLike[str], config: TrainConfig, *,
          max_steps: int | None = None, max_minutes: float | None = None,
          on_log: Callable[[dict[str, Any]], None] | None = None,
          after_step: Callable[[], None] | None = None,
          should_stop: Callable[[], bool] | None = None) -> dict[str, Any]:
    """Trains until ``max_steps`` (total, including resumed ones) or ``max_minutes`` (this
    sitting) or ``config.total_steps``; resumes from ``out_dir/checkpoint`` if present.
    ``after_step`` runs after each optimiser step (e.g. an EMA update). ``should_stop`` is
    asked before each step (e.g. a SIGTERM flag): when true, the loop saves a checkpoint and
    returns.

    Returns:
        The final state (step, elapsed_s, last metrics).
    """
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    groups = _param_groups(task)
    params = [p for g in groups for p in g["params"]]
    opt = torch.optim.AdamW(groups, lr=config.lr, weight_decay=config.weight_decay,
                            betas=(0.9, 0.99))
    state = load_checkpoint(out, task, opt) or {"step": 0, "elapsed_s": 0.0,
                                                "seed": config.seed}
    if state["seed"] != config.seed:
        raise ValueError(f"seed={config.seed}: the checkpoint in {out} was trained with seed "
                         f"{state['seed']}")
    for m in task.modules().values():
        m.train()
    stop_step = config.total_steps if max_steps is None else min(config.total_steps, max_steps)
    t0 = time.monotonic()
    last_ckpt = t0
    saved_step = None  # the step of the last checkpoint this call saved
    elapsed0 = state["elapsed_s"]
    log_path = out / "train_log.jsonl"
    metrics: dict[str, float] = {}
    acc: dict[str, list[float]] = {}
    while state["step"] < stop_step:
        if max_minutes is not None and time.monotonic() - t0 > max_minutes * 60:
            break
        if should_stop is not None and should_stop():
            break
        step = state["step"]
        rng = np.random.default_rng([config.seed, step])
        gen = torch.Generator().manual_seed(config.seed * 1_000_003 + step)
        lr = config.lr_at(step)
        for group in opt.param_groups:
            group["lr"] = lr * group["lr_scale"]
        batch = task.batch(rng)
        loss, metrics = task.loss(batch, gen)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        grad_norm = torch.nn.utils.clip_grad_norm_(params, config.grad_clip)
        opt.step()
        if after_step is not None:
            after_step()  # e.g. an EMA update
        state["step"] = step + 1
        for k, v in {"loss": loss.item(), "grad_norm": float(grad_norm), **metrics}.items():
            acc.setdefault(k, []).append(v)
        now = time.monotonic()
        state["elapsed_s"] = elapsed0 + now - t0
        if state["step"] % config.log_every == 0:
            line = {"step": state["step"], "lr": lr, "elapsed_s": round(state["elapsed_s"], 1),
                    **{k: round(float(np.mean(v)), 6) for k, v in acc.items()}}
            acc = {}
            with open(log_path, "a") as fh:
                fh.write(json.dumps(line) + "\n")
            if on_log:
                on_log(line)
        if now - last_ckpt > config.checkpoint_every_s:
            _save_checkpoint(out, task, opt, state)
            task.on_checkpoint(out, state["step"])
            saved_step, last_ckpt = state["step"], time.monotonic()
    if saved_step != state["step"]:  # not again (and no second eval line) at the same step,
        _save_checkpoint(out, task, opt, state)  # e.g. a SIGTERM during a periodic eval
        task.on_checkpoint(out, state["step"])
    return {**state, "metrics": metrics}
