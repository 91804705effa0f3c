"""`python -m bench cpu` end to end on the tiny random Wan model with two peers: every row is
there, each timed run is paired with a baseline run, the work counter sees the cache's
skips, and every timed run reproduces the counted one."""

import json

from bench import cpu


def test_quick_run_on_tiny_wan(tmp_path):
    assert cpu.main(["--quick", "--cases", "tiny-wan", "--peers",
                     "fewer-steps,first-block-cache", "--out", str(tmp_path)]) == 0
    [result_file] = tmp_path.glob("*-cpu-quick.json")
    rows = json.loads(result_file.read_text())["rows"]
    base = rows[0]
    assert base["method"] == "baseline" and base["full_denoiser_calls"] == 40.0
    assert len(base["latencies_s"]) == 2  # --quick: 2 timed runs
    # every other configuration's runs are paired with baseline runs timed just before
    assert all(len(r["baseline_latencies_s"]) == len(r["latencies_s"]) == 2
               for r in rows[1:] if "latency_s" in r)
    ours = {r["profile"]: r for r in rows if r["kind"] == "ours" and "+" not in r["method"]}
    assert set(ours) == set(cpu.PROFILES)
    assert ours["fast"]["full_denoiser_calls"] < 40.0  # the counter sees the skipped blocks
    assert all(r.get("repeatable", True) for r in rows)
    assert {r.get("peer") for r in rows} >= {"fewer-steps", "first-block-cache"}
