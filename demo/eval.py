"""python -m demo.eval [eval.py's flags]: eval.py, with the demo's worlds registered and a demo run's customer
served again, as the demo served it.

eval.py plays the worlds of domains.DOMAINS. The demo's shop and store join that table when the demo is imported
(demo/worlds/), as a forker's own world joins it when the forker's code is, so a demo run, whose config.json says
--domains store, is evaluated from here:

    python -m demo.eval --model runs/muarl/final      # the run's last figures again, with its own settings

eval.py takes a run's settings from its config.json, the customer's included. A demo run's customer was the
endpoint the demo served for it (RUN/config.json: --user_base_url http://127.0.0.1:PORT/v1), gone when the run
ended; the model folder it served is in the demo's own settings (RUN/demo/config.json: --user_serve). So when the
command line names no customer, that folder is served again the way the demo serves it (demo/customer.py's
ServedCustomer: its context, no gate this time), and eval.py is handed the endpoint, as muarl.train was.

Every flag is eval.py's (python -m demo.eval --help), and so is every line it prints.
"""

import json
import runpy
import sys
from pathlib import Path

import demo  # noqa: F401  (registers the shop and the store)

CUSTOMER_FLAGS = ("--user", "--user_model", "--user_base_url", "--user_api_key", "--user_serve")


def _flag(argv: list[str], name: str) -> str | None:
    """The value of `--name VALUE` or `--name=VALUE` in argv (the last one given), or None."""
    value = None
    for i, a in enumerate(argv):
        if a == name and i + 1 < len(argv):
            value = argv[i + 1]
        elif a.startswith(name + "="):
            value = a.split("=", 1)[1]
    return value


def run_customer(argv: list[str]) -> Path | None:
    """The customer model folder the demo served for the run whose model is --model, or None when the command
    line names a customer itself, or --model is not a demo run's model folder, or that run's customer was not a
    served model. A folder that is gone is one line and exit 2."""
    model = _flag(argv, "--model")
    if not model or any(a.split("=", 1)[0] in CUSTOMER_FLAGS for a in argv):
        return None
    saved = Path(model).expanduser().parent / "demo" / "config.json"  # (RUN/final -> RUN/demo/config.json)
    try:
        folder = json.loads(saved.read_text()).get("user_serve", "") if saved.is_file() else ""
    except (OSError, ValueError, AttributeError):
        return None
    if not folder:
        return None
    if not (Path(folder) / "config.json").is_file():
        print(f"demo.eval: the run's customer model {folder} (in {saved}) is gone: pass --user_serve FOLDER "
              f"(the shipped one: {demo.SHIPPED})", file=sys.stderr)
        sys.exit(2)
    return Path(folder)


def serve_again(folder: Path, out: Path):
    """The customer model in `folder` served as the demo serves it for a run (ServedCustomer), ungated: the
    customer and the flags that hand its endpoint to eval.py."""
    from demo.customer import ServedCustomer
    from user_sim import make_user

    served = ServedCustomer(folder, out, make_llm=lambda **kw: make_user("llm", **kw))
    served.start()
    return served, ["--user_base_url", served.base_url, "--user_api_key", served.server.api_key, "--user_model",
                    served.server.name]


if __name__ == "__main__":
    argv, served = sys.argv[1:], None
    if (folder := run_customer(argv)) is not None:
        try:
            served, endpoint = serve_again(folder, Path(_flag(argv, "--out") or "runs/eval/transcripts.jsonl").parent)
        except (ValueError, OSError) as e:  # (vLLM missing, a server that would not start: one line)
            sys.exit(f"demo.eval: {e}")
        argv += endpoint
    sys.argv = ["eval.py", *argv]
    try:
        runpy.run_path(str(Path(__file__).resolve().parents[1] / "eval.py"), run_name="__main__")
    finally:
        if served is not None:
            served.close()
