from __future__ import annotations

import json
import subprocess
import sys
import uuid

import pytest

import handlers
from handlers import FRAMEWORK_CHOICES, BaseAgentHandler, SessionInfo, get_agent_handler
from handlers.errors import UnknownFramework


def _session(framework: str) -> SessionInfo:
    return SessionInfo(id=uuid.uuid4(), agent_framework=framework, model="echo")


def test_framework_choices() -> None:
    assert FRAMEWORK_CHOICES == [("none", "None"), ("langgraph", "LangGraph"), ("plain_openai", "Plain OpenAI SDK")]


def test_get_agent_handler_builds_the_adapter() -> None:
    from handlers.langgraph.handler import LangGraphHandler
    from handlers.plain_openai.handler import PlainOpenAIHandler
    from handlers.single_call.handler import SingleCallHandler

    langgraph = get_agent_handler(_session("langgraph"))
    assert isinstance(langgraph, LangGraphHandler) and isinstance(langgraph, BaseAgentHandler)
    assert isinstance(get_agent_handler(_session("none")), SingleCallHandler)
    assert isinstance(get_agent_handler(_session("plain_openai")), PlainOpenAIHandler)


@pytest.mark.parametrize("framework", ["crewai", "", "LangGraph "])
def test_unknown_framework_is_one_clear_line(framework: str) -> None:
    with pytest.raises(UnknownFramework) as info:
        get_agent_handler(_session(framework))
    message = info.value.message
    assert "\n" not in message
    assert "none" in message and "langgraph" in message


def test_exports() -> None:
    for name in ("AgentMessage", "StreamEvent", "BaseAgentHandler", "AgentInvocationError", "FRAMEWORK_CHOICES"):
        assert name in handlers.__all__


def test_importing_handlers_imports_no_agent_framework() -> None:
    code = (
        "import json, sys\n"
        "import handlers, handlers.base, handlers.errors, handlers.tools, handlers.messages\n"
        "import handlers.turn_input, handlers.streaming, handlers.history, handlers.prompts\n"
        "from handlers import get_agent_handler, FRAMEWORK_CHOICES\n"
        "prefixes = ('langchain', 'langgraph', 'openai', 'langchain_core', 'langchain_openai')\n"
        "print(json.dumps(sorted(m for m in sys.modules if m.split('.')[0] in prefixes)))\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60)
    assert json.loads(result.stdout) == []


def test_load_handler_class() -> None:
    from handlers import load_handler_class
    from handlers.single_call.handler import SingleCallHandler

    assert load_handler_class("none") is SingleCallHandler
    with pytest.raises(UnknownFramework):
        load_handler_class("autogen")
