"""Error-site detection: each kind on real parser output, the priority between kinds, one site
per turn, clean turns, rollouts without schemas, and an environment's own rule."""

from composer_prime.env_runtime.turns import Turn
from composer_prime.env_runtime.error_sites import ErrorSite, detect, site_counts
from composer_prime.env_runtime.tool_calls import parse_tool_call

CALC = {"type": "function", "function": {
    "name": "calc", "description": "integer arithmetic",
    "parameters": {"type": "object", "properties": {"expr": {"type": "string"}}, "required": ["expr"],
                   "additionalProperties": False}}}
LOOKUP = {"type": "function", "function": {
    "name": "lookup", "description": "search",
    "parameters": {"type": "object", "properties": {"query": {"type": "string"}, "limit": {"type": "integer"}},
                   "required": ["query"]}}}
TOOLS = [CALC, LOOKUP]


def turn(text: str, result: dict | None = None, finish: str = "stop") -> Turn:
    return Turn(text, finish, call=parse_tool_call(text), result=result)


def ok(content: str) -> dict:
    return {"content": content, "is_error": False, "done": False}


def err(content: str) -> dict:
    return {"content": content, "is_error": True, "done": False}


def call(name: str, arguments: str) -> str:
    return f'<tool_call>{{"name": "{name}", "arguments": {arguments}}}</tool_call>'


# one turn of each kind, with the error reply the session (or the parser, via converse) gave
PARSE = turn('<tool_call>{"name": calc}</tool_call>', err("the tool call is not valid JSON (...)"))
UNCLOSED = turn('Let me compute. <tool_call>{"name": "calc"', err("the tool call is not closed"))
UNKNOWN = turn(call("calculator", '{"expr": "1 + 2"}'), err("unknown tool 'calculator': the only tool is 'calc'"))
MISSPELT = turn(call("calc", '{"expression": "1 + 2"}'), err("calc takes one argument, 'expr'; got ['expression']"))
WRONG_TYPE = turn(call("lookup", '{"query": "x", "limit": "ten"}'), ok("no results"))
NOT_OBJECT = turn(call("calc", '"1 + 2"'), err('"arguments" of calc must be a JSON object'))
TOOL_ERROR = turn(call("calc", '{"expr": "1 plus 2"}'), err("cannot evaluate '1 plus 2'"))
CLEAN = turn(call("calc", '{"expr": "1 + 2"}'), ok("3"))
ANSWER = turn("3")


def test_each_default_kind_with_its_specific_detail():
    turns = [PARSE, UNCLOSED, UNKNOWN, MISSPELT, WRONG_TYPE, NOT_OBJECT, TOOL_ERROR, CLEAN, ANSWER]
    assert detect(turns, TOOLS) == [
        ErrorSite(0, "parse", "the tool call is not valid JSON (Expecting value at character 9)"),
        ErrorSite(1, "parse", "the tool call is not closed: end it with </tool_call>"),
        ErrorSite(2, "unknown_tool", "unknown tool 'calculator'; the tools are: calc, lookup", "calculator"),
        ErrorSite(3, "bad_arguments", "'expr' is a required property; "
                  "Additional properties are not allowed ('expression' was unexpected)", "calc"),
        ErrorSite(4, "bad_arguments", "limit: 'ten' is not of type 'integer'", "lookup"),
        ErrorSite(5, "bad_arguments", '"arguments" of calc must be a JSON object', "calc"),
        ErrorSite(6, "tool_error", "cannot evaluate '1 plus 2'", "calc"),
    ]
    assert site_counts(detect(turns, TOOLS)) == {"parse": 2, "unknown_tool": 1, "bad_arguments": 3, "tool_error": 1}


def test_clean_turns_and_truncated_replies_are_not_sites():
    assert detect([CLEAN, CLEAN, ANSWER], TOOLS) == []
    assert detect([CLEAN, turn("The answer is", finish="length")], TOOLS) == []
    assert site_counts([]) == {}


def test_the_specific_cause_wins_over_the_tools_error_reply():
    """The session flagged these turns too (is_error); the site names the cause, not the echo."""
    assert [s.kind for s in detect([UNKNOWN, MISSPELT, PARSE], TOOLS)] == ["unknown_tool", "bad_arguments", "parse"]
    # an unknown tool whose arguments are also no object: the name is the first thing to fix
    assert detect([turn(call("calculator", "[1]"), err("x"))], TOOLS)[0].kind == "unknown_tool"


def test_without_schemas_only_the_parser_and_the_tool_can_say_what_went_wrong():
    sites = detect([PARSE, UNKNOWN, MISSPELT, WRONG_TYPE, NOT_OBJECT, TOOL_ERROR, CLEAN], [])
    assert [(s.turn, s.kind, s.detail) for s in sites] == [
        (0, "parse", "the tool call is not valid JSON (Expecting value at character 9)"),
        (1, "tool_error", "unknown tool 'calculator': the only tool is 'calc'"),
        (2, "tool_error", "calc takes one argument, 'expr'; got ['expression']"),
        (4, "bad_arguments", '"arguments" of calc must be a JSON object'),
        (5, "tool_error", "cannot evaluate '1 plus 2'"),
    ]


def test_environment_rules_run_after_the_defaults_one_site_per_turn():
    seen = []

    def shout(k: int, t: Turn, tools: list[dict]) -> ErrorSite | None:
        seen.append(k)
        return ErrorSite(k, "format", f"turn {k} is not upper case") if t.text != t.text.upper() else None

    sites = detect([UNKNOWN, CLEAN, turn("three"), turn("3")], TOOLS, rules=[shout])
    assert sites == [detect([UNKNOWN], TOOLS)[0],
                     ErrorSite(1, "format", "turn 1 is not upper case"),
                     ErrorSite(2, "format", "turn 2 is not upper case")]
    assert seen == [1, 2, 3]  # turn 0 had its site from a default rule: the env rule was not asked
