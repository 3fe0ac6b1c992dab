"""Bad input, as a new user types it: every command answers with one line naming what is wrong,
exit code 2, no traceback, and writes nothing.

Each row runs the real command as a subprocess (tests/support/bad_input.py: its expected text is
part of the line, or its end where it ends in `$`). Checks made at config time run with --dry-run;
a port in use is a real socket listening; output paths point into the test's own directory,
which must not exist afterwards. (Environment rows live with the environment runtime's tests;
the tools' `composer-prime traces|env` rows in test_bad_input_tools.py.)
"""

import os
import socket
from pathlib import Path

import pytest

from tests.conftest import free_port
from tests.support import forkserver
from tests.support.bad_input import fill, listing, run_bad_input, scaffold

OUT = {"rl": "--output_dir", "inference": "--output_dir", "orchestrator": "--output_dir", "trainer": "--output_dir",
       "sft": "--output_dir", "relay": "--data_dir", "worker": "--work_dir"}
RELAY = ["--upstream", "http://127.0.0.1:1", "--public_key", "ab"]
SFT = ["--data", "{jsonl}"]
ROWS = [
    # rl: ranges, types, keys, files, directories, cores, ports
    ("rl", ["@", "configs/quickstart.toml", "--max_steps", "-5", "--dry-run"], "max_steps: Input should be greater than or equal to 1 (command line)"),
    ("rl", ["--orchestrator.batch_size", "many", "--dry-run"], "orchestrator.batch_size: Input should be a valid integer"),
    ("rl", ["--orchestrator.sampling.temperature", "0", "--dry-run"], "orchestrator.sampling.temperature: Input should be greater than 0"),
    ("rl", ["--orchestrator.sampling.top_p", "1.5", "--dry-run"], "orchestrator.sampling.top_p: Input should be less than or equal to 1"),
    ("rl", ["--trainer.optim.lr", "-1e-4", "--dry-run"], "trainer.optim.lr: Input should be greater than 0"),
    ("rl", ["--inference.port", "70000", "--dry-run"], "inference.port: Input should be less than or equal to 65535"),
    ("rl", ["--transport.address", "tcp://127.0.0.1:0", "--dry-run"], "transport.address: 'tcp://127.0.0.1:0' is not tcp://HOST:PORT"),
    ("rl", ["--orchestrator.eval.interval", "0", "--dry-run"], "orchestrator.eval.interval: Input should be greater than or equal to 1"),
    ("rl", ["--trainer.ckpt.keep_last", "0", "--dry-run"], "trainer.ckpt.keep_last: Input should be greater than or equal to 1"),
    ("rl", ["--max_stepz", "5", "--dry-run"], "max_stepz: unknown key (command line)"),
    ("rl", ["@", "configs/quickstart.toml", "--trainer.loss.weights.nosuch", "1", "--dry-run"],
     "trainer.loss.weights.nosuch: unknown loss channel 'nosuch' (known: ce, distill, dpo, rl) (command line)$"),
    ("rl", ["--model", "/nonexistent/path", "--dry-run"], "model: model directory not found: /nonexistent/path (command line)"),
    ("rl", ["--model", "{dir}", "--dry-run"], "model: {dir} is not a model directory (it has no config.json)"),
    ("rl", ["--model", "no-such-org/no-such-model", "--dry-run"],
     "model: no directory no-such-org/no-such-model here, and HF_HUB_OFFLINE is set"),
    ("rl", ["@", "{tmp}/missing.toml", "--dry-run"], "config file not found: {tmp}/missing.toml"),
    ("rl", ["@", "{dir}", "--dry-run"], "cannot read config file {dir}: Is a directory"),
    ("rl", ["--output_dir", "{file}", "--dry-run"], "output_dir: {file} is not a directory (command line)"),
    ("rl", ["--output_dir", "{file}/run", "--dry-run"], "output_dir: {file} is not a directory (on the way to {file}/run)"),
    ("rl", ["--trainer.cpus", "[4096]", "--dry-run"], "trainer.cpus: cpus [4096] are not available here"),
    ("rl", ["--inference.port", "{port}"], "inference.port: cannot listen on 127.0.0.1:{port} (Address already in use); "
                                           "is another run using it? (command line)"),
    ("rl", ["--transport.address", "tcp://127.0.0.1:{port}"],  # the trainer's copy of the top-level key
     "trainer.transport.address: cannot listen on 127.0.0.1:{port} (Address already in use); is another run using it? "
     "(command line)"),
    # each process alone
    ("inference", ["--model", "/nonexistent/path", "--dry-run"], "model: model directory not found: /nonexistent/path"),
    ("inference", ["--weights_path", "{tmp}/no-step", "--dry-run"], "weights_path: directory not found: {tmp}/no-step"),
    ("inference", ["--max_model_len", "0", "--dry-run"], "max_model_len: Input should be greater than or equal to 2"),
    ("inference", ["--port", "{port}"], "port: cannot listen on 127.0.0.1:{port} (Address already in use)"),
    ("inference", ["--device", "cpu", "--graphs", "capture", "--dry-run"],
     "graphs: capture records CUDA graphs: it needs device = cuda or auto"),
    ("orchestrator", ["--envs", "[]", "--dry-run"], "envs: List should have at least 1 item"),
    ("orchestrator", ["--batch_size", "12", "--group_size", "8", "--dry-run"], "batch_size 12 x ratio 1 = 12 rollouts, not a positive multiple of its group size 8"),
    ("orchestrator", ["--output_dir", "{file}", "--dry-run"], "output_dir: {file} is not a directory"),
    ("trainer", ["--nproc", "0", "--dry-run"], "nproc: Input should be greater than or equal to 1"),
    ("trainer", ["--model", "~/no/such/model", "--dry-run"], "model: model directory not found: ~/no/such/model"),
    ("trainer", ["--transport.address", "tcp://127.0.0.1:{port}"], "transport.address: cannot listen on 127.0.0.1:{port}"),
    ("trainer", ["--nodes.count", "2", "--nodes.master", "10.0.0.1:29500", "--dry-run"],
     "nodes.master: 10.0.0.1 is beyond loopback, and the rendezvous store there would accept anyone: set "
     "trainer.nodes.trusted_network = true once the nodes' network is private"),
    # a trainer's second node whose node 0 never starts; node 0 whose second node never comes: each stops, naming the master
    ("trainer", ["--nodes.count", "2", "--nodes.rank", "1", "--nodes.master", "127.0.0.1:{closed}", "--nodes.join_timeout_s", "2"],
     "error: trainer.nodes.master: nothing answers at 127.0.0.1:{closed} (Connection refused); start it first (waited 2s)"),
    ("trainer", ["--nodes.count", "2", "--nodes.master", "127.0.0.1:{closed}", "--nodes.join_timeout_s", "2"],
     "error: trainer.nodes: the 2 nodes did not meet at 127.0.0.1:{closed} within 2s ("),
    ("rl", ["@", "configs/diloco.toml", "--diloco.sync_every", "6", "--diloco.fragments", "4", "--dry-run"],
     "diloco.sync_every: 6 is not a multiple of fragments = 4: every fragment syncs once per 6 steps, one every "
     "sync_every / fragments steps (command line)"),
    ("rl", ["@", "configs/diloco.toml", "--diloco.fragments", "8", "--dry-run"],  # the tiny model has 4 layers
     "diloco.fragments: 8 is more than the model's 4 decoder layers (command line)"),
    ("rl", ["@", "configs/diloco.toml", "--diloco.fragments", "40", "--dry-run"],
     "diloco.fragments: 40 is more than sync_every = 8: every fragment syncs once per sync_every steps, one every "
     "sync_every / fragments steps (command line)"),
    ("rl", ["@", "configs/diloco.toml", "--diloco.wire_dtype", "quantized", "--dry-run"],
     "diloco.wire_dtype: \"quantized\" needs CUDA and Triton (torchft's FP8 kernels); without them torchft would send "
     "float32 without a word: use float32 or bfloat16 (command line)"),
    ("rl", ["@", "configs/diloco.toml", "--diloco.island", "1", "--dry-run"],
     "diloco.lighthouse: is needed with island set: the host:port of the lighthouse every island reaches (defaults)"),
    ("rl", ["@", "configs/diloco.toml", "--diloco.island", "1", "--diloco.lighthouse", "127.0.0.1:{closed}"],
     "diloco.lighthouse: nothing answers at 127.0.0.1:{closed} (Connection refused); start it first (command line)"),
    ("lighthouse", ["--port", "{port}"], "port: cannot listen on 127.0.0.1:{port} (Address already in use)"),
    ("lighthouse", ["--min_replicas", "0", "--dry-run"], "min_replicas: Input should be greater than or equal to 1"),
    ("relay", ["--dry-run"], "upstream: required; set it in a config file or with --upstream"),
    ("relay", [*RELAY, "--poll_wait_s", "0", "--dry-run"], "poll_wait_s: Input should be greater than 0"),
    ("relay", [*RELAY, "--data_dir", "{file}/relay", "--dry-run"], "data_dir: {file} is not a directory"),
    ("relay", [*RELAY, "--port", "{port}"], "port: cannot listen on 127.0.0.1:{port} (Address already in use)"),
    ("rl", ["@", "configs/quickstart.toml", "@", "configs/volunteers.toml", "--orchestrator.volunteers.dtype", "float16",
            "--dry-run"], "orchestrator.volunteers.dtype: Input should be 'float32' or 'bfloat16' (command line)"),
    ("orchestrator", ["--volunteers.enabled", "true", "--volunteers.host", "0.0.0.0", "--volunteers.tls", "false"],
     "volunteers.tls: is off but the pool listens on 0.0.0.0, beyond loopback, where nothing travels in clear (prompts, "
     "leases, tokens): leave tls unset or true (command line)"),
    ("orchestrator", ["--volunteers.enabled", "true", "--volunteers.port", "{port}"],
     "volunteers.port: cannot listen on 127.0.0.1:{port} (Address already in use)"),
    ("worker", ["--join", "http://127.0.0.1:{closed}", "--token", "t", "--dry-run"],
     "join: nothing answers at 127.0.0.1:{closed} (Connection refused); start it first (command line)"),
    ("worker", ["--join", "http://127.0.0.1:1", "--dry-run"],
     "token: give the join token as `token` or `token_file` (one of them)"),
    ("worker", ["--join", "http://127.0.0.1:1", "--token_file", "{tmp}/volunteers.token", "--dry-run"],
     "token_file: file not found: {tmp}/volunteers.token; the run's operator makes one with "
     "`composer-prime volunteers invite NAME --run OUTPUT_DIR --out FILE` (an open run writes its token to "
     "<output_dir>/orchestrator/volunteers.token) (command line)"),
    ("worker", ["--join", "http://127.0.0.1:1", "--token", "t", "--concurrency", "0", "--dry-run"],
     "concurrency: Input should be greater than or equal to 1"),
    ("sft", ["--data", "{tmp}/missing.jsonl", "--dry-run"], "data: file not found: {tmp}/missing.jsonl"),
    ("sft", ["--data", "{dir}", "--dry-run"], "data: {dir} is a directory but not a saved dataset (no dataset_info.json)"),
    ("sft", [*SFT, "--batch_size", "0", "--dry-run"], "batch_size: Input should be greater than or equal to 1"),
    ("sft", [*SFT, "--output_dir", "{file}", "--dry-run"], "output_dir: {file} is not a directory"),
    # composer-prime
    ("cli", ["model", "/nonexistent/path"], "error: model directory not found: /nonexistent/path"),
    ("cli", ["model", "{dir}"], "error: {dir} is not a model directory"),
    ("cli", ["model"], "composer-prime model: error: the following arguments are required: name"),
    ("cli", ["modle", "tiny"], "composer-prime: error: argument command: invalid choice: 'modle'"),
    ("cli", ["env", "eval", "reverse-text", "--url", "http://x", "--model", "m", "--num-tasks", "x"],
     "composer-prime env eval: error: argument -n/--num-tasks: invalid int value: 'x'"),
    ("cli", ["env", "build", "{tmp}/missing"], "error: {tmp}/missing is not a directory"),
    ("cli", ["volunteers", "invite", "../bob", "--run", "{tmp}"],
     "error: invite name '../bob': letters, digits, '.', '_' or '-', at most 64"),
    ("cli", ["volunteers", "revoke", "nobody", "--run", "{tmp}"],
     "error: no invite named 'nobody' (see `composer-prime volunteers list`)"),
    ("rl", ["@", "configs/quickstart.toml", "@", "configs/volunteers.toml", "--orchestrator.volunteers.join_token", "t",
            "--dry-run"], "orchestrator.volunteers.join_token: is an open run's one token: set volunteers.open = true too, "
                          "or leave it out and invite each volunteer (composer-prime volunteers invite NAME) (command line)"),
]


@pytest.fixture
def taken_port():
    """A port something is listening on, as another run's server would be."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        yield s.getsockname()[1]


@pytest.mark.parametrize("command, args, expected", ROWS, ids=[f"{c} {' '.join(a)}" for c, a, _ in ROWS])
def test_bad_input_is_one_line_exit_2_and_writes_nothing(command, args, expected, tmp_path, taken_port):
    subs = {**scaffold(tmp_path), "port": str(taken_port), "closed": str(free_port())}  # listened on / not
    made = listing(tmp_path)
    argv = [fill(a, subs) for a in args]
    if command in OUT and OUT[command] not in argv:  # any output lands where the test can see it
        argv += [OUT[command], str(tmp_path / "run")]
    if command in ("rl", "inference") and "--inference.port" not in argv and "--port" not in argv:
        argv += ["--inference.port" if command == "rl" else "--port", str(free_port())]
    if command in ("rl", "trainer") and "--transport.address" not in argv:
        argv += ["--transport.address", f"tcp://127.0.0.1:{free_port()}"]
    run_bad_input(f"composer_prime.entrypoints.{command}", argv, fill(expected, subs))
    assert listing(tmp_path) == made  # nothing written: no run directory, here or under the file


def as_nobody(fn) -> int:
    """Run fn() in a child process without root's power over file modes; returns its exit code."""
    pid = os.fork()
    if pid == 0:
        code = 3
        try:
            if os.geteuid() == 0:
                os.setgid(65534)
                os.setuid(65534)
            fn()
            code = 0
        except SystemExit as e:
            code = e.code if isinstance(e.code, int) else 1
        finally:
            os._exit(code)
    return os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])


def test_a_read_only_output_dir_is_refused_before_anything_is_written(tmp_path, capfd):
    from composer_prime.entrypoints.rl import main

    base = Path(os.path.realpath("/tmp")) / f"bad-input-{os.getpid()}"  # every user can reach it, unlike tmp_path
    for mode, name in ((0o777, "open"), (0o555, "read-only")):
        (base / name).mkdir(parents=True)
        (base / name).chmod(mode)
    base.chmod(0o755)
    try:
        ports = ["--inference.port", str(free_port()), "--transport.address", f"tcp://127.0.0.1:{free_port()}"]
        main(["--output_dir", str(tmp_path / "warm"), "--dry-run", *ports])  # imports what nobody could not read
        assert as_nobody(lambda: main(["--output_dir", str(base / "open" / "run"), "--dry-run", *ports])) == 0
        capfd.readouterr()
        assert as_nobody(lambda: main(["--output_dir", str(base / "read-only" / "run"), "--dry-run", *ports])) == 2
        err = capfd.readouterr().err
        assert err.strip() == f"config error: output_dir: {base / 'read-only'} is not writable (on the way to " \
                              f"{base / 'read-only' / 'run'}) (command line)"
        assert (base / "open" / "run" / "configs" / "trainer.toml").exists()  # the control did write
        assert list((base / "read-only").iterdir()) == []
    finally:
        forkserver.run(["rm", "-rf", str(base)], check=True)
