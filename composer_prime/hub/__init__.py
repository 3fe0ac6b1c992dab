"""Environment tooling behind `composer-prime env init|validate|eval|build|publish|install|build-tasks|serve`:
scaffolding, model-free and model-backed checks, hub artifacts and the hub HTTP protocol.

Running an environment (loading its tasks, an episode, scoring) is not here: it is the
environment runtime (`composer_prime.env_runtime`), which the orchestrator uses too. The file
rules, content hash and HTTP routes follow what the `prime` CLI (0.18.0) does; see docs/hub.md
for the protocol as observed. The stand-in hub the tests run against is tests/support/hub_standin.py.
"""
