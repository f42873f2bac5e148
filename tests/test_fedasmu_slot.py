"""FedASMU's learned fetch slot (``fedasmu.slot='learned'``): the meta-model's slot distribution by
hand, REINFORCE on a synthetic bandit, the hand-over to Q-learning, and full runs (deterministic,
resumed bit for bit, from the CLI); bad settings refused before any work."""
import os

import jax
import numpy as np
import pytest

from jaxfl.algorithms.fedasmu import LearnedSlot, SlotContext
from jaxfl.cli import main
from jaxfl.config import ConfigError, RunConfig, validate
from jaxfl.kernels.fedasmu_slot import make_slot_meta_model
from jaxfl.runlog import load_run
from jaxfl.testing import check_algorithm

CONTEXT = SlotContext(version=3, in_flight=1, capacity=2, relative_weight=1.0)


def test_slot_distribution_is_the_first_decision_that_fires():
    model = make_slot_meta_model(epochs=5, num_features=2, hidden=4, learning_rate=1e-3)
    params, _ = model.init(7)
    context = np.array([0.3, -1.0], np.float32)
    p = model.decision_probabilities(params, context).astype(np.float64)  # p_1, p_2, p_3
    by_hand = [p[0], (1 - p[0]) * p[1], (1 - p[0]) * (1 - p[1]) * p[2], (1 - p[0]) * (1 - p[1]) * (1 - p[2])]
    np.testing.assert_allclose(model.slot_probabilities(params, context), by_hand, rtol=1e-5)


def test_a_second_meta_model_of_the_same_shape_compiles_nothing():
    # Every FedASMU run builds one; compiled anew each time, jax kept every program (memory maps
    # that 10,000 runs in one process took past the kernel's limit: XLA then crashed)
    model = make_slot_meta_model(epochs=5, num_features=2, hidden=4, learning_rate=1e-3)
    first = model.init(1)
    lowered = []

    def count(event, duration, **_):
        if event == "/jax/core/compile/jaxpr_to_mlir_module_duration":
            lowered.append(event)

    jax.monitoring.register_event_duration_secs_listener(count)
    try:
        second = model.init(2)
        again = model.init(1)
    finally:
        jax.monitoring.unregister_event_duration_listener(count)
    assert lowered == []
    assert all(np.array_equal(a, b) for a, b in zip(jax.tree.leaves(first), jax.tree.leaves(again)))
    assert not all(np.array_equal(a, b) for a, b in zip(jax.tree.leaves(first), jax.tree.leaves(second)))


def test_reinforce_moves_the_meta_model_toward_the_rewarded_slot():
    # a bandit: every client's first participation is rewarded 1 if its slot is 3, else 0
    selector = LearnedSlot(num_clients=200, epochs=5, seed=0, learning_rate=0.5, baseline_rate=0.1)
    initial = selector.slot_probabilities(CONTEXT)[2]
    slots = []
    for client in range(200):
        slot = selector.choose(client, 5, CONTEXT)
        slots.append(slot)
        selector.feedback(client, slot, 1.0 if slot == 3 else 0.0)
    assert selector.meta_choices == 200 and selector.meta_updates == 200  # one forward, one step per device
    assert slots[:50].count(3) < 20 and slots[100:].count(3) > 80  # seed 0: 10 of the first 50, 95 of the last 100
    assert initial < 0.2 and selector.slot_probabilities(CONTEXT)[2] > 0.9  # seed 0: 0.12 → 0.98
    # the same seed gives the same samples and the same model
    again = LearnedSlot(num_clients=200, epochs=5, seed=0, learning_rate=0.5, baseline_rate=0.1)
    assert [again.choose(c, 5, CONTEXT) for c in range(3)] == slots[:3]


def test_baseline_advantage_and_hand_over_to_q_learning():
    selector = LearnedSlot(num_clients=3, epochs=5, seed=1, learning_rate=0.5, baseline_rate=0.25)
    params = selector.params
    slot = selector.choose(0, 5, CONTEXT)
    selector.feedback(0, slot, 0.0)  # R = b = 0: no advantage, the model does not move
    assert all(np.array_equal(a, b) for a, b in zip(_leaves(params), _leaves(selector.params)))
    assert selector.meta_updates == 1 and selector.baseline == 0.0
    slot = selector.choose(1, 5, CONTEXT)
    selector.feedback(1, slot, 2.0)  # b ← 0.75·0 + 0.25·2
    assert selector.baseline == 0.5 and selector.meta_updates == 2
    assert not any(np.array_equal(a, b) for a, b in zip(_leaves(params), _leaves(selector.params)))
    # the second participation: the Q-table moves the slot by at most one and learns; the meta-model does not
    second = selector.choose(1, 5, CONTEXT)
    assert abs(second - slot) <= 1 and selector.meta_choices == 2
    selector.feedback(1, second, 1.0)  # b ← 0.75·0.5 + 0.25·1
    assert selector.meta_updates == 2 and selector.baseline == 0.625 and np.abs(selector.table[1]).sum() > 0
    # a first participation that is never rewarded (no newer model to mix) is forgotten at the next one
    selector.choose(2, 5, CONTEXT)
    selector.choose(2, 5, CONTEXT)
    selector.feedback(2, int(selector.slot[2]), 1.0)
    assert selector.meta_updates == 2


def _leaves(tree):
    import jax

    return [np.asarray(x) for x in jax.tree.leaves(tree)]


LEARNED = {"clients": 8, "max_updates": 10,
           "algorithm_options": {"slot": "learned", "max_concurrency": 3, "rl_lr": 0.1, "trigger_period": 0.2}}


def test_a_learned_run_learns_and_resumes_bit_for_bit(tmp_path):
    # one run uninterrupted ("full") and one interrupted mid-run and resumed: the same events, summary
    # (meta-model counts, reward baseline) and model, bit for bit
    report = check_algorithm("fedasmu", checks=("resume",), output_dir=str(tmp_path), **LEARNED)
    assert report["interrupted_at_event"] > 0
    run = load_run(report["run_dir"])
    policy = run.summary["policy"]
    devices = set(run.events["client"][run.events["event"] == "dispatch"].tolist())
    assert policy["slot_rule"] == "learned" and len(devices) >= 4
    assert policy["meta_choices"] == len(devices)  # the meta-model runs once per device, at its first dispatch
    assert 1 <= policy["meta_updates"] <= policy["meta_choices"] and policy["rewards"] >= policy["meta_updates"]


def test_the_cli_runs_the_learned_slot_and_refuses_bad_settings(tmp_path, capsys):
    flags = ["run", "--algorithm", "fedasmu", "--model", "mlp", "--clients", "4", "--local-steps", "6",
             "--batch-size", "16", "--max-updates", "2", "--no-progress", "--checkpoint-every", "none",
             "--output-dir", str(tmp_path)]
    assert main(flags + ["--fedasmu.rl-lr", "0.01", "--fedasmu.epochs", "3"]) in (0, None)
    (run_dir,) = [name for name in os.listdir(tmp_path) if name.startswith("fedasmu-")]
    assert '"slot_rule": "learned"' in open(tmp_path / run_dir / "summary.json").read()  # the default
    with pytest.raises((ConfigError, SystemExit)):
        main(flags + ["--fedasmu.slot", "middle", "--fedasmu.rl-hidden", "8"])
    assert "rl_hidden=8 is not allowed: only with fedasmu.slot='learned'" in capsys.readouterr().err
    assert os.listdir(tmp_path) == [run_dir]  # refused before any run directory was written
    with pytest.raises(ConfigError, match="fedasmu.epochs=2 is not allowed: an integer >= 3 with fedasmu.slot"):
        validate(RunConfig(algorithm="fedasmu", algorithm_options={"epochs": 2}))
    with pytest.raises(ConfigError, match="timing_only=True.*slot='learned' \\(the default\\)"):
        validate(RunConfig(algorithm="fedasmu", timing_only=True))
