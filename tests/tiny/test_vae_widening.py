"""Issue 3's third VAE: object-weighted reconstruction and latent channels widened from a
trained VAE without changing its round trip."""

from __future__ import annotations

import json
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from studio.tiny import world
from studio.tiny.autoencoder import (
    VaeDecoderTask,
    VaeTask,
    build_vae,
    expand_latent_channels,
    load_trained_vae,
    to_tensor,
    vae_architecture,
)


def _solid_scene(video: bool = False) -> world.SceneSpec:
    obj = world.ObjectSpec("red", "star", "small", "top left", "right" if video else "still")
    return world.SceneSpec("black", (obj,), video=video)


def test_object_coverage_is_where_the_render_paints_the_objects():
    spec = _solid_scene()
    pixels = world.render_image(spec).astype(np.int32)
    background = world.render_background("black", 64, 64, np.random.default_rng(0))
    background = np.asarray(background).round().astype(np.int32)
    cover = world.object_coverage(spec)
    assert cover.shape == (64, 64) and cover.dtype == np.float32
    painted = np.abs(pixels - background).sum(-1) > 0
    assert np.array_equal(painted, cover > 0)
    assert 0.0 <= cover.min() and cover.max() == 1.0

    clip_spec = _solid_scene(video=True)
    clip = world.render_clip(clip_spec, 9).astype(np.int32)
    covers = world.object_coverage(clip_spec, 9)
    assert covers.shape == (9, 64, 64)
    painted = np.abs(clip - background).sum(-1) > 0
    assert np.array_equal(painted, covers > 0)
    columns = [np.nonzero(c.sum(0))[0].mean() for c in covers]
    assert columns == sorted(columns) and columns[-1] > columns[0] + 5  # moving right


def test_widened_vae_round_trip_equals_the_original_and_its_new_channels_learn():
    torch.manual_seed(0)
    vae = build_vae(temporal_compression=2).eval()
    with pytest.raises(ValueError, match="latent_channels=8"):
        expand_latent_channels(vae, 8)
    with pytest.raises(ValueError, match="latent_channels"):
        build_vae(latent_channels=0)
    wide = expand_latent_channels(vae, 12)
    assert wide.config.z_dim == 12 and not wide.training
    assert list(wide.config.temperal_downsample) == [False, True]
    rng = np.random.default_rng(0)
    for video in (False, True):
        x = VaeTask(torch.device("cpu"), image_batch=2, clip_batch=1).batch(rng) if not video \
            else to_tensor(next(world.batches(rng, 1, video=True))[1], torch.device("cpu"))
        with torch.no_grad():
            post = wide.encode(x).latent_dist
            old = vae.encode(x).latent_dist
            assert torch.allclose(post.mode()[:, :8], old.mode(), atol=1e-6)
            assert torch.allclose(post.std[:, :8], old.std, rtol=1e-5)
            assert torch.allclose(post.std[:, 8:], torch.full_like(post.std[:, 8:], np.exp(-4)))
            assert post.mode()[:, 8:].abs().max() > 0  # the new channels carry something
            assert torch.allclose(wide.decode(post.mode()).sample,
                                  vae.decode(old.mode()).sample, atol=1e-5)
    # one step of training reaches the decoder's weights for the new channels
    wide.train()
    x = VaeTask(torch.device("cpu"), image_batch=2, clip_batch=1).batch(rng)
    loss = (wide.decode(wide.encode(x).latent_dist.mode()).sample - x).abs().mean()
    loss.backward()
    assert wide.decoder.conv_in.weight.grad[:, 8:].abs().sum() > 0


class _OffByATenth(torch.nn.Module):
    """A VAE whose round trip adds 0.1 to every pixel inside ``where``."""

    def __init__(self, where=None):
        super().__init__()
        self.where = where

    def encode(self, x):
        mean = x.clone()
        return SimpleNamespace(latent_dist=SimpleNamespace(
            mean=mean, std=torch.zeros_like(mean), kl=lambda: torch.zeros(len(x))))

    def decode(self, z):
        return SimpleNamespace(sample=z + 0.1 * (1 if self.where is None else self.where))


def test_object_weight_puts_the_loss_on_the_objects():
    with pytest.raises(ValueError, match="object_weight"):
        VaeTask(torch.device("cpu"), object_weight=-1)
    rng = np.random.default_rng(3)
    task = VaeTask(torch.device("cpu"), image_batch=4, clip_batch=1, object_weight=20.0,
                   clip_share=0.5)
    kinds = set()
    for _ in range(6):
        x, objects = task.batch(rng)
        kinds.add(x.shape[2])
        assert objects.shape == (x.shape[0], 1, *x.shape[2:])
        assert 0 <= objects.min() and objects.max() == 1
        share = float(objects.mean())
        assert 0.01 < share < 0.3  # objects and their rings, not the frame
        w = task.pixel_weights(x, objects)
        assert torch.allclose(w, 1 + 20 * objects)
    assert kinds == {1, 9}  # images and clips both carry their objects

    x, objects = VaeTask(torch.device("cpu"), image_batch=4, object_weight=20.0).batch(rng)
    gen = torch.Generator().manual_seed(0)
    task.vae = _OffByATenth()  # the same error everywhere: the weighted mean keeps its scale
    loss, _ = task.loss((x, objects), gen)
    assert loss.item() == pytest.approx(0.1 + 0.01, rel=1e-4)
    on_objects = (objects > 0.5).float().expand_as(x)
    task.vae = _OffByATenth(on_objects)
    loss_objects, _ = task.loss((x, objects), gen)
    task.vae = _OffByATenth(1 - on_objects)
    loss_background, _ = task.loss((x, objects), gen)
    area = float(on_objects.mean())  # a missed object pixel costs 1 + 20 background pixels
    assert 15 < (loss_objects / area) / (loss_background / (1 - area)) <= 21

    plain = VaeTask(torch.device("cpu"), image_batch=4)
    assert isinstance(plain.batch(rng), torch.Tensor)  # no weight: the batch as before


def test_vae_stage_widens_a_trained_run_and_keeps_its_channels(tmp_path, capsys):
    from studio.tiny.train import main
    from studio.train.loop import TrainConfig, train

    torch.manual_seed(0)
    source = VaeTask(torch.device("cpu"), image_batch=2, clip_batch=1, temporal_compression=2)
    train(source, tmp_path / "v2" / "vae", TrainConfig(lr=1e-3, warmup_steps=1, total_steps=1,
                                                       seed=0, checkpoint_every_s=1e9))
    assert vae_architecture(tmp_path / "v2") == {"temporal_compression": 2,
                                                 "latent_channels": 8,
                                                 "spatial_compression": 4}
    base = ["vae", "--out", str(tmp_path / "v3"), "--threads", "1", "--seed", "0"]
    with pytest.raises(SystemExit):
        main([*base, "--init-from", str(tmp_path / "nowhere"), "--steps", "0"])
    assert "no trained VAE under" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main([*base, "--init-from", str(tmp_path / "v2"), "--latent-channels", "4",
              "--steps", "0"])
    assert "fewer than --init-from's 8" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main([*base, "--init-from", str(tmp_path / "v2"), "--temporal-compression", "4",
              "--steps", "0"])
    assert "--init-from's VAE has 2" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main([*base, "--init-from", str(tmp_path / "v2"), "--spatial-compression", "2",
              "--steps", "0"])
    assert "--init-from's VAE has 4" in capsys.readouterr().err

    assert main([*base, "--init-from", str(tmp_path / "v2"), "--latent-channels", "12",
                 "--object-weight", "20", "--steps", "0"]) == 0
    assert "8 -> 12 latent channels" in capsys.readouterr().err
    assert json.loads((tmp_path / "v3" / "vae" / "architecture.json").read_text()) == {
        "temporal_compression": 2, "latent_channels": 12, "spatial_compression": 4}
    widened = load_trained_vae(tmp_path / "v3", torch.device("cpu")).eval()
    original = load_trained_vae(tmp_path / "v2", torch.device("cpu")).eval()
    x = VaeTask(torch.device("cpu"), image_batch=2).batch(np.random.default_rng(0))
    with torch.no_grad():  # step 0: the saved start decodes as the source
        assert torch.allclose(widened.decode(widened.encode(x).latent_dist.mode()).sample,
                              original.decode(original.encode(x).latent_dist.mode()).sample,
                              atol=1e-5)
    with pytest.raises(SystemExit):  # resuming with other channels is refused
        main([*base, "--latent-channels", "16", "--steps", "0"])
    assert "was started with 12" in capsys.readouterr().err
    decoder = VaeDecoderTask(torch.device("cpu"), widened, image_batch=1, clip_batch=1,
                             object_weight=5.0)
    assert decoder.vae.config.z_dim == 12 and decoder.object_weight == 5.0
    gen = torch.Generator().manual_seed(0)
    loss, _ = decoder.loss(decoder.batch(np.random.default_rng(1)), gen)
    assert torch.isfinite(loss)


def test_2x_spatial_vae_keeps_32x32_latents_through_a_run(tmp_path, capsys):
    """The third VAE's layout: one down stage, 64x64 -> 32x32 latents, 9 frames -> 5,
    written to the run's architecture and used to load it back (and by the decoder stage)."""
    from studio.tiny.train import main

    with pytest.raises(ValueError, match="spatial_compression=3"):
        build_vae(spatial_compression=3, temporal_compression=2)
    with pytest.raises(ValueError, match="must be 2 with spatial_compression 2"):
        build_vae(spatial_compression=2, temporal_compression=4)
    with pytest.raises(SystemExit):
        main(["vae", "--out", str(tmp_path / "bad"), "--spatial-compression", "2",
              "--steps", "0"])
    assert "must be 2 with spatial_compression 2" in capsys.readouterr().err
    assert main(["vae", "--out", str(tmp_path / "v3"), "--spatial-compression", "2",
                 "--temporal-compression", "2", "--object-weight", "20", "--steps", "1",
                 "--threads", "1"]) == 0
    capsys.readouterr()
    assert vae_architecture(tmp_path / "v3") == {"temporal_compression": 2,
                                                 "latent_channels": 8,
                                                 "spatial_compression": 2}
    vae = load_trained_vae(tmp_path / "v3", torch.device("cpu")).eval()
    clip = to_tensor(next(world.batches(np.random.default_rng(0), 1, video=True))[1],
                     torch.device("cpu"))
    with torch.no_grad():
        z = vae.encode(clip).latent_dist.mode()
        assert z.shape == (1, 8, 5, 32, 32)
        assert vae.decode(z).sample.shape == clip.shape
    assert vae.config.scale_factor_spatial == 2
    decoder = VaeDecoderTask(torch.device("cpu"), vae, image_batch=1, clip_batch=1)
    assert list(decoder.vae.config.dim_mult) == [1, 2]
    with pytest.raises(SystemExit):
        main(["vae", "--out", str(tmp_path / "v3"), "--spatial-compression", "4",
              "--steps", "0"])
    assert "was started with 2" in capsys.readouterr().err
