"""bench kernel-quality's pieces: the bar's reading, the sparse mask's kept share, the table."""

import pytest

from bench import kernel_quality as kq


def test_bar_is_no_attribute_dropping_more_than_two_points():
    assert kq.within_bar({"colour": -2.0, "shape": 3.1})
    assert not kq.within_bar({"colour": -2.4, "shape": 0.0})


def test_kept_fraction_of_the_embedded_video_grid():
    # 3 latent frames of 8x8 tokens, blocks of 64 tokens (one frame each), window of +-1
    # frame: frame 0 and frame 2 do not see each other; with the sink frame 2 sees frame 0
    assert kq.kept_fraction(3, 8, 8) == pytest.approx(8 / 9)  # frame 0 still misses 2
    assert kq.kept_fraction(3, 8, 8, "sparse,sink=0") == pytest.approx(7 / 9)
    assert kq.kept_fraction(3, 8, 8, "sparse,window=0x4x4") == pytest.approx(5 / 9)


def test_table_shows_signed_differences_and_the_verdict():
    row = {"setting": "sage", "accuracy": {"colour": 0.5}, "delta_points": {"colour": -3.0},
           "within_bar": False, "pixels": {"psnr_median_db": 40.0, "psnr_min_db": 30.0,
                                            "ssim_median": 0.99, "ssim_min": 0.95}}
    ref = {"setting": "sdpa", "accuracy": {"colour": 0.53}}
    table = kq.markdown({"command": "python -m bench kernel-quality", "machine_note": "2",
                         "training_step": 1, "date": "d", "file": "f.json",
                         "attributes": ["colour"], "modes": {"t2i": [ref, row]}})
    assert "| t2i | sdpa (reference) | 53.0% |" in table
    assert "| t2i | sage | -3.0 | 40.0 / 30.0 dB | 0.9900 / 0.9500 | **no** |" in table


def test_bad_modes_are_refused_with_the_flag(capsys):
    with pytest.raises(SystemExit):
        kq.main(["--modes", "t2i,r2v"])
    assert "--modes" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        kq.main(["--settings", "sparse,sink=x"])
    assert "--settings" in capsys.readouterr().err
