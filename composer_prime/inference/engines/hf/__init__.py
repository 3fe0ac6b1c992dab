"""The embedded engine (transformers): engine.py serves it; scheduler.py is its continuous batch,
batch.py the rows' device state, cache.py the static KV cache and model calls, model/sampling.py the
per-request seeded sampler, graphs.py the decode step as CUDA graphs."""
