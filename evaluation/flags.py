"""eval.py's command line, its customer and its agent: what eval.py needs around `evaluate()`.

The flags it shares with muarl.py are config.Config's, with the same names, types and help
(--domains, --eval_tasks, --eval_trials, the customer's); its own are the agent's and the
benchmark's. `--model RUN/final` (a folder muarl.py wrote, with RUN/config.json beside it) takes
that run's settings for every shared flag the command line leaves out (the agent stays greedy:
--temperature is evaluation's own). Every endpoint in use is checked once before any episode
(plumbing/preflight.py).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
from pathlib import Path

from config import Config
from plumbing.flags import ConfigError, add_flags, one_line_errors
from plumbing.validate import field_problems, first_problem, model_problem

# The flags eval.py shares with muarl.py, declared once (config.Config); evaluation's own defaults beside them
SHARED = ("model", "engine", "domains", "data_dir", "synthetic_seed", "eval_tasks", "eval_trials", "seed",
          "max_turns", "max_new_tokens", "max_context", "tools_in_prompt", "temperature", "top_p",
          "user", "user_model", "user_base_url", "user_api_key", "user_serve", "user_prompt", "user_temperature",
          "user_max_tokens", "user_thinking", "user_concurrency", "user_timeout", "user_retries", "user_backoff", "preflight",
          "allow_insecure_http")
DEFAULTS = {**{k: getattr(Config, k) for k in SHARED}, "model": "", "engine": "hf", "eval_tasks": 0,
            "eval_trials": 4, "temperature": 0.0, "top_p": 1.0, "seed": 0}  # a greedy agent, 4 trials a task
NOT_FROM_RUN = ("model", "temperature", "top_p", "engine", "eval_tasks")  # evaluation's own, even for a run
EVAL = "evaluation"


def run_settings(model: str) -> dict:
    """The settings muarl.py saved for the run whose model folder is `model` (RUN/final,
    RUN/cold-start), or {}."""
    path = Path(model).expanduser().parent / "config.json"
    try:
        saved = json.loads(path.read_text()) if model and path.is_file() else {}
    except (OSError, ValueError):
        return {}
    return saved if isinstance(saved, dict) and "max_context" in saved else {}


def parse_args(argv=None) -> argparse.Namespace:
    """The command line, checked: every bad value or combination is a ConfigError naming the flag."""
    from config import GROUPS

    p = one_line_errors(argparse.ArgumentParser(prog="eval.py", allow_abbrev=False, description="Evaluate an "
                                                "agent: pass^k, turns, tool mix, stop reasons"))
    g = p.add_argument_group(EVAL, "the agent, the benchmark, the transcripts")
    g.add_argument("--agent", choices=["local", "openai", "oracle"], help="local: --model through an engine; "
                   "openai: an OpenAI-compatible endpoint; oracle: the gold actions replayed ['local']")
    g.add_argument("--agent_model", help="the agent's model name at its endpoint (--agent openai) ['']")
    g.add_argument("--agent_base_url", help="the agent's endpoint, ending in /v1 (else $OPENAI_BASE_URL) ['']")
    g.add_argument("--agent_api_key", help="the agent endpoint's key, never shown (else $OPENAI_API_KEY, sent "
                   "only to $OPENAI_BASE_URL or OpenAI's) ['']")
    g.add_argument("--bench", help="a benchmark of domains.BENCHES (bfcl_multi_turn, acebench_agent): its world, "
                   "its rules, its own figures; replaces --domains ['']")
    g.add_argument("--category", help="--bench: comma-separated categories (empty: all) ['']")
    g.add_argument("--split", help="the tasks' split: test | train | all ['test']")
    g.add_argument("--check_outputs", type=int, metavar="0|1", help="also demand the required outputs [1]")
    g.add_argument("--out", help="this evaluation's transcripts, replaced ['runs/eval/transcripts.jsonl']")
    add_flags(p, Config, SHARED, groups=GROUPS, shown=DEFAULTS)
    a = p.parse_args(argv)
    given = {k for k, v in vars(a).items() if v is not None}
    own = dict(agent="local", agent_model="", agent_base_url="", agent_api_key="", bench="", category="",
               split="test", check_outputs=1, out="runs/eval/transcripts.jsonl")
    saved = run_settings(a.model or "")
    for k, v in {**own, **DEFAULTS}.items():  # the run's settings under the command line, the defaults under both
        if getattr(a, k) is None:
            setattr(a, k, saved[k] if k in saved and k in SHARED and k not in NOT_FROM_RUN else v)
    for k, v in saved.items():  # a run's world settings (sizes and seeds of generated worlds) the flags lack
        if not hasattr(a, k):
            setattr(a, k, v)
    for f in dataclasses.fields(Config):  # and the defaults of the rest (a generated world's sizes)
        if not hasattr(a, f.name):
            setattr(a, f.name, f.default)
    a.synthetic_train, a.user_down_s = 0, float("inf")  # (held-out tasks only; no steps to be down for)
    from domains import BENCHES, unknown_domains

    if a.bench:
        if a.bench not in BENCHES:
            raise ConfigError(f"--bench must be one of {', '.join(BENCHES)}, got {a.bench!r}")
        a.domains = BENCHES[a.bench].domain
    unknown = unknown_domains(a.domains.split(","))
    first_problem([
        (not unknown, unknown),
        (a.agent != "local" or a.model, "--agent local needs --model (a model folder or a hub id)"),
        (a.agent == "local" or not a.model, f"--model is for --agent local (got --agent {a.agent})"),
        (a.agent != "openai" or a.agent_model, "--agent openai needs --agent_model"),
        (a.agent == "openai" or not a.agent_model, f"--agent_model is for --agent openai (got --agent {a.agent})"),
        (a.agent != "oracle" or not given & {"user", "user_model", "user_base_url", "user_serve"},
         "--agent oracle replays the gold actions to a fixed line and talks to no customer: drop the --user flags"),
        (a.check_outputs in (0, 1), "--check_outputs is 0 or 1"),
        (a.split in ("test", "train", "all"), f"--split must be test, train or all, got {a.split!r}"),
        (a.engine in ("hf", "vllm"), "--engine must be hf or vllm"),
        *field_problems(a, [k for k in SHARED if k != "model"]),
        *[(False, m) for m in [model_problem(a.model) if a.agent == "local" else None] if m],
    ])
    a.from_run, a.given = saved.get("out_dir", "") if saved else "", given
    if saved and a.agent == "local":
        print(f"[eval] {a.model}: the settings of the run in {Path(a.model).parent} (flags given override them)")
    return a


def rules(a, worlds, tasks, bench):
    """The conversation's rules (a RolloutConfig). In tau2's worlds tau2's own caps: 200 messages and
    10 failed tool calls (an episode cut by either scores 0) and no turn cap unless --max_turns says
    one; a benchmark's own (BFCL runs every call of a step). A scripted customer must play them all."""
    import dataclasses

    from domains.tau2_data import provenance
    from rollout import RolloutConfig
    from user_sim import USERS, ScriptedUser

    tau2 = bool(provenance(worlds))
    turns = a.max_turns if "max_turns" in a.given or not tau2 else 10**9
    cfg = RolloutConfig(turns, a.max_context, a.max_new_tokens, a.temperature, a.top_p, seed=a.seed,
                        tools_in_prompt=bool(a.tools_in_prompt), max_messages=200 * tau2,
                        max_errors=10 * tau2)
    if getattr(USERS.get(a.user), "scripted", False) and a.agent != "oracle":
        try:  # a task no script plays would abort
            script = ScriptedUser()
            for t in tasks:
                script.script_for(t)
        except ValueError:
            raise ConfigError(f"the scripted customer does not play {a.domains}'s tasks: use --user "
                              "llm") from None
    return dataclasses.replace(cfg, **bench.rollout) if bench else cfg


def start_customer(a, tasks, worlds, bench):
    """The customer, checked and started (an endpoint's preflight; a served model served now)."""
    from plumbing.preflight import PreflightError
    from plumbing.serve import customer_for
    from user_sim import USERS, FixedUser, ScriptedUser, make_user

    if USERS.get(a.user) is None:
        raise ConfigError(f"--user must be one of {', '.join(USERS)}, got {a.user!r}")

    # the oracle talks to a fixed line, or to its benchmark's own scripted customer (BFCL's turns)
    user = (ScriptedUser() if bench and bench.oracle else FixedUser()) if a.agent == "oracle" else \
        customer_for(a, make_user, os.path.dirname(a.out) or ".")
    try:
        user.check(tasks, worlds)
        user.start(tasks)
    except PreflightError as e:  # (a served model that cannot start: ServeError, an OSError, one line)
        raise ConfigError(str(e)) from None
    return user


def make_agent(a, worlds, bench):
    """(agent, its name in the table): the local model through an engine, an endpoint, or the
    oracle."""
    from engine import make_engine
    from evaluation.agents import MessageAgent, OracleAgent, openai_act
    from plumbing.models import load_policy, load_tokenizer, model_folder
    from chat import prompt_warning
    from plumbing.preflight import PreflightError, check_endpoint, endpoint
    from rollout import PolicyAgent

    if a.agent == "local":
        # vLLM reads the weights itself: only the tokenizer here (a transformers copy of 32B: 131 GB of RAM)
        folder = model_folder(a.model)
        model, tok = load_policy(folder) if a.engine == "hf" else (None, load_tokenizer(folder))
        agent = PolicyAgent(make_engine(a.engine, model=model, tokenizer=tok, model_path=folder,
                                        max_model_len=a.max_context), tok)
        if warning := prompt_warning(tok, worlds, a.max_context, a.max_new_tokens, bool(a.tools_in_prompt)):
            print(warning)
        name = a.model
    elif a.agent == "oracle":
        agent, name = MessageAgent(bench.oracle if bench and bench.oracle else OracleAgent), "oracle (gold actions)"
    else:  # the agent's endpoint and key under preflight.endpoint's rule (a key goes to its own host only)
        a.agent_base_url, a.agent_api_key = endpoint(a.agent_base_url or None, a.agent_api_key or None,
                                                     bool(a.allow_insecure_http), "--agent")
        if a.preflight:
            w = max(worlds.values(), key=lambda w: len(json.dumps(w.tool_schemas())))  # the longest prompt
            first = [{"role": "system", "content": w.rules}, {"role": "user", "content": "Hello"}]
            try:
                # retried as the agent's own requests are (evaluation/agents.py: the client's 3 retries)
                check_endpoint("agent", a.agent_model, first, a.max_new_tokens, None if bench and bench.agent else
                               w.tool_schemas(), a.agent_base_url, a.agent_api_key, retries=3)
            except PreflightError as e:
                raise ConfigError(str(e)) from None
        act = openai_act(a.agent_model, a.agent_base_url, a.agent_api_key, a.temperature, a.max_new_tokens)
        agent, name = MessageAgent(lambda task: act), a.agent_model
    if bench is not None and bench.agent is not None:  # a benchmark speaking its own protocol brings its agent
        agent = bench.agent(a.agent, engine=getattr(agent, "engine", None), tokenizer=getattr(agent, "tok", None),
                            model=a.agent_model, base_url=a.agent_base_url, api_key=a.agent_api_key,
                            max_new_tokens=a.max_new_tokens, temperature=a.temperature)
    return agent, name
