"""The store (demo/worlds/store.py): the customer's behaviours, the cautious annotator, the fidelity check; and the
customer model's data (customer.py) is exactly what LLMUser sends."""

import random

import pytest

from demo import customer
from demo.worlds import store
from user_sim import STOP, LLMUser, ScriptedUser, simulator_messages


@pytest.fixture(scope="module")
def world():
    return store.build_world(seed=0, n_orders=300, n_test_orders=100, n_train=400, n_test=100)


def _calls(task):
    return [{"name": c["function"]["name"], "arguments": c["function"]["arguments"]}
            for m in task.expert for c in m.get("tool_calls") or []]


def _score(world, task, actions):
    env = world.replay(actions)
    try:
        return world.score(task, env)[0]
    finally:
        env.close()


def test_every_behaviour_occurs_and_gold_scores_one(world):
    train = world.tasks("train")
    for key in ("omit", "change", "insist", "human"):
        assert 0.1 < sum(t.spec[key] for t in train) / len(train) < 0.6, key
    assert {t.spec["kind"] for t in train} == {"cancel", "return", "refuse"}
    for t in world.tasks():
        assert _score(world, t, t.actions) == 1.0
        if t.actions:
            assert _score(world, t, []) == 0.0


def test_a_needless_transfer_costs_the_reward(world):
    t = next(t for t in world.tasks("test") if t.spec["insist"])
    assert _score(world, t, []) == 1.0  # refusing twice is right
    assert _score(world, t, [{"name": "transfer_to_human_agents", "arguments": {"summary": "insists"}}]) == 0.0


def test_a_customer_who_asks_for_a_human_is_transferred(world):
    # the same refusal, another customer: now the hand-off is the gold action and refusing again scores 0, so no
    # rule that ignores the customer's words gets both this task and the insisting one above
    t = next(t for t in world.tasks("test") if t.spec["human"])
    assert _score(world, t, []) == 0.0
    assert _score(world, t, [{"name": "transfer_to_human_agents", "arguments": {"summary": "any words"}}]) == 1.0
    assert _score(world, t, [{"name": "transfer_to_human_agents", "arguments": {"summary": "x"}}] * 2) == 0.0


def test_held_out_tasks_hold_combinations_no_training_task_has(world):
    combo = lambda t: (t.spec["request"], t.spec["behaviour"], t.spec["omit"])  # noqa: E731
    train, test = {combo(t) for t in world.tasks("train")}, [combo(t) for t in world.tasks("test")]
    assert not train & store.HELD_OUT and sum(c in store.HELD_OUT for c in test) >= len(test) // 5
    assert all(t.spec["unseen"] == (combo(t) in store.HELD_OUT) for t in world.tasks())


def test_the_cautious_annotator_makes_each_mistake(world):
    calls = {t.id: [c["name"] for c in _calls(t)] for t in world.tasks()}
    needless = [c for c in calls.values() if c.index("think") < c.index("get_order_details")]  # before the lookup
    assert needless and any("transfer_to_human_agents" in c for c in calls.values())
    changed = [t for t in world.tasks("train") if t.spec["change"]]
    first_word = [t for t in changed if _calls(t)[-1]["arguments"].get(store.CHOICES[t.spec["request"]][0])
                  != t.spec["choice"]]
    assert 0 < len(first_word) < len(changed)
    right = sum(_score(world, t, _calls(t)) for t in world.tasks("train")) / len(world.tasks("train"))
    assert 0.4 < right < 0.8  # what the cold start imitates: often right, often not
    for t in world.tasks("test"):  # held-out conversations are written without the mistakes (one think: the rule's)
        assert calls[t.id].count("think") == 1 and _score(world, t, _calls(t)) == 1.0


def test_after_every_lookup_the_annotator_works_the_rule_out_as_a_lookup(world):
    # the status, the rule for that status, the request, and the word that followed the request in the rule; that word
    # is the policy's answer (a refusal task is exactly one whose request the status forbids)
    seen = set()
    for t in world.tasks():
        calls = _calls(t)
        at = [c["name"] for c in calls].index("get_order_details")
        rule, asked = calls[at + 1]["arguments"]["thought"].split(". The customer wants to ")
        answer = "no" if t.spec["kind"] == "refuse" else "yes"
        assert rule.startswith(f"It is {t.spec['status']}: ") and f"{t.spec['request']} {answer}" in rule, t.id
        assert asked == f"{t.spec['request']}: {answer}.", t.id
        seen.add((t.spec["request"], t.spec["status"]))
    assert len(seen) >= 5  # both requests against pending, delivered and processed orders


def test_the_scripted_customer_keeps_to_its_instructions(world):
    for t in world.tasks():
        assert store.customer_mistakes(t.spec, t.expert) == [], t.id
        assert STOP in t.expert[-1]["content"] or t.expert[-1]["role"] == "tool"
    assert customer.fidelity(ScriptedUser(), world.tasks("test")[:40])["fidelity"] == 1.0


def test_the_script_is_faithful_whatever_the_agent_says(world):
    # The fidelity check and the script read an agent's words the same way, so the deterministic customer scores
    # 100 % against any agent: the young policy's wrong questions and broken grammar, a GRPO agent's hybrid "Done:
    # ... cannot be returned" (the script reads "done" first: a run's check once called that "no_insist"), a chat
    # that hits the customer's patience (its last message ends the chat, whatever it answers).
    rng = random.Random(1)
    lines = customer._AGENT_LINES + ["Done: order {oid} is pending, so it cannot be returned.", "Sorry, done.", "",
                                     "I allow it, but the policy does not allow it, but", "refund mistake order id"]
    for _ in range(1500):
        t = rng.choice(world.tasks())
        history = [{"role": "user", "content": store.customer_turn(t.spec, [])}]
        while STOP not in history[-1]["content"]:
            words = rng.choice(lines).format(oid=rng.choice([t.spec["order_id"], "#W1"])).split()
            if rng.random() < 0.2:
                rng.shuffle(words)
            history.append({"role": "assistant", "content": " ".join(words)})
            history.append({"role": "user", "content": store.customer_turn(t.spec, history)})
        assert store.customer_mistakes(t.spec, history) == [], (t.spec, history)


def test_sampled_customers_paraphrase_and_stay_faithful(world):
    t = next(t for t in world.tasks("test") if t.spec["choice"] and t.spec["omit"])
    rng = random.Random(0)
    firsts = {store.customer_turn(t.spec, [], rng) for _ in range(40)}
    assert len(firsts) >= 3 and not any(t.spec["order_id"] in f for f in firsts)  # omitted, in several ways
    for c in customer.customer_conversations(world.tasks("test"), per_task=2, noise=0.0):
        history = [{"role": "user" if m["role"] == "assistant" else "assistant", "content": m["content"]}
                   for m in c["messages"][2:]]  # back to the agent's view (after the system prompt and greeting)
        assert store.customer_mistakes(world.task(c["task_id"]).spec, history) == []


def test_the_fidelity_check_catches_each_mistake():
    spec = {"world": "store", "kind": "cancel", "request": "cancel", "order_id": "#W123", "status": "pending",
            "choice": "ordered by mistake", "omit": True, "change": True, "insist": False, "style": 0,
            "max_user_turns": 6}
    good = [{"role": "user", "content": "Hi, I want to cancel an order."},
            {"role": "assistant", "content": store.ASK_ID}, {"role": "user", "content": "It is #W123."},
            {"role": "assistant", "content": store.shop.ASK_REASON},
            {"role": "user", "content": "It is no longer needed. Actually, no: it was ordered by mistake."}]
    assert store.customer_mistakes(spec, good) == []
    edit = lambda i, text: good[:i] + [{"role": "user", "content": text}] + good[i + 1:]  # noqa: E731
    assert store.customer_mistakes(spec, edit(0, "Cancel #W123 please.")) == ["id_too_early"]
    assert store.customer_mistakes(spec, edit(2, "It is #W124.")) == ["wrong_id", "no_id_given"]
    assert store.customer_mistakes(spec, edit(4, "It was ordered by mistake.")) == ["no_change"]
    assert store.customer_mistakes(spec, edit(4, "By mistake. No: no longer needed.")) == ["wrong_choice"]
    assert store.customer_mistakes(spec, edit(0, "I want to return an order.")) == ["no_request", "wrong_request"]
    refuse = dict(spec, kind="refuse", choice=None, change=False, insist=True, status="delivered")
    conv = [{"role": "user", "content": "Hi, I want to cancel an order."}, {"role": "assistant", "content": "Sorry, "
            "order #W123 is delivered, so it cannot be cancelled."}, {"role": "user", "content": "Okay. " + STOP}]
    assert store.customer_mistakes(refuse, conv) == ["no_insist"]
    assert store.customer_mistakes(dict(refuse, insist=False), conv) == []
    conv[2]["content"] = "Please, cancel it anyway!"
    assert store.customer_mistakes(dict(refuse, insist=False), conv) == ["extra_insist"]
    assert store.customer_mistakes(refuse, conv) == []


def test_the_fidelity_check_faults_an_uncooperative_customer():
    # A customer can break the task without naming a wrong id or option: each of these would keep "fidelity" 100 %
    # under a check of ids and options alone, and each must be a mistake (the reward then says nothing about the agent).
    spec = {"world": "store", "kind": "return", "request": "return", "order_id": "#W123", "status": "delivered",
            "choice": "gift card", "omit": True, "change": False, "insist": False, "human": False, "style": 0,
            "max_user_turns": 6}
    a = lambda text: {"role": "assistant", "content": text}  # noqa: E731
    u = lambda text: {"role": "user", "content": text}  # noqa: E731
    good = [u("Hi, I want to return an order."), a(store.ASK_ID), u("It is #W123."), a(store.shop.ASK_REFUND),
            u("To my gift card, please."), a("Done: order #W123 is returned."), u("Thanks. " + STOP)]
    assert store.customer_mistakes(spec, good) == []
    edit = lambda i, text: good[:i] + [u(text)] + good[i + 1:]  # noqa: E731
    assert store.customer_mistakes(spec, edit(2, "I don't know " + STOP)) == ["no_id_given"]
    assert store.customer_mistakes(spec, edit(4, "Please return my order #W123.")) == ["no_choice"]
    assert "gibberish" in store.customer_mistakes(spec, edit(4, "lamp the kettle of of"))
    assert "gibberish" in store.customer_mistakes(spec, edit(4, ""))
    assert store.customer_mistakes(spec, edit(4, "Get me a human agent, now.")) == ["extra_human", "no_choice"]
    assert store.customer_mistakes(spec, edit(0, STOP)) == ["no_request", "quit_early"]
    assert set(store.customer_mistakes(spec, edit(0, "Hello there."))) == {"gibberish", "no_request"}
    refuse = dict(spec, kind="refuse", choice=None, status="pending", human=True, omit=False)
    conv = [u("Hi, I want to return an order, it is #W123."), a("Sorry, order #W123 is pending, so it cannot be "
            "returned."), u("Can I speak to a human agent?")]
    assert store.customer_mistakes(refuse, conv) == []
    assert store.customer_mistakes(refuse, conv[:2] + [u("Okay. " + STOP)]) == ["no_human"]
    assert store.customer_mistakes(refuse, conv[:2] + [u("Please, return it anyway!")]) == ["no_human"]
    assert store.customer_mistakes(dict(refuse, human=False), conv) == ["extra_human", "extra_insist"]


def test_customer_data_are_the_requests_llmuser_sends(world):
    # The customer model is trained on what LLMUser sends a hosted model: the same function builds both. Replay one
    # training conversation through LLMUser with a client that records each request and answers with the data.
    conv = customer.customer_conversations(world.tasks("train")[:1], per_task=1, seed=3)[0]
    task = world.task(conv["task_id"])
    answers = [m["content"] for m in conv["messages"] if m["role"] == "assistant"]
    sent = []

    class Client:  # client.chat.completions.create(**kwargs), recording
        class chat:
            class completions:
                @staticmethod
                def create(messages, **kw):
                    sent.append(messages)
                    from types import SimpleNamespace as NS
                    return NS(choices=[NS(message=NS(content=answers[len(sent) - 1]))])

    user = LLMUser("customer", base_url="http://127.0.0.1:1/v1", api_key="x", client=Client)
    history = [{"role": "user", "content": user.first_message(task)}]
    for m in conv["messages"][3:]:
        if m["role"] == "user":  # an agent line (roles swapped): the customer answers it
            history.append({"role": "assistant", "content": m["content"]})
            history.append({"role": "user", "content": user.reply(task, history)})
    assert sent[-1] + [{"role": "assistant", "content": answers[-1]}] == conv["messages"]  # byte for byte
    assert sent[0] == simulator_messages(task.instructions, [])


def test_customer_model_trains_on_the_servers_rendering(world, tmp_path):
    # vLLM's server renders each request with the chat template (add_generation_prompt); the customer model must be
    # trained on exactly that: every request is a token prefix of the rendered conversation, and the trained tokens
    # are the customer's turns with their end-of-turn token, nothing else.
    from demo.tiny_model import build_tiny

    convs = customer.customer_conversations(world.tasks("train")[:6], per_task=1, seed=1)
    _, tok = build_tiny(tmp_path, texts=[m["content"] for c in convs for m in c["messages"]], vocab_size=300,
                        hidden=64, layers=1, heads=1, kv_heads=1, intermediate=128)
    for c in convs:
        ids, mask = customer.render_customer(tok, c["messages"])
        turns = [i for i, m in enumerate(c["messages"]) if m["role"] == "assistant"]
        for i in turns:
            req = tok.apply_chat_template(c["messages"][:i], add_generation_prompt=True, tokenize=False)
            req_ids = tok.encode(req, add_special_tokens=False)
            assert ids[: len(req_ids)] == req_ids and mask[len(req_ids) - 1] == 0
        trained = tok.decode([t for t, m in zip(ids, mask) if m])
        assert trained == "".join(c["messages"][i]["content"] + "<|im_end|>" for i in turns)


def test_the_second_phrasing_keeps_the_key_words_and_is_faithful_whatever_the_agent_says(world):
    # phrasing "b" (the held-out customer's banks): other frames, the same key words, so the check and the agent's
    # reading carry over; against random agent lines it stays faithful, and none of its lines is one of "a"'s
    a, b = store.PHRASINGS["a"], store.PHRASINGS["b"]
    assert a.keys() == b.keys() and a["say"].keys() == b["say"].keys()
    rng, seen = random.Random(2), set()
    for _ in range(600):
        t = rng.choice(world.tasks())
        spec = dict(t.spec, phrasing="b")
        history = [{"role": "user", "content": store.customer_turn(spec, [], rng)}]
        while STOP not in history[-1]["content"]:
            line = rng.choice(customer._AGENT_LINES + ["Sorry, I cannot.", "Done."]).format(oid=spec["order_id"])
            history.append({"role": "assistant", "content": line})
            history.append({"role": "user", "content": store.customer_turn(spec, history, rng)})
        assert store.customer_mistakes(spec, history) == [], (spec, history)
        seen |= {m["content"] for m in history if m["role"] == "user"}
    said_a = {store.customer_turn(dict(t.spec, style=k), []) for t in world.tasks()[:50] for k in range(4)}
    assert len(seen) > 100 and not seen & said_a
    # the rule that reads everything plays the second customer (scripted) perfectly: nothing in it is unreadable
    from demo.baselines import play_rules

    class Second(ScriptedUser):
        def first_message(self, task, tools=False):
            return store.customer_turn(dict(task.spec, phrasing="b"), [])

        def reply(self, task, history, phone=None, seed=None):
            return store.customer_turn(dict(task.spec, phrasing="b"), history)

    assert play_rules(world, Second())["reads everything"]["pass^1"] == 1.0


def test_the_data_imitated_weights_its_rates_by_the_held_out_behaviours(world):
    # demo.baselines' "cold-start data" row, column "all": what a cold start imitating its data exactly would score
    # on the held-out tasks (57.8-66.6 % on eleven worlds measured; the demo's --stage_band ends at 65)
    from demo.baselines import annotator_right, imitated

    test = [t.spec["behaviour"] for t in world.tasks("test")]
    assert imitated(world, dict.fromkeys(("plain", "change", "accept", "insist", "human"), 1.0)) == 1.0
    assert imitated(world, {"insist": 1.0}) == test.count("insist") / len(test) > 0
    data = annotator_right(world)
    assert data["accept"] == 1.0 and data["insist"] < 0.5  # the annotator's slips: never on accept, mostly on insist
    assert imitated(world, data) == sum(data[b] for b in test) / len(test)


def test_a_runs_world_asks_more_of_the_reading():
    # in a run's world (domains.DOMAINS["store"]) 8 in 10 allowed requests want the option other than the
    # shop's default (build_world's default: either as likely), customers no default-writing rule serves; the data
    # imitated falls with them (seed 0: 62.6 -> 53.4 %), and the refusals' mix is untouched
    from demo.baselines import annotator_right, imitated
    from demo.train import parse
    from demo.worlds import shop
    from domains import load_worlds

    cfg = parse([])  # the demo's run (python -m demo): its preset's world, seed 0
    assert (cfg.domains, cfg.synthetic_seed) == ("store", 0)
    run = load_worlds(cfg)["store"]
    plain = store.build_world(seed=0, n_orders=600, n_test_orders=200, n_train=1000, n_test=200, lazy_rate=0.55)
    share = {}
    for name, w in (("run", run), ("plain", plain)):
        allowed = [t.spec for t in w.tasks() if t.spec["choice"]]
        refused = [t.spec for t in w.tasks() if not t.spec["choice"]]
        share[name] = (sum(s["choice"] != shop.DEFAULT[store.CHOICES[s["request"]][0]] for s in allowed) / len(allowed),
                       sum(s["behaviour"] == "accept" for s in refused) / len(refused))
    assert abs(share["run"][0] - 0.8) < 0.04 and abs(share["plain"][0] - 0.5) < 0.05, share
    assert abs(share["run"][1] - share["plain"][1]) < 0.04, share
    assert imitated(run, annotator_right(run)) < imitated(plain, annotator_right(plain)) - 0.04
    with pytest.raises(ValueError, match="other_share"):
        store.build_world(seed=0, n_train=5, n_test=5, other_share=1.5)


def test_the_customer_models_worlds_are_the_ones_its_record_was_measured_on():
    # build_world's defaults draw the worlds the shipped customer was trained on (demo.customer.DATA_WORLDS) and
    # gated on (GATE_WORLD, fidelity.json) exactly as when it was built: a change to them needs the model rebuilt or
    # its gate re-measured (python -m demo.customer measure), and this digest renewed
    import hashlib
    import json

    from domains import load_world

    h = hashlib.sha256()
    for w in (customer.GATE_WORLD, *customer.DATA_WORLDS):
        kw = customer.GATE_KW if w == customer.GATE_WORLD else customer.DATA_KW  # (as build() and measure() draw)
        for t in load_world("store", seed=w, **kw).tasks():
            h.update(json.dumps([t.id, t.instructions, t.spec, t.expert, t.actions], sort_keys=True).encode())
    assert h.hexdigest() == "5ddc34988208b97c21164afb081c1847a0ddac6baa93d93b14e9dbd37a16f02c"


def test_lookup_cases_are_the_decisions_the_status_alone_does_not_settle(world):
    # the probe of the cold start (demo/drills.until_lookup), four steps of the same n conversations, only where the
    # status allows one request and not the other: the thought's status, its answer, its request, the act after it
    probes = store.lookup_cases(world.tasks("train"), n=60)
    assert list(probes) == ["status", "answer", "request", "act"] and all(len(c) == 60 for c in probes.values())
    seen, acts, rule_of = set(), set(), {}
    for t in world.tasks("train"):  # the annotator's thought's first sentence for each status
        thought = [c["arguments"]["thought"] for c in _calls(t) if c["name"] == "think" and
                   store.THOUGHT.fullmatch(c["arguments"]["thought"])][0]
        rule_of[t.spec["status"]] = thought.split(". The")[0]
    for (b0, good0, status_wrong), (before, good, bad), (b2, good2, request_wrong), (b3, act, *act_wrong) in \
            zip(*probes.values()):
        assert before == b2 == b0 and good == good2 == good0 and before[-1]["role"] == "tool" and \
            before[-1]["name"] == "get_order_details"
        thought, wrong, swapped, misread = (m["tool_calls"][0]["function"]["arguments"]["thought"]
                                            for m in (good, bad, request_wrong, status_wrong))
        hit = store.THOUGHT.fullmatch(thought)
        status, request = hit[0].split(":")[0][6:], hit[3]
        other = {"cancel": "return", "return": "cancel"}[request]
        assert status in ("pending", "delivered")
        answer = (request, status) in store.ALLOWED
        assert thought.endswith(f": {'yes' if answer else 'no'}.")
        assert wrong[:-4].rstrip(" :ye") == thought[:-4].rstrip(" :ye") and wrong != thought  # the last word alone
        # the other request, answered for it: where the request is forbidden, the status's flow and "yes"
        assert swapped == thought[: thought.index("wants to ")] + f"wants to {other}: {'no' if answer else 'yes'}."
        # the other status (pending <-> delivered) copied in, with its own flow: the request answered the other way
        flipped = {"pending": "delivered", "delivered": "pending"}[status]
        assert misread == f"It is {flipped}: cancel {'yes' if flipped == 'pending' else 'no'}, return " \
            f"{'yes' if flipped == 'delivered' else 'no'}. The customer wants to {request}: {'no' if answer else 'yes'}."
        assert misread.split(". The")[0] == rule_of[flipped]  # the annotator's own line for that status
        # the act: after the thought's reply, what its answer asks for against each other act (the refusal and the
        # two questions): first the status's own question (seed 4 asked it after a "no"), then the third act (after a
        # "no", the request's own question: seed 13 asked that)
        assert b3 == before + [good, b3[-1]] and b3[-1]["role"] == "tool" and b3[-1]["name"] == "think"
        asks = {"cancel": store.shop.ASK_REASON, "return": store.shop.ASK_REFUND}
        flow = asks["cancel"] if status == "pending" else asks["return"]  # the status's own question
        refusal = f"Sorry, order {before[-1]['content'].split(chr(34))[3]} is {status}, so it cannot be " \
            f"{'cancelled' if request == 'cancel' else 'returned'}."
        assert act["content"] == (asks[request] if answer else refusal)
        assert [m["content"] for m in act_wrong] == ([asks[other], refusal] if answer else [flow, asks[request]])
        assert len({m["content"] for m in [act, *act_wrong]}) == 3  # the three acts, each once
        assert all(m["role"] == "assistant" and not m.get("tool_calls") for m in (act, *act_wrong))
        seen.add((request, status))
        acts.add((answer, refusal.split()[-1]))
    assert seen == {(r, s) for r in ("cancel", "return") for s in ("pending", "delivered")}
    assert acts == {(a, w) for a in (True, False) for w in ("cancelled.", "returned.")}
    assert store.lookup_cases(world.tasks("train"), n=5) == {k: v[:5] for k, v in probes.items()}


def test_option_cases_swap_the_customers_answer_and_nothing_else(world):
    # the second probe of the cold start (demo/drills.reads_option): a plain answer to the option question, once naming
    # the shop's default and once the other option, and the write call with each option
    cases = store.option_cases(world.tasks("train"), n=20)
    assert list(cases) == ["cancel", "return"] and all(len(c) == 20 for c in cases.values())
    for request, part in cases.items():
        arg, options = store.CHOICES[request]
        default, other = store.shop.DEFAULT[arg], next(o for o in options if o != store.shop.DEFAULT[arg])
        for said_default, said_other, write_default, write_other in part:
            assert said_default[:-1] == said_other[:-1] and said_default[-2]["content"] == \
                (store.shop.ASK_REASON if request == "cancel" else store.shop.ASK_REFUND)  # asked, then answered
            a, b = said_default[-1]["content"], said_other[-1]["content"]
            assert default in a and other not in a and other in b and default not in b
            assert a.replace(default, other) == b  # the answer's words but the option: the same phrasing
            calls = [w["tool_calls"][0]["function"] for w in (write_default, write_other)]
            assert calls[0]["name"] == calls[1]["name"] == \
                ("cancel_pending_order" if request == "cancel" else "return_delivered_order")
            assert [c["arguments"][arg] for c in calls] == [default, other]
            assert set(calls[0]["arguments"]) == {"order_id", arg} and \
                calls[0]["arguments"]["order_id"] == calls[1]["arguments"]["order_id"]
    plain = [t for t in world.tasks("train") if t.spec["choice"] and not t.spec["change"]]
    assert len(plain) > 40  # plain answers only (a change of mind names both options)
    assert store.option_cases(world.tasks("train"), n=5) == {k: v[:5] for k, v in cases.items()}


def test_hold_cases_end_on_the_customers_reply_to_the_refusal(world):
    # the third probe of the cold start (demo/drills.holds_refusal): the expert conversation up to the customer's reply
    # to the first refusal (insisting, or asking for a human), then the refusal repeated and the transfer; the
    # transfer's arguments are the gold hand-off of a customer who asks for a human
    cases = store.hold_cases(world.tasks("train"), n=10)
    assert list(cases) == ["insist", "human"] and all(len(c) == 10 for c in cases.values())
    specs = {t.id: t for t in world.tasks("train")}
    for behaviour, part in cases.items():
        for before, again, transfer in part:
            assert before[-2]["role"] == "assistant" and "cannot be" in before[-2]["content"]
            assert before[-1]["role"] == "user" and "###STOP###" not in before[-1]["content"]
            assert ("human" in before[-1]["content"].lower()) == (behaviour == "human")
            assert again == {"role": "assistant", "content": store.REFUSE_AGAIN}
            assert transfer["tool_calls"][0]["function"]["name"] == "transfer_to_human_agents"
            task = next(t for t in specs.values() if t.expert[: len(before)] == before)
            assert task.spec["behaviour"] == behaviour
            if behaviour == "human":
                assert task.actions == [transfer["tool_calls"][0]["function"]]
    assert store.hold_cases(world.tasks("train"), n=3) == {k: v[:3] for k, v in cases.items()}
