"""CoMLRL side of bench/actor_critic_step.py: its IACTrainer / MAACTrainer at the same settings.

Run by the CoMLRL venv's python (``--comlrl-python``) with this repository on PYTHONPATH,
so both sides load the same weights (``comlrl_core.models.model_source``) and score with the
same environment: CoMLRL's reward function steps a comlrl/Writing-v0 env (one joint
action per call, as CoMLRL calls it); its later-turn prompts use a plain revise
transition. Prints ``RESULT {json}`` like the comlrl-gym worker.
"""

from __future__ import annotations

import json
import resource
import sys
import time


def main(spec: dict) -> dict:
    import torch
    from comlrl.trainers.actor_critic import IACConfig, IACTrainer, MAACConfig, MAACTrainer
    from datasets import Dataset

    from comlrl_core.models.model_source import load_causal_lm, load_tokenizer, resolve_model_source
    from comlrl_core.registry import make

    torch.set_num_threads(spec["threads"])
    t0 = time.perf_counter()
    source = resolve_model_source(spec["model"])
    tokenizer = load_tokenizer(source)
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    agents = [load_causal_lm(source, torch.float32) for _ in range(2)]
    algo = spec["algo"]
    n_critics = {"iac-head": 0, "iac-separate": 2, "maac": 1}[algo]
    critics = [load_causal_lm(source, torch.float32) for _ in range(n_critics)]
    load_s = time.perf_counter() - t0

    env = make("comlrl/Writing-v0", num_turns=1)
    names = list(env.possible_agents)
    items = []
    for i in range(spec["steps"]):
        obs, _ = env.reset(options={"task": i})
        items.append({"task_index": i, "prompt": obs[names[0]], "p0": obs[names[0]], "p1": obs[names[1]]})

    def reward_func(c0, c1, *, batch_items=None):  # keyword-only: CoMLRL counts positionals
        env.reset(options={"task": batch_items[0]["task_index"]})
        _obs, rewards, *_ = env.step({names[0]: c0[0], names[1]: c1[0]})
        return [float(rewards[names[0]])]

    def transition(
        prompt, agent_completions, num_agents, prompt_history_per_agent=None, response_history_per_agent=None
    ):
        return [
            f"{prompt_history_per_agent[a][0]}\n\nYour previous answer:\n{agent_completions[a]}\n\n"
            f"Your teammate's answer:\n{agent_completions[1 - a]}\n\nRevise your answer."
            for a in range(num_agents)
        ]

    common = dict(
        agent_learning_rate=5e-6,
        critic_learning_rate=5e-6,
        rollout_buffer_size=spec["rollout_buffer_size"],
        max_new_tokens=spec["max_new_tokens"],
        temperature=0.6,
        top_p=0.6,
        num_train_epochs=1,
        num_agents=2,
        num_generations=1,
        num_turns=spec["T"],
        discount=0.9,
        critic_type="v",
        early_termination_threshold=None,
        eval_interval=0,
    )
    kwargs = dict(
        agents=agents,
        tokenizer=tokenizer,
        reward_func=reward_func,
        train_dataset=Dataset.from_list(items),
        formatters=[lambda x: x["p0"], lambda x: x["p1"]],
        external_transition=transition,
    )
    if algo == "maac":
        trainer = MAACTrainer(critic_model=critics[0], args=MAACConfig(**common), **kwargs)
    else:
        separate = algo == "iac-separate"
        trainer = IACTrainer(
            args=IACConfig(use_separate_critic=separate, **common), critics=critics if separate else None, **kwargs
        )
    trainer.verbose = False
    step_times: list[float] = []
    original = trainer._run_batch

    def timed(*a, **kw):
        start = time.perf_counter()
        result = original(*a, **kw)
        step_times.append(time.perf_counter() - start)
        return result

    trainer._run_batch = timed
    trainer.train()
    env.close()
    return {
        "load_s": load_s,
        "step_s": step_times,  # one task item each (rollout + any buffer update it triggered)
        "peak_rss_gib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20,
    }


if __name__ == "__main__":
    if len(sys.argv) != 3 or sys.argv[1] != "--worker":
        sys.exit("usage: _comlrl_ac_worker.py --worker SPEC_JSON (run by bench/actor_critic_step.py)")
    print("RESULT " + json.dumps(main(json.loads(sys.argv[2]))), flush=True)
