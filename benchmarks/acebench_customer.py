"""ACEBench's simulated user: the LLM customer (user_sim.LLMUser) told ACEBench's own prompt, not muarl's.

ACEBench's multi-turn tasks carry their customer (`task.spec["simulator"]`, written by acebench.AceWorld): its system
text, the greeting it answers, the role its own lines take ("system"), the prefixes it cuts from the agent's lines
("user:", "agent:") and its sampling (temperature 0.001, top_p 1, 1,000 tokens). AceCustomer sends exactly those
messages, verbatim, where LLMUser would send muarl's customer prompt; a multi-step task's customer says the task's
question and is never asked again (every agent message there goes to the executor).

    python eval.py --bench acebench_agent --agent openai --agent_model gpt-4o --user llm --user_model gpt-4o

plays it, and so does a training run on ACEBench's tasks: the world's row in domains.DOMAINS names it as its
`customer`, and every LLM customer (user_sim.make_user("llm", ...)) has it mixed in, a class whose methods come before
LLMUser's; a task without ACEBench's prompt is played by LLMUser's own. It is a mixin, not a subclass, because this
file cannot import user_sim: user_sim imports domains, whose table lists this benchmark.
tests/test_acebench_parity.py replays ACEBench's recorded requests to it byte for byte.

Departures from ACEBench: none in what the customer is sent; its replies come through LLMUser's client (retries, a
deadline), and a request that fails for good aborts the episode rather than the evaluation.
"""

from __future__ import annotations

from tools import as_text


def simulator_messages(sim: dict, history: list[dict]) -> list[dict]:
    """Agent-side conversation -> ACEBench's user-simulator messages: its system text, its greeting as the first
    "user" message, then each line, the customer's own in `sim["own_role"]` and the agent's as "user" with its
    prefix cut."""
    msgs = [{"role": "system", "content": sim["system"]},
            {"role": "user", "content": sim["greeting"]}]
    for m in history:
        text = m["content"]
        if m["role"] == "assistant":  # its prefixes cut
            text = next((text[len(p):] for p in sim.get("strip", []) if text.startswith(p)), text)
        msgs.append({"role": sim["own_role"] if m["role"] == "user" else "user", "content": text})
    return [{**m, "content": as_text(m["content"])} for m in msgs]  # look-alikes reach it as text


def _simulator(task) -> dict | None:
    spec = getattr(task, "spec", None)
    return spec.get("simulator") if isinstance(spec, dict) else None


class AceCustomer:
    """ACEBench's customer, mixed into user_sim.LLMUser: the task's own prompt, sampling and fixed opening; a task
    that carries no simulator (not ACEBench's) is played as LLMUser plays it (`super()`)."""

    def request(self, task, history, tools: bool = False) -> list[dict]:
        sim = _simulator(task)
        return super().request(task, history, tools) if sim is None else simulator_messages(sim, history)

    def opening(self, task, tools: bool, seed: int | None) -> str:
        sim = _simulator(task)
        if sim is None:
            return super().opening(task, tools, seed)
        if "opening" in sim:  # a multi-step task: its question, no model call
            return sim["opening"]
        return self.complete(self.request(task, [], tools), sampling=sim.get("sampling"), verbatim=True, seed=seed)

    def reply(self, task, history, phone=None, seed=None):
        sim = _simulator(task)
        if sim is None or phone is not None:
            return super().reply(task, history, phone, seed)
        return self.complete(self.request(task, history), sampling=sim.get("sampling"), verbatim=True, seed=seed)


if __name__ == "__main__":
    # The messages ACEBench's customer is sent after one agent line (no data needed): its system text, the greeting it
    # answers, its own line as "system", the agent's as "user" with the "agent:" prefix cut.
    sim = {"system": "You are a user who wants to send a message to Frank.", "greeting":
           "Is there anything you need help with today?", "own_role": "system", "strip": ["user:", "agent:"]}
    for m in simulator_messages(sim, [{"role": "user", "content": "I want to message Frank."},
                                      {"role": "assistant", "content": "agent:What should it say?"}]):
        print(f"{m['role']:>7}: {m['content']}")
