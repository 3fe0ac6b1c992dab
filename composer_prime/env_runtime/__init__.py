"""The environment runtime: what running an environment takes, in one place.

The kinds of environment a run mixes and the one place that tells them apart (envs.py): verifiers
v1 packages, their tasks loaded by id and scored in-process (tasksets.py), and OpenEnv servers,
started from their package or reached at a URL and driven over their WebSocket route (openenv.py,
openenv_servers.py). Whatever the kind, one episode (episode.py, turns.py): open it, converse
(whatever generates the turns), score the final reply, close it; the tool-call parser
(tool_calls.py) and the turns that went wrong (error_sites.py). The orchestrator's rollouts,
`composer-prime env eval` and `env validate` all run environments through it.
"""
