"""Helper of tests/test_trl.py: a few HaraGRPOTrainer steps whose rollouts do not depend on the
process layout; saves advantages and parameters. Several batch sizes run one after the other in
the same processes (one launch)."""

import os
import sys

os.environ.setdefault('HF_HUB_OFFLINE', '1')
import warnings

warnings.filterwarnings('ignore')
import torch
from datasets import Dataset
from transformers import AutoTokenizer, AutoModelForCausalLM
from transformers.utils import logging as hf_logging
from trl import GRPOConfig
from hara_ref.practice.trl import HaraGRPOTrainer, gather_rows
from hara_ref.practice.trl_config import HaraConfig
from hara_ref.train.policy import sample


class LayoutFreeTrainer(HaraGRPOTrainer):
    """Each rollout is sampled with its own generator, seeded by (step, global rollout index): the
    same rollouts on 1 or 2 processes."""

    def _generate_single_turn(
        self, prompt_ids, images, multimodal_fields, num_generations, has_tool_images=False
    ):
        p, out = self.accelerator.process_index, []
        for i, ids in enumerate(prompt_ids):
            g = torch.Generator().manual_seed(
                1000 * self.state.global_step + p * len(prompt_ids) + i
            )
            x = torch.tensor([ids])  # (1, P)
            r, m = sample(
                self.model,
                x,
                torch.ones_like(x, dtype=torch.bool),
                self.max_completion_length,
                self._tokenizer.eos_token_id,
                self._tokenizer.pad_token_id,
                1.0,
                g,
            )
            out.append(r[m].tolist())
        return out, None

    def _generate_and_score_completions(self, inputs):
        out = super()._generate_and_score_completions(inputs)
        # (B, T) in global order
        self.seen.append(gather_rows(self.accelerator, out['advantages']).cpu())
        return out


def train(model, out, per_device, steps, loss_type):
    "One training of `steps` steps with `per_device` rollouts per process; saves to `out`."
    tok = AutoTokenizer.from_pretrained(model)
    ds = Dataset.from_list(
        [
            dict(prompt=f"<bos>{a}+{b}=", answer=str(a + b))
            for a in range(10, 30)
            for b in range(10, 30)
        ]
    )

    def reward(completions, answer, **kw):
        return [
            float(c.strip().startswith(a[:1])) + 0.5 * (len(c) % 2)
            for c, a in zip(completions, answer)
        ]

    args = GRPOConfig(
        output_dir=out + '.trl',
        per_device_train_batch_size=per_device,
        num_generations=4,
        max_completion_length=6,
        max_steps=steps,
        learning_rate=0.1,
        optim='sgd',
        report_to='none',
        logging_steps=1,
        save_strategy='no',
        use_cpu=True,
        seed=0,
        loss_type=loss_type,
        disable_tqdm=True,
        gradient_checkpointing=False,
        bf16=False,
    )
    # float64: the loss gradient cancels, float32 rounding would show
    net = AutoModelForCausalLM.from_pretrained(model, dtype=torch.float64)
    tr = LayoutFreeTrainer(
        model=net,
        reward_funcs=reward,
        args=args,
        train_dataset=ds,
        processing_class=tok,
        hara=HaraConfig(
            novelty_kw=dict(bary_kw=dict(max_iter=3, inner_iter=20), plan_kw=dict(num_iter_max=20))
        ),
    )
    tr.seen = []
    tr.train()
    if tr.accelerator.is_main_process:
        params = {n: q.detach().clone() for n, q in tr.model.named_parameters()}
        torch.save(dict(adv=tr.seen, params=params, world=tr.accelerator.num_processes), out)
    tr.accelerator.wait_for_everyone()


def main(model, outs, per_devices, steps, loss_type='grpo'):
    "`outs`, `per_devices`: comma-separated, one training each."
    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    for out, per_device in zip(outs.split(','), per_devices.split(','), strict=True):
        train(model, out, int(per_device), steps, loss_type)
    sys.stdout.flush()
    sys.stderr.flush()
    # no process-group or interpreter teardown: a rank used to hang there (futex wait) after the
    # other had exited
    os._exit(0)


if __name__ == '__main__':
    main(sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), sys.argv[5])
