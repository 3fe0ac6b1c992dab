"""Environments Hub tooling: artifacts, the hub HTTP protocol, a local stand-in hub, and the
model-free / model-backed checks behind `composer-prime env init|validate|eval|build|publish|install`.

The file rules, content hash and HTTP routes follow what the `prime` CLI (0.18.0) does; see
docs/hub.md for the protocol as observed and for what the stand-in can only guess.
"""
