"""benchmarks/real_model.py's results end to end at their smallest settings (tests/support/bench_runs.py): the
decode, the step's time breakdown and the learning curve; the async overlap against its bound."""

import os

import pytest

from benchmarks.support.overlap import overlap
from tests.support.bench_runs import ran_at_once, recorded, run
from tests.unit.inference.test_decode_ops import TINY as TINY_OPS


def test_real_model(tmp_path):
    out = run("real_model", tmp_path)["decode"]["cpu"]
    assert (out["model"], out["dtype"], out["prompt_len"], out["new_tokens"], out["repeats"]) == ("tiny", "float32", 8, 16, 1)
    assert set(out) >= {"machine", "date", "commit", "summary", "bound"} and list(out["summary"]) == ["1", "2"]
    for b, systems in out["summary"].items():
        assert list(systems) == ["ours", "hf-dynamic", "hf-static"]
        for s in systems.values():
            [step] = s["step_ms"]["runs"]
            assert step > 0 and s["decode_tokens_per_s"]["runs"] == [pytest.approx(1000 * int(b) / step, rel=1e-3)]
            assert 0 < s["tokens_per_s"]["median"]
    bound = out["bound"]  # the tiny model: 0.85M float32 weights; 4 layers x 2 KV heads x 32 x (K and V) x 4 bytes
    assert (bound["weights_mb"], bound["kv_bytes_per_token"], bound["graph_floor_ms"]) == (3.4, 2048, None)
    assert bound["ops_per_step"] == TINY_OPS and bound["matmul_tflops"] > 0  # the count test_decode_ops pins
    one, two = bound["1"], bound["2"]
    assert one["step_floor_ms"] == max(one["memory_ms"], one["compute_ms"], bound["launch_floor_ms"])
    assert two["compute_ms"] == pytest.approx(2 * one["compute_ms"], abs=2e-3)  # rounded to 3 places
    assert (tmp_path / "not-yet" / "results" / "real_model_decode_cpu.png").stat().st_size > 0


def test_real_model_breakdown(tmp_path):
    """The breakdown on the quickstart's config: 2 steps as shipped (max_async_level 1) and 2 at level 0, the
    second step of each read (the first is start-up)."""
    out = run("real_model:breakdown", tmp_path)["breakdown"]["cpu"]
    assert (out["config"], out["steps"], out["warmup"], out["repeats"], list(out["engines"])) == \
        ("configs/quickstart.toml", 2, 1, 1, ["hf"])
    hf = out["engines"]["hf"]
    [shipped] = hf["async"]
    for level, run_ in (("1", shipped), ("0", hf["sync"])):
        assert f"--orchestrator.max_async_level {level}" in run_["command"] and run_["breakdown"]["steps"] == 1
    assert hf["step_s"]["runs"] == [round(shipped["breakdown"]["step_s"], 3)] and recorded(hf["step_s"]["median"])
    assert hf["startup_s"]["runs"] == [round(shipped["startup_s"], 1)] and recorded(shipped["startup_s"])
    assert len(out["load_average"]) == 2 and out["cores"] == os.cpu_count()
    rss = hf["peak_rss_mb"]  # every process of the run found and measured
    assert rss == shipped["peak_rss_mb"] and list(rss) == ["inference", "orchestrator", "trainer"] and min(rss.values()) > 0
    p = hf["phases"]
    assert list(p) == ["generate_and_score_s", "build_batch_s", "send_s", "pack_s", "forward_s", "backward_s", "optim_s",
                       "other_compute_s", "checkpoint_s", "score_s", "write_and_broadcast_s", "reload_s"]
    assert recorded(*(p[k] for k in ("generate_and_score_s", "forward_s", "backward_s", "optim_s", "score_s", "reload_s")))
    sync = hf["sync"]["breakdown"]  # the phases are the synchronous run's; the weights' hand-off split in two
    assert p["write_and_broadcast_s"] + p["reload_s"] == pytest.approx(sync["trainer"]["publish_s"])
    o = hf["overlap"]
    assert o["bound"] == pytest.approx((o["t_gen_s"] + o["t_train_s"]) / max(o["t_gen_s"], o["t_train_s"]))
    assert (o["sync_step_s"], o["async_step_s"]) == (sync["step_s"], hf["step_s"]["median"])
    assert (tmp_path / "not-yet" / "results" / "real_model_breakdown_cpu.png").stat().st_size > 0


def test_real_model_learning(tmp_path):
    out = run("real_model:learning", tmp_path)["learning"]["cpu"]
    assert (out["config"], out["minutes"], out["max_steps"], out["cores"], out["parallel"]) == \
        ("configs/quickstart.toml", None, 4, os.cpu_count(), 2)
    assert [s["seed"] for s in out["seeds"]] == [0, 1]
    for seed in out["seeds"]:
        assert f"--seed {seed['seed']}" in seed["command"] and "--max_steps 4" in seed["command"]
        evals = seed["evals"]
        # the converted weights at step 0, then every 2 steps (eval.interval) up to the budget's 4
        assert evals[0]["step"] == 0 and evals[0]["version"] == 0 and seed["steps"] == 4
        assert [e["step"] for e in evals] == sorted(e["step"] for e in evals) and evals[-1]["step"] <= 4 and len(evals) >= 2
        assert seed["rise"] == round(evals[-1]["reward"] - evals[0]["reward"], 4) and min(seed["peak_rss_mb"].values()) > 0
    assert out["rises_on_every_seed"] == all(s["rise"] > 0 for s in out["seeds"])
    ran_at_once(out["seeds"])
    assert (tmp_path / "not-yet" / "results" / "real_model_learning_cpu.png").stat().st_size > 0


def test_overlap_against_its_bound():
    """The async speed-up and its bound, from a synchronous and an asynchronous breakdown."""
    def breakdown(step_s: float, gen: float, train: float) -> dict:
        return {"step_s": step_s, "orchestrator": {"generate_and_score_s": gen, "build_batch_s": 0.0, "send_s": 0.0},
                "trainer": {"pack_s": 0.0, "forward_s": train / 2, "backward_s": train / 2, "optim_s": 0.0,
                            "other_compute_s": 0.0, "checkpoint_s": 0.0, "publish_s": 0.0}}
    o = overlap(breakdown(2.4, 1.0, 1.4), breakdown(3.0, 1.0, 2.0))
    assert (o["t_gen_s"], o["t_train_s"]) == (1.0, 2.0)  # from the synchronous run
    assert o["bound"] == pytest.approx(1.5) and o["achieved"] == pytest.approx(1.25)  # 3.0 s -> 2.4 s per step
    assert o["fraction_of_bound"] == pytest.approx(1.25 / 1.5)
