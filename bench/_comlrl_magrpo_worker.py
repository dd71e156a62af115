"""CoMLRL side of bench/magrpo_step.py: its MAGRPOTrainer at the same settings.

Run by the CoMLRL venv's python (``--comlrl-python``) with this repository on
PYTHONPATH, so both sides load the same weights (``comlrl_core.models.model_source``) and score
with the same environment: CoMLRL's reward function steps a CoopCode env (one joint
action per call, as CoMLRL calls it) and its turn-2 prompts use a plain revise
transition. Prints ``RESULT {json}`` like the comlrl-gym worker.
"""

from __future__ import annotations

import json
import resource
import sys
import time


def main(spec: dict) -> dict:
    import torch
    from comlrl.trainers.reinforce.magrpo import MAGRPOConfig, MAGRPOTrainer
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
    if spec["mode"] == "lora":
        from peft import LoraConfig, get_peft_model

        from comlrl_core.models.lora import find_lora_target_modules

        targets = find_lora_target_modules(agents[0])
        agents = [
            get_peft_model(m, LoraConfig(r=8, lora_alpha=16, target_modules=targets, task_type="CAUSAL_LM"))
            for m in agents
        ]
    load_s = time.perf_counter() - t0

    env = make(spec["env"], sandbox_backend=spec["sandbox"], task_slice="0:20", num_turns=1)
    names = list(env.possible_agents)
    items = []
    for i in range(spec["steps"]):
        obs, _ = env.reset(options={"task": i})
        items.append({"task_index": i, "prompt": obs[names[0]], "p0": obs[names[0]], "p1": obs[names[1]]})

    def reward_func(c0, c1, *, batch_items=None):
        task = batch_items[0]["task_index"]
        env.reset(options={"task": task})
        _obs, rewards, *_ = env.step({names[0]: c0[0], names[1]: c1[0]})
        return [float(rewards[names[0]])]

    def transition(
        prompt, agent_completions, num_agents, prompt_history_per_agent=None, response_history_per_agent=None
    ):
        out = []
        for a in range(num_agents):
            mine, other = agent_completions[a], agent_completions[1 - a]
            out.append(
                f"{prompt_history_per_agent[a][0]}\n\nYour previous answer:\n{mine}\n\n"
                f"Your teammate's answer:\n{other}\n\nRevise your answer."
            )
        return out

    lora = spec["mode"] == "lora"
    args = MAGRPOConfig(
        num_train_epochs=1,
        agent_learning_rate=1e-4 if lora else 5e-6,
        num_agents=2,
        agent_devices="cpu",
        num_generations=spec["G"],
        max_new_tokens=spec["max_new_tokens"],
        temperature=0.6,
        top_p=0.6,
        top_k=50,
        num_turns=spec["T"],
        discount=1.0,
        joint_mode="aligned",
        early_termination_threshold=None,
        eval_interval=0,
        rollout_buffer_size=spec["rollout_buffer_size"],
        advantage_normalization=False,
    )
    trainer = MAGRPOTrainer(
        agents=agents,
        num_agents=2,
        tokenizer=tokenizer,
        train_dataset=Dataset.from_list(items),
        reward_func=reward_func,
        formatters=[lambda x: x["p0"], lambda x: x["p1"]],
        external_transition=transition,
        args=args,
    )
    trainer.verbose = False
    step_times: list[float] = []
    original = trainer._train_step_returns

    def timed(*a, **kw):
        start = time.perf_counter()
        result = original(*a, **kw)
        step_times.append(time.perf_counter() - start)
        return result

    trainer._train_step_returns = timed
    trainer.train()
    env.close()
    return {
        "load_s": load_s,
        "step_s": step_times,
        "rollout_s": step_times,  # CoMLRL interleaves rollout and updates
        "update_s": [0.0 for _ in step_times],
        "peak_rss_gib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20,
        "children_peak_rss_gib": resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 2**20,
    }


if __name__ == "__main__":
    if len(sys.argv) != 3 or sys.argv[1] != "--worker":
        sys.exit("usage: _comlrl_magrpo_worker.py --worker SPEC_JSON (run by bench/magrpo_step.py)")
    print("RESULT " + json.dumps(main(json.loads(sys.argv[2]))), flush=True)
