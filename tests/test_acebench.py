"""ACEBench Agent in muarl: the oracle scores 100 % through eval.py, ACEBench's stop rule and scores, hostile agent
messages, the customer's prompt variant, missing data in one line, and one GRPO step of the tiny model on it."""

import json
import os
import stat
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

import domains
from benchmarks import acebench, acebench_agents

REPO = Path(__file__).resolve().parents[1]
HAVE = (acebench.DEFAULT_DIR / "data" / "data_agent_multi_turn.json").is_file() or bool(os.environ.get("ACEBENCH_DIR"))
needs_data = pytest.mark.skipif(not HAVE, reason=f"ACEBench data not found at {acebench.DEFAULT_DIR} "
                                "(../shared is absent)")


@pytest.fixture(scope="module")
def world():
    return acebench_agents.build_world()


@needs_data
def test_the_oracle_scores_100_percent_through_eval(capsys):
    import eval as ev

    m = ev.main(["--bench", "acebench_agent", "--agent", "oracle", "--eval_trials", "1", "--out", os.devnull])
    assert stat.S_ISCHR(os.stat(os.devnull).st_mode)  # written to, never replaced by a file of transcripts
    out = capsys.readouterr().out
    assert m["multi_turn_n"] == 30 and m["multi_step_n"] == 20 and m["aborted"] == 0
    assert m["agent"] == m["multi_turn_end_to_end"] == m["multi_step_end_to_end"] == 1.0
    assert m["multi_turn_process"] == m["multi_step_process"] == 1.0
    assert "ACEBench Agent (headline = mean of the two end-to-end accuracies): 100.0" in out


@needs_data
def test_every_task_has_a_gold_path_and_a_wrong_path_fails(world):
    lenient = []
    for t in world.tasks():
        assert t.actions and acebench_agents.reaches_truth(world, t, [a["arguments"]["message"] for a in t.actions])
        if acebench_agents.reaches_truth(world, t, [a["arguments"]["message"] for a in t.actions[:-1]] or
                                         ["[turn_on_wifi()]"]):  # the path without its last message
            lenient.append(t.id)
    # only where ACEBench never checks the last step: the reminder of the tasks whose answer misspells ReminderApi
    assert lenient == ["acebench/agent_multi_turn_7", "acebench/agent_multi_step_0", "acebench/agent_multi_step_1"]


def _ep(world, task, msgs, obs=None):
    env = world.new_env(task)
    env.last_observation = obs
    return SimpleNamespace(env=env, task=task, messages=[{"role": "system", "content": ""}] + msgs)


@needs_data
def test_the_stop_rule_is_acebench_s(world):
    task = world.tasks()[0]
    u, a = {"role": "user", "content": "hi"}, {"role": "assistant", "content": "finish conversation"}
    assert world.ends(_ep(world, task, [u, a])) is None  # index 0: too early
    assert world.ends(_ep(world, task, [u, a, dict(u, content="finish conversation")])) is None  # index 1
    assert world.ends(_ep(world, task, [u, a, u, a])) == "finished"  # index 2, the agent
    assert world.ends(_ep(world, task, [u, a, u, dict(u, content="ok. finish conversation")])) == "user_stop"
    tool = {"role": "tool", "content": "['finish conversation x']"}
    assert world.ends(_ep(world, task, [u, a, u, tool], ["finish conversation x"])) is None  # list membership
    assert world.ends(_ep(world, task, [u, a, u, tool], ["finish conversation"])) == "finished"
    long = [u] + [dict(u, content="go on")] * 40  # the opening, then ACEBench's 40 loop messages
    assert world.ends(_ep(world, task, long[:-1])) is None and world.ends(_ep(world, task, long)) == "max_turns"


@needs_data
def test_the_router_and_hostile_messages_never_crash(world, tmp_path):
    mt, ms = world.tasks()[0], world.tasks()[-1]
    assert acebench.routes_to_execution("[turn_on_wifi()]") and not acebench.routes_to_execution("[turn_on_wifi()] ")
    assert not acebench.routes_to_execution("Sure: [turn_on_wifi()]") and not acebench.routes_to_execution("hello")
    marker = tmp_path / "written"
    evil = ["", " ", "  [f()]", "[" * 5000 + "]" * 5000, "[f(x=2**10**8)]", "[f(x='a'*10**9)]", "\x00",
            f"[send_message(message=open(file='{marker}', mode='w'))]", f"[x(y=open(file='{marker}', mode='w'))]",
            "[__import__(name='os').system(command='true')]", "[f(**{'a': 1})]", "[é(x=1)]", "[a.b.turn_on_wifi()]",
            "[delete_message(message_id=float('inf'))]", "[delete_message(message_id=1e999)]", "[(lambda: 1)()]",
            "[turn_on_wifi(), 3]", "[f(x={'g': {1: 2}})]", "[f(x={})]", "[f(x=[1, {2: 3}], y=(1,))]", "[]"]
    for task in (mt, ms):
        env = world.new_env(task)
        for m in evil:
            obs = env.execute(m)
            assert isinstance(obs, (list, str))
            assert world.parse_turn(env, m).content == m
        world.score(task, env)
    assert not marker.exists()  # nothing the agent writes is evaluated as code
    env = world.new_env(ms)
    assert env.execute("[delete_message(message_id=1e999)]") == ["Error during execution: name 'inf' is not defined"]
    assert env.call("other", {"message": "[f()]"}).startswith("Error") and env.call("execute", [1]).startswith("Error")


@needs_data
def test_the_customer_is_an_llm_told_acebench_s_prompt(world):
    from benchmarks.acebench_customer import simulator_messages
    from user_sim import make_user

    task = world.tasks()[0]
    sim = task.spec["simulator"]
    msgs = simulator_messages(sim, [{"role": "user", "content": "Hi"},
                                    {"role": "assistant", "content": "agent:Which message?"}])
    assert msgs == [{"role": "system", "content": sim["system"]},
                    {"role": "user", "content": "Is there anything you need help with today?"},
                    {"role": "system", "content": "Hi"}, {"role": "user", "content": "Which message?"}]
    step = next(t for t in world.tasks() if t.raw["category"] == "multi_step")  # its question, no model call
    user = make_user("llm", model="m", base_url="http://127.0.0.1/v1", client=object())
    assert user.first_message(step) == step.instructions


def test_every_llm_customer_plays_an_acebench_task_with_its_prompt_and_any_other_task_with_muarls():
    # (training with --domains acebench_agent and evaluating with --bench alike: the world's row names its customer)
    from domains import load_world
    from user_sim import LLMUser, make_user, simulator_messages as muarls

    sent = []

    class Client:  # records what the customer sends; answers one line
        class chat:
            class completions:
                @staticmethod
                def create(**kw):
                    sent.append(kw["messages"])
                    msg = SimpleNamespace(content="Hello.", reasoning_content=None, tool_calls=None)
                    return SimpleNamespace(choices=[SimpleNamespace(message=msg, finish_reason="stop")])

    user = make_user("llm", model="m", base_url="http://127.0.0.1/v1", client=Client())
    assert isinstance(user, LLMUser)
    sim = {"system": "You are a user who wants to message Frank.", "greeting": "Anything you need?",
           "own_role": "system", "strip": ["agent:"]}
    ace = SimpleNamespace(id="ace/0", domain="acebench_agent", spec={"world": "acebench_agent", "simulator": sim},
                          instructions="-")
    user.reply(ace, [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "agent:To whom?"}])
    assert sent[-1][:2] == [{"role": "system", "content": sim["system"]}, {"role": "user", "content": sim["greeting"]}]
    other = load_world("synthetic", seed=0).tasks("test")[0]
    user.reply(other, [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "How can I help?"}])
    assert sent[-1][0] == muarls(other.instructions, [])[0]  # muarl's own customer prompt


def test_acebench_summary_is_acebench_arithmetic():
    def ep(cat, r, p):
        return SimpleNamespace(task=SimpleNamespace(raw={"category": cat}), reward=r, aborted=False,
                               info={"process_accuracy": p})

    m, text = acebench_agents.summarize([ep("multi_turn", 1.0, 1.0), ep("multi_turn", 0.0, 1 / 3),
                                         ep("multi_turn", 0.0, 0.0), ep("multi_step", 1.0, 1.0),
                                         ep("multi_step", 0.0, 0.5)])
    assert (m["multi_turn_end_to_end"], m["multi_turn_process"]) == (0.333, 0.444)
    assert (m["multi_step_end_to_end"], m["multi_step_process"], m["agent"]) == (0.5, 0.75, 0.416)
    assert "41.6" in text
    assert acebench.process_accuracy(["a", "x", "c"], ["a", "b", "c"], False) == pytest.approx(1 / 3)
    assert acebench.process_accuracy(["a", "b"], [["a", "c"], ["a", " b "]], False) == 1.0


def test_missing_data_is_one_clear_line(monkeypatch, tmp_path):
    monkeypatch.setattr(acebench, "DEFAULT_DIR", tmp_path / "nowhere")
    monkeypatch.delenv("ACEBENCH_DIR", raising=False)
    monkeypatch.setattr(domains, "_WORLDS", {})
    with pytest.raises(FileNotFoundError, match="ACEBench Agent data not found"):
        acebench.find_data()
    import eval as ev

    with pytest.raises(FileNotFoundError, match="ACEBench Agent data not found") as e:  # eval.py's __main__: 1 line
        ev.main(["--bench", "acebench_agent", "--agent", "oracle", "--out", str(tmp_path / "t.jsonl")])
    assert "\n" not in str(e.value)
    env = dict(os.environ, ACEBENCH_DIR=str(tmp_path / "nowhere"))  # an explicit folder is the only one tried
    # never the default runs/muarl: a test writes nothing inside the checkout (a run there would set a user's aside)
    out = tmp_path / "run"
    folder = tmp_path / "model"  # a model folder, as validation sees one: the data is missed before it is loaded
    folder.mkdir()
    (folder / "config.json").write_text("{}")
    for cli, name in ((["muarl.py", "--model", str(folder)], "muarl"), (["-m", "demo", "--model", "tiny"], "demo")):
        run = subprocess.run([sys.executable, *cli, "--domains", "acebench_agent", "--out_dir", str(out)],
                             capture_output=True, text=True, env=env, cwd=REPO)
        assert run.returncode == 2 and run.stderr.startswith(f"{name}: ACEBench Agent data not found"), run.stderr
        assert run.stderr.strip().count("\n") == 0, run.stderr
        assert not out.exists()  # stopped on missing data: nothing set aside, nothing written


@needs_data
def test_muarl_trains_one_grpo_step_on_acebench(tmp_path):
    from demo import train as demo

    out = tmp_path / "run"
    res = demo.main(["--domains", "acebench_agent", "--model", "tiny", "--tiny_hidden", "64", "--tiny_layers", "1",
                     "--threads", "1", "--copy_warmup", "0", "--sft_epochs", "0", "--steps", "1", "--tasks_per_step",
                     "2", "--group_size", "2", "--max_new_tokens", "16", "--max_turns", "6", "--eval_tasks", "2",
                     "--max_context", "16384", "--out_dir", str(out)])
    recs = [json.loads(line) for line in (out / "log.jsonl").read_text().splitlines()]
    grpo = [r for r in recs if r["phase"] == "grpo"]
    assert len(grpo) == 1 and grpo[0]["episodes"] == 4 and grpo[0]["turns"] > 0 and "GRPO (1 steps)" in res
    # the trained model evaluated through ACEBench's protocol (AceAgent over the local engine, ACEBench's prompts)
    import eval as ev

    m = ev.main(["--bench", "acebench_agent", "--agent", "local", "--model", str(out / "final"), "--eval_tasks", "2",
                 "--max_new_tokens", "8", "--out", os.devnull])
    assert m["multi_turn_n"] == 2 and m["aborted"] == 0


@needs_data
def test_an_endpoint_agent_sees_acebench_s_prompt(monkeypatch):
    import openai

    import eval as ev

    seen = []

    class Stub:  # an OpenAI-compatible endpoint: the oracle's first message, then the end marker
        def __init__(self, **kwargs):
            self.chat = SimpleNamespace(completions=SimpleNamespace(create=self.create))

        def create(self, model, messages, **kw):
            seen.append((messages, kw))
            text = "[turn_on_wifi()]" if len(seen) % 2 else "finish conversation"
            return SimpleNamespace(choices=[SimpleNamespace(message=SimpleNamespace(content=text))])

    monkeypatch.setattr(openai, "OpenAI", Stub)
    m = ev.main(["--bench", "acebench_agent", "--agent", "openai", "--agent_model", "stub", "--user", "fixed",
                 "--eval_tasks", "1", "--eval_trials", "1", "--out", os.devnull,
                 "--preflight", "0",  # (a stub client, not a server to check)
                 "--agent_api_key", "k"])  # OpenAI's endpoint needs its key (a placeholder "EMPTY" is not sent there)
    assert m["episodes"] == 1 and m["aborted"] == 0 and len(seen) >= 2
    messages, kw = seen[0]
    assert [x["role"] for x in messages] == ["system", "user"] and kw == {"temperature": 0.001, "top_p": 1,
                                                                           "max_tokens": 1000}
    assert messages[1]["content"].startswith("Below is the list of APIs you can use:\n [{'name': 'turn_on_wifi'")


@pytest.mark.parametrize("expr", ["((((3**64)**64)**64)**64)**64", "('a'*99999)*9999", "[0]*10**9",
                                  "'%0999999999d' % 1", "(2**64)**64**1", "(1<<64)<<64<<64<<64" * 1])
def test_argument_arithmetic_is_refused_before_it_blows_the_budget(expr):
    # unbounded, the first does not finish in 60 s, the second builds 1 GB before its length is checked
    import time

    t0 = time.perf_counter()
    text = f"[send_message(sender_name='Eve', receiver_name='Bob', message={expr})]"
    ok = acebench.decodes(text)
    assert time.perf_counter() - t0 < 1.0
    if not ok:  # refused: not a call, exactly as an undecodable message
        assert not acebench.routes_to_execution(text)
    assert acebench.decodes("[send_message(sender_name='Eve', receiver_name='Bob', message='ab'*3)]")
