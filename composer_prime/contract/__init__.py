"""What crosses a process boundary: the one definition of each message, and its checks.

Every side imports these types from here, and from nowhere else. The package is the bottom of the
import order (tests/unit/test_imports.py): every package of composer_prime may import it, and it
imports none of them; nor does it import torch (tests/integration/test_contract_imports.py), so
the orchestrator (and later a volunteer) speaks it without the trainer's dependencies. One
module per message family:

- `batches`: orchestrator -> trainer, the training batch (`Batch` of `Sample`s), its msgpack
  encoding and version. It travels over ZMQ (transports/batches/zmq.py).
- `distill`, `dpo`: what a loss channel needs beyond its per-token weights, in
  `Sample.channel_data[channel]`: built by the orchestrator, checked on arrival by the trainer's
  channel (trainer/loss/<channel>.py, where the channel's math stays). A new channel whose data
  the orchestrator builds adds its module here; a plug-in channel may keep its data in its own
  module (the batch schema treats `channel_data` as opaque, so it never changes for a channel).
- `inference`: inference server -> orchestrator, what the token route answers (generations) and
  what the score route answers (a teacher's top-k log-probs).

Next, as their own modules when they are built: volunteers' signed submissions (`submissions`)
and TOPLOC proofs (`proofs`). Not here: the SHARDCAST manifest (transports/weights/shardcast/
manifest.py), whose layout is the `shardcast` package's, kept byte-compatible with it.
"""
