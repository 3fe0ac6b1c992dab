"""An agent rollout as OpenEnv's capture proxy records and exports it, made with its own code
(`openenv.core.harness.capture`): the nodes its proxy adds for each model call (`TurnNode` into a
session's `RolloutGraph`, linked by token prefix), then `export_session` and `to_training_trace`
or `to_trace_entries`, exactly as the proxy's `/sessions/{id}/trace_entries` route does.

The rollout: a tool-calc agent that calls `calc`, reads the result and answers (two agent calls,
with a tool manifest), plus a title generator's call the harness made on the side (no tools:
auxiliary, which the proxy's export leaves out). Token ids and log-probs are made up, shaped as
an engine returns them: the second call's prompt extends the first call's prompt + completion."""

from openenv.core.harness.capture import to_trace_entries, to_training_trace
from openenv.core.harness.capture.export import export_session
from openenv.core.harness.capture.graph import TurnNode
from openenv.core.harness.capture.sessions import Session

CALC = {"type": "function", "function": {"name": "calc", "description": "Evaluate one integer expression.",
                                         "parameters": {"type": "object", "properties": {"expr": {"type": "string"}},
                                                        "required": ["expr"]}}}
SYSTEM = {"role": "system", "content": "Use calc, then reply with the result."}
USER = {"role": "user", "content": "12 * 34"}
CALL = {"role": "assistant", "content": None, "reasoning_content": "The tool computes it.",
        "tool_calls": [{"id": "call_1", "type": "function", "function": {"name": "calc", "arguments": '{"expr": "12 * 34"}'}}]}
RESULT = {"role": "tool", "tool_call_id": "call_1", "content": "408"}
ANSWER = {"role": "assistant", "content": "408"}
TITLE = {"role": "assistant", "content": "Multiplying numbers"}


def _session(session_id: str) -> Session:
    session = Session(session_id=session_id)
    first = TurnNode(node_id="n1", prompt_ids=[1, 2, 3, 4], sampled_ids=[5, 6, 7], sampled_logprobs=[-0.5, -0.25, -0.125],
                     model="tiny", finish_reason="tool_calls", n_tools=1, request_messages=[SYSTEM, USER],
                     request_tools=[CALC], response_message=CALL)
    title = TurnNode(node_id="aux", prompt_ids=[90, 91], sampled_ids=[92], sampled_logprobs=[-1.0], model="tiny",
                     finish_reason="stop", request_messages=[{"role": "user", "content": "Title: 12 * 34"}],
                     response_message=TITLE)
    second = TurnNode(node_id="n2", prompt_ids=[1, 2, 3, 4, 5, 6, 7, 8, 9], sampled_ids=[10, 11], sampled_logprobs=[-0.75, -0.0625],
                      model="tiny", finish_reason="stop", n_tools=1, request_messages=[SYSTEM, USER, CALL, RESULT],
                      request_tools=[CALC], response_message=ANSWER)
    for node in (first, title, second):
        session.graph.add_turn(node)
    return session


def training_trace(session_id: str = "rollout-1") -> dict:
    """The rollout as a `TrainingTrace` v1, JSON-ready (what `to_training_trace(...).model_dump()` gives)."""
    session = _session(session_id)
    document = export_session(session, include_messages=True, capture_level="tokens")
    return to_training_trace(session.graph, document).model_dump(mode="json")


def trace_entries_answer(session_id: str = "rollout-1") -> dict:
    """What the proxy's `GET /sessions/{session_id}/trace_entries` answers for the rollout."""
    session = _session(session_id)
    document = export_session(session, include_messages=True, capture_level="tokens")
    return {"session_id": session_id, "entries": to_trace_entries(session.graph, document)}
