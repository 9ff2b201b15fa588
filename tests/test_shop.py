"""The shop world (demo/worlds/shop.py): tools, tasks, the careless annotator, the scripted customer, rollouts."""

import json

import pytest

from demo.worlds import shop
from domains import load_world
from user_sim import ScriptedUser


@pytest.fixture(scope="module")
def world():
    return shop.build_world(seed=0, n_orders=300, n_test_orders=100, n_train=400, n_test=100, lazy_rate=0.6)


def _calls(task):
    return [{"name": c["function"]["name"], "arguments": c["function"]["arguments"]}
            for m in task.expert for c in m.get("tool_calls") or []]


def _score_actions(world, task, actions):
    env = world.replay(actions)
    try:
        return world.score(task, env)[0]
    finally:
        env.close()


def test_splits_use_disjoint_orders(world):
    train, test = world.tasks("train"), world.tasks("test")
    assert len(train) == 400 and len(test) == 100
    test_orders = {t.spec["order_id"] for t in test}
    assert len(test_orders) == 100  # one held-out task per held-out order
    assert not test_orders & {t.spec["order_id"] for t in train}


def test_gold_scores_one_and_missing_write_scores_zero(world):
    for t in world.tasks():
        assert _score_actions(world, t, t.actions) == 1.0, t.id
        if t.actions:  # without its write the database is wrong
            assert _score_actions(world, t, []) == 0.0, t.id


def test_held_out_experts_are_perfect(world):
    # test tasks are written with lazy_rate 0: their conversations are exactly the gold
    for t in world.tasks("test"):
        assert _score_actions(world, t, _calls(t)) == 1.0, t.id
        assert t.expert[-1]["content"] == shop.STOP


def test_lazy_annotator(world):
    # Customers who want the default choice always get it; the others get the default 60 % of the time.
    decisions = [t for t in world.tasks("train") if t.spec["kind"] != "refuse"]
    arg = lambda t: "reason" if t.spec["request"] == "cancel" else "refund_to"  # noqa: E731
    default = [t for t in decisions if t.spec[arg(t)] == shop.DEFAULT[arg(t)]]
    other = [t for t in decisions if t.spec[arg(t)] != shop.DEFAULT[arg(t)]]
    assert all(_score_actions(world, t, _calls(t)) == 1.0 for t in default)
    lazy = [t for t in other if _score_actions(world, t, _calls(t)) == 0.0]
    assert 0.45 < len(lazy) / len(other) < 0.75, (len(lazy), len(other))
    for t in lazy:  # a lazy conversation wrote the default, nothing else
        assert _calls(t)[-1]["arguments"][arg(t)] == shop.DEFAULT[arg(t)]
    careful = shop.build_world(seed=0, n_orders=300, n_test_orders=100, n_train=200, n_test=50, lazy_rate=0.0)
    assert all(_score_actions(careful, t, _calls(t)) == 1.0 for t in careful.tasks())


def test_refusal_means_no_write(world):
    refusals = [t for t in world.tasks() if t.spec["kind"] == "refuse"]
    assert refusals and all(not t.actions for t in refusals)
    for t in refusals[:20]:  # the tools do not enforce the policy: a forbidden write changes the DB and scores 0
        arg = {"reason": "no longer needed"} if t.spec["request"] == "cancel" else {"refund_to": "gift card"}
        name = "cancel_pending_order" if t.spec["request"] == "cancel" else "return_delivered_order"
        assert _score_actions(world, t, [{"name": name, "arguments": {"order_id": t.spec["order_id"], **arg}}]) == 0.0


def test_wrong_choice_scores_zero(world):
    t = next(t for t in world.tasks("test") if t.spec["kind"] == "cancel")
    other = next(r for r in shop.REASONS if r != t.spec["reason"])
    bad = [{"name": "cancel_pending_order", "arguments": {"order_id": t.spec["order_id"], "reason": other}}]
    assert _score_actions(world, t, bad) == 0.0


def test_tools_reject_bad_input(world):
    env = world.new_env()
    try:
        assert env.call("get_order_details", {"order_id": "#W000"}).startswith("Error: order #W000 not found")
        oid = next(iter(world.tasks("test"))).spec["order_id"]
        assert env.call("cancel_pending_order", {"order_id": oid, "reason": "bored"}).startswith("Error: reason must")
        assert env.call("return_delivered_order", {"order_id": oid, "refund_to": "cash"}).startswith("Error: refund_to")
        assert env.call("get_order_details", {"order_id": 5}).startswith("Error")  # wrong type: checked, not run
        out = json.loads(env.call("get_order_details", {"order_id": oid}))
        assert set(out) == {"order_id", "item", "status"}
    finally:
        env.close()


def test_scripted_customer():
    spec = {"world": "shop", "kind": "cancel", "request": "cancel", "order_id": "#W123", "status": "pending",
            "reason": "ordered by mistake", "refund_to": None, "max_user_turns": 4}
    first = shop.scripted_first_message(spec)
    assert first == "Hi, I want to cancel my order #W123."
    hist = [{"role": "user", "content": first}, {"role": "assistant", "content": shop.ASK_REASON}]
    assert shop.scripted_reply(spec, hist) == "It was ordered by mistake."
    assert shop.scripted_reply(spec, hist[:1] + [{"role": "assistant", "content": "Done: order #W123 is cancelled."}]) == shop.STOP
    assert shop.scripted_reply(spec, hist[:1] + [{"role": "assistant", "content": "Sorry, I cannot."}]) == shop.STOP
    # an agent that rambles gets the request again, and the customer gives up at its turn bound
    hist = [{"role": "user", "content": first}, {"role": "assistant", "content": "Hello there"}]
    assert shop.scripted_reply(spec, hist) == first
    long = hist + [{"role": "user", "content": first}, {"role": "assistant", "content": "Hm"}] * 2
    assert shop.scripted_reply(spec, long) == shop.STOP


def test_scripted_user_dispatches_to_the_shop(world):
    t = world.tasks("test")[0]
    assert ScriptedUser().first_message(t) == shop.scripted_first_message(t.spec)


def test_load_world_and_bad_noise():
    w = load_world("shop", seed=1, n_orders=260, n_test_orders=60, n_train=50, n_test=20)
    assert len(w.tasks("train")) == 50 and len(w.tasks("test")) == 20
    with pytest.raises(ValueError, match="lazy_rate"):
        shop.build_world(lazy_rate=1.5)


def test_deterministic():
    a = shop.build_world(seed=3, n_orders=250, n_test_orders=50, n_train=30, n_test=10)
    b = shop.build_world(seed=3, n_orders=250, n_test_orders=50, n_train=30, n_test=10)
    assert [t.expert for t in a.tasks()] == [t.expert for t in b.tasks()]


def test_expert_through_the_token_pipeline(world):
    from evaluation.agents import ExpertEngine
    from demo.tiny_model import build_tiny
    from rollout import PolicyAgent, RolloutConfig, rollout, score

    import tempfile

    tasks = world.tasks("test")[:12]
    _, tok = build_tiny(tempfile.mkdtemp(), texts=[world.rules] + [json.dumps(t.expert) for t in tasks],
                        hidden=64, layers=1, heads=1, kv_heads=1, intermediate=128, vocab_size=400)
    eps = rollout(tasks, 2, {"shop": world}, PolicyAgent(ExpertEngine(tok, tasks), tok), ScriptedUser(),
                  RolloutConfig(max_turns=10, max_new_tokens=64, max_context=1024, tools_in_prompt=False))
    score(eps, {"shop": world})
    assert [e.reward for e in eps] == [1.0] * 24, [(e.task.id, e.stop_reason) for e in eps if e.reward != 1]
    assert all(e.stop_reason == "user_stop" for e in eps)
