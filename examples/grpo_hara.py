r"""GRPO with HARA's token advantages, in the style of TRL's example scripts.

The HARA lines are the import, `HaraConfig` among the parser's dataclasses and `HaraGRPOTrainer` in
place of `GRPOTrainer`. The dataset is a JSONL file, one object per line with a `prompt` (text)
and an `answer` (what a correct completion ends with). Two reward functions: `accuracy` (1 when the
completion's last number is the answer) and `format_reward` (0.5 when the completion gives a number
at all; a real task checks its own template there). `accuracy` comes first, so it decides HARA's
outcome groups (`--outcome_funcs` chooses others); both shape TRL's advantages.

    python examples/grpo_hara.py --model_name_or_path Qwen/Qwen3-0.6B --dataset_path train.jsonl \
        --output_dir runs/grpo_hara --num_generations 8 --max_completion_length 512 \
        --kappa 1.0 --clip 0.5 2.0 --novelty_kw '{"bary_kw": {"max_iter": 500}}'

or with a YAML file of the same keys (`--config grpo_hara.yaml`), and on several GPUs with
`accelerate launch --num_processes N examples/grpo_hara.py ...`. The model and `hara_config.json`
end up in `--output_dir`. A value `HaraConfig` refuses (checked by the oracle itself when the
flags are read) ends the script with exit code 2 and one line naming the field, before any work.

To try it on a CPU with nothing downloaded, from the repository's root: a tiny random Qwen3 with a
character tokenizer and a JSONL file of additions, then two steps with the CPU flags (`--use_cpu
true`; `--bf16 false`, since TRL's default bf16 autocasts on a CPU too; a small barycenter budget):

    python - <<'EOF'
    import json
    from hara_ref.train.policy import char_tokenizer, tiny_qwen3
    from hara_ref.trainer.loop import save_policy

    tok = char_tokenizer()
    save_policy(tiny_qwen3(tok, hidden_size=32, seed=0), tok, 'tiny')
    with open('train.jsonl', 'w') as f:
        for a in range(10, 20):
            for b in range(10, 20):
                print(json.dumps(dict(prompt=f'<bos>{a}+{b}=', answer=str(a + b))), file=f)
    EOF
    HF_HUB_OFFLINE=1 python examples/grpo_hara.py --model_name_or_path tiny \
        --dataset_path train.jsonl --output_dir runs/tiny --max_steps 2 --num_generations 4 \
        --per_device_train_batch_size 8 --max_completion_length 4 --logging_steps 1 \
        --report_to none --use_cpu true --bf16 false \
        --novelty_kw '{"bary_kw": {"max_iter": 5}, "plan_kw": {"num_iter_max": 50}}'
"""

import re
import sys
from dataclasses import dataclass, field

from datasets import load_dataset
from trl import GRPOConfig, TrlParser

from hara_ref import HaraConfig
from hara_ref import HaraGRPOTrainer


@dataclass
class ScriptArguments:
    model_name_or_path: str = field(metadata={'help': 'a model name on the Hub or a local folder'})
    dataset_path: str = field(metadata={'help': 'a JSONL file with prompt and answer fields'})


def text(completion) -> str:
    "A completion's text: as it is, or the last message of a conversational completion."
    return completion if isinstance(completion, str) else completion[-1]['content']


def last_number(s: str):
    "The last number in `s` (None: there is none)."
    found = re.findall(r'-?\d+(?:\.\d+)?', s)
    return found[-1] if found else None


def accuracy(completions, answer, **kwargs) -> list:
    "1 when the completion's last number is the answer, else 0: the verifiable reward."
    return [float(last_number(text(c)) == str(a).strip()) for c, a in zip(completions, answer)]


def format_reward(completions, **kwargs) -> list:
    "0.5 when the completion gives a number for `accuracy` to grade, else 0."
    return [0.5 * (last_number(text(c)) is not None) for c in completions]


def main(script_args, training_args, hara_args):
    dataset = load_dataset('json', data_files=script_args.dataset_path, split='train')
    trainer = HaraGRPOTrainer(
        model=script_args.model_name_or_path,
        reward_funcs=[accuracy, format_reward],
        args=training_args,
        train_dataset=dataset,
        hara=hara_args,
    )
    trainer.train()
    trainer.save_model(training_args.output_dir)


if __name__ == '__main__':
    parser = TrlParser((ScriptArguments, GRPOConfig, HaraConfig))
    try:
        args = parser.parse_args_and_config()
    except (ValueError, TypeError) as e:  # a value refused: a usage error, before any work
        print(f"{parser.prog}: error: {e}", file=sys.stderr)
        sys.exit(2)
    main(*args)
