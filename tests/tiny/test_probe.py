"""The conditioning probe: it sees the signals the shipped denoiser uses, reads zero when a
signal cannot reach the denoiser, and refuses bad input."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from studio.tiny.probe import DenoiserProbe, conditioning_sensitivity

SHIPPED = Path(__file__).resolve().parents[2] / "assets" / "models" / "tiny-wan"


@pytest.fixture(scope="module")
def probe():
    torch.manual_seed(0)
    return DenoiserProbe(SHIPPED)


def test_probe_sees_what_the_shipped_denoiser_uses(probe):
    report = conditioning_sensitivity(probe, scenes=6, signals=("caption", "colour",
                                                                "first_frame"))
    assert set(report) == {"caption", "colour", "first_frame"}
    # the trained denoiser follows the caption and its colour word, and copies the first frame
    # (the 2x-VAE weights of step 7542: caption 1.04, colour 0.74, first frame 0.31 -- one
    # latent frame of five given clean, where the 4x-VAE weights had one of three and read 2.8)
    assert report["caption"]["relative_increase"] > 0.05, report
    assert report["colour"]["relative_increase"] > 0.02, report
    assert report["first_frame"]["relative_increase"] > 0.15, report
    assert all(r["loss"] > 0 for r in report.values())


def test_probe_reads_zero_when_the_signal_cannot_reach_the_denoiser(probe, monkeypatch):
    # the text pathway cut: every caption encodes to the same embedding
    monkeypatch.setattr(probe, "encode_text",
                        lambda captions: torch.zeros(len(captions), probe.text_len, 64))
    report = conditioning_sensitivity(probe, scenes=4, signals=("caption", "colour"))
    assert report["caption"]["relative_increase"] == 0.0
    assert report["colour"]["relative_increase"] == 0.0


def test_probe_refuses_bad_input(probe, tmp_path, capsys):
    from studio.tiny.probe import main

    with pytest.raises(ValueError, match="scenes"):
        conditioning_sensitivity(probe, scenes=1)
    with pytest.raises(ValueError, match="signals"):
        conditioning_sensitivity(probe, scenes=4, signals=("colour", "smell"))
    assert main(["--model", str(tmp_path)]) == 2
    assert "not an exported model folder" in capsys.readouterr().err


def test_placement_shift_reads_the_rows_the_denoiser_follows(probe):
    from studio.tiny.probe import placement_shift

    shift = placement_shift(probe, samples=2)
    # the shipped denoiser places rows by the caption (world centres: 0.25 / 0.75)
    assert 0.1 < shift["row"] <= 0.6, shift
    assert -0.6 <= shift["column"] <= 0.6, shift


def test_placement_shift_is_zero_without_the_words(probe, monkeypatch):
    from studio.tiny.probe import placement_shift

    monkeypatch.setattr(probe, "encode_text",
                        lambda captions: torch.zeros(len(captions), probe.text_len, 64))
    assert placement_shift(probe, samples=2) == {"column": 0.0, "row": 0.0}
    with pytest.raises(ValueError, match="noise_level"):
        placement_shift(probe, noise_level=0.0)
    with pytest.raises(ValueError, match="samples"):
        placement_shift(probe, samples=0)


def test_position_awareness_finds_what_the_layers_know_and_nothing_in_the_embedding(probe):
    from studio.tiny.probe import position_awareness

    aware = position_awareness(probe, samples=16)
    assert list(aware)[:2] == ["embed", "block0"] and len(aware) == 7
    # a pure-noise patch embedding holds no position: the probe reads chance (1/8) there
    assert aware["embed"]["row"] < 0.25 and aware["embed"]["column"] < 0.25, aware
    # the shipped denoiser knows its rows and columns from the frame's edges in its blocks
    # (the recipe's weights best at block 1, where their position read-out trains; the
    # weights before them by block 5)
    best_row = max(aware[k]["row"] for k in aware if k != "embed")
    best_column = max(aware[k]["column"] for k in aware if k != "embed")
    assert best_row > 0.9 and best_column > 0.3, aware
    with pytest.raises(ValueError, match="samples"):
        position_awareness(probe, samples=5)
    with pytest.raises(ValueError, match="noise_level"):
        position_awareness(probe, noise_level=1.5)
