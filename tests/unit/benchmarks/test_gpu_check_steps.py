"""The GPU check's pytest steps (benchmarks/gpu_check.py) do not lean on the suite's `addopts`, whose
`-n auto --dist loadfile` need pytest-xdist, which a node installed from the wheelhouse lacks (issue 46:
`gpu_tier` and `gpu_compiled` failed in a second there, `unrecognized arguments: -n --dist loadfile -n
0`): each empties them and sets its own. And a test's recorded properties (the FP8 wire's measured
error) reach the step's JSON. The real pytest run of these options, xdist blocked, is
tests/integration/test_gpu_check_pytest.py."""

from pathlib import Path

from benchmarks import gpu_check

XDIST = ("-n", "--numprocesses", "--dist", "--maxprocesses")


def pytest_steps(monkeypatch, tmp_path: Path, **kwargs) -> dict[str, list[str]]:
    monkeypatch.setattr(gpu_check, "free_port", lambda: 1)  # the other steps' ports: no socket here
    steps = gpu_check.steps(out=tmp_path, work=tmp_path, compiled=True, **kwargs)
    return {s["name"]: s["cmd"] for s in steps if s["cmd"][1:3] == ["-m", "pytest"]}


def test_pytest_steps_empty_the_suites_addopts_and_name_nothing_of_xdist(monkeypatch, tmp_path):
    for kwargs in ({"device": "cuda", "smallest": False}, {"device": "cpu", "smallest": True}):
        cmds = pytest_steps(monkeypatch, tmp_path, **kwargs)
        assert list(cmds) == ["gpu_tier", "diloco_fp8", "gpu_compiled"]
        for name, cmd in cmds.items():
            options = list(zip(cmd, cmd[1:]))
            assert ("-o", "addopts=") in options and ("-m", "gpu") in options, cmd
            assert not [a for a in cmd if a.split("=")[0] in XDIST], cmd
            assert ("--junitxml", str(tmp_path / f"{name}.xml")) in options
        assert f"--ignore={gpu_check.FP8_TEST}" in cmds["gpu_tier"] and f"--ignore={gpu_check.COMPILED_TEST}" in cmds["gpu_tier"]
        assert cmds["diloco_fp8"][-1] == gpu_check.FP8_TEST and cmds["gpu_compiled"][-1] == gpu_check.COMPILED_TEST


JUNIT = """<?xml version="1.0" encoding="utf-8"?><testsuites><testsuite name="pytest" errors="0" failures="1" skipped="1"
tests="2"><testcase classname="tests.integration.test_diloco_replicas" name="test_islands_on_cuda_sync_with_torchfts_fp8_wire[one]"
time="41.0"><properties><property name="fp8_error" value="0.0712" /></properties><failure message="no">...</failure></testcase>
<testcase classname="tests.integration.test_diloco_replicas" name="test_islands_on_cuda_sync_with_torchfts_fp8_wire[two]" time="0.0">
<skipped type="pytest.skip" message="an island per GPU needs two GPUs">...</skipped></testcase></testsuite></testsuites>"""


def test_a_tests_recorded_properties_reach_the_steps_results(tmp_path):
    (tmp_path / "diloco_fp8.xml").write_text(JUNIT)  # as pytest writes it (junit_family xunit1), a failed test's too
    assert gpu_check.read_results(tmp_path / "diloco_fp8.xml") == {
        "tests": 2, "failures": 1, "errors": 0, "skipped": 1,
        "properties": {"test_islands_on_cuda_sync_with_torchfts_fp8_wire[one]": {"fp8_error": "0.0712"}}}
