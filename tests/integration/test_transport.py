import http.server
import json
import threading
import time

import pytest

from composer_prime.transports.batches.zmq import BatchReceiver, BatchSender
from composer_prime.transports.weights import filesystem
from tests.conftest import free_port
from tests.support.batches import make_batch


def test_zmq_round_trip_is_exact():
    address = f"tcp://127.0.0.1:{free_port()}"
    receiver = BatchReceiver(address)
    sender = BatchSender(address)
    sent = make_batch()
    sender.send(sent)
    got = receiver.recv(timeout_s=10)
    sender.close()
    receiver.close()
    assert got == sent
    assert got.channel_token_counts() == {"rl": 4}



def test_the_trainer_s_sockets_never_wait_to_deliver_at_exit():
    """LINGER 0 on every socket of the receiver's context (the batch socket, its monitor): a trainer stopped by its
    parent's death, its receiver left to garbage collection, hung in the context's term for good (CI host, test_rl_vllm's
    kill -9: closed sockets still listening, `term` waiting on them, py-spy) with the default infinite linger."""
    import zmq

    receiver = BatchReceiver(f"tcp://127.0.0.1:{free_port()}")
    assert receiver._sock.getsockopt(zmq.LINGER) == receiver._monitor.getsockopt(zmq.LINGER) == 0
    receiver.close()


def test_receiver_times_out_with_none():
    receiver = BatchReceiver(f"tcp://127.0.0.1:{free_port()}")
    assert receiver.recv(timeout_s=0.05) is None
    receiver.close()



def test_a_taken_address_is_a_clear_error():
    address = f"tcp://127.0.0.1:{free_port()}"
    first = BatchReceiver(address)
    with pytest.raises(SystemExit, match="cannot listen .*--transport.address"):
        BatchReceiver(address)
    first.close()



def test_free_ports_are_distinct_and_below_the_ephemeral_range():
    from composer_prime.utils.net import _ephemeral_low

    ports = [free_port() for _ in range(50)]
    assert len(set(ports)) == 50  # never the same port twice in one process, even before anyone binds it
    assert max(ports) < _ephemeral_low()  # outgoing connections take their source ports from that range



def _late_server(port: int, delay_s: float, seen: list) -> threading.Thread:
    """An /update_weights endpoint that starts listening only after `delay_s` (a server loading its model)."""
    class Handler(http.server.BaseHTTPRequestHandler):
        def do_POST(self):
            seen.append(json.loads(self.rfile.read(int(self.headers["Content-Length"]))))
            self.send_response(200)
            self.end_headers()

        def log_message(self, *args):
            pass

    def serve():
        time.sleep(delay_s)
        with http.server.HTTPServer(("127.0.0.1", port), Handler) as srv:
            srv.handle_request()

    t = threading.Thread(target=serve, daemon=True)
    t.start()
    return t



def test_weights_wait_for_a_server_still_starting(tmp_path):
    # A resumed trainer publishes its checkpoint's weights at once; the server comes up 1.5 s later.
    port, seen = free_port(), []
    t = _late_server(port, 1.5, seen)
    filesystem.notify_inference([f"http://127.0.0.1:{port}"], tmp_path, 7, startup_s=30)
    t.join(timeout=5)
    assert seen == [{"path": str(tmp_path.resolve()), "version": 7}]



def test_a_server_that_never_comes_up_is_a_clear_error(tmp_path):
    url = f"http://127.0.0.1:{free_port()}"
    with pytest.raises(RuntimeError, match=f"{url} did not answer for 1s: cannot hand it weights step 3"):
        filesystem.notify_inference([url], tmp_path, 3, startup_s=1)
