import contextlib
import os
from pathlib import Path

import pytest

# setuptools before anything imports the standard library's distutils: torch.compile's C++ builder imports
# setuptools, whose distutils shim then asserts it can load its own. A process of its own never met it; a test
# worker, running many tests in one process, did (the compiled-step test after others on one worker).
with contextlib.suppress(ImportError):
    import setuptools  # noqa: F401

from composer_prime.utils.net import free_port  # noqa: E402,F401 - tests import it from here

ROOT = Path(__file__).resolve().parents[1]
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# One torch thread per process unless told otherwise: the suite runs a worker per core (below), and each worker's
# in-process torch tests with torch's default (a thread per core) oversubscribed the machine: the unit tier's
# torch tests took 71 s of wall time with it, 36 s with one thread, on the loaded 2-core machine (2026-11-27).
# Processes the tests start inherit it (`rl` pins each of its processes to its own cores besides).
os.environ.setdefault("OMP_NUM_THREADS", "1")


@pytest.hookimpl(optionalhook=True)  # pytest-xdist's hook: a pytest without it (a GPU node installed from the wheelhouse) runs the suite too
def pytest_xdist_auto_num_workers(config) -> int:
    """Workers for `-n auto` (pyproject's addopts): one per core, at most 4.

    Run one at a time, the suite leaves about half of a 2-core machine idle (vmstat: 47% idle over the
    first 10 minutes of a whole run, 2026-11-27): its tests mostly wait on processes starting, servers
    answering and async pipelines handing work over. More than 4 concurrent `rl` runs would ask for more
    memory than a 24 GiB machine has (SmolLM2's runs take 6 GB each)."""
    return max(1, min(os.cpu_count() or 1, 4))


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    """A test marked `alone` runs with no other test beside it; every other test shares the machine.

    Between workers (pytest-xdist) this is a readers-writer lock on one file per run: every test holds
    it shared, an `alone` test exclusively. A turnstile lock taken first stops a stream of shared
    holders from starving an exclusive one."""
    run = getattr(item.config, "workerinput", {}).get("testrunuid")
    if run is None:  # one process: nothing runs beside the test anyway
        yield
        return
    import fcntl
    import tempfile

    base = Path(tempfile.gettempdir()) / f"composer-prime-tests-{run}"
    exclusive = item.get_closest_marker("alone") is not None
    with open(f"{base}.turnstile", "a") as turnstile, open(f"{base}.lock", "a") as lock:
        fcntl.flock(turnstile, fcntl.LOCK_EX)
        fcntl.flock(lock, fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH)
        fcntl.flock(turnstile, fcntl.LOCK_UN)
        yield


# The files whose tests take longest (seconds of test time in a fresh clone's run, 0.8 minutes or more, at c0eefef on a
# fresh host, 2026-12-07), handed to the workers first: whole files go to whichever worker is free (--dist loadfile) in
# collection order, so a long file left for last keeps one worker busy while the other idles. test_bench_gpu_check.py
# first: its stand-in GPU node (install, then the GPU check) is several minutes in one fixture. pytest_configure keeps
# pytest-xdist from reordering the files by their number of tests, which put these single-test runs last.
LONGEST_FIRST = ("test_bench_gpu_check.py", "test_rl_openenv.py", "test_rl_volunteers.py", "test_separate_machines.py",
                 "test_slurm.py", "test_bench_ab.py", "test_rl_diloco.py", "test_bench_systems.py", "test_env_serve_trl.py",
                 "test_volunteers_vllm.py", "test_rl_smollm2.py", "test_layouts.py", "test_bench_runs.py",
                 "test_readme_feature_deletion.py", "test_generate.py", "test_readme_rl.py", "test_inference_vllm.py",
                 "test_volunteers.py", "test_readme.py", "test_inference_compile.py", "test_watchdog.py",
                 "test_bench_real_model.py", "test_stalls.py", "test_bad_input.py", "test_fsdp.py", "test_diloco_replicas.py",
                 "test_openenv_faults.py", "test_rl_feature_deletion.py", "test_run_dirs.py", "test_bad_input_tools.py",
                 "test_bench_volunteers.py", "test_redteam.py")


def first_by_length(items: list) -> None:
    """Stable: the LONGEST_FIRST files in that order, then everything as collected."""
    rank = {name: i for i, name in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))


def pytest_configure(config) -> None:
    """pytest-xdist (3.7 and later) hands out a `--dist loadfile` run's files by their number of tests, most first,
    unless told not to: the collection order `first_by_length` sets would be lost, and the heaviest files, which hold
    one or two tests each, came last (a fresh clone's last 2% of tests took 7 of its 34 minutes, 2026-12-07)."""
    if hasattr(config.option, "loadscopereorder"):
        config.option.loadscopereorder = False


def pytest_collection_modifyitems(config, items) -> None:
    """The longest files first (above); tests marked `gpu` run only where CUDA is available, elsewhere
    they are skipped with that reason."""
    first_by_length(items)
    gpu = [item for item in items if item.get_closest_marker("gpu")]
    if not gpu:
        return
    import torch

    if not torch.cuda.is_available():
        for item in gpu:
            item.add_marker(pytest.mark.skip(reason="needs CUDA (a gpu test), and torch sees no CUDA device here"))


@pytest.fixture(scope="session")
def tiny_model_dir() -> Path:
    """The project's tiny default model (built once, then cached by content hash)."""
    from composer_prime.model.tiny import ensure_tiny_model

    return ensure_tiny_model()


def start_until_ready(cmd: list[str], probe, timeout_s: float = 240.0):
    """Start a server process and wait until `probe()` is true (connection errors count as not yet)."""
    import time

    import httpx

    from tests.support import forkserver

    proc = forkserver.Popen(cmd, cwd=ROOT)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and proc.poll() is None:
        try:
            if probe():
                return proc
        except httpx.HTTPError:
            pass
        time.sleep(0.3)
    proc.kill()
    raise RuntimeError(f"{' '.join(cmd[:4])} did not become ready in {timeout_s:.0f}s")


@pytest.fixture(scope="module")
def hf_inference(tiny_model_dir, tmp_path_factory):
    """Our inference server (embedded engine) on the tiny model; yields its URL."""
    import sys

    import httpx

    port = free_port()
    url = f"http://127.0.0.1:{port}"
    proc = start_until_ready([sys.executable, "-m", "composer_prime.entrypoints.inference", "--model", str(tiny_model_dir),
                              "--engine", "hf", "--port", str(port), "--output_dir", str(tmp_path_factory.mktemp("inference"))],
                             lambda: httpx.get(f"{url}/health").status_code == 200)
    yield url
    proc.terminate()
    proc.wait(timeout=30)
