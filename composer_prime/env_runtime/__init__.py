"""The environment runtime: what running a verifiers v1 environment takes, in one place.

Loading an environment's tasks by id (tasksets.py), one episode with its tool session,
conversation loop and scoring, whatever generates the turns (episode.py, turns.py), the tool-call
parser (tool_calls.py) and the turns that went wrong (error_sites.py). The orchestrator's
rollouts, `composer-prime env eval` and `env validate` all run environments through it.
"""
