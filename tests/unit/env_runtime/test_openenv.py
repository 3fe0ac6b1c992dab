"""OpenEnv episodes without a server: the message mapping (MCP tools -> the chat template's tool
schemas, a step's observation -> the tool's reply, the reward), and a whole rollout through the
orchestrator's `rollout` against openenv-calc's real environment, played in-process by
`Loopback` (openenv's own (de)serialisation around the environment, as its /ws route does)."""

import asyncio
import json
from types import SimpleNamespace

import pytest
from openenv.core.env_server.mcp_types import CallToolAction, CallToolObservation
from openenv.core.env_server.serialization import deserialize_action, serialize_observation
from openenv_calc.calc import SYSTEM_PROMPT, evaluate
from openenv_calc.server.environment import CalcEnvironment, CalcObservation
from transformers import AutoTokenizer

from composer_prime.config.sampling import SamplingParams
from composer_prime.env_runtime.episode import EpisodeFault
from composer_prime.env_runtime.openenv import OpenEnvTask, answer_argument, opening_messages, tool_reply, tool_schemas
from composer_prime.env_runtime.openenv_servers import Schemas, Slot
from composer_prime.orchestrator.distill import DistillConfig, Distiller, DistillStats
from composer_prime.orchestrator.rollouts import rollout
from composer_prime.utils.chat import encode_chat
from tests.support.scripted import ScriptedPolicy

CALC = {"name": "calc", "description": "Evaluate one integer expression.",
        "input_schema": {"type": "object", "properties": {"expr": {"type": "string"}}, "required": ["expr"]}}
# a template that renders tools, as real models' templates do (the tiny model's ignores them)
TOOLS_TEMPLATE = ("{% if tools %}<|im_start|>tools\n{{ tools | tojson }}<|im_end|>\n{% endif %}"
                  "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
                  "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


@pytest.fixture(scope="module")
def tok(tiny_model_dir):
    return AutoTokenizer.from_pretrained(tiny_model_dir)


def test_mcp_tools_become_the_chat_templates_tool_schemas(tok):
    schemas = tool_schemas([CALC, {"name": "answer", "input_schema": {"type": "object", "properties": {"text": {}}}}])
    assert schemas[0] == {"type": "function", "function": {"name": "calc", "description": "Evaluate one integer expression.",
                                                           "parameters": CALC["input_schema"]}}
    assert schemas[1]["function"]["description"] == "" and answer_argument(schemas) == "text"
    assert answer_argument(schemas[:1]) is None
    opening = [{"role": "user", "content": "12 * 34"}]
    rendering = AutoTokenizer.from_pretrained(tok.name_or_path)
    rendering.chat_template = TOOLS_TEMPLATE
    text = rendering.decode(encode_chat(rendering, opening, tools=schemas))
    assert text.startswith("<|im_start|>tools\n" + json.dumps(schemas)[:40])
    assert encode_chat(rendering, opening, tools=[]) == encode_chat(rendering, opening)  # no tools: nothing rendered
    assert encode_chat(tok, opening, tools=schemas) == encode_chat(tok, opening)  # a template without tools ignores them


def test_a_reset_observation_opens_the_conversation():
    chat = [{"role": "system", "content": "s"}, {"role": "user", "content": "q"}]
    assert opening_messages({"messages": chat, "metadata": {}}) == chat
    assert opening_messages({"prompt": "q", "messages": []}) == [{"role": "user", "content": "q"}]
    assert opening_messages({"board": [1, 2], "metadata": {"x": 1}}) == [{"role": "user", "content": '{"board": [1, 2]}'}]


def test_a_steps_observation_is_the_tools_reply():
    text = {"observation": {"result": {"content": [{"type": "text", "text": "408"}, {"type": "image", "data": "…"}],
                                       "is_error": False}}, "done": False, "reward": 0.0}
    assert tool_reply(text) == {"content": "408", "is_error": False, "done": False}
    error = {"observation": {"result": None, "error": {"error_type": "tool_not_found", "message": "Unknown tool: 'x'"}}}
    assert tool_reply(error) == {"content": "Unknown tool: 'x'", "is_error": True, "done": False}
    own_error = {"observation": {"result": {"content": [{"type": "text", "text": "bad"}], "is_error": True}}, "done": True}
    assert tool_reply(own_error) == {"content": "bad", "is_error": True, "done": True}
    assert tool_reply({"observation": {"result": {"value": 3}}}) == {"content": '{"value": 3}', "is_error": False, "done": False}


class Message(SimpleNamespace):
    pass


class Loopback:
    """An aiohttp WebSocket's face over one openenv-calc environment, answering as openenv's /ws
    route does (its own deserialize_action and serialize_observation)."""

    def __init__(self, capacity_reached: bool = False) -> None:
        self.env, self.replies, self.closed = CalcEnvironment(), [], False
        self.refuse = capacity_reached

    async def send_str(self, text: str) -> None:
        msg = json.loads(text)
        if self.refuse:
            self.replies.append({"type": "error", "data": {"message": "Server at capacity (1/1 sessions)",
                                                            "code": "CAPACITY_REACHED"}})
        elif msg["type"] == "reset":
            self.replies.append({"type": "observation", "data": serialize_observation(self.env.reset(**msg["data"]))})
        elif msg["type"] == "step":
            obs = await self.env.step_async(deserialize_action(msg["data"], CallToolAction))
            self.replies.append({"type": "observation", "data": serialize_observation(obs)})

    async def receive(self) -> Message:
        import aiohttp

        return Message(type=aiohttp.WSMsgType.TEXT, data=json.dumps(self.replies.pop(0)))

    async def close(self) -> None:
        self.closed = True


SCHEMAS = Schemas.of({"observation": CallToolObservation.model_json_schema(),
                      "reset_observation": CalcObservation.model_json_schema()})


class LoopbackServers:
    """The servers' side an episode uses: slots (one here), schemas, release, recover."""

    def __init__(self) -> None:
        self.schemas, self.slots, self.released = SCHEMAS, [Slot(server=None)], 0

    async def slot(self) -> Slot:
        return self.slots[0]

    def release(self, slot: Slot) -> None:
        self.released += 1

    async def recover(self, server) -> bool:
        return False


class LoopbackEnv:
    """An OpenEnv environment whose WebSocket sessions are Loopbacks."""

    def __init__(self, **loopback) -> None:
        self.cfg, self.servers, self.loopback = SimpleNamespace(id="loopback", step_timeout_s=5.0), LoopbackServers(), loopback
        self.sockets: list[Loopback] = []

    async def open_ws(self, server) -> Loopback:
        self.sockets.append(Loopback(**self.loopback))
        return self.sockets[-1]


def calc_call(expr: str, name: str = "calc") -> str:
    return f'<tool_call>{json.dumps({"name": name, "arguments": {"expr": expr}})}</tool_call>'


def run(tok, env, replies):
    task = OpenEnvTask(env, 3, {"split": "eval"})
    return asyncio.run(rollout(ScriptedPolicy(tok, replies), tok, "openenv-calc", task, SamplingParams(max_tokens=128),
                               512, 4, 0, asyncio.Semaphore(1)))


def test_a_rollout_against_the_environment_reward_and_model_tokens(tok):
    env = LoopbackEnv()
    env_question = CalcEnvironment().reset(seed=3, split="eval").question  # the task's question (reset seed 3)
    value = str(evaluate(env_question))
    r = run(tok, env, [calc_call(env_question, "calculator"), calc_call(env_question), value])
    assert r.dropped is None and r.reward == 0.5  # the answer the last reply gave; the first call failed
    assert r.opening == [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": env_question}]
    assert [t.error for t in r.turns] == ["Unknown tool: 'calculator'", None, None]
    assert [s.kind for s in r.sites] == ["unknown_tool"]  # the same error sites as a verifiers environment's
    assert [t["function"]["name"] for t in r.tools] == ["calc", "answer"]
    assert r.metrics == {"turns": 3.0, "tool_calls": 2.0, "tool_errors": 1.0, "error_sites": 1.0, "sites/parse": 0.0,
                         "sites/unknown_tool": 1.0, "sites/bad_arguments": 0.0, "sites/tool_error": 0.0, "sites/format": 0.0}
    model = [len(tok.encode(x, add_special_tokens=False)) + 1 for x in (calc_call(env_question, "calculator"),
                                                                        calc_call(env_question), value)]
    assert r.model_tokens == sum(model) and len(r.completion_ids) > sum(model)  # the tool replies are there, unmasked
    conversation = r.opening + [{"role": "assistant", "content": r.turns[0].text},
                                {"role": "tool", "content": "error: Unknown tool: 'calculator'"},
                                {"role": "assistant", "content": r.turns[1].text}, {"role": "tool", "content": value},
                                {"role": "assistant", "content": value}]
    assert r.prompt_ids + r.completion_ids == encode_chat(tok, conversation, add_generation_prompt=False)[:-1]
    # the session stays open for the slot's next episode, which resets it
    assert env.servers.released == 1 and len(env.sockets) == 1 and not env.sockets[0].closed
    again = run(tok, env, [calc_call(env_question), value])
    assert again.reward == 1.0 and len(env.sockets) == 1 and env.servers.released == 2


def test_the_reward_is_the_environments_and_a_refused_session_is_a_fault(tok):
    question = CalcEnvironment().reset(seed=3, split="eval").question
    assert run(tok, LoopbackEnv(), [calc_call(question), str(evaluate(question))]).reward == 1.0
    r = run(tok, LoopbackEnv(), [calc_call(question), "7"])
    assert r.dropped is None and r.reward == 0.5  # the first call worked, the answer is wrong
    refused = LoopbackEnv(capacity_reached=True)
    r = run(tok, refused, ["never sampled"])
    assert (r.dropped, r.turns, r.prompt_ids) == ("capacity", [], []) and refused.servers.released == 1
    assert refused.sockets[0].closed and refused.servers.slots[0].ws is None  # a faulted session is closed, not kept
    with pytest.raises(EpisodeFault, match="CAPACITY_REACHED"):
        asyncio.run(OpenEnvTask(LoopbackEnv(capacity_reached=True), 0, {}).open_episode())


def test_an_error_turn_of_an_openenv_rollout_gets_a_hinted_teacher(tok):
    """Hint self-distillation on an OpenEnv environment: its error sites are found as for any other,
    and with no hint of its own the template's hint names its MCP tools."""
    question = CalcEnvironment().reset(seed=3, split="eval").question
    r = run(tok, LoopbackEnv(), [calc_call(question, "calculator"), calc_call(question), str(evaluate(question))])
    stats = DistillStats()
    [teacher] = asyncio.run(Distiller(DistillConfig(enabled=True), tok, client=None).attach(r, stats))
    assert (stats.sites, stats.hinted) == (1, 1)
    turn = r.turns[0]
    assert (teacher.student_start, teacher.length) == (len(r.prompt_ids) + turn.start, turn.end - turn.start)
    assert teacher.input_ids[teacher.start:] == (r.prompt_ids + r.completion_ids)[teacher.student_start:
                                                                                 teacher.student_start + teacher.length]
    assert "The tool is called `calc`, `answer`, not `calculator`." in tok.decode(teacher.input_ids[: teacher.start])
