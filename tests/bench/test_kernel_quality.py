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
    # the shipped model's 9-frame clips: 5 latent frames; rows see 2, 3, 4, 4, 3 frames
    assert kq.kept_fraction(5, 8, 8) == pytest.approx(16 / 25)


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


def test_the_video_grid_is_read_from_the_models_configs():
    from studio.engine.models.registry import DEFAULT_EMBEDDED, EMBEDDED_DIR

    # the shipped model: VAE x2 in space and time, denoiser patches of 1x4x4
    assert kq.video_token_grid(EMBEDDED_DIR / DEFAULT_EMBEDDED, 9, 64, 64) == (5, 8, 8)
    assert kq.video_token_grid(EMBEDDED_DIR / DEFAULT_EMBEDDED, 17, 64, 128) == (9, 8, 16)


def test_runs_merge_into_one_report_and_refuse_other_prompts(tmp_path):
    def run(rows, step=1, file="a.json"):
        return {"command": f"run {file}", "date": "d", "machine_note": "2", "torch_threads": 2,
                "training_step": step, "file": file, "modes": {"t2v": rows}}

    ref = {"setting": "sdpa", "accuracy": {"motion": 0.9}}
    sage = {"setting": "sage", "accuracy": {"motion": 0.9}, "within_bar": True}
    sparse = {"setting": "sparse", "accuracy": {"motion": 0.3}, "within_bar": False}
    merged = kq.merge_results([run([ref, sage]), run([ref, sparse], file="b.json")])
    # rows run by their STUDIO_ATTENTION value (--settings) take their standard names
    assert [r["setting"] for r in merged["modes"]["t2v"]] == ["sdpa", "sage, 16-bit P·V", "sparse"]
    assert merged["command"] == "run a.json ; run b.json" and not merged["all_within_bar"]
    other = {"setting": "sdpa", "accuracy": {"motion": 0.5}}
    with pytest.raises(ValueError, match="SDPA references differ"):
        kq.merge_results([run([ref]), run([other], file="b.json")])
    with pytest.raises(ValueError, match="training_step"):
        kq.merge_results([run([ref]), run([ref], step=2)])
