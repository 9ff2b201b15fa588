"""Synthetic tasks: the expert earns reward 1 (and 0 without its last write), the scripted customer reproduces
the expert's user turns and behaves sensibly with other agents, generation is deterministic, and generated
tasks stay clear of protected tasks (tau2's test split; the small world's held-out split)."""

import json
import random
import re

import pytest
from conftest import needs_tau2

from domains import load_world
from domains import synthetic as S

# ---------------------------------------------------------------------------------------------------------------
# Worlds and task sets, built once per module


@pytest.fixture(scope="module")
def retail_world():
    from domains import retail

    return retail.build_world()


@pytest.fixture(scope="module")
def small_world():
    return S.build_world(seed=0, n_train=80, n_test=30)


@pytest.fixture(scope="module")
def retail_tasks(retail_world):
    return S.generate_tasks(retail_world, 200, seed=0)


# ---------------------------------------------------------------------------------------------------------------
# Checks shared by both worlds


def check_expert_scores(world, tasks):
    """Expert replayed on a fresh env -> 1; without its last write -> 0; an info task without its answer -> 0."""
    for t in tasks:
        env = S.replay_expert(world, t)
        reward, info = world.score(t, env, t.expert, check_outputs=True)
        assert reward == 1.0, (t.id, info)
        if any(a["name"] in world.write_tools for a in t.actions):
            assert t.spec["goal"] == "act"
            reward, _ = world.score(t, S.replay_expert(world, t, skip_last_write=True), t.expert, check_outputs=True)
            assert reward == 0.0, t.id
        else:  # questions and refusals change nothing: an agent that does nothing keeps the DB right
            assert t.spec["goal"] in ("answer", "refuse")
            assert world.score(t, world.new_env(), [], check_outputs=False)[0] == 1.0
        if t.spec["goal"] == "answer":
            assert t.outputs == [t.spec["answer"]]
            silent = [m for m in t.expert if not (m["role"] == "assistant" and t.spec["answer"] in (m["content"] or ""))]
            assert world.score(t, S.replay_expert(world, t), silent, check_outputs=True)[0] == 0.0


def check_expert_shape(world, tasks):
    """Message format and the policy's order of business: identify, look up, confirm with 'yes', then write."""
    for t in tasks:
        ex = t.expert
        assert ex[0]["role"] == "user" and ex[-1] == {"role": "user", "content": S.STOP}
        assert sum(m["content"] == S.STOP for m in ex) == 1
        calls = []
        for i, m in enumerate(ex):
            if m["role"] == "assistant" and m.get("tool_calls"):
                assert len(m["tool_calls"]) == 1 and m["content"] == ""  # one call, no talking at the same time
                f = m["tool_calls"][0]["function"]
                assert ex[i + 1]["role"] == "tool" and ex[i + 1]["name"] == f["name"]
                assert not ex[i + 1]["content"].startswith("Error")
                calls.append(f)
                if f["name"] in world.write_tools:  # the last thing the user said was an explicit yes
                    said = [x for x in ex[:i] if x["role"] == "user"]
                    assert said[-1]["content"] == S.YES
                    asked = [x for x in ex[:i] if x["role"] == "assistant" and x["content"]][-1]["content"]
                    assert "(yes/no)" in asked  # ...to a confirmation that listed the action
                    assert all(str(v) in asked for k, v in f["arguments"].items() if k in ("order_id", "payment_method_id"))
        assert calls[0]["name"].startswith("find_user_id_by")  # authentication comes first
        assert [{"name": c["name"], "arguments": c["arguments"]} for c in calls] == t.actions
        assert sum(c["name"] in world.write_tools for c in calls) == (t.spec["goal"] == "act")


def check_user_reproduces_expert(tasks):
    for t in tasks:
        assert S.scripted_first_message(t.spec) == t.expert[0]["content"]
        for i, m in enumerate(t.expert):
            if m["role"] == "user" and i > 0:
                assert S.scripted_reply(t.spec, S.text_view(t.expert[:i])) == m["content"], (t.id, i)


def check_deviating_agents(tasks, seed=0):
    """Wrong confirmations get 'no', identity questions get the asked facts, every conversation ends in bound."""
    rng = random.Random(seed)
    for t in tasks:
        spec, first = t.spec, t.expert[0]["content"]
        u = spec["user"]
        ask = lambda text: S.scripted_reply(spec, [{"role": "user", "content": first}, {"role": "assistant", "content": text}])  # noqa: E731
        r = ask("Could you tell me your email address?")
        assert (u["email"] in r) if spec["knows_email"] else ("don't remember" in r and u["zip"] in r)
        r = ask("Please tell me your first name, last name and zip code.")
        assert u["first_name"] in r and u["last_name"] in r and u["zip"] in r and u["email"] not in r
        confirms = [m["content"] for m in t.expert if m["role"] == "assistant" and "(yes/no)" in (m["content"] or "")]
        if confirms:
            good = confirms[0]
            assert ask(good) == S.YES
            wrong = []
            if spec["order_id"]:
                wrong.append(good.replace(spec["order_id"], "#W0000001"))
            if spec["payment"]:
                wrong.append(good.replace(spec["payment"]["id"], "gift_card_0000001"))
            for i in spec["items"]:
                others = [w for w in spec["confirm"]["wrong"] if w not in good]
                if "new_item_id" in i and others:
                    wrong.append(good.replace(i["new_item_id"], others[0]))
            no_verb = good
            for v in spec["confirm"]["verbs"]:
                no_verb = no_verb.replace(v, "frobnicate")
            wrong.append(no_verb)
            assert all(w != good for w in wrong)
            for w in wrong:
                assert ask(w).startswith("No,"), (t.id, w)
        elif spec["goal"] == "answer":
            assert ask(f"Shall I cancel order {spec['order_id']} (yes/no)?").startswith("No,")
        # a random agent: the customer always stops within its bound
        pool = ["Hello!", "How can I help?", "What is your email?", "What is your name and zip code?",
                "Which payment method?", "What is the new address?", "Please confirm (yes/no).", "I cannot do that.",
                "Which order?", "What is the reason?", "Let me check.", "Done."]
        hist = [{"role": "user", "content": first}]
        for _ in range(S.MAX_USER_TURNS):
            hist.append({"role": "assistant", "content": rng.choice(pool)})
            hist.append({"role": "user", "content": S.scripted_reply(spec, hist)})
            if hist[-1]["content"] == S.STOP:
                break
        assert hist[-1]["content"] == S.STOP and sum(m["role"] == "user" for m in hist) <= S.MAX_USER_TURNS


def check_refusal_handling(tasks):
    for t in tasks:
        first = t.expert[0]["content"]
        h = [{"role": "user", "content": first}, {"role": "assistant", "content": "Sorry, I cannot do that."}]
        if t.spec["goal"] == "refuse":
            assert S.scripted_reply(t.spec, h) == S.STOP
        elif t.spec["goal"] == "act":  # an allowed request refused: the customer insists once, then gives up
            h.append({"role": "user", "content": S.scripted_reply(t.spec, h)})
            assert h[-1]["content"].startswith("Please check again")
            h.append({"role": "assistant", "content": "Sorry, I cannot do that."})
            assert S.scripted_reply(t.spec, h) == S.STOP


def check_all(world, tasks):
    check_expert_scores(world, tasks)
    check_expert_shape(world, tasks)
    check_user_reproduces_expert(tasks)
    check_deviating_agents(tasks)
    check_refusal_handling(tasks)


# ---------------------------------------------------------------------------------------------------------------
# The real retail world (tau2 data)


@needs_tau2
def test_retail_200_tasks(retail_world, retail_tasks):
    assert len({t.id for t in retail_tasks}) == 200
    assert {t.spec["kind"] for t in retail_tasks} == set(S.KINDS)
    assert all(t.split == "synthetic" and t.domain == "retail" for t in retail_tasks)
    check_all(retail_world, retail_tasks)


@needs_tau2
def test_retail_no_collision_with_tau2_test(retail_world, retail_tasks):
    test = retail_world.tasks("test")
    assert len(test) == 40
    keys = set().union(*(S.write_keys(retail_world, t) for t in test))
    users = set().union(*(S.task_user_ids(retail_world, t) for t in test))
    assert len(keys) > 30 and len(users) > 30  # the protected sets are not trivially empty
    for t in retail_tasks:
        assert not S.write_keys(retail_world, t) & keys, t.id
        assert not S.task_user_ids(retail_world, t) & users, t.id
    # and the check is live: with nothing to avoid, some drawn task does touch a test-task user
    free = S.generate_tasks(retail_world, 200, seed=0, avoid=[])
    assert any(S.task_user_ids(retail_world, t) & users for t in free)


@needs_tau2
def test_retail_deterministic(retail_world, retail_tasks):
    again = S.generate_tasks(retail_world, 200, seed=0)
    assert [(t.id, t.spec, t.actions, t.expert) for t in again] == [(t.id, t.spec, t.actions, t.expert) for t in retail_tasks]
    other = S.generate_tasks(retail_world, 20, seed=1)
    assert [t.actions for t in other] != [t.actions for t in retail_tasks[:20]]
    only = S.generate_tasks(retail_world, 20, seed=0, kinds=["exchange", "info"])
    assert {t.spec["kind"] for t in only} == {"exchange", "info"}


@needs_tau2
@pytest.mark.slow
def test_retail_1000_tasks(retail_world):
    tasks = S.generate_tasks(retail_world, 1000, seed=123)
    assert len({t.id for t in tasks}) == 1000
    check_all(retail_world, tasks)
    test = retail_world.tasks("test")
    keys = set().union(*(S.write_keys(retail_world, t) for t in test))
    assert not any(S.write_keys(retail_world, t) & keys for t in tasks)


# ---------------------------------------------------------------------------------------------------------------
# The small synthetic world (no tau2 data needed)


def test_small_world_tasks(small_world):
    train, test = small_world.tasks("train"), small_world.tasks("test")
    assert len(train) == 80 and len(test) == 30
    assert all(t.domain == "synthetic" for t in train + test)
    check_all(small_world, train + test)


def test_small_world_splits_disjoint(small_world):
    train, test = small_world.tasks("train"), small_world.tasks("test")
    users = lambda ts: set().union(*(S.task_user_ids(small_world, t) for t in ts))  # noqa: E731
    keys = lambda ts: set().union(*(S.write_keys(small_world, t) for t in ts))  # noqa: E731
    assert not users(train) & users(test)
    assert not keys(train) & keys(test)
    assert len({t.id for t in train + test}) == len(train) + len(test)


def test_small_world_is_small_and_deterministic(small_world):
    again = S.build_world(seed=0, n_train=80, n_test=30)
    assert [t.expert for t in again.tasks()] == [t.expert for t in small_world.tasks()]
    other = S.build_world(seed=1, n_train=5, n_test=5)
    assert other.template_path != small_world.template_path
    db = small_world.new_env().export()
    assert len(db["users"]) == 40 and len(db["products"]) == 8 and 40 <= len(db["orders"]) <= 120
    outs = [len(m["content"]) for t in small_world.tasks() for m in t.expert if m["role"] == "tool"]
    assert max(outs) < 1500 and sum(outs) / len(outs) < 800
    assert all(re.fullmatch(r"#W\d{4}", o) for o in db["orders"])
    # the tools the model is told about: 12, with short descriptions
    schemas = small_world.tool_schemas()
    assert len(schemas) == 12 and len(json.dumps(schemas)) < 6000
    assert {s["function"]["name"] for s in schemas} >= small_world.write_tools


def test_load_world_synthetic():
    w = load_world("synthetic", seed=0, n_train=10, n_test=5)
    assert len(w.tasks("train")) == 10 and len(w.tasks("test")) == 5
    assert load_world("synthetic", seed=0, n_train=10, n_test=5) is w


def test_full_tool_set_matches_core():
    # the short-docstring wrappers behave exactly like retail's tools: same expert, same outputs
    core = S.build_world(seed=3, n_train=15, n_test=5)
    full = S.build_world(seed=3, n_train=15, n_test=5, tool_set="full")
    assert len(full.tools) == 17
    assert [t.expert for t in core.tasks()] == [t.expert for t in full.tasks()]


def test_scripted_user_examples():
    # hand-written spec: a cancel with name+zip identification and a hidden reason
    spec = {
        "kind": "cancel", "goal": "act", "request": "cancel", "refuse_why": None,
        "user": {"user_id": "ava_li_01", "first_name": "Ava", "last_name": "Li", "zip": "89501", "email": "ava.li1@example.com"},
        "offers": "name_zip", "knows_email": False, "order_id": "#W1234", "order_known": True, "order_hint": None,
        "status": "pending", "items": [], "reason": "ordered by mistake", "address": None, "payment": None,
        "question": None, "answer": None, "action": {"name": "cancel_pending_order", "arguments": {}},
        "max_user_turns": 10, "confirm": {"verbs": ["cancel"], "must": [["#W1234"], ["ordered by mistake"]], "wrong": []},
    }
    first = S.scripted_first_message(spec)
    assert first == "Hi, I want to cancel my order #W1234."
    h = lambda *agent: [{"role": "user", "content": first}] + [{"role": "assistant", "content": a} for a in agent]  # noqa: E731
    assert S.scripted_reply(spec, h(S.ASK_ID)) == "I'm Ava Li, zip code 89501."
    assert S.scripted_reply(spec, h("What's your email?")).startswith("I don't remember my email.")
    assert S.scripted_reply(spec, h(S.ASK_REASON)) == "The reason is ordered by mistake."
    assert S.scripted_reply(spec, h("Cancel order #W1234 (reason: ordered by mistake)? Proceed (yes/no)?")) == "yes"
    assert S.scripted_reply(spec, h("Cancel order #W1234 (reason: no longer needed)? Proceed (yes/no)?")).startswith("No,")
    assert S.scripted_reply(spec, h("Cancel order #W9999 (reason: ordered by mistake)? Proceed (yes/no)?")).startswith("No,")
    assert S.scripted_reply(spec, h("Done. Order #W1234 is cancelled.")) == S.STOP
    assert S.scripted_reply(spec, h("Hmm.", "Hmm.", "Hmm.")) == S.STOP  # the agent goes in circles
