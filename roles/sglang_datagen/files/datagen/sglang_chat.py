"""What SGLang's chat completions API does with a request and where it puts the token ids (pure functions).

Read from sglang 0.5.23, ``sglang/srt/entrypoints/openai/protocol.py`` and ``serving_chat.py``; the unit
tests compare these functions with fixtures recorded from those classes
(``tests/unit/datagen/fixtures/sglang_chat.json``).

- Token ids: a non-streaming request with ``return_prompt_token_ids`` / ``return_token_ids`` gets
  ``choices[i].prompt_token_ids`` (the prompt the server tokenized) and ``choices[i].response_token_ids``
  (the ids it sampled, untrimmed: the stop token it matched is included). A server started with
  ``--return-input-ids --return-output-ids`` puts them on every response as ``sglext.input_ids`` and
  ``sglext.output_ids[i]`` instead; that route survives sglang-router, which drops the request flags
  (its typed request has no such fields) but passes the response body through.
- Template inputs: the server renders ``[m.model_dump() for m in request.messages]``, with assistant
  tool-call ``arguments`` strings parsed into objects, ``content: None`` as ``""``, a tool message's
  text parts joined by a space, and the tools as ``Tool.model_dump()`` (``defer_loading: null`` added,
  a function's missing ``description``/``parameters`` as null, unknown keys dropped), none at all when
  ``tool_choice`` is ``"none"``, only the named one for a named ``tool_choice``. The local rendering
  that checks a row's prompt has to see exactly that, or every tool row would differ.
- The route: sglang-router 0.3.2 re-serialises every chat request from its own typed struct before a
  worker sees it (observed by running the released binary against a recording worker): a tool needs
  ``type`` and ``parameters`` (400 without), a function's keys come out as name, description, parameters,
  strict (others, and the tool's ``defer_loading``, dropped), a tool message loses ``name``, a tool call
  loses ``index``. ``canonical_request`` sends what both routes deliver unchanged, so the row generate
  writes is what the worker rendered, with or without the router.
"""

from __future__ import annotations

import json
from typing import Any, Dict, List, Optional, Tuple

# sent with every chat request: the ids come back on the choice (direct to a worker)
TOKEN_ID_FLAGS: Dict[str, bool] = {"return_prompt_token_ids": True, "return_token_ids": True}

# pydantic field order of ChatCompletionMessageGenericParam (model_dump keeps it, defaults included)
_GENERIC_MESSAGE_FIELDS = ("role", "content", "tool_call_id", "name", "phase", "reasoning_content", "tool_calls",
                           "tools", "prefix")
_FUNCTION_FIELDS = ("description", "name", "parameters", "strict", "defer_loading")


def _int_list(value: Any) -> Optional[List[int]]:
    if isinstance(value, list) and all(isinstance(t, int) and not isinstance(t, bool) for t in value):
        return value
    return None


def token_ids_from_response(data: Dict[str, Any], index: int = 0) -> Optional[Tuple[List[int], List[int]]]:
    """(prompt ids, response ids) of choice ``index``, from the choice or the response-level ``sglext``; None when
    the server sent neither (a route that dropped the request flags, or an older server)."""
    choice = data["choices"][index]
    prompt = _int_list(choice.get("prompt_token_ids"))
    output = _int_list(choice.get("response_token_ids"))
    ext = data.get("sglext")
    if isinstance(ext, dict):
        if prompt is None:
            prompt = _int_list(ext.get("input_ids"))
        outs = ext.get("output_ids")
        if output is None and isinstance(outs, list) and len(outs) > index:
            output = _int_list(outs[index])
    if not prompt or output is None:
        return None
    return prompt, output


_ROUTER_FUNCTION_FIELDS = ("name", "description", "parameters", "strict")


def _canonical_tool(tool: Dict[str, Any]) -> Dict[str, Any]:
    fn = tool.get("function") or {}
    out = {k: fn[k] for k in _ROUTER_FUNCTION_FIELDS if fn.get(k) is not None}
    out.setdefault("parameters", None)  # as SGLang reads a missing one; the router refuses it missing
    return {"type": tool.get("type") or "function", "function": {k: out[k] for k in _ROUTER_FUNCTION_FIELDS if k in out}}


def _canonical_message(message: Dict[str, Any]) -> Dict[str, Any]:
    out = dict(message)
    if out.get("role") == "tool":
        out.pop("name", None)
    if isinstance(out.get("tool_calls"), list):
        out["tool_calls"] = [{k: v for k, v in c.items() if k != "index"} if isinstance(c, dict) else c
                             for c in out["tool_calls"]]
    return out


def canonical_request(messages: List[Dict[str, Any]], tools: Optional[List[Dict[str, Any]]]
                      ) -> Tuple[List[Dict[str, Any]], Optional[List[Dict[str, Any]]]]:
    """(messages, tools) in the form that reaches a worker unchanged, straight or through sglang-router."""
    return [_canonical_message(m) for m in messages], [_canonical_tool(t) for t in tools] if tools else tools


def _function_dump(fn: Dict[str, Any], tool_defer: Any) -> Dict[str, Any]:
    """``Function.model_dump()``: the keys the client sent in its order, then the missing fields as null;
    ``strict``/``defer_loading`` only when set; unknown keys dropped."""
    values = {k: fn.get(k) for k in _FUNCTION_FIELDS}
    if values["defer_loading"] is None and tool_defer is not None:  # Tool._propagate_defer_loading
        values["defer_loading"] = tool_defer
    data = {k: v for k, v in values.items() if not (k in ("strict", "defer_loading") and v is None)}
    order = [k for k in fn if k in data]
    return {k: data[k] for k in order + [k for k in data if k not in order]}


def tool_dump(tool: Dict[str, Any]) -> Dict[str, Any]:
    """``Tool.model_dump()``: type, function, defer_loading (null unless set)."""
    defer = tool.get("defer_loading")
    return {"type": tool.get("type", "function"), "function": _function_dump(tool.get("function") or {}, defer),
            "defer_loading": defer}


def _tool_call_dump(call: Dict[str, Any], parse_arguments: bool) -> Dict[str, Any]:
    fn = call.get("function") or {}
    args = fn.get("arguments")
    if parse_arguments and isinstance(args, str):
        # normalize_assistant_tool_call_arguments (strict): SGLang answers 400 on arguments that are not an object
        try:
            args = json.loads(args)
        except ValueError:
            raise ValueError("assistant tool call function.arguments must be valid JSON") from None
        if not isinstance(args, dict):
            raise ValueError("assistant tool call function.arguments must be a JSON object")
    return {"id": call.get("id"), "index": call.get("index"), "type": "function",
            "function": {"name": fn.get("name"), "arguments": args}}


def _message_dump(message: Dict[str, Any]) -> Dict[str, Any]:
    role = str(message.get("role", "")).lower()
    if role == "user":  # ChatCompletionMessageUserParam: role and content only
        return {"role": "user", "content": message.get("content")}
    out = {k: message.get(k) for k in _GENERIC_MESSAGE_FIELDS}
    out["role"] = role
    if isinstance(out["tool_calls"], list):
        out["tool_calls"] = [_tool_call_dump(c, role == "assistant") for c in out["tool_calls"]]
    if isinstance(out["tools"], list):
        out["tools"] = [tool_dump(t) for t in out["tools"]]
    return out


def _tool_content(role: str, content: Any) -> Any:
    """normalize_tool_content: a tool message made of text parts becomes their texts joined by a space."""
    if role != "tool" or not isinstance(content, list):
        return content
    if all((isinstance(p, dict) and p.get("type") == "text") or isinstance(p, str) for p in content):
        return " ".join(p.get("text", "") if isinstance(p, dict) else p for p in content)
    return content


def template_inputs(messages: List[Dict[str, Any]], tools: Optional[List[Dict[str, Any]]],
                    tool_choice: Any = "auto") -> Tuple[List[Dict[str, Any]], Optional[List[Dict[str, Any]]]]:
    """(messages, tools) as SGLang passes them to ``apply_chat_template`` for a text-only chat request.

    Raises ValueError where SGLang answers 400 (tool-call arguments that are not a JSON object).
    """
    out = []
    for m in messages:
        d = _message_dump(m)
        if d.get("content") is None:
            d["content"] = ""
        d["content"] = _tool_content(d["role"], d["content"])
        out.append(d)
    dumped = None
    if tools and tool_choice != "none":
        if isinstance(tool_choice, dict):
            name = (tool_choice.get("function") or {}).get("name")
            dumped = [tool_dump(t) for t in tools if (t.get("function") or {}).get("name") == name] or None
        else:
            dumped = [tool_dump(t) for t in tools]
    return out, dumped
