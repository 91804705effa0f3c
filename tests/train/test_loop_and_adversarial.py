"""The general training stack: modules added to a run under way, and the adversarial pieces."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from studio.train.adversarial import (
    AdversarialCritic,
    PatchDiscriminator,
    adaptive_adversarial_weight,
    hinge_discriminator_loss,
)
from studio.train.loop import TrainConfig, TrainTask, load_checkpoint, train


class Regression(TrainTask):
    """y = 3x + 1 with a linear model; ``extra`` adds a second module."""

    def __init__(self, extra: bool = False, optional: bool = True):
        self.model = torch.nn.Linear(1, 1)
        self.extra = torch.nn.Linear(1, 1) if extra else None
        self.optional_modules = frozenset({"extra"} if optional else ())

    def modules(self):
        return {"model": self.model, **({"extra": self.extra} if self.extra else {})}

    def batch(self, rng):
        return torch.from_numpy(rng.standard_normal((16, 1)).astype(np.float32))

    def loss(self, x, gen):
        pred = self.model(x) + (0 * self.extra(x) if self.extra else 0)
        return (pred - (3 * x + 1)).pow(2).mean(), {}


def test_a_module_added_to_a_run_under_way_starts_fresh(tmp_path):
    config = TrainConfig(lr=1e-2, warmup_steps=1, total_steps=20, checkpoint_every_s=1e9)
    train(Regression(), tmp_path, config, max_steps=5)
    trained = Regression()
    load_checkpoint(tmp_path, trained)
    grown = Regression(extra=True)
    init = grown.extra.weight.detach().clone()
    opt = torch.optim.AdamW([p for m in grown.modules().values() for p in m.parameters()])
    state = load_checkpoint(tmp_path, grown, opt)
    assert state["step"] == 5
    assert torch.equal(grown.model.weight, trained.model.weight)  # the old module: loaded
    assert torch.equal(grown.extra.weight, init)  # the new one: as initialised
    # the old module keeps its AdamW moments; the new one has none yet
    saved = torch.load(tmp_path / "checkpoint" / "optimizer.pt", weights_only=True)
    moments = {id(p): s for p, s in opt.state.items()}
    model_params = list(grown.model.parameters())
    for k, param in enumerate(model_params):
        assert torch.equal(moments[id(param)]["exp_avg"], saved["state"][k]["exp_avg"])
        assert float(moments[id(param)]["step"]) == 5
    assert not any(id(p) in moments for p in grown.extra.parameters())
    assert train(grown, tmp_path, config, max_steps=8)["step"] == 8  # and training goes on
    other = tmp_path / "other"
    train(Regression(), other, config, max_steps=2)
    with pytest.raises(FileNotFoundError, match="extra.safetensors"):  # not optional
        load_checkpoint(other, Regression(extra=True, optional=False))


def test_lr_scales_give_a_module_its_own_learning_rate(tmp_path, caplog):
    """A module named in ``lr_scales`` trains at that multiple of the schedule's rate (Adam's
    first step moves each weight by about the rate); a checkpoint saved with other groups
    resumes with fresh optimizer moments; bad scales are refused."""

    class Scaled(Regression):
        def __init__(self, scales):
            super().__init__(extra=True)
            self.scales = scales

        def lr_scales(self):
            return self.scales

        def loss(self, x, gen):
            return (self.model(x) + self.extra(x) - (3 * x + 1)).pow(2).mean(), {}

    config = TrainConfig(lr=1e-3, warmup_steps=1, total_steps=4, checkpoint_every_s=1e9,
                         weight_decay=0.0, grad_clip=1e9)
    train(Regression(extra=True), tmp_path, config, max_steps=2)  # saved with one group
    task = Scaled({"extra": 10.0})
    load_checkpoint(tmp_path, task)
    before = {k: m.weight.item() for k, m in task.modules().items()}
    with caplog.at_level("WARNING", logger="studio.train"):
        train(task, tmp_path, config, max_steps=3)  # one step, moments fresh
    assert "parameter groups" in caplog.text
    moved = {k: abs(m.weight.item() - before[k]) for k, m in task.modules().items()}
    lr = config.lr_at(2)
    assert moved["model"] == pytest.approx(lr, rel=1e-3)
    assert moved["extra"] == pytest.approx(10 * lr, rel=1e-3)
    for bad in ({"nothing": 2.0}, {"extra": 0.0}, {"extra": float("nan")}):
        with pytest.raises(ValueError, match="lr_scales="):
            train(Scaled(bad), tmp_path / "bad", config, max_steps=1)


def test_hinge_losses_and_the_critic_step():
    real, fake = torch.full((2, 1, 4, 4), 2.0), torch.full((2, 1, 4, 4), -2.0)
    assert hinge_discriminator_loss(real, fake).item() == 0.0  # both beyond the margins
    assert hinge_discriminator_loss(-real, -fake).item() == pytest.approx(6.0)
    torch.manual_seed(0)
    critic = AdversarialCritic(PatchDiscriminator(width=8))
    d = critic.discriminator
    assert not any(p.requires_grad for p in d.parameters())  # a loop's optimiser skips it
    sharp = torch.rand(8, 3, 16, 16) * 2 - 1
    blurred = torch.nn.functional.avg_pool2d(sharp, 3, 1, 1)
    first = critic.step(sharp, blurred)
    for _ in range(60):
        last = critic.step(sharp, blurred)
    assert last < first - 0.5  # it learns to tell sharp from blurred
    assert not any(p.requires_grad for p in d.parameters())
    # the generator's loss gives the images a gradient, the discriminator none
    fake = blurred.clone().requires_grad_(True)
    critic.generator_loss(fake).backward()
    assert fake.grad is not None and fake.grad.abs().sum() > 0
    assert all(p.grad is None or p.grad.abs().sum() == 0 for p in d.parameters())
    with pytest.raises(ValueError, match="multiples of 4"):
        d(torch.zeros(1, 3, 10, 10))
    with pytest.raises(ValueError, match="lr="):
        AdversarialCritic(PatchDiscriminator(), lr=0)


def test_adaptive_weight_balances_gradient_norms_at_the_last_layer():
    torch.manual_seed(0)
    layer = torch.nn.Conv2d(3, 3, 1)
    out = layer(torch.randn(2, 3, 4, 4))
    rec = out.pow(2).mean()
    adv = 10 * out.mean()
    w = adaptive_adversarial_weight(rec, adv, layer.weight)
    g_rec = torch.autograd.grad(rec, layer.weight, retain_graph=True)[0].norm()
    g_adv = torch.autograd.grad(adv, layer.weight, retain_graph=True)[0].norm()
    assert w.item() == pytest.approx((g_rec / (g_adv + 1e-4)).item(), rel=1e-5)
    assert not w.requires_grad
    # scaling the adversarial loss scales the weight inversely: its push stays the same
    assert adaptive_adversarial_weight(rec, 2 * adv, layer.weight).item() == pytest.approx(
        w.item() / 2, rel=1e-3)
