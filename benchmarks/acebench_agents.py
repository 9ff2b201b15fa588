"""Who plays ACEBench's agent, and ACEBench's summary: the oracle, an endpoint or a local model, all speaking ACEBench's
protocol through rollout.rollout(); and the category scores as ACEBench reports them.

    python eval.py --bench acebench_agent --agent oracle       # the answers replayed: 100 % end to end and process
    python eval.py --bench acebench_agent --agent openai --agent_model gpt-4o --user llm --user_model gpt-4o
    python eval.py --bench acebench_agent --model Qwen/Qwen3-8B --user llm --user_model gpt-4o   # a local model

`AceAgent` is a rollout Agent at the message level: each turn it rebuilds the two messages ACEBench sends (world.
agent_messages), asks a `complete` function for the text, and lets the world route it (parse_turn). Three completes:
    oracle   replays the task's ground-truth messages (task.actions), then says "finish conversation"
    openai   any OpenAI-compatible endpoint, with ACEBench's sampling (temperature 0.001, top_p 1, 1,000 tokens)
    engine   a local model through muarl's engines, with the chat template over the same two messages (ACEBench's
             local-model settings: greedy, top_p 0.9, 1,024 tokens; English multi-step prompts, as its local path;
             departure: a leading <think> block is dropped before routing)

The oracle's messages: ACEBench's answer file gives milestone paths, but not all of them reach the ground truth
(AGENT.md 9). Per task we take the first path that does when replayed through our executor, as written or repaired
(whitespace stripped, a quoted literal holding an apostrophe re-quoted with double quotes); for the 9 tasks where
no path does (multi-turn 6, multi-step 0, 1, 12-17) we wrote the messages below (REFERENCE), which do.
"""

from __future__ import annotations

import re
from concurrent.futures import ThreadPoolExecutor

import chat
from tools import as_text
from benchmarks.acebench import EXECUTE, FINISH, AceWorld, build_world as _build, routes_to_execution
from benchmarks.bench import Bench

_MEETING = "Hey Frank, don't forget about our meeting on 2024-06-11 at 4 PM in Conference Room 1."
_PIZZA = "[add_food_delivery_order(username='Eve', merchant_name=\"Domino's\", items=[{'product': 'Super Supreme " \
         "Pizza', 'quantity': 1}])]"
_SPENT = "[add_reminder(title=\"Today's spending\", description=\"Today's spending 88.0 yuan\", " \
         "time='2024-07-15 09:30')]"
_TEA = ["[login_food_platform(username='Helen', password='password321')]", "[get_products(merchant_name='Heytea')]",
        "[add_food_delivery_order(username='Helen', merchant_name='Heytea', items=[{'product': 'Four Seasons Spring "
        "Milk Tea', 'quantity': 1}])]", "[get_latest_message_id()]", "[delete_message(message_id=4)]",
        "[send_message(sender_name='Helen', receiver_name='Grace', message='Already bought.')]"]
_GIFT = ["[view_reminder_by_title(title='To-do list')]",
         "[login_food_platform(username='Eve', password='password123')]",
         "[add_food_delivery_order(username='Eve', merchant_name='Hema Fresh', items=[{'product': 'Fresh Gift Pack', "
         "'quantity': 2}])]", "[get_latest_message_id()]", "[delete_message(message_id=4)]",
         "[send_message(sender_name='Eve', receiver_name='Frank', message='The price of the purchased goods is 198.0 "
         "yuan')]"]
_GRACE = "[view_messages_between_users(sender_name='Grace', receiver_name='Helen')]"
REFERENCE = {  # task -> messages that reach its ground truth where no answer path does (written for muarl)
    "agent_multi_turn_6": ["[login_device()]",
                           "[view_messages_between_users(sender_name='Eve', receiver_name='Frank')]",
                           f"[add_reminder(title='Meeting Reminder', description=\"{_MEETING}\", "
                           "time='2024-06-11 16:00')]"],
    "agent_multi_step_0": ["[login_food_platform(username='Eve', password='password123')]", _PIZZA, _SPENT],
    "agent_multi_step_1": ["[turn_on_wifi()]", "[login_food_platform(username='Eve', password='password123')]", _PIZZA,
                           _SPENT],
    "agent_multi_step_12": ["[login_device()]", _GRACE] + _TEA,
    "agent_multi_step_13": ["[login_device()]", "[turn_on_wifi()]", _GRACE] + _TEA,
    "agent_multi_step_14": ["[login_device()]", "[turn_on_wifi()]"] + _GIFT,
    "agent_multi_step_15": ["[login_device()]"] + _GIFT,
    "agent_multi_step_16": ["[login_device()]"] + _GIFT,
    "agent_multi_step_17": _GIFT,
}


def repair(message: str) -> str:
    """A milestone as valid Python: surrounding whitespace off, 'it's'-style literals re-quoted as "it's"."""
    def requote(m):
        return f'="{m.group(1)}"' if "'" in m.group(1) and '"' not in m.group(1) else m.group(0)

    return re.sub(r"=\s*'(.*?)'(?=\s*[,)\]])", requote, message.strip())


def reaches_truth(world: AceWorld, task, path: list[str]) -> bool:
    env = world.new_env(task)
    if task.raw["category"] == "multi_turn" and not all(routes_to_execution(m) for m in path):
        return False  # in a conversation, a message that does not route is never executed
    for m in path:
        env.execute(m)
    return world.score(task, env)[0] == 1.0


def oracle_path(world: AceWorld, task) -> list[str]:
    stones = task.raw["answer"]["mile_stone"]
    paths = stones if isinstance(stones[0], list) else [stones]
    for path in [p for p in paths] + [[repair(m) for m in p] for p in paths] + [REFERENCE.get(task.raw["task"]["id"])]:
        if path and reaches_truth(world, task, path):
            return path
    raise ValueError(f"no oracle path reaches the ground truth of {task.id}")


def build_world(data_dir=None) -> AceWorld:
    """The world with each task's oracle messages as its gold actions (`execute` calls, one message each)."""
    world = _build(data_dir)
    for t in world.tasks():
        t.actions = [{"name": EXECUTE, "arguments": {"message": m}} for m in oracle_path(world, t)]
    return world


# ---------------------------------------------------------------------------------------------------------------
# The agent: ACEBench's prompt, a complete function, ACEBench's router


class AceAgent:
    """rollout's Agent protocol at the message level (no token stream, nothing to train): ACEBench's two messages in,
    the model's text out. complete(episodes, prompts) -> per episode the text, or an Exception (aborts it)."""

    def __init__(self, complete, lang: str = "zh"):
        self.complete, self.lang = complete, lang

    def begin(self, ep, rules, schemas, first):
        pass  # ACEBench rebuilds the whole prompt every turn: nothing to keep

    def act(self, ep, cfg):
        [text] = self.complete([ep], [ep.env.world.agent_messages(ep.task, ep.messages[1:], self.lang)])
        return text if isinstance(text, Exception) else ep.env.world.parse_turn(ep.env, text)

    def observe(self, ep, messages):
        pass


def oracle_complete(episodes, prompts):
    """The task's gold messages in order (one per agent turn), then ACEBench's end marker."""
    out = []
    for e in episodes:
        k = sum(m["role"] == "assistant" for m in e.messages)
        out.append(e.task.actions[k]["arguments"]["message"] if k < len(e.task.actions) else FINISH)
    return out


def openai_complete(model: str, base_url=None, api_key=None, workers: int = 8, **sampling):
    import openai  # optional: only endpoint agents need it

    client = openai.OpenAI(base_url=base_url or None, api_key=api_key or "EMPTY", timeout=120, max_retries=3)
    kw = {"temperature": 0.001, "top_p": 1, "max_tokens": 1000} | sampling  # ACEBench's agent client

    def one(messages):
        try:
            messages = [{**m, "content": as_text(m["content"])} for m in messages]  # look-alikes stay text
            return client.chat.completions.create(model=model, messages=messages, **kw).choices[0].message.content or ""
        except Exception as e:  # noqa: BLE001 - an endpoint failure aborts this episode, not the evaluation
            return e

    def complete(episodes, prompts):
        with ThreadPoolExecutor(max_workers=max(1, min(workers, len(prompts)))) as pool:
            return list(pool.map(one, prompts))

    return complete


_THINK = re.compile(r"^\s*<think>.*?</think>\s*", re.S)


def engine_complete(engine, tokenizer, max_new_tokens: int = 1024, temperature: float = 0.0, top_p: float = 0.9):
    """A local model: the chat template over ACEBench's two messages, one batched generate for every episode; a
    leading <think>...</think> block (Qwen3's thinking mode) is removed before ACEBench's router reads the text."""
    eot = chat.end_of_turn_id(tokenizer)

    def complete(episodes, prompts):
        # chat.py's rule for untrusted content: a message holding special-token strings (a customer's words, an
        # execution result) is set aside while the template renders and put back as text, never as live markers
        held = [chat._set_aside(tokenizer, p) for p in prompts]
        ids = [chat._encode_rendered(tokenizer, tokenizer.apply_chat_template(msgs, tokenize=False,
                                     add_generation_prompt=True), aside) for msgs, aside in held]
        samples = engine.generate(ids, max_new_tokens=max_new_tokens, temperature=temperature, top_p=top_p,
                                  stop_token_ids=[eot])
        texts = [tokenizer.decode([t for t in s.token_ids if t != eot], skip_special_tokens=True) for s in samples]
        return [_THINK.sub("", t, count=1) for t in texts]  # a reasoning model's think block is not its answer

    return complete


def make_agent(kind: str, engine=None, tokenizer=None, model=None, base_url=None, api_key=None, max_new_tokens=1024,
               temperature=0.0):
    """eval.py's hook (DOMAINS row `agent`): the AceAgent for --agent oracle / openai / local."""
    if kind == "oracle":
        return AceAgent(oracle_complete)
    if kind == "openai":
        return AceAgent(openai_complete(model, base_url, api_key), lang="zh")  # API models: Chinese multi-step
    return AceAgent(engine_complete(engine, tokenizer, max_new_tokens, temperature), lang="en")


# ---------------------------------------------------------------------------------------------------------------
# ACEBench's scores


def summarize(episodes) -> tuple[dict, str]:
    """Per sub-category round(correct / n, 3) end to end and round(sum / n, 3) process; the headline is the mean of
    the two end-to-end accuracies (ACEBench's "Agent" score). Aborted episodes are left out and counted."""
    scored = [e for e in episodes if not e.aborted]
    m = {"aborted": len(episodes) - len(scored)}
    for cat in ("multi_turn", "multi_step"):
        eps = [e for e in scored if e.task.raw["category"] == cat]
        n = max(1, len(eps))
        m[f"{cat}_n"] = len(eps)
        m[f"{cat}_end_to_end"] = round(sum(e.reward for e in eps) / n, 3)
        m[f"{cat}_process"] = round(sum(e.info.get("process_accuracy", 0.0) for e in eps) / n, 3)
    m["agent"] = round((m["multi_turn_end_to_end"] + m["multi_step_end_to_end"]) / 2, 3)
    text = (f"ACEBench Agent (headline = mean of the two end-to-end accuracies): {100 * m['agent']:.1f}\n"
            "| sub-category | tasks | end-to-end | process |\n|---|---|---|---|\n"
            + "".join(f"| {c} | {m[c + '_n']} | {100 * m[c + '_end_to_end']:.1f} | {100 * m[c + '_process']:.1f} |\n"
                      for c in ("multi_turn", "multi_step"))
            + f"aborted episodes (not scored): {m['aborted']}")
    return m, text


BENCH = Bench(domain="acebench_agent", summary=summarize, agent=make_agent)  # eval.py --bench acebench_agent


if __name__ == "__main__":
    # Which answer path each task's oracle replays: as written, repaired, or ours (REFERENCE).
    world = build_world()
    kinds = {}
    for t in world.tasks():
        stones = t.raw["answer"]["mile_stone"]
        paths = stones if isinstance(stones[0], list) else [stones]
        msgs = [a["arguments"]["message"] for a in t.actions]
        kinds[t.id] = "as written" if msgs in paths else "ours" if t.raw["task"]["id"] in REFERENCE else "repaired"
    for k in ("as written", "repaired", "ours"):
        print(f"{k:>10}: {sum(v == k for v in kinds.values())} tasks")
