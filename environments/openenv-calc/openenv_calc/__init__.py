"""openenv-calc: an OpenEnv environment (openenv's own server classes) shaped like tool-calc.

An episode over OpenEnv's WebSocket route `/ws`: `reset(seed, split)` returns the question as chat
`messages`; the MCP tools are `calc(expr)`, which evaluates one integer expression, and
`answer(text)`, which ends the episode with its reward: 0.5 when its first tool call worked
(calc, called as its schema says), plus 0.5 when the answer is the question's value. Served by
`uvicorn openenv_calc.server.app:app`. The task logic is in calc.py (no openenv import); the
server in server/.
"""
